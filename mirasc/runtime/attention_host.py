"""The host side of the flash kernels of softmax memories, and what the stick-breaking read's host side shares with
it (a runtime piece: the functions an emitted attention module names are copied into it by
mirasc.codegen.attention_backend): the op's Triton path (the backend a call takes; a call from an empty cache on the
read's kernels, whose _triton_read is the flash read here and the stick-breaking one in stickbreaking_host), launch
options, the tiles a launch takes (autotuned over mirasc.runtime.flash_space on a GPU), the forward and backward
launches, and the op that wraps them. The spec's choices it reads are mirasc.runtime.attention_spec's (every emitted
module sets its own)."""

import torch
import triton

from .attention_spec import CAUSAL, DECAY, OP_ID, SINK, WINDOW
from .custom_ops import _register_op
from .flash_space import _FLASH_KERNELS, _flash_configs
from .gpu_limits import _device_smem_limit
from .inputs import _check_triton_device
from .kernels.attention import _flash_bwd_delta
from .kernels.flash import _flash_bwd_dkdv, _flash_bwd_dq, _flash_fwd
from .launch_plan import _auto_reason
from .nonparametric import _coefficients, _scale, _trim


def _attention_backend(backend, device):
    """backend "auto" resolved, and why it leaves the Triton kernels out (None where it takes them, or where the
    backend is given)."""
    if backend == "auto":
        why = _auto_reason(triton, device)
        return ("torch" if why else "triton"), why
    return backend, None


def _triton_apply(q, k, v, gates, params, bounds=None):
    """A call from an empty cache on the Triton read (_triton_read): q [B, T, H, Dk], k, v [B, T, H, D] -> (o [B, T,
    H, Dv], the cache). The cache holds the keys and values as given (views, [B, H, T, D]); the torch path reads them
    in its compute dtype when it continues from it. bounds: the offsets of causal sequences packed along time (B = 1),
    read in one launch of each kernel, each with its own cache (a list). A decaying memory's fp32 running sum of log α
    c feeds the kernels (they add c_t − c_s to the logits); only its differences within a sequence are read."""
    _check_triton_device(q, triton)
    compute = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    cumulative = None
    if DECAY is not None:
        cumulative = torch.cumsum(_coefficients(gates, q.float())["log_alpha"], dim=-1).contiguous()
    o = _triton_read(qh, kh, vh, _scale(q.shape[-1]), cumulative, params, bounds).transpose(1, 2)
    if bounds is None:
        final = {"K": kh, "V": vh, "Q": qh[:, :, :0], "start": 0}
        if cumulative is not None:
            final["log_weight"] = (cumulative[..., -1:] - cumulative).to(compute)
        return o, _trim(final) if CAUSAL else None
    kc, vc = kh.to(compute), vh.to(compute)
    caches = [{"K": kc[:, :, a:b], "V": vc[:, :, a:b], "Q": qh[:, :, :0].to(compute), "start": 0}
              for a, b in zip(bounds, bounds[1:])]
    if cumulative is not None:
        for cache, a, b in zip(caches, bounds, bounds[1:]):
            cache["log_weight"] = (cumulative[..., b - 1:b] - cumulative[..., a:b]).to(compute)
    return o, [_trim(cache) for cache in caches]


def _flash_interpreted():
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    return bool(getattr(knobs, "interpret", False))


def _dot_options(dtype):
    """The dtype-derived constants of a launch: PREC, the dots' input precision ("ieee": exact fp32 for fp32
    inputs; fp16/bf16 operands multiply exactly on tensor cores whatever it says, "tf32" is Triton's default),
    and WIDEN_: under the interpreter, whose tl.dot multiplies bf16 tiles as their raw 16-bit patterns
    (triton-lang/triton#11584), bf16 operands are widened to fp32 just before each product, which is exact (the
    product of two bf16 values fits fp32's significand; the sums stay fp32 as on the tensor cores)."""
    return {"PREC": "ieee" if dtype == torch.float32 else "tf32",
            "WIDEN_": dtype == torch.bfloat16 and _flash_interpreted()}



def _packed_offsets(bounds, device):
    """(cu, max_len) of sequences packed along time with offsets `bounds`: the int32 offsets the kernels read and
    the longest sequence's length."""
    return (torch.tensor(bounds, dtype=torch.int32, device=device),
            max(b - a for a, b in zip(bounds, bounds[1:])))


