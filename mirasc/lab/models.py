"""Language models around compiled memory layers: `build` compiles a spec (and the sliding-window attention of
hybrid blocks) and stacks it in mirasc.runtime.lm's LanguageModel (Llama-style blocks, tied byte embeddings, cached
generation).
"""

from __future__ import annotations

from ..runtime.lm import LanguageModel, LMConfig


def sliding_window_spec(window: int) -> str:
    """The spec text of the hybrid layer: softmax attention over the last `window` tokens."""
    return (f"model swa {{\n    memory  = nonparametric(kernel=softmax, window={window})\n    bias    = l2\n"
            "    learner = nonparametric\n}\n")


def build(spec, cfg: LMConfig) -> LanguageModel:
    """A LanguageModel whose mixers are the compiled `spec` (path, text or emitted module); hybrid blocks
    use sliding-window attention compiled from `sliding_window_spec(cfg.window)`."""
    compile_spec = None
    if not hasattr(spec, "Layer") or cfg.hybrid_every:  # an emitted module and no hybrid blocks: torch alone
        from ..compiler import compile_spec  # only here: a GPU machine without the compiler's dependencies
    mod = spec if hasattr(spec, "Layer") else compile_spec(spec)
    hybrid = compile_spec(sliding_window_spec(cfg.window)) if cfg.hybrid_every else None

    def make_mixer(d, h):
        return mod.Layer(d, h, **cfg.layer_options)

    def make_hybrid(d, h):
        return hybrid.Layer(d, h, **{k: v for k, v in cfg.layer_options.items() if k in hybrid.LAYER_DEFAULTS})

    return LanguageModel(cfg, make_mixer, make_hybrid if hybrid else None)
