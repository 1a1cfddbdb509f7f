"""A parametric memory's op over a sequence, `_apply_memory` (a runtime piece: copied into every emitted memory module
by mirasc.codegen.torch_backend; docs/module-api.md, "apply"): the checks at its door, the state it starts from, the
coefficients, then the path `_route` picks — the torch recurrence or chunk form, or the module's Triton kernels through
`_triton_run`, one of the runs below (the chunked families, the mini-batch kernels, a chunk readout's launches, the
fused recurrent kernel alone) — and packed sequences, one call per sequence or one launch of the chunk-parallel
kernels. A plain memory's `apply` and `init_state` are its memory's; a multi-step learner (mirasc.runtime.multistep)
and a composite memory (mirasc.runtime.composite) write their own over it. One hook has its plain default here: the
preconditioned learner's `_preconditioned` (mirasc.runtime.memory_ops). The spec's choices are the module's
(mirasc.runtime.memory_spec and memory_hooks have examples)."""

import torch
import triton

from .inputs import _check_dtypes, _check_triton_device, _check_types, _extra_inputs
from .memory_hooks import _chunk_readout_triton, _chunked, _coefficients, _init_memory_state, _state_shapes
from .memory_spec import EXTRAS, HALF_IN_PLACE, PACKED, POSITIVE_WEIGHTS, RESIDUAL, WEIGHTS
from .minibatch_host import _minibatch_triton
from .momentum_host import _chunked_triton
from .packing import _packed, _packed_padded
from .recurrent_host import _on_chunk_kernels, _recurrent_triton
from .routes import _dot_precision, _route
from .token_step import _recurrent


def _packed_per_sequence(q, k, v, gates, state, params, backend, algorithm, chunk_size, cu_seqlens, extras, out):
    """Packed sequences (cu_seqlens) run one call per sequence (`_packed`)."""
    return _packed(lambda q, k, v, g, s, x: _apply_memory(q, k, v, g, state=s, params=params, backend=backend,
                                                          algorithm=algorithm, chunk_size=chunk_size, extras=x,
                                                          _out=out),
                   q, k, v, gates, state, cu_seqlens, extras)


def _packed_on_kernels(q, k, v, gates, state, params, backend, algorithm, chunk_size, cu_seqlens, extras, out):
    """Packed sequences in one launch of the chunk kernels where the call takes them, else one call per sequence."""
    if _packed_on_chunk_kernels(q, v, backend, algorithm, chunk_size):
        return _packed_padded_apply(q, k, v, gates, state, cu_seqlens, chunk_size, extras, out)
    return _packed_per_sequence(q, k, v, gates, state, params, backend, algorithm, chunk_size, cu_seqlens, extras, out)


def _packed_on_chunk_kernels(q, v, backend, algorithm, chunk_size):
    """Whether packed sequences run in one launch of the chunk or mini-batch kernels (else one call per sequence); a
    module carries it only where its Plan packs (PACKED)."""
    if q.dim() != 4 or v.dim() != 4:  # (the call per sequence refuses malformed inputs)
        return False
    backend, chunked, _, _ = _route(q.shape[-1], v.shape[-1], q.dtype, q.device, backend, algorithm, chunk_size)
    return backend == "triton" and chunked


def _packed_padded_apply(q, k, v, gates, state, cu_seqlens, chunk_size, extras=None, out=None):
    """Packed sequences in one launch of the chunk kernels, as the rows of a padded batch (`_packed_padded`): the
    padding tokens are exact no-ops (chunk kernels: k = v = 0, η = 0, α = 1; mini-batch kernels: each row's last
    chunk ends at its last real token)."""
    def rows(q, k, v, g, s, valid, x):
        return _apply_memory(q, k, v, g, state=s, backend="triton", algorithm="chunked", chunk_size=chunk_size,
                             extras=x, _pad_mask=valid, _out=out)

    def initial(n):
        one = _init_memory_state(1, q.shape[2], q.shape[3], v.shape[3], device=q.device)
        return {name: t.expand(n, *t.shape[1:]).contiguous() for name, t in one.items()}

    return _packed_padded(rows, lambda q, k, v, g, s, x: _apply_memory(q, k, v, g, state=s, extras=x, _out=out),
                          initial, q, k, v, gates, state, cu_seqlens, extras)


