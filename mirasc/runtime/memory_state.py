"""A parametric memory's state (a runtime piece: copied into every emitted memory module by mirasc.codegen.
torch_backend; docs/module-api.md, "init_state"): the tensors it holds beside the weights, and the carry of the token
recurrence built from it and returned as it. What a spec keeps is the module's constants (ACCUMULATORS,
MOMENTUM_BUFFERS, STATISTIC, the Omega window's WINDOW, WINDOW_COEFS, WINDOW_STATE); the retention's accumulators at
the start of a recurrence are its printed `_accumulators`, and `_init_memory_state` starts each weight with
`_initial_weights`, the accumulator beside it with the retention's printed `_initial_accumulator`
(mirasc.runtime.memory_spec and memory_hooks have examples)."""

import math

import torch

from .memory_hooks import _accumulators, _initial_accumulator, _weight_shapes
from .memory_spec import (
    ACCUMULATORS,
    GATE_CHANNELS,
    MOMENTUM_BUFFERS,
    POSITIVE_SCALE,
    RESIDUAL,
    STATISTIC,
    WEIGHT_INIT,
    WEIGHTS,
    WINDOW,
    WINDOW_COEFS,
    WINDOW_STATE,
)


def _state_shapes(d_k, d_v):
    """Every state key with the [rows, cols] of its tensor (after the [B, H] axes)."""
    out = {}
    for name, shape in zip(WEIGHTS, _weight_shapes(d_k, d_v)):
        out[name] = shape
        if ACCUMULATORS:
            out["A_" + name] = shape
        if MOMENTUM_BUFFERS:
            out["S_" + name] = shape
    if STATISTIC:
        out["A"] = (d_k,)  # the preconditioner's statistic a, one number per key channel
    widths = {"k": d_k, "v": d_v, **{n: 1 for n in WINDOW_COEFS}}
    widths.update({n: d_k if side == "k" else d_v for n, side in GATE_CHANNELS.items() if n in WINDOW_COEFS})
    for name in WINDOW_STATE:
        out[name] = (WINDOW - 1, widths[name[len("win_"):]])
    return out


def _start(state):
    """Carry of the recurrence: weights W, retention accumulators Y, momentum S, chunk anchor, the Omega window (the
    last WINDOW − 1 tokens' keys, values, weights γ and the coefficients their losses read)."""
    W = [state[n] for n in WEIGHTS]
    S = [state["S_" + n] for n in WEIGHTS] if MOMENTUM_BUFFERS else None
    win = {n[len("win_"):]: state[n] for n in WINDOW_STATE} if WINDOW_STATE else None
    return {"W": W, "Y": _accumulators(W, state), "S": S, "anchor": W, "t": 0, "win": win}


def _finish(carry):
    """The state a call returns, from the recurrence's carry."""
    out = dict(zip(WEIGHTS, carry["W"]))
    if ACCUMULATORS:
        out.update({"A_" + n: y for n, y in zip(WEIGHTS, carry["Y"])})
    if MOMENTUM_BUFFERS:
        out.update({"S_" + n: s for n, s in zip(WEIGHTS, carry["S"])})
    if WINDOW_STATE:
        out.update({"win_" + n: x for n, x in carry["win"].items()})
    return out


def _initial_weights(batch, heads, rows, cols, generator):
    """A weight's default initial value [batch, heads, rows, cols] in float64, by WEIGHT_INIT: "zeros" (a linear
    memory: an empty memory), "normal" (N(0, 1/cols)) or "softmax" (a retention that keeps W > 0: rows
    POSITIVE_SCALE·softmax(3·N(0, 1)); a row near uniform averages its input, so an MLP memory of such layers returns
    almost the same value on every channel and its LayerNorm divides by that spread, docs/training.md)."""
    if WEIGHT_INIT == "zeros":
        return torch.zeros(batch, heads, rows, cols, dtype=torch.float64)
    x = torch.randn(batch, heads, rows, cols, generator=generator, dtype=torch.float64)
    if WEIGHT_INIT == "softmax":
        return torch.softmax(3.0 * x, dim=-1) * POSITIVE_SCALE
    return x / math.sqrt(cols)


def _init_memory_state(batch, heads, d_k, d_v, *, dtype=torch.float32, device="cpu", generator=None):
    """The default initial state (docs/module-api.md, "init_state"): each weight drawn as WEIGHT_INIT says
    (_initial_weights), read through the retention's accumulator where it keeps one (_initial_accumulator); momentum
    buffers, the preconditioner's statistic and the Omega window at zero (no token before the first: γ = 0 weighs
    nothing). With generator=None a fixed seed (0) is used, so the default state is deterministic."""
    if RESIDUAL and d_k != d_v:
        raise ValueError(f"memory residual=true maps x -> x + y and needs d_k == d_v (got d_k={d_k}, d_v={d_v})")
    if generator is None:
        generator = torch.Generator(device="cpu").manual_seed(0)
    state = {}
    for name, (rows, cols) in zip(WEIGHTS, _weight_shapes(d_k, d_v)):
        w = _initial_accumulator(_initial_weights(batch, heads, rows, cols, generator), state, name, dtype, device)
        state[name] = w.to(dtype=dtype, device=device)
        if MOMENTUM_BUFFERS:
            state["S_" + name] = torch.zeros(batch, heads, rows, cols, dtype=dtype, device=device)
    for name, shape in _state_shapes(d_k, d_v).items():
        if name not in state:
            state[name] = torch.zeros(batch, heads, *shape, dtype=dtype, device=device)
    return state
