"""The multi-step learner (docs/semantics.md, "Multi-step learners"; a runtime piece, copied into the emitted modules of
such specs by mirasc.codegen.torch_backend): STEPS (key, value) pairs per token run as a sequence of sub-steps of the
memory, _apply_memory, which reads the query after each token's last sub-step. The spec's choices and the memory's
function are the emitted module's (mirasc.runtime.memory_spec and memory_hooks have examples)."""

import torch

from .inputs import _check_dtypes, _check_types, _extra_inputs, _offsets
from .memory_hooks import _apply_memory, _coefficients
from .memory_spec import EXTRAS, GATE_CHANNELS, GATES, STEPS
from .token_step import _read_tokens


def _interleave(x):
    """[B, T, H, STEPS, ...] -> [B, T·STEPS, H, ...]: sub-step j of token t goes to position t·STEPS + j."""
    B, T, H = x.shape[:3]
    return x.movedim(3, 2).reshape(B, T * STEPS, H, *x.shape[4:])


def _repeat(x):
    """A per-token input [B, T, H, ...] for every sub-step: [B, T·STEPS, H, ...]."""
    return _interleave(x.unsqueeze(3).expand(*x.shape[:3], STEPS, *x.shape[3:]))


def substeps(q, k, v, gates=None, extras=None):
    """The token inputs as the sequence of sub-steps the memory runs (docs/semantics.md, "Multi-step learners").

    q [B, T, H, Dk]; k [B, T, H, STEPS, Dk]; v [B, T, H, STEPS, Dv]; gates: η [B, T, H, STEPS] (channel-wise
    [B, T, H, STEPS, D]), the others per token as usual; extras [B, T, H, STEPS, Dk]. Returns (q, k, v, gates,
    extras) over T·STEPS sub-steps: q is read after each token's last sub-step only (zeros at the others, whose
    outputs are dropped), per-token gates are repeated (_coefficients keeps α at the first sub-step only)."""
    if q.dim() != 4 or k.dim() != 5 or v.dim() != 5 or k.shape[:3] != q.shape[:3] or v.shape[:3] != q.shape[:3] \
            or k.shape[3] != STEPS or v.shape[3] != STEPS or k.shape[4] != q.shape[3]:
        raise ValueError(f"expected q [B, T, H, Dk], k [B, T, H, STEPS={STEPS}, Dk], v [B, T, H, STEPS={STEPS}, Dv] "
                         f"(a key and a value per inner step); got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    B, T, H, Dk = q.shape
    read = torch.zeros(B, T, H, STEPS, Dk, dtype=q.dtype, device=q.device)
    q_sub = _interleave(torch.cat([read[:, :, :, 1:], q.unsqueeze(3)], dim=3))
    gates_sub = {}
    for name, g in (gates or {}).items():
        if name not in GATES:
            raise ValueError(f"unknown gate {name!r}; this op takes {', '.join(GATES) or 'no gates'}")
        side = GATE_CHANNELS.get(name)
        per_step = name == "eta"  # one learning rate per inner step; the others once per token
        width = [] if side is None else [Dk if side == "k" else v.shape[4]]
        want = (B, T, H, *([STEPS] if per_step else []), *width)
        if tuple(g.shape) != want:
            raise ValueError(f"gate {name!r} has shape {tuple(g.shape)}, expected {list(want)}"
                             + (" (one per inner step)" if per_step else ""))
        gates_sub[name] = _interleave(g) if per_step else _repeat(g)
    extras_sub = {}
    for name, x in (extras or {}).items():
        if tuple(x.shape) != (B, T, H, STEPS, Dk):
            raise ValueError(f"extra input {name!r} has shape {tuple(x.shape)}, expected one per inner step: "
                             f"{[B, T, H, STEPS, Dk]}")
        extras_sub[name] = _interleave(x)
    return q_sub, _interleave(k), _interleave(v), gates_sub, extras_sub


def apply(q, k, v, gates=None, *, state=None, params=None, backend="auto", algorithm="auto", chunk_size=None,
          cu_seqlens=None, extras=None):
    """Run the memory over a sequence: returns (o [B, T, H, Dv], final_state).

    q: [B, T, H, Dk]; k: [B, T, H, STEPS, Dk] and v: [B, T, H, STEPS, Dv], the STEPS (key, value) pairs of each
    token; gates: dict name -> [B, T, H] for the names in GATES, except η: [B, T, H, STEPS], one per inner step
    (channel-wise gates add their channel axis last); extras: dict name -> [B, T, H, STEPS, Dk].
    Token t starts from the state token t-1 left, applies the retention (α_t) once and takes STEPS gradient
    steps, one per pair, each at the state the previous step left; o_t reads the state after the last.
    backend, algorithm: as for every memory; the algorithms run over the T·STEPS sub-steps (chunk_size counts
    sub-steps). cu_seqlens: optional [N + 1] token offsets of N sequences packed in one row (B = 1).
    Every backend and algorithm computes the same function up to rounding. No scaling is applied to q."""
    _check_types(q, k, v, gates, extras)
    _check_dtypes(q, k, v, gates, extras)
    q_sub, k_sub, v_sub, gates_sub, extras_sub = substeps(q, k, v, gates, extras)
    if cu_seqlens is not None:
        cu_seqlens = [bound * STEPS for bound in _offsets(q, cu_seqlens)]
    o, final = _apply_memory(q_sub, k_sub, v_sub, gates_sub, state=state, params=params, backend=backend,
                               algorithm=algorithm, chunk_size=chunk_size, cu_seqlens=cu_seqlens,
                               extras=extras_sub or None)
    return o[:, STEPS - 1::STEPS], final


def _layer_read(cache, q, k, v, gates, extras, read_params, keep=None):
    """Layer.step's memory read (mirasc.runtime.layer) under a multi-step learner: the token's STEPS inner steps in
    order, o_t the read after the last."""
    q, k, v, gates, extras = substeps(q, k, v, gates, extras)
    c = _coefficients(gates, q, v.shape[-1])
    if extras:
        c.update(_extra_inputs(extras, q, EXTRAS))
    carry, o_t = _read_tokens(cache["carry"], q, k, v, c, {n: p.to(q.dtype) for n, p in read_params.items()})
    return {"carry": carry}, o_t


def _substep_coefficients(out, T):
    """The coefficients of T sub-steps (T counts them here, mirasc.runtime.coefficients): the retention decays once
    per token, at its first sub-step (α = 1 at the others)."""
    if "alpha" in out:
        alpha = out["alpha"]
        first = torch.arange(T, device=alpha.device) % STEPS == 0
        out["alpha"] = torch.where(first if alpha.dim() == 3 else first[:, None], alpha, torch.ones_like(alpha))
    return out