def _apply_memory(q, k, v, gates=None, *, state=None, params=None, backend="auto", algorithm="auto", chunk_size=None,
                  cu_seqlens=None, extras=None, _pad_mask=None, _out=None):
    """Run the memory over a sequence: returns (o [B, T, H, Dv], final_state).

    q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; gates: dict name -> [B, T, H] for the names in GATES.
    backend: "auto" | "torch" | "triton" ("auto": the chunked Triton kernels for CUDA inputs where this memory
    has them, else torch); algorithm: "auto" | "recurrent" | "chunked".
    cu_seqlens: optional [N + 1] offsets of N sequences packed in one row (B = 1); state then has N rows.
    extras: dict name -> [B, T, H, Dk] for the key inputs in EXTRAS (none unless the spec declares one).
    Every backend and algorithm computes the same function up to rounding. No scaling is applied to q.
    (Internal: _pad_mask [B, T], False marks padding tokens, made no-ops by η = 0 and α = 1; _out, the output's dtype,
    the inputs' by default.)"""
    _check_types(q, k, v, gates, extras)
    if cu_seqlens is not None:
        return _packed_apply(q, k, v, gates, state, params, backend, algorithm, chunk_size, cu_seqlens, extras, _out)
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', not {backend!r}")
    if params:
        raise ValueError(f"this memory takes no params, got {sorted(params)}")
    if algorithm not in ("auto", "recurrent", "chunked"):
        raise ValueError(f"algorithm must be 'auto', 'recurrent' or 'chunked', not {algorithm!r}")
    _check_dtypes(q, k, v, gates, extras)
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"expected q, k [B, T, H, Dk] and v [B, T, H, Dv]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    backend, chunked, chunk, _ = _route(Dk, Dv, q.dtype, q.device, backend, algorithm, chunk_size)
    if backend == "triton":
        _check_triton_device(q, triton)
    compute = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    state = _initial_state(state, B, H, Dk, Dv, compute, q.device)
    if T == 0:  # an empty sequence leaves the state as it was
        return v.new_zeros(B, 0, H, Dv), state
    # [B, H, T, D] in the compute dtype, contiguous: one copy each, which the chunk forms and kernels then view
    if HALF_IN_PLACE and backend == "triton" and chunked and q.dtype in (torch.float16, torch.bfloat16):
        # views: the chunk op reads 16-bit [B, T, H, D] in place (docs/semantics.md "Numerics")
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    else:
        qh, kh, vh = (t.transpose(1, 2).to(compute, memory_format=torch.contiguous_format) for t in (q, k, v))
    qc = qh.transpose(1, 2)  # (a view, [B, T, H, Dk])
    # every coefficient in the compute dtype: a decay near 1 (a gate, a per-head constant) keeps its precision
    c = _coefficients(gates, qc, Dv)
    c.update(_extra_inputs(extras, qc, EXTRAS))  # read by the gradient and the chunk forms as c[name]
    c, state, stat = _preconditioned(c, kh, state, compute, _pad_mask)
    if _pad_mask is not None:
        keep = _pad_mask.to(q.device)[:, None, :]
        c["eta"] = c["eta"] * keep
        if "alpha" in c:
            c["alpha"] = torch.where(keep if c["alpha"].dim() == 3 else keep[..., None], c["alpha"],
                                     torch.ones_like(c["alpha"]))
    if backend == "triton":
        o, final = _triton_run(qh, kh, vh, c, state, chunked, chunk, _dot_precision(q.dtype), _pad_mask)
    elif chunked:
        o, final = _chunked(qh, kh, vh, c, state, chunk)
    else:
        o, final = _recurrent(qh, kh, vh, c, state)
    if stat is not None:  # a preconditioner's statistic a_T is part of the memory's state
        final = {**final, "A": stat}
    return o.transpose(1, 2).to(_out or q.dtype), final


