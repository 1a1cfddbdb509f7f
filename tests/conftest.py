"""Make the repository root importable (for `import mirasc`) when pytest runs without installation."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

# Triton kernels run on the CPU through the interpreter; this must be set before triton is imported.
import os  # noqa: E402

os.environ.setdefault("TRITON_INTERPRET", "1")
