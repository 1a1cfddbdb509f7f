"""The factory `mirasc compile --model` appends after the language model (a runtime piece, copied by
mirasc.codegen.standalone.model_source): a LanguageModel whose every block mixes with the emitted module's Layer."""

from .layer import Layer
from .lm import LanguageModel, LMConfig


def make_model(cfg=None):
    """A byte-level LM whose every block mixes with this module's Layer (no hybrid blocks here: those
    need a second compiled memory; use mirasc.lab.models.build() for them)."""
    cfg = cfg or LMConfig()
    if cfg.hybrid_every:
        raise ValueError("hybrid stacks need mirasc.lab.models.build()")
    return LanguageModel(cfg, lambda d, h: Layer(d, h, **cfg.layer_options))
