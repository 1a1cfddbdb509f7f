"""The driver: spec text -> Spec -> Derivation -> IR -> Plan -> emitted module text (and module object)."""

from __future__ import annotations

import hashlib
import linecache
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from . import derive as D
from . import ir
from .codegen import torch_backend
from .language import frontend
from .language import spec as S
from .language.messages import SpecError
from .plan import Plan, plan


@dataclass
class Compiled:
    spec: S.Spec
    derivation: D.Derivation
    forward: ir.Graph | None
    grad: ir.Graph | None
    source: str
    plan: Plan  # which algorithms and kernels compute the spec (mirasc.plan)

    def dump_ir(self) -> str:
        if self.forward is None:
            return f"# {self.spec.name}: nonparametric memory, no update-step graph\n"
        return ir.dump(self.forward) + "\n\n" + ir.dump(self.grad) + "\n"


def compile_text(text: str, path: str = "<spec>") -> Compiled:
    spec = frontend.parse_text(text, path)
    return compile_parsed(spec, text, path)


def derive_parsed(spec: S.Spec, text: str, path: str) -> D.Derivation:
    """The symbolic derivation, its errors located in the spec text."""
    try:
        return D.derive(spec)
    except D.DerivationError as err:
        raise _locate(err, text, path) from None


def compile_parsed(spec: S.Spec, text: str, path: str) -> Compiled:
    d = derive_parsed(spec, text, path)
    if not spec.parametric:
        from .codegen import attention_backend
        return Compiled(spec, d, None, None, *attention_backend.emit(spec, d, plan(spec, d, None, None)))
    fwd, grad = ir.compile_graphs(spec.inner_spec(), d)  # precond: the graphs of gd(lr=gate(k)) it runs
    return Compiled(spec, d, fwd, grad, *torch_backend.emit(spec, d, fwd, grad, plan(spec, d, fwd, grad)))


def _locate(err: D.DerivationError, text: str, path: str) -> SpecError:
    """Point a derivation error at the spec field (and parameter) it concerns."""
    code = re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), text)  # blank out comments, keep offsets
    offset = 0
    field = re.search(rf"\b{err.field}\s*=\s*", code)
    if field:
        offset = field.end()
        if err.param:
            param = re.compile(rf"\b{err.param}\s*=").search(code, field.end())
            if param:
                offset = param.start()
    line = code.count("\n", 0, offset) + 1
    col = offset - (code.rfind("\n", 0, offset) + 1) + 1
    return SpecError(path, line, col, err.message)


_CACHE: dict[str, types.ModuleType] = {}


def load_source(source: str, name: str) -> types.ModuleType:
    """Execute emitted source as a fresh module object (cached by source hash)."""
    key = hashlib.sha256(source.encode()).hexdigest()
    if key in _CACHE:
        return _CACHE[key]
    module = types.ModuleType(f"mirasc_generated_{name}_{key[:12]}")
    sys.modules[module.__name__] = module  # importable by name (torch.compile resolves globals that way)
    module.__file__ = f"<mirasc:{name}:{key[:12]}>"
    # Register the text so inspect.getsource works on the module's functions (triton.jit needs it).
    linecache.cache[module.__file__] = (len(source), None, source.splitlines(True), module.__file__)
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    _CACHE[key] = module
    return module


_BY_TEXT: dict[str, types.ModuleType] = {}


def compile_spec(text_or_path: str | Path) -> types.ModuleType:
    """Compile a spec (text, or a path to a .miras file) and return the emitted module, in-process.
    An unchanged spec text returns the already-built module (compilation is deterministic)."""
    text, path = _read(text_or_path)
    if text in _BY_TEXT:
        return _BY_TEXT[text]
    compiled = compile_text(text, path)
    module = load_source(compiled.source, compiled.spec.name)
    _BY_TEXT[text] = module
    return module


def _read(text_or_path: str | Path) -> tuple[str, str]:
    return frontend.read_spec(text_or_path)