apply = _apply_memory  # (a plain memory's op is its memory's; mirasc.runtime.multistep and composite write their own)
init_state = _init_memory_state  # (likewise its initial state)


def init_params(heads, d_k, d_v, *, dtype=torch.float32, device="cpu", generator=None, layer_idx=0):
    """A parametric memory's read has no learned parameters of its own (its weights are the state)."""
    return {}


def _initial_state(state, B, H, Dk, Dv, compute, device):
    """The state a call starts from: init_state()'s when None, else the given one checked key by key and shape by
    shape, in the compute dtype."""
    if state is None:  # (which refuses the widths a residual memory cannot take)
        return _init_memory_state(B, H, Dk, Dv, dtype=compute, device=device)
    expected = _state_shapes(Dk, Dv)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"state is missing {missing}; init_state() gives the expected keys")
    for name, shape in expected.items():
        if tuple(state[name].shape) != (B, H, *shape):
            raise ValueError(f"state[{name!r}] has shape {tuple(state[name].shape)}, expected {[B, H, *shape]}")
    state = {name: state[name].to(compute) for name in expected}
    if POSITIVE_WEIGHTS and any(bool((state[n] <= 0).any()) for n in WEIGHTS):
        raise ValueError("this retention keeps the weights positive (it works with log W): the initial weights must "
                         "be > 0, e.g. from init_state()")
    if RESIDUAL and Dk != Dv:
        raise ValueError(f"memory residual=true needs Dk == Dv (got Dk={Dk}, Dv={Dv})")
    return state


def _preconditioned(c, k, state, compute, pad_mask=None):
    """The coefficients and state the memory runs with, and a statistic to return in the final state: here, without
    a preconditioner, c and state as they are and none (a preconditioned learner's: mirasc.runtime.memory_ops)."""
    return c, state, None


def _run_chunk_kernels(q, k, v, c, state, chunked, chunk, prec, pad_mask):
    """backend='triton' for the chunked families: the chunk kernels, or the fused recurrent kernel. q, k, v [B, H, T,
    D]; c, state as _apply_memory passes them; pad_mask [B, T] where padded rows run (None otherwise)."""
    if not chunked:
        return _recurrent_triton(q, k, v, c, state)
    if pad_mask is not None:  # no gate values make a momentum token a no-op (W += S): the chunk kernels end rows here
        c = {**c, "valid": pad_mask.to(q.device)[:, None, :]}
    return _on_chunk_kernels(_chunked_triton, q, k, v, c, state, chunk, prec=prec)


def _run_minibatch_kernels(q, k, v, c, state, chunked, chunk, prec, pad_mask):
    """backend='triton' for the mini-batch kernels (any mini-batch: each chunk is padded to a tile of _mb_block(chunk)
    rows; a padded row's last chunk ends at its last real token), or the fused recurrent kernel."""
    if not chunked:
        return _recurrent_triton(q, k, v, c, state)
    lengths = None if pad_mask is None else pad_mask.to(q.device).sum(-1)
    return _on_chunk_kernels(_minibatch_triton, q, k, v, c, state, chunk, prec=prec, lengths=lengths)


def _run_chunk_readout(q, k, v, c, state, chunked, chunk, prec, pad_mask):
    """backend='triton' for readout=chunk (docs/semantics.md: chunk readouts): one launch of the kernels per chunk
    (_route refuses the recurrent algorithm: there is no fused recurrent kernel)."""
    return _on_chunk_kernels(_chunk_readout_triton, q, k, v, c, state, chunk, prec=prec)


def _run_recurrent_kernel(q, k, v, c, state, chunked, chunk, prec, pad_mask):
    """backend='triton' where the fused recurrent kernel is the only one (_route refuses algorithm='chunked')."""
    return _recurrent_triton(q, k, v, c, state)


_triton_run = _run_chunk_kernels  # (the module's own names its family's run above, or None without Triton kernels)
_packed_apply = _packed_on_kernels if PACKED else _packed_per_sequence  # (a module names its own: torch_pieces)
