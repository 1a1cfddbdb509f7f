"""The composite linear memory (docs/semantics.md, "Feature maps and the normaliser"; a runtime piece, copied into
the emitted modules of specs with a feature map or the normaliser by mirasc.codegen.torch_backend): the memory,
_apply_memory, runs on the features φ(q), φ(k) of width Dφ = feature_dim(Dk), and with the normaliser on the values
[v, 1]: the last row of its W is then the normaliser z, and the read divides by it. The spec's choices below are set
by every emitted module in its header; the memory's own functions are the emitted module's
(mirasc.runtime.memory_hooks has examples)."""

import math

import torch
import torch.nn.functional as F

from .inputs import _check_dtypes, _check_types
from .memory_hooks import _apply_memory, _coefficients, _init_memory_state, _start, _state_shapes
from .token_step import _read_tokens

FEATURE = "elu1"  # the feature map φ: "identity", "elu1", "taylor" (Based) or "hedgehog"
NORMALIZE = True  # the normaliser: the read divides by z_t·φ(q_t) + NORM_EPS
NORM_EPS = 1e-6  # o_t = W_t φ(q_t) / (z_t·φ(q_t) + NORM_EPS) with the normaliser


def feature_dim(d_k):
    """Dφ: the width of φ(x) for keys of width d_k (the columns of the state)."""
    if FEATURE == "taylor":
        return 1 + d_k + d_k * (d_k + 1) // 2
    return 2 * d_k if FEATURE == "hedgehog" else d_k


def _features(x, params=None):
    """φ(x): [B, T, H, D] -> [B, T, H, Dφ], applied to queries and keys alike."""
    if FEATURE == "elu1":
        return F.elu(x) + 1  # positive features (Katharopoulos et al. 2020)
    if FEATURE == "taylor":
        # exp's second-order Taylor features (Based): φ(q)·φ(k) = 1 + q·k + (q·k)²/2. Each pair i <= j of x⊗x is
        # kept once: the squares scaled by 1/√2, the products x_i x_j (i < j) as they are (in (q·k)² they come twice)
        i, j = torch.triu_indices(x.shape[-1], x.shape[-1], offset=1, device=x.device)
        return torch.cat([torch.ones_like(x[..., :1]), x, x * x / math.sqrt(2), x[..., i] * x[..., j]], dim=-1)
    if FEATURE == "hedgehog":
        # a learned map per head (Hedgehog, Zhang et al. 2024), then one softmax over [u, −u]: positive features
        u = torch.einsum("bthd,hed->bthe", x, params["feature_U"].to(x.dtype)) + params["feature_c"].to(x.dtype)
        return torch.softmax(torch.cat([u, -u], dim=-1), dim=-1)
    return x


def init_params(heads, d_k, d_v, *, dtype=torch.float32, device="cpu", generator=None, layer_idx=0):
    """The feature map's learned parameters, per head (hedgehog's; none for the others): φ(x) = softmax([U x + c,
    −(U x + c)]) with U = I and c = 0 at the start (Hedgehog's identity initialisation)."""
    if FEATURE != "hedgehog":
        return {}
    U = torch.eye(d_k, dtype=dtype, device=device).expand(heads, d_k, d_k).clone()
    return {"feature_U": U, "feature_c": torch.zeros(heads, d_k, dtype=dtype, device=device)}


def _memory_state(state):
    """The public state as _apply_memory's: with the normaliser, W [B, H, Dv, Dφ] with z [B, H, 1, Dφ] as its
    last row."""
    return {"W": torch.cat([state["W"], state["z"]], dim=-2)} if NORMALIZE else state


def _public_state(state):
    """_apply_memory's state as the public one (the inverse of _memory_state)."""
    if not NORMALIZE:
        return state
    return {"W": state["W"][..., :-1, :].contiguous(), "z": state["W"][..., -1:, :].contiguous()}


def _public_shapes(d_k, d_v):
    """Every public state key with its shape after the [B, H] axes."""
    shapes = _state_shapes(feature_dim(d_k), d_v + int(NORMALIZE))
    if not NORMALIZE:
        return shapes
    (rows, cols), = shapes.values()
    return {"W": (rows - 1, cols), "z": (1, cols)}