def _flash_delta(o, do):
    """δ = rowsum(dO ∘ O) [B, H, T] fp32 (contiguous), by one small kernel that reads O and dO where they are."""
    B, H, T, DV = o.shape
    delta = torch.empty(B, H, T, dtype=torch.float32, device=o.device)
    bm, bdv = 64, min(64, max(16, triton.next_power_of_2(DV)))
    _flash_bwd_delta[(triton.cdiv(T, bm), B * H)](o, do, delta, T, H, DV, o.stride(1), o.stride(2), o.stride(3),
                                                  o.stride(0), do.stride(1), do.stride(2), do.stride(3), do.stride(0),
                                                  BM=bm, BDV=bdv)
    return delta


def _flash_rows(q, cu, max_len):
    """(query/key length the kernels see, programs along (sequence,) head): with cu ([N + 1] int32 offsets of N
    causal sequences packed in the one row of q, B = 1) the longest sequence and N·H programs, whose blocks past a
    shorter sequence's end return at once."""
    B, H, T = q.shape[:3]
    return (T, B * H) if cu is None else (max_len, (cu.numel() - 1) * H)




_TUNED = {}


def _autotuned(kernel, configs):
    """kernel timed over configs once per head sizes, dtypes and decay. dq adds its row sums of dS to the
    column sums dk/dv stored in DC_ (a decaying memory's forget-gate gradient): every timed run starts from
    the saved DC_, or the launch that follows would add them once more per run."""
    restore = ["DC_"] if kernel.fn.__name__ == "_flash_bwd_dq" else None
    return triton.autotune(configs=configs, key=["DK", "DV", "DECAY_"], restore_value=restore)(kernel)


def _flash_kernel(kernel, x, DK, DV, Tq, Tk):
    """The kernel to launch for tensors like x, and its fixed tiles: on a GPU autotuned over the fitting
    configurations (first call per head sizes and dtype), elsewhere (the interpreter) one tile size, 16 rows for
    short sequences so small tests cross tiles."""
    if not x.is_cuda:
        tile = 16 if max(Tq, Tk) <= 64 else 64
        return kernel, {"BM": tile, "BN": tile}
    key = (kernel.fn.__name__, DK, DV, x.dtype, x.device.index)
    if key not in _TUNED:
        _TUNED[key] = _autotuned(kernel, _flash_launch_configs(kernel.fn.__name__, DK, DV, _device_smem_limit(x.device),
                                                               x.element_size()))
    return _TUNED[key], {}


def _flash_launch_configs(name, DK, DV, smem_limit, elt):
    """The configurations a GPU launch of kernel `name` is autotuned over: those that fit, else the smallest."""
    return _flash_configs(name, DK, DV, smem_limit, elt) or _flash_configs(name, DK, DV, None, elt)[:1]


# kernel name -> its autotuning space at a launch's arguments (read by `mirasc kernels`)
_ATTENTION_AUTOTUNE = {name: (lambda args, smem_limit, name=name: _flash_configs(
    name, args["DK"], args["DV"], smem_limit, args["Q"].element_size())) for name in _FLASH_KERNELS}


def _triton_kernels(Dk, Dv, prec, device, chunked=True, chunk=None):
    """launch_plan's kernels: each flash kernel with the configurations a GPU `device` autotunes it over."""
    elt = 4 if prec == "ieee" else 2
    return {name: _flash_launch_configs(name, Dk, Dv, _device_smem_limit(device), elt) for name in _FLASH_KERNELS}


def _head_tiles(q, v):
    return max(16, triton.next_power_of_2(q.shape[-1])), max(16, triton.next_power_of_2(v.shape[-1]))


def _strides(q, k, v, o):
    # [B, H, T, D] tensors, contiguous or views of [B, T, H, D] ones: head, time and feature strides, then batch strides
    return (q.stride(1), q.stride(2), q.stride(3), k.stride(1), k.stride(2), k.stride(3),
            v.stride(1), v.stride(2), v.stride(3), o.stride(1), o.stride(2), o.stride(3),
            q.stride(0), k.stride(0), v.stride(0), o.stride(0))


