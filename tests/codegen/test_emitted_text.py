"""Every emitted file reads as finished text (docs/module-api.md): no template slot or `# @if` directive left in
it, no reason left empty where a message or comment gives one, no comment cut off mid-sentence, no function or
class defined twice (a runtime kernel and a host function of one name would shadow each other). Checked on the
module `mirasc compile` writes for every bundled spec, and on the parts `mirasc export` adds around it (the
language model, the model factory, the Hugging Face wrapper)."""

from __future__ import annotations

import ast
import collections
import io
import re
import tokenize
from pathlib import Path

import pytest

from mirasc import compile_text
from mirasc.codegen.standalone import model_source
from mirasc.lab import hf

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATHS = sorted((ROOT / "specs").glob("*.miras"))

DIRECTIVE = re.compile(r"^\s*#\s*@(if|elif|else|endif)\b")
# A comment that stops at "because" or whose line starts with the ")" of a cut-off parenthesis.
CUT_OFF = re.compile(r"^\s*#.*\bbecause\s*$|^\s*#\s*\)")
# A string that ends at a colon and closes the call: `"...: ")`.
EMPTY_AT_END = re.compile(r":\s*['\"]\s*\)")
# Inside a message, comment or docstring: an empty reason after a colon (`: ;`, `: ''`) or in parentheses (`x ()`).
EMPTY_REASON = re.compile(r"[\w,:] \(\s*\)|:\s*;|:\s*(''|\"\")")


def problems(source: str) -> list[str]:
    found = []
    for i, line in enumerate(source.splitlines(), 1):
        if "{{" in line or DIRECTIVE.match(line) or CUT_OFF.match(line) or EMPTY_AT_END.search(line):
            found.append(f"line {i}: {line.strip()}")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            for m in EMPTY_REASON.finditer(tok.string):
                found.append(f"line {tok.start[0]}: ...{tok.string[max(0, m.start() - 60):m.end() + 20]}...")
    names = collections.defaultdict(list)
    _definitions(ast.parse(source).body, names)
    found += [f"{name} defined at lines {lines}" for name, lines in names.items() if len(lines) > 1]
    return found


def _definitions(body, names):
    """The functions and classes a module defines at its top level and in its top-level `if` blocks."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name].append(node.lineno)
        elif isinstance(node, ast.If):
            _definitions(node.body + node.orelse, names)


@pytest.mark.parametrize("path", SPEC_PATHS, ids=[p.stem for p in SPEC_PATHS])
def test_emitted_module_has_no_template_leftovers(path):
    source = compile_text(path.read_text(encoding="utf-8"), str(path)).source
    assert problems(source) == []


def test_export_parts_have_no_template_leftovers():
    spec = (ROOT / "specs" / "gated_deltanet.miras").read_text(encoding="utf-8")
    assert problems(hf.modeling_source(spec, "gated_deltanet.miras", hybrid=True)) == []
    assert problems(model_source()) == []


@pytest.mark.parametrize("text", [
    "# The backward recomputes the torch recurrence, because\n# ) and its interval.\nx = 1\n",
    'raise ValueError("no chunked algorithm for this spec: ; use algorithm=\'recurrent\'")\n',
    "# @if chunked\nx = 1\n",
    "x = {{SLOT}}\n",
    'raise RuntimeError("no kernel: ")\n',
    '"""chunked: not available ()"""\n',
    "if triton is not None:\n    def _log_decays(G, bh):\n        pass\ndef _log_decays(alpha, n):\n    pass\n",
])
def test_the_check_finds_leftovers(text):
    assert problems(text)
