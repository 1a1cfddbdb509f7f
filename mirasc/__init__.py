"""mirasc: a compiler for Miras sequence-model designs (memory, attentional bias, retention, learner)."""

from .compiler import compile_spec, compile_text
from .frontend import SpecError, parse_file, parse_text

__all__ = ["compile_spec", "compile_text", "parse_file", "parse_text", "SpecError"]
__version__ = "0.1.0"
