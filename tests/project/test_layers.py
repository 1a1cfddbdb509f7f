"""The package's layers (docs/development.md, "Layout"): every import in mirasc/ (at module level or inside a
function) goes to a module of the same layer or of a layer below, and no modules import each other in a loop.

From the ground up: the runtime pieces an emitted module carries (torch, triton and the standard library only), the
language (grammar, spec, parser), the symbolic stage (printers, derivation, IR, equations), the plan (which
algorithms and kernels compute a spec), the code generators, the compiler that drives them, the lab (training,
exploration, tasks, data, export, kernel reports) and the command line. The package's face (mirasc/__init__.py)
hands on the compiler's and the language's public names.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "mirasc"
LAYERS = [
    ("runtime", ["mirasc.runtime"]),
    ("language", ["mirasc.language"]),
    ("symbolic", ["mirasc.printers", "mirasc.derive", "mirasc.ir", "mirasc.explain"]),
    ("plan", ["mirasc.plan"]),
    ("codegen", ["mirasc.codegen"]),
    ("compiler", ["mirasc.compiler", "mirasc.verify", "mirasc"]),  # the face: compile_spec, parse_text, SpecError
    ("lab", ["mirasc.lab"]),
    ("command line", ["mirasc.cli", "mirasc.__main__"]),
]
MAX_LINES, MAX_FUNCTION = 600, 80
# Files and functions allowed over those sizes (none now): each listed one should shrink, none may join.
OVER_SIZE: set[str] = set()
LONG_FUNCTIONS: set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    """The layer of `module` (None: no layer lists it): the longest prefix listed wins (mirasc.lab.x is the lab,
    plain mirasc the face)."""
    best = max(((len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
                if module == prefix or module.startswith(prefix + ".")), default=None)
    return None if best is None else best[1]


def imports() -> dict[str, set[str]]:
    """module -> the mirasc modules it imports (a name imported from a package counts as its submodule when one
    exists)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    out = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == "mirasc"}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "mirasc":
                    continue
                subs = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in files}
                found |= subs or {target}
        out[name] = found - {name}
    return out


def test_every_module_has_a_layer():
    for name in imports():
        assert layer(name) is not None


def test_no_import_goes_up_a_layer():
    upward = [f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})"
              for a, targets in imports().items() for b in targets if layer(b) > layer(a)]
    assert upward == []


def test_the_runtime_imports_nothing_of_the_compiler():
    """(Its modules may import one another: an emitted module carries each piece it launches and what that uses.)"""
    assert {a: [m for m in t if not m.startswith("mirasc.runtime")] for a, t in imports().items()
            if a.startswith("mirasc.runtime") and any(not m.startswith("mirasc.runtime") for m in t)} == {}


def test_the_runtime_imports_only_torch_triton_and_the_standard_library():
    """What an emitted module may import (it runs where mirasc, lark, sympy, pydantic, networkx are not); the Hugging
    Face wrapper, which only `mirasc export --hf` appends, imports transformers too."""
    allowed = set(sys.stdlib_module_names) | {"torch", "triton", "__future__"}
    found = {}
    for path in (PACKAGE / "runtime").rglob("*.py"):
        ok = allowed | ({"transformers"} if path.name == "hf_model.py" else set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found.update({f"{path.name}: {n}": n for n in names if n.split(".")[0] not in ok})
    assert found == {}


def test_no_import_cycle():
    graph = nx.DiGraph([(a, b) for a, targets in imports().items() for b in targets if b != "mirasc"])
    assert sorted(sorted(c) for c in nx.simple_cycles(graph)) == []


def sizes():
    files, functions = {}, {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        text = path.read_text(encoding="utf-8")
        files[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{rel}:{node.name}"] = node.end_lineno - node.lineno + 1
    return files, functions


@pytest.mark.parametrize("kind", ["files", "functions"])
def test_sizes_do_not_grow_past_the_limits(kind):
    files, functions = sizes()
    if kind == "files":
        assert {f for f, n in files.items() if n > MAX_LINES} == OVER_SIZE
    else:
        assert {f for f, n in functions.items() if n > MAX_FUNCTION} == LONG_FUNCTIONS


def test_every_file_the_package_reads_is_package_data():
    """A wheel carries the .py modules and what pyproject.toml's package-data names: every other file under mirasc/
    (the grammar, the templates and their optional sections) must match one of those patterns, or an installed
    (not editable) mirasc could not compile the specs that read it."""
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]
    data = [p for p in PACKAGE.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
            and "__pycache__" not in p.parts]
    assert data, "no data files found"
    for path in data:
        covered = any(path.relative_to(PACKAGE.parent / package.replace(".", "/")).match(glob)
                      for package, globs in patterns.items() for glob in globs
                      if path.is_relative_to(PACKAGE.parent / package.replace(".", "/")))
        assert covered, f"{path.relative_to(PACKAGE.parent)} is not in pyproject.toml's package-data"
