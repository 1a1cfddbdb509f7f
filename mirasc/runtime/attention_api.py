"""The nonparametric memories' op (a runtime piece: copied into every emitted module of a nonparametric memory by
mirasc.codegen.attention_backend; docs/module-api.md): apply, the route a call takes and launch_plan. A module with
Triton kernels takes _attention_backend and _triton_apply from mirasc.runtime.attention_host (their Triton read,
_triton_read, from attention_host or stickbreaking_host); a module without carries the ones below, which refuse
backend='triton' with the reason. The spec's choices are the module's (mirasc.runtime.attention_spec)."""

import torch

from .attention_spec import CAUSAL, DEFAULT_CHUNK, GATES, HEAD_MIX, HOPS, NO_TRITON_REASON
from .inputs import _check_dtypes, _check_gates, _check_types, _offsets
from .launch_plan import _plan
from .nonparametric import PARAM_NAMES, _chunked, _coefficients, _cross, _recurrent, init_params, init_state


def apply(q, k, v, gates=None, *, state=None, params=None, backend="auto", algorithm="auto", chunk_size=None,
          cu_seqlens=None):
    """The Nadaraya–Watson read: returns (o [B, Tq, H, Dv], final_state).

    q [B, Tq, H, Dk]; k [B, Tk, H, Dk]; v [B, Tk, H, Dv] (Tk = Tq unless causal=false). gates: {name: [B, T, H]}
    for each name in GATES (a decaying memory: "alpha", the forget gate in (0, 1]). `params` are the
    learned kernel parameters (init_params() gives the defaults; required when the spec has any).
    cu_seqlens: optional [N + 1] offsets of N causal sequences packed in one row (B = 1); each reads
    only its own tokens and returns its own cache (the final state is then a list of N caches)."""
    _check_types(q, k, v, gates)
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', not {backend!r}")
    if algorithm not in ("auto", "recurrent", "chunked"):
        raise ValueError(f"algorithm must be 'auto', 'recurrent' or 'chunked', not {algorithm!r}")
    gates = gates or {}
    _check_dtypes(q, k, v, gates)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] \
            or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3] or (CAUSAL and k.shape[1] != q.shape[1]):
        raise ValueError(f"expected q [B, T, H, Dk], k [B, T', H, Dk], v [B, T', H, Dv] (T' = T when causal); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    if HOPS > 1 and Dk != Dv:
        raise ValueError(f"hops > 1 refines the query with the read (u + o): needs Dk == Dv, got {Dk}, {Dv}")
    if HEAD_MIX > 1 and H % HEAD_MIX:
        raise ValueError(f"head_mix={HEAD_MIX} needs the number of heads to be a multiple of it, got {H}")
    _check_gates(gates, q, Dv, GATES, {})  # by name, and each [B, T, H]
    path = _route(Dk, Dv, q.dtype, q.device, backend, algorithm, chunk_size)[0]  # (from an empty cache)
    compute = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    if params is None:
        params = init_params(H, Dk, Dv, dtype=compute, device=q.device) if PARAM_NAMES else {}
    missing = sorted(set(PARAM_NAMES) - set(params))
    if missing:
        raise ValueError(f"params is missing {missing}; init_params() gives them")
    params = {n: params[n].to(compute) for n in PARAM_NAMES}
    if cu_seqlens is not None:
        if not CAUSAL:
            raise ValueError("cu_seqlens packs causal sequences; for cross-attention call apply per pair")
        bounds = _offsets(q, cu_seqlens)
        if state is None and path == "triton":
            return _triton_apply(q, k, v, gates, params, bounds)
        runs = [apply(q[:, a:b], k[:, a:b], v[:, a:b], {n: g[:, a:b] for n, g in gates.items()},
                      state=None if state is None else state[i], params=params, backend=backend, algorithm=algorithm,
                      chunk_size=chunk_size)
                for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        return torch.cat([o for o, _ in runs], dim=1), [cache for _, cache in runs]
    block = DEFAULT_CHUNK if chunk_size is None else int(chunk_size)
    cached = state is not None and state["K"].shape[2] > 0  # (backend='auto' continues a cache on the torch path)
    if backend == "triton" or (path == "triton" and not cached):
        if cached:
            raise ValueError("the Triton path starts from an empty cache; use backend='torch' to continue one")
        return _triton_apply(q, k, v, gates, params)
    qh, kh, vh = (t.to(compute).transpose(1, 2) for t in (q, k, v))
    if not CAUSAL:
        if state is not None and state["K"].shape[2] > 0:
            raise ValueError("causal=false reads the given memory (k, v); it continues no cache")
        if qh.shape[2] == 0:  # no queries: nothing to read
            return v.new_zeros(B, 0, H, Dv), None
        return _cross(qh, kh, vh, params, block).transpose(1, 2).to(q.dtype), None
    if state is None:
        state = init_state(B, H, Dk, Dv, dtype=compute, device=q.device)
    if "valid" in state:
        raise ValueError("this cache holds padding tokens (Layer.step with a mask): continue it with Layer.step")
    state = {n: (t.to(compute) if torch.is_tensor(t) and t.is_floating_point() else t) for n, t in state.items()}
    if T == 0:  # an empty sequence leaves the cache as it was
        return v.new_zeros(B, 0, H, Dv), state
    c = _coefficients(gates, q.to(compute))
    if algorithm == "recurrent":
        o, final = _recurrent(qh, kh, vh, state, params, c)
    else:
        o, final = _chunked(qh, kh, vh, state, params, block, c)
    return o.transpose(1, 2).to(q.dtype), final


def _route(Dk, Dv, dtype, device, backend, algorithm, chunk_size):
    """The path a call from an empty cache takes (a cache is continued on torch): (backend, chunked, chunk, why) —
    backend "auto" resolved; on Triton the flash kernels' tiles whatever `algorithm` says, on torch the algorithm
    and its block of queries; why backend='auto' leaves the Triton kernels out (None where it takes them, or where the
    backend is given). Raises what the call raises for a path that does not exist. apply and launch_plan ask it."""
    backend, why = _attention_backend(backend, device)
    if backend == "triton":
        return backend, True, None, why
    chunked = algorithm != "recurrent"
    return backend, chunked, (DEFAULT_CHUNK if chunk_size is None else int(chunk_size)) if chunked else None, why


def _precision(dtype):
    """How the Triton dots multiply: fp32 inputs exactly, fp16/bf16 operands as they are (fp32 accumulation)."""
    return "ieee" if dtype in (torch.float32, torch.float64) else "bf16" if dtype == torch.bfloat16 else "fp16"


def _widths(d_k, d_v):
    return d_k, d_v


def launch_plan(d_k, d_v, *, dtype=torch.float32, device="sm_90", backend="auto", algorithm="auto", chunk_size=None):
    """What `apply` would run from an empty cache for heads of d_k x d_v, `dtype` inputs on `device`, without running
    it (docs/module-api.md, "launch_plan"): a torch device, or a GPU named by its compute capability ("sm_80",
    "sm_90", ...; none needed). Returns {"backend", "algorithm", "chunk", "precision", "kernels", "reason"} as the
    memory modules' launch_plan does; on Triton "chunk" is None (the kernels' tiles are in "kernels")."""
    return _plan(_route, _triton_kernels, _precision, _widths, d_k, d_v, dtype, device, backend, algorithm,
                 chunk_size)


def _attention_backend(backend, device):
    """backend "auto" resolved, and why it leaves the Triton kernels out: this memory has none (NO_TRITON_REASON);
    backend='triton' is refused."""
    why = f"no Triton kernel for this nonparametric memory: {NO_TRITON_REASON}"
    if backend == "triton":
        raise RuntimeError(f"{why}; use backend='torch'")
    return ("torch", why) if backend == "auto" else (backend, None)


def _triton_apply(q, k, v, gates, params, bounds=None):
    """The Triton read: this memory has none (_attention_backend refuses a call that would reach it)."""
    _attention_backend("triton", q.device)


_triton_kernels = None  # (no Triton kernel: launch_plan's route never reaches it)