def init_state(batch, heads, d_k, d_v, *, dtype=torch.float32, device="cpu", generator=None):
    """The default initial state, in feature space: W [B, H, Dv, Dφ] = 0 (Dφ = feature_dim(d_k))"""
    return _public_state(_init_memory_state(batch, heads, feature_dim(d_k), d_v + int(NORMALIZE), dtype=dtype,
                                            device=device, generator=generator))


def apply(q, k, v, gates=None, *, state=None, params=None, backend="auto", algorithm="auto", chunk_size=None,
          cu_seqlens=None):
    """Run the memory over a sequence: returns (o [B, T, H, Dv], final_state).

    q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; gates: dict name -> [B, T, H] for the names in GATES. The memory reads
    and writes the features φ(q), φ(k) (FEATURE); its state is W [B, H, Dv, Dφ] (and, with the normaliser, z
    [B, H, 1, Dφ]), Dφ = feature_dim(Dk). params: the feature map's learned parameters (default init_params(...);
    none for identity, elu1 and taylor). backend, algorithm, chunk_size, cu_seqlens: as _apply_memory's; each
    computes the same function up to rounding."""
    _check_types(q, k, v, gates)
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"expected q, k [B, T, H, Dk] and v [B, T, H, Dv]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    _check_dtypes(q, k, v, gates)
    H, Dk, Dv = q.shape[2], q.shape[3], v.shape[3]
    out_dtype = q.dtype
    compute = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    q, k, v = q.to(compute), k.to(compute), v.to(compute)  # the features and the normaliser's division too
    if params is None:  # the feature map's initial parameters (none for identity, elu1, taylor)
        params = init_params(H, Dk, Dv, dtype=compute, device=q.device)
    names = tuple(init_params(1, 1, 1))
    missing, unknown = sorted(set(names) - set(params)), sorted(set(params) - set(names))
    if missing or unknown:
        raise ValueError(f"params {'is missing ' + str(missing) if missing else 'has unknown ' + str(unknown)}; "
                         f"this memory takes {list(names) or 'none'} (init_params() gives them)")
    feature_params = dict(params)
    if state is not None:
        for name, shape in _public_shapes(Dk, Dv).items():
            if name not in state:
                raise ValueError(f"state is missing {name!r}; init_state() gives the expected keys")
            if tuple(state[name].shape[1:]) != (H, *shape):
                raise ValueError(f"state[{name!r}] has shape {tuple(state[name].shape)}, expected [B, {H}, "
                                 f"{', '.join(map(str, shape))}]")
        state = _memory_state(state)
    q, k = _features(q, feature_params), _features(k, feature_params)
    if NORMALIZE:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # the normaliser's value 1: z is W's last row
    if out_dtype != compute:  # 16-bit inputs: the memory's operands in their dtype (its dots on the tensor cores),
        q, k, v = q.to(out_dtype), k.to(out_dtype), v.to(out_dtype)  # its output in fp32 for the division below
    o, final = _apply_memory(q, k, v, gates, state=state, backend=backend, algorithm=algorithm, chunk_size=chunk_size,
                             cu_seqlens=cu_seqlens, _out=compute)
    if NORMALIZE:
        o = o[..., :-1] / (o[..., -1:] + NORM_EPS)
    return o.to(out_dtype), _public_state(final)


def _memory_widths(d_k, d_v):
    """The widths the memory reads for heads of d_k x d_v (launch_plan, mirasc.runtime.routes): the features', and
    the normaliser's row."""
    return feature_dim(d_k), d_v + int(NORMALIZE)


def _layer_cache(state):
    """A decoding cache (mirasc.runtime.layer) from the public state: the carry of the memory's state."""
    return {"carry": _start(_memory_state(state)), "conv": None}


def _layer_read(cache, q, k, v, gates, extras, read_params, keep=None):
    """Layer.step's memory read (mirasc.runtime.layer): the memory reads and writes φ(q), φ(k) (the feature map's
    parameters are the Layer's read parameters; the memory has none), with the normaliser on [v, 1], the read divided
    by its last row."""
    feature_params = {n: p.to(q.dtype) for n, p in read_params.items()}
    q, k = _features(q, feature_params), _features(k, feature_params)
    if NORMALIZE:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # the normaliser's value 1
    carry, o_t = _read_tokens(cache["carry"], q, k, v, _coefficients(gates, q, v.shape[-1]), None)
    if NORMALIZE:
        o_t = o_t[..., :-1] / (o_t[..., -1:] + NORM_EPS)
    return {"carry": carry}, o_t
