"""mirasc: a compiler for Miras sequence-model designs (memory, attentional bias, retention, learner)."""

from __future__ import annotations

import importlib

__all__ = ["compile_spec", "compile_text", "parse_file", "parse_text", "SpecError"]
__version__ = "0.1.0"

# The public names load their module on first use: `import mirasc` (and `mirasc --help`, `mirasc check`)
# does not pay for sympy, networkx or the code generators until something needs them.
_HOME = {"compile_spec": "compiler", "compile_text": "compiler", "parse_file": "language.frontend",
         "parse_text": "language.frontend", "SpecError": "language.messages"}


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
