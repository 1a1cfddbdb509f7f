"""The Layer's q, k, v streams: the short convolution's initial weights, and the convolved projection cut into q and
each inner step's k and v (a runtime piece: its body is copied into every emitted module by mirasc.codegen;
docs/module-api.md, "Layer"; docs/language.md, "The layer block")."""

import torch
import torch.nn as nn


def _conv_weight(width, taps, key_rows, key_shift=0.0):
    """The depthwise causal convolution's weight [width, taps] at initialisation: near the identity (the current
    token's tap 1, every tap plus 0.02·N(0, 1)), and key_shift added to the tap one token back on the key rows (a
    slice: each key starts as its own token plus key_shift times the previous one, a previous-token key; a
    one-tap convolution has no such tap, and nothing is shifted)."""
    w = torch.zeros(width, taps)
    w[:, -1] = 1.0
    w.add_(0.02 * torch.randn_like(w))
    if key_shift and taps > 1:
        w[key_rows, -2] += key_shift
    return nn.Parameter(w)


def _per_step(x, heads, head_dim, steps=1):
    """[B, T, steps·heads·head_dim], projected step-major -> [B, T, heads, head_dim], or [B, T, heads, steps,
    head_dim] for a multi-step learner (steps > 1)."""
    B, T = x.shape[0], x.shape[1]
    if steps == 1:
        return x.reshape(B, T, heads, head_dim)
    return x.reshape(B, T, steps, heads, head_dim).movedim(2, 3)


def _streams(qkv, heads, head_dim, steps=1):
    """q [B, T, H, D] and k, v (each as `_per_step`) from the convolved projection [B, T, (1 + 2·steps)·H·D]: q,
    then `steps` keys, then `steps` values per token (one pair per inner step, as DeltaProduct projects them)."""
    n = heads * head_dim
    q, k, v = qkv.split([n, steps * n, steps * n], dim=-1)
    return _per_step(q, heads, head_dim), _per_step(k, heads, head_dim, steps), _per_step(v, heads, head_dim, steps)
