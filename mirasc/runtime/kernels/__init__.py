"""Triton kernels as real modules (importable, linted, unit-tested). An emitted module carries the body of each
one it launches as text (mirasc.codegen.standalone), inside its `if triton is not None:` block, so that it stays
standalone; importing one of these modules needs triton."""