def _rows_last(t):
    """t [B, H, T, D] as the kernels read it: in place where its features are contiguous (a view of the [B, T, H, D]
    tensor a layer hands over, or a contiguous one), else copied."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _like_rows(t, width, dtype):
    """An empty [B, H, T, width] in the memory layout of t ([B, T, H, ·] underneath where t is such a view)."""
    B, H, T = t.shape[:3]
    if t.dim() == 4 and t.stride(1) < t.stride(2):  # heads inside time: [B, T, H, ·] underneath
        return torch.empty(B, T, H, width, dtype=dtype, device=t.device).transpose(1, 2)
    return torch.empty(B, H, T, width, dtype=dtype, device=t.device)


def _flash_forward(q, k, v, c, scale, cu=None, max_len=0, sink=None):
    """c: the running sum of log α [B, H, T] (fp32) of a decaying memory, or None. The dots take q's dtype.
    cu, max_len: sequences packed along T (B = 1, causal), see _flash_rows. sink: the sink logits [H], or None."""
    q, k, v = (_rows_last(t.to(q.dtype)) for t in (q, k, v))
    B, H, Tq, DK = q.shape
    Tk, DV = k.shape[2], v.shape[-1]
    t_seq, rows = _flash_rows(q, cu, max_len)
    bdk, bdv = _head_tiles(q, v)
    o = _like_rows(q, DV, q.dtype)
    lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)
    decay = c is not None
    kernel, tiles = _flash_kernel(_flash_fwd, q, DK, DV, t_seq, t_seq if cu is not None else Tk)
    kernel[lambda meta: (triton.cdiv(t_seq, meta["BM"]), rows)](  # grid: the tiles may come from the autotuner
        q, k, v, o, lse, c.contiguous() if decay else lse, lse if cu is None else cu,
        lse if sink is None else sink.float().contiguous(), scale,
        t_seq if cu is not None else Tq, t_seq if cu is not None else Tk, Tq, Tk, H, DK, DV, *_strides(q, k, v, o),
        CAUSAL_=CAUSAL, WINDOW_=WINDOW, DECAY_=decay, VARLEN_=cu is not None, SINK_=sink is not None,
        BDK=bdk, BDV=bdv, **_dot_options(q.dtype), **tiles)
    return o, lse


def _flash_backward(q, k, v, o, lse, do, c, scale, cu=None, max_len=0, sink=None):
    """-> dq, dk, dv, dc, dsink (dc: ∂L/∂c [B, H, T] fp32, or an empty tensor without a decay; dsink: ∂L/∂b [H],
    or an empty tensor without a sink). The sink needs nothing in the kernels: the forward's logsumexp includes
    it, so P = exp(s − lse) is right, and its own gradient is −Σ_t P_sink,t δ_t with P_sink,t = exp(b − lse_t)
    (its value is 0, so dP_sink = 0)."""
    k_dtype, v_dtype = k.dtype, v.dtype
    q, k, v = (_rows_last(t.to(q.dtype)) for t in (q, k, v))
    do = _rows_last(do.to(q.dtype))  # read where it is (the kernels take its own strides) unless features are strided
    B, H, Tq, DK = q.shape
    Tk, DV = k.shape[2], v.shape[-1]
    bdk, bdv = _head_tiles(q, v)
    delta = _flash_delta(o, do)
    # each gradient written once by its kernel, in its input's dtype and layout (no casts or copies after)
    dq, dk, dv = _like_rows(q, DK, q.dtype), _like_rows(k, DK, k_dtype), _like_rows(v, DV, v_dtype)
    decay = c is not None
    c = c.contiguous() if decay else lse  # never read without a decay
    dc = torch.empty(k.shape[:3] if decay else (0,), dtype=torch.float32, device=q.device)
    strides = _strides(q, k, v, do)
    t_seq, rows = _flash_rows(q, cu, max_len)
    tq, tk = (t_seq, t_seq) if cu is not None else (Tq, Tk)  # the lengths the kernels see
    varlen, cu = cu is not None, (lse if cu is None else cu)  # (cu is never read without VARLEN_)
    kernel, tiles = _flash_kernel(_flash_bwd_dkdv, q, DK, DV, tq, tk)
    kernel[lambda meta: (triton.cdiv(tk, meta["BN"]), rows)](
        q, k, v, do, lse, delta, dk, dv, c, dc if decay else lse, cu, scale, tq, tk, Tq, Tk, H, DK, DV, *strides,
        CAUSAL_=CAUSAL, WINDOW_=WINDOW, DECAY_=decay, VARLEN_=varlen, BDK=bdk, BDV=bdv,
        **_dot_options(q.dtype), **tiles)
    kernel, tiles = _flash_kernel(_flash_bwd_dq, q, DK, DV, tq, tk)
    kernel[lambda meta: (triton.cdiv(tq, meta["BM"]), rows)](
        q, k, v, do, lse, delta, dq, c, dc if decay else lse, cu, scale, tq, tk, Tq, Tk, H, DK, DV, *strides,
        CAUSAL_=CAUSAL, WINDOW_=WINDOW, DECAY_=decay, VARLEN_=varlen, BDK=bdk, BDV=bdv,
        **_dot_options(q.dtype), **tiles)
    dsink = torch.empty((0,), dtype=torch.float32, device=q.device)
    if sink is not None:
        dsink = -(torch.exp(sink.float()[None, :, None] - lse) * delta).sum((0, 2))
    return dq, dk, dv, dc, dsink


# torch.compile: the kernel is a registered custom op with a fake (shape-only) implementation, so
# compiled graphs hold it without a graph break. The op name is derived from the spec text, so the
# same spec loaded twice in one process shares the registration.
def _register_ops():
    if triton is None:
        return None

    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor | None,
            scale: float, cu: torch.Tensor | None, max_len: int,
            sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return _flash_forward(q, k, v, c, scale, cu, max_len, sink)

    def fwd_fake(q, k, v, c, scale, cu, max_len, sink):
        return q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3], dtype=torch.float32)

    def bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
            do: torch.Tensor, c: torch.Tensor | None, scale: float, cu: torch.Tensor | None, max_len: int,
            sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return _flash_backward(q, k, v, o, lse, do, c, scale, cu, max_len, sink)

    def bwd_fake(q, k, v, o, lse, do, c, scale, cu, max_len, sink):
        dc = q.new_empty(k.shape[:3] if c is not None else (0,), dtype=torch.float32)
        dsink = q.new_empty(sink.shape if sink is not None else (0,), dtype=torch.float32)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dc, dsink

    def setup_context(ctx, inputs, output):
        q, k, v, c, scale, cu, max_len, sink = inputs
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse, c, cu, sink)
        ctx.scale, ctx.max_len = scale, max_len

    def backward(ctx, bwd, do, dlse):
        q, k, v, o, lse, c, cu, sink = ctx.saved_tensors
        dq, dk, dv, dc, dsink = bwd(q, k, v, o, lse, do, c, ctx.scale, cu, ctx.max_len, sink)
        return (dq, dk, dv, (dc if c is not None else None), None, None, None,
                (dsink.to(sink.dtype) if sink is not None else None))

    return _register_op("flash", OP_ID, fwd, fwd_fake, bwd, bwd_fake, setup_context, backward)


_FLASH_OP = _register_ops()


def _flash_attention(q, k, v, scale, c=None, bounds=None, sink=None):
    """q [B, H, Tq, Dk], k [B, H, Tk, Dk], v [B, H, Tk, Dv] -> o [B, H, Tq, Dv] (input dtype); c [B, H, T]: the
    running sum of log α of a decaying memory (fp32), or None. bounds: the offsets of causal sequences packed
    along T (B = 1), read in one launch per kernel. sink: the attention sink's logits [H], or None."""
    if _FLASH_OP is None:
        raise RuntimeError("backend='triton' needs the triton package (and torch.library.custom_op)")
    if bounds is None:
        return _FLASH_OP(q, k, v, c, float(scale), None, 0, sink)[0]
    return _FLASH_OP(q, k, v, c, float(scale), *_packed_offsets(bounds, q.device), sink)[0]


def _triton_read(q, k, v, scale, c, params, bounds=None):
    """The Triton read of a softmax memory, [B, H, T, D] in and out: the flash kernels, with the attention sink's
    logits where the spec has one."""
    return _flash_attention(q, k, v, scale, c, bounds, params["sink"] if SINK else None)
