"""The functions of a parametric memory that the runtime pieces call by name, with an example memory: a linear memory
W [B, H, Dv, Dk] with the l2 bias, read as it is, learned by gd without a retention. Every emitted module defines its
own, printed from its spec's IR, learner and retention (mirasc.codegen.torch_backend); this module only lets the pieces
that call them (mirasc.runtime.token_step, minibatch_chunks, composite, chunk_readouts, layer, multistep, memory_api)
be imported, and unit-tested against token recurrences with these examples in place."""

import torch

from .chunk_forms import _delta_chunks
from .memory_spec import WEIGHTS


def _memory_forward(layer, x):
    """y = M(x) with layer(i, h) applying weight i to h: the linear memory's read W x."""
    return layer(0, x)


def _memory_grad(W, k, v, c):
    """Gradient factors at weights W: for each weight i, (δ_i, x_i) with ∇_{W_i} ℓ = δ_i x_iᵀ per token; the l2 bias
    ½‖W k − v‖² has δ = W k − v, x = k."""
    return ((k @ W[0].transpose(-1, -2) - v, k),)


def _readout(acc):
    """The weights a retention's accumulator reads as (a nonlinear map, so that a per-token readout is exercised)."""
    return acc / (1 + acc.abs())


def _lq_norm(acc):
    """A chunk readout's normaliser of an accumulator, [B, H, 1, 1] (here its Frobenius norm, bounded below)."""
    return acc.flatten(-2).norm(dim=-1)[..., None, None].clamp_min(1e-6)


def _lag_step(W, S, q1, k1, v1, g1):
    """A chunk readout's lag token: the chunk's first token alone, one full step from W_{s-1} (here a decayed gradient
    step); returns (o_s, W_s, S_s)."""
    delta, x = _memory_grad(W, k1, v1, g1)[0]
    W = [g1["alpha"] * W[0] - g1["eta"] * (delta.transpose(-1, -2) @ x)]
    return q1 @ W[0].transpose(-1, -2), W, S


def _weight_shapes(d_k, d_v):
    """[rows, cols] of each weight in WEIGHTS: here W [d_v, d_k]."""
    return [(d_v, d_k)]


def _accumulators(W, state):
    """A retention's accumulators at the start of a recurrence (None where it keeps none apart from W): here the
    state's A_<weight>, as a retention that keeps them apart reads them."""
    return [state["A_" + n] for n in WEIGHTS] if "A_" + WEIGHTS[0] in state else None


def _initial_accumulator(w, state, name, dtype, device):
    """The weights a drawn initial value `w` reads as (a module prints its retention's: mirasc.codegen.
    torch_retention): here a retention that keeps its accumulator, stored as A_<name>, and reads it through
    _readout."""
    state["A_" + name] = w.to(dtype=dtype, device=device)
    return _readout(w)


def _per_head_coefficients(H, device):
    """The coefficients constant over tokens with one value per head h = 0..H-1 (the spec's per-head constants, each
    [H] in float64): here an Omega-rule token weight γ_h = 1 − 2^-(h+1)."""
    h = torch.arange(H, dtype=torch.float64, device=device)
    return {"gamma": 1 - 2.0 ** -(h + 1)}


def _start(state):
    """The recurrence's carry: weights W, retention accumulators Y, momentum S, the Omega window."""
    W = [state[n] for n in WEIGHTS]
    # the accumulators where the retention keeps them apart from W (a mapped or chunk readout), else None: W itself
    Y = [state["A_" + n] for n in WEIGHTS] if "A_W" in state else None
    S = [state["S_" + n] for n in WEIGHTS] if "S_W" in state else None
    win = {n[len("win_"):]: x for n, x in state.items() if n.startswith("win_")} or None
    return {"W": W, "Y": Y, "S": S, "anchor": W, "t": 0, "win": win}


def _finish(carry):
    """The state a call returns: the weights, the accumulators, the momentum where there is one, the Omega window
    where there is one."""
    out = {n: w for n, w in zip(WEIGHTS, carry["W"])}
    if carry["Y"] is not None:
        out.update({"A_" + n: y for n, y in zip(WEIGHTS, carry["Y"])})
    if carry["S"] is not None:
        out.update({"S_" + n: s for n, s in zip(WEIGHTS, carry["S"])})
    if carry.get("win") is not None:
        out.update({"win_" + n: x for n, x in carry["win"].items()})
    return out


