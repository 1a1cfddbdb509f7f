"""A parametric memory's coefficients for a call (a runtime piece: copied into every emitted memory module by
mirasc.codegen.torch_pieces; docs/module-api.md, "apply"): the declared gates, checked, the constants and per-head
constants filled in, as [B, H, T] ([B, H, T, D] channel-wise). A multi-step learner's sub-steps keep the retention's α
at each token's first sub-step only (its `_substep_coefficients`, mirasc.runtime.multistep). The spec's choices are
the module's (mirasc.runtime.memory_spec and memory_hooks have examples)."""

import torch

from .inputs import _checked_gates
from .memory_hooks import _per_head_coefficients
from .memory_spec import CONSTANTS, GATE_CHANNELS, GATES


def _coefficients(gates, like, d_v=None):
    """Every coefficient as [B, H, T] ([B, H, T, D] channel-wise): declared gates from `gates`, constants filled in.
    like: q [B, T, H, Dk]; d_v: the value width (channel-wise gates over v). In float32 for fp16/bf16 inputs, never
    rounded to 16 bits (docs/semantics.md "Numerics": a decay near 1 would move in steps of 2^-8 in bf16)."""
    B, T, H = like.shape[0], like.shape[1], like.shape[2]
    dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
    out = _checked_gates(gates, like, d_v, GATES, GATE_CHANNELS)
    for name, value in CONSTANTS.items():
        out[name] = torch.full((B, H, T), value, dtype=dtype, device=like.device)
    for name, per_head in _per_head_coefficients(H, like.device).items():  # constant over tokens, one per head
        out[name] = per_head.to(dtype)[None, :, None].expand(B, H, T).contiguous()
    out = _substep_coefficients(out, T)
    if GATE_CHANNELS.get("eta"):  # a channel-wise η weights the gradient (read there); the update's η is 1
        out["eta_ch"] = out["eta"]
        out["eta"] = torch.ones((B, H, T), dtype=dtype, device=like.device)
    return out


def _substep_coefficients(out, T):
    """The coefficients of the T tokens the memory runs, as they are (a multi-step learner's are sub-steps:
    mirasc.runtime.multistep)."""
    return out
