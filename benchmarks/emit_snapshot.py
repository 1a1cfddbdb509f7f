"""Write the module emitted for every spec the project knows into a directory, to check that a refactoring of
the code generators changes no emitted byte:

    python benchmarks/emit_snapshot.py /tmp/before      # on the code before the change
    python benchmarks/emit_snapshot.py /tmp/after       # after it
    diff -r /tmp/before /tmp/after                      # must print nothing

The specs: every bundled `specs/*.miras`, and every spec text the tests hold (string constants of
tests/**/test_*.py, module-level values and pytest parametrize arguments; bodies without the `model NAME { }` frame
are framed; "{C}" placeholders are filled with the mini-batch sizes the tests use), each also with
`parallel = minibatch(C, readout=chunk)` where it has no `parallel` line. A spec the compiler rejects is
written as NAME.err with its message, so a change in the errors shows too. Files are named by a hash of
the spec text; `_model_source.py` is the language model `compile --model` appends.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TRITON_INTERPRET", "1")  # as the tests run; the emitted text does not depend on it
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import conftest  # noqa: E402, F401  (puts the test folders on the path, as for the tests)

from mirasc import compiler  # noqa: E402
from mirasc.codegen import standalone  # noqa: E402
from mirasc.language import frontend  # noqa: E402


def _variants(text: str) -> list[str]:
    """The parseable spec texts a string stands for (none if it is not a spec)."""
    if not isinstance(text, str) or "memory" not in text or "=" not in text or len(text) > 5000:
        return []
    bodies = [text.format(C=c) for c in (1, 3, 4, 8, 16, 64)] if "{C}" in text else [text]
    out = []
    for body in bodies:
        for cand in (body, "model x {\n" + body + "\n}\n"):
            try:
                frontend.parse_text(cand, "<snapshot>")
            except Exception:  # not a spec (or not in this frame)
                continue
            out.append(cand)
            if "parallel" not in cand:
                for c in (4, 8):
                    chunked = cand.rstrip().rstrip("}") + f"\nparallel = minibatch({c}, readout=chunk)\n}}\n"
                    try:
                        frontend.parse_text(chunked, "<snapshot>")
                        out.append(chunked)
                    except Exception:
                        pass
            break
    return out


def _walk(value, found: dict, depth: int = 0, seen=None) -> None:
    seen = set() if seen is None else seen
    if depth > 6 or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, str):
        found.update(dict.fromkeys(_variants(value)))
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk(k, found, depth + 1, seen)
            _walk(v, found, depth + 1, seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            _walk(v, found, depth + 1, seen)


def spec_texts() -> list[str]:
    found: dict[str, None] = {}
    for path in sorted((ROOT / "specs").glob("*.miras")):
        found.update(dict.fromkeys(_variants(path.read_text(encoding="utf-8"))))
    for path in sorted((ROOT / "tests").rglob("test_*.py"), key=lambda p: p.name):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant):
                found.update(dict.fromkeys(_variants(node.value)))
        try:
            module = importlib.import_module(path.stem)
        except Exception as err:  # a test module that needs what is not installed: its constants still count
            print(f"{path.name}: not imported ({type(err).__name__}); string constants only", file=sys.stderr)
            continue
        for value in vars(module).values():
            _walk(value, found)
            for mark in getattr(value, "pytestmark", None) or []:
                _walk(mark.args, found)
    return sorted(found)


def main(out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ok = bad = 0
    for text in spec_texts():
        name = hashlib.sha256(text.encode()).hexdigest()[:10]
        try:
            (out / f"{name}.py").write_text(compiler.compile_text(text, "<snapshot>").source, encoding="utf-8")
            ok += 1
        except Exception as err:
            (out / f"{name}.err").write_text(f"{type(err).__name__}: {err}\n{text}", encoding="utf-8")
            bad += 1
    (out / "_model_source.py").write_text(standalone.model_source(), encoding="utf-8")
    print(f"{out}: {ok} emitted modules, {bad} rejected specs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "emit_snapshot"))