def _state_shapes(d_k, d_v):
    """Every state key with the [rows, cols] of its tensor (after the [B, H] axes): here W [d_v, d_k]."""
    return {"W": (d_v, d_k)}


def _init_memory_state(batch, heads, d_k, d_v, *, dtype=torch.float32, device="cpu", generator=None):
    """The memory's initial state: here W = 0."""
    return {"W": torch.zeros(batch, heads, d_v, d_k, dtype=dtype, device=device)}


def _apply_memory(q, k, v, gates=None, *, state=None, params=None, backend="auto", algorithm="auto", chunk_size=None,
                  cu_seqlens=None, extras=None, _out=None):
    """The memory over a sequence, [B, T, H, D] in and out (a module's: mirasc.runtime.memory_api): here the l2 bias's
    delta rule with η = gates["eta"], W_t = W_{t-1} − η_t (W_{t-1} k_t − v_t) k_tᵀ, o_t = W_t q_t, by the token."""
    B, T, H, Dk = q.shape
    W = state["W"] if state is not None else _init_memory_state(B, H, Dk, v.shape[-1], dtype=q.dtype)["W"]
    outs = []
    for t in range(T):
        k_t, v_t = k[:, t, :, :, None], v[:, t, :, :, None]
        W = W - gates["eta"][:, t, :, None, None] * ((W @ k_t - v_t) @ k_t.transpose(-1, -2))
        outs.append((W @ q[:, t, :, :, None])[..., 0])
    return torch.stack(outs, 1).to(_out or q.dtype), {"W": W}


def _chunked(q, k, v, c, state, chunk):
    """The chunked algorithm on [B, H, T, D] inputs (a module's is its chunk form, mirasc.runtime.chunk_forms and
    minibatch_chunks): here the delta rule's, for _apply_memory's memory with η = c["eta"]."""
    o, W = _delta_chunks(q, k, v, c["eta"], None, state["W"], chunk, implicit=False, pre_decay=False)
    return o, {"W": W}


def _chunk_readout_triton(q, k, v, c, state, chunk, prec="ieee"):
    """readout=chunk on the Triton kernels (a module with a chunk readout has one: its readout's chunk function over
    its family's kernels, mirasc.runtime.chunk_readouts): here the example memory's chunk form, since it reads its
    weights as they are and so reads the same at chunk boundaries as at every token."""
    return _chunked(q, k, v, c, state, chunk)


def _coefficients(gates, like, d_v=None):
    """Every coefficient as [B, H, T]: here the gates as given (the example memory reads η only)."""
    return {n: g.transpose(1, 2) for n, g in (gates or {}).items()}


def _learn(grads, S, c):
    """The learner, from the gradients to the updates (a module prints its spec's: mirasc.codegen.torch_learner): here
    gd, U = −η g, with no momentum buffers."""
    return [-c["eta"] * grad for grad in grads], S


def _before_gradient(W, carry, c, first):
    """The weights a token's gradient and step start from (a module prints its retention's: mirasc.codegen.
    torch_retention): here the weights as they are."""
    return W


def _retain(W, Y, updates, c, carry, first):
    """The retention, from the updates to the next weights and accumulators (a module prints its spec's): here none,
    W_t = W_{t−1} + U_t."""
    return [w + update for w, update in zip(W, updates)], Y


def init_state(batch, heads, d_k, d_v, *, dtype=torch.float32, device="cpu", generator=None):
    """The module's default initial state: the memory's."""
    return _init_memory_state(batch, heads, d_k, d_v, dtype=dtype, device=device, generator=generator)


def init_params(heads, d_k, d_v, *, dtype=torch.float32, device="cpu", generator=None, layer_idx=0):
    """The read's learned parameters: none for a parametric memory."""
    return {}


def apply(q, k, v, gates=None, *, state=None, params=None, backend="auto", algorithm="auto", chunk_size=None,
          cu_seqlens=None, extras=None):
    """The module's op: here _apply_memory."""
    return _apply_memory(q, k, v, gates, state=state, backend=backend, algorithm=algorithm, chunk_size=chunk_size,
                         cu_seqlens=cu_seqlens)


def launch_plan(d_k, d_v, *, dtype=torch.float32, device="sm_90", backend="auto", algorithm="auto", chunk_size=None):
    """What apply runs (docs/module-api.md, "launch_plan"): here the token loop in torch."""
    return {"backend": "torch", "algorithm": "recurrent", "chunk": None, "precision": None, "kernels": {},
            "reason": "the example memory has no Triton kernel"}
