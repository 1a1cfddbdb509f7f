"""The runtime pieces an emitted module carries as text: the body of a module under mirasc/runtime/ (everything after
its docstring and imports), so that an emitted file stays standalone while each piece is one real, importable,
linted module.
"""

from __future__ import annotations

import ast
import functools
import types
from pathlib import Path

from ..runtime import lm

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"


@functools.cache
def body(module: types.ModuleType) -> str:
    """`module`'s source from its first definition (or statement) after the docstring and the imports, with the
    comment lines right above it."""
    return _body(Path(module.__file__).read_text(encoding="utf-8"))


@functools.cache
def _spans(path: Path) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """The lines of a runtime module (read, not imported: emitting needs neither triton nor torch) and the span of
    each top-level function, class and constant in them (decorators and the comment lines right above included)."""
    text = path.read_text(encoding="utf-8")
    lines, spans = text.splitlines(True), {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined = node.name
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            defined = node.targets[0].id
        else:
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        while first > 1 and lines[first - 2].startswith("#"):
            first -= 1
        spans[defined] = (first, node.end_lineno)
    return lines, spans


def runtime_constants(name: str, values: dict[str, str], notes: dict[str, list[str]] | None = None) -> list[str]:
    """The lines of an emitted module's constants `values` (name -> its value as source) as mirasc/runtime/`name`.py
    declares them, the one home of what each means: in that module's order, each with its trailing comment, and the
    comment block above a group of constants (the assignments that follow it up to a blank line or the next comment
    block) before the group's first constant that `values` sets; the module's own values are examples, except where a
    value is None: the declared one (a constant every module has the same). `notes`: comment lines of this spec's on
    a constant, printed right above it. A name the module does not declare raises KeyError."""
    declared = _declarations(name)
    unknown = sorted((set(values) | set(notes or ())) - {const for const, _, _, _ in declared})
    if unknown:
        raise KeyError(f"mirasc/runtime/{name}.py declares no {', '.join(unknown)}")
    lines, block = [], []
    for const, above, value, trailing in declared:
        if above is not None:
            block = above
        if const in values:
            given = values[const]
            lines += block + (notes or {}).get(const, []) + [f"{const} = {value if given is None else given}{trailing}"]
            block = []
    return lines


def runtime_value(name: str, const: str):
    """The value mirasc/runtime/`name`.py declares for the constant `const` (a literal)."""
    values = {c: value for c, _, value, _ in _declarations(name)}
    if const not in values:
        raise KeyError(f"mirasc/runtime/{name}.py declares no {const}")
    return ast.literal_eval(values[const])


def quoted(text: str) -> str:
    """`text` as a double-quoted string literal of an emitted module (a reason, a choice's name): its double quotes
    become single ones, so that the literal stays one."""
    return '"' + text.replace('"', "'") + '"'


def runtime_doc(name: str) -> list[str]:
    """The docstring of mirasc/runtime/`name`.py as comment lines: an emitted module's note on the pieces it carries
    from there (the kernels a family launches, what they compute, how they are split and scheduled)."""
    return list(_doc_lines(name))


@functools.cache
def _doc_lines(name: str) -> tuple[str, ...]:
    doc = ast.get_docstring(ast.parse((RUNTIME / f"{name}.py").read_text(encoding="utf-8"))) or ""
    return tuple(f"# {line}" if line else "#" for line in doc.split("\n"))


@functools.cache
def _declarations(name: str) -> tuple[tuple[str, list[str] | None, str, str], ...]:
    """The top-level constants of mirasc/runtime/`name`.py, in order: (name, the comment block that starts its group,
    or None when it continues the group above, its value's source, its trailing comment)."""
    text = (RUNTIME / f"{name}.py").read_text(encoding="utf-8")
    lines, out = text.splitlines(), []
    for node in ast.parse(text).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(
            node, "target", None) if isinstance(node, ast.AnnAssign) else None
        if not isinstance(target, ast.Name):
            continue
        first = node.lineno - 1
        while first > 0 and lines[first - 1].startswith("#"):
            first -= 1
        starts = first < node.lineno - 1 or first == 0 or not lines[first - 1].strip()
        out.append((target.id, lines[first:node.lineno - 1] if starts else None,
                    ast.get_source_segment(text, node.value),
                    lines[node.end_lineno - 1].encode()[node.value.end_col_offset:].decode()))  # (byte offsets)
    return tuple(out)


def kernels_source(name: str, functions: tuple[str, ...] | None = None) -> str:
    """The Triton functions and constants `functions` (all, in file order, when None) of
    mirasc/runtime/kernels/`name`.py, to paste inside an emitted module's `if triton is not None:` block: indented
    by four spaces, one blank line apart."""
    lines, spans = _spans(RUNTIME / "kernels" / f"{name}.py")
    missing = sorted(set(functions or ()) - set(spans))
    if missing:
        raise KeyError(f"mirasc/runtime/kernels/{name}.py defines no {', '.join(missing)}")
    pieces = ("".join(lines[a - 1:b]) for a, b in (spans[f] for f in (functions or spans)))
    return "\n".join("".join(f"    {line}" if line.strip() else line for line in piece.splitlines(True))
                     for piece in pieces)


def runtime_functions(name: str, functions: list[str]) -> str:
    """The functions `functions` of mirasc/runtime/`name`.py, in that order, as an emitted module carries them at its
    top level: two blank lines apart, without a trailing newline (they fill a template slot)."""
    lines, spans = _spans(RUNTIME / f"{name}.py")
    missing = sorted(set(functions) - set(spans))
    if missing:
        raise KeyError(f"mirasc/runtime/{name}.py defines no {', '.join(missing)}")
    return "\n\n".join("".join(lines[a - 1:b]) for a, b in (spans[f] for f in functions)).rstrip("\n")


def _body(text: str) -> str:
    for node in ast.parse(text).body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not docstring and not isinstance(node, (ast.Import, ast.ImportFrom)):
            lines = text.splitlines(True)
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            while first > 1 and lines[first - 2].startswith("#"):  # the comment right above it belongs to it
                first -= 1
            return "".join(lines[first - 1:])
    return ""


def runtime_names(name: str) -> set[str]:
    """The top-level functions, classes and constants mirasc/runtime/`name`.py defines."""
    return set(_spans(RUNTIME / f"{name}.py")[1])


@functools.cache
def runtime_source(name: str) -> str:
    """The body of mirasc/runtime/`name`.py as an emitted module carries it, without its trailing newline (it fills a
    template slot): read rather than imported, since emitting needs neither triton nor torch."""
    return _body((RUNTIME / f"{name}.py").read_text(encoding="utf-8")).rstrip("\n")


def lm_source() -> str:
    """The language model (mirasc.runtime.lm: LMConfig, RMSNorm, SwiGLU, Block, LanguageModel), to append to an
    emitted module (its Layer is the mixer)."""
    rule = "# " + "-" * 94
    return (f"\n\n{rule}\n# Language model (mirasc.runtime.lm): RMSNorm, mixer = the Layer above, SwiGLU MLP, tied "
            f"byte embeddings.\n{rule}\nfrom dataclasses import dataclass, field  # noqa: E402\n\n\n"
            f"{body(lm).rstrip()}\n")


def model_source() -> str:
    """The language model and a make_model() factory, appended to an emitted module by `mirasc compile --model`."""
    return lm_source() + "\n\n" + runtime_functions("lm_factory", ["make_model"]) + "\n"


def hf_wrapper_source() -> str:
    """The Hugging Face wrapper (config, PreTrainedModel, generation; mirasc.runtime.hf_model) that `mirasc export
    --hf` appends; the file it goes into defines build_language_model."""
    rule = "# " + "-" * 94
    imports = ("from dataclasses import dataclass as _dataclass", "from typing import Any", "",
               "from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel",
               "from transformers.utils import ModelOutput")
    return (f"\n\n{rule}\n# Hugging Face wrapper (mirasc.runtime.hf_model): MirascConfig (config.json) and "
            f"MirascForCausalLM\n# (AutoModelForCausalLM), decoding with the Layer's state cache.\n{rule}\n"
            + "".join(f"{line}  # noqa: E402\n" if line else "\n" for line in imports) + "\n\n"
            + runtime_functions("hf_model", list(hf_classes())) + "\n")


def hf_classes() -> tuple[str, ...]:
    """The classes of mirasc.runtime.hf_model, in file order: what an exported file carries (read, not imported:
    exporting does not need transformers)."""
    tree = ast.parse((RUNTIME / "hf_model.py").read_text(encoding="utf-8"))
    return tuple(node.name for node in tree.body if isinstance(node, ast.ClassDef))
