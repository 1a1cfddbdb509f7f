"""Emitter for nonparametric memories (CONTRACT §5): the softmax kernel, i.e. causal attention."""

from __future__ import annotations

from pathlib import Path

from .. import spec as S
from ..derive import Derivation
from ..explain import equations
from .torch_backend import layer_source

TEMPLATE = (Path(__file__).parent / "templates" / "attention_module.py.tmpl").read_text()


def emit(spec: S.Spec, d: Derivation) -> str:
    eqs = "\n".join("    " + line for line in equations(spec, d))
    spec_text = "\n".join("    " + line for line in spec.canonical().splitlines())
    doc = (f'"""mirasc-generated memory `{spec.name}` — standalone: imports only torch.\n\n'
           f"Spec:\n\n{spec_text}\n\nNonparametric memory (Miras: the l2 bias solved by Nadaraya–Watson):\n\n{eqs}\n\n"
           "Algorithms: recurrent = token loop over a growing key/value cache (reference); chunked = one masked\n"
           "scaled_dot_product_attention call over [cache, new tokens].\n"
           '"""\n')
    body = TEMPLATE.replace("{{SPEC}}", spec.canonical())
    body = body.replace("{{WINDOW}}", str(spec.memory.window))
    body = body.replace("{{SCALE}}", "None" if spec.memory.scale is None else repr(float(spec.memory.scale)))
    return doc + "\n" + body + layer_source(spec)
