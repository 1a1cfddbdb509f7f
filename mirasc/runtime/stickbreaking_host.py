"""The host side of the stick-breaking read's flash kernels (a runtime piece: copied into the emitted stick-breaking
attention modules by mirasc.codegen.attention_backend, after mirasc.runtime.attention_host's shared helpers): its
schedule (one configuration per GPU, not autotuned), the forward and backward launches and the op that wraps them.
The spec's choices it reads are mirasc.runtime.attention_spec's (every emitted module sets its own)."""

import torch
import triton

from .attention_host import _dot_options, _flash_delta, _flash_rows, _packed_offsets
from .attention_spec import ATTEND_CURRENT, OP_ID, REMAINDER, WINDOW
from .custom_ops import _register_op
from .gpu_limits import _device_smem_limit
from .kernels.stickbreaking import _sb_bwd_dkdv, _sb_bwd_dq, _sb_fwd

# ---- schedule: the tiles a GPU launches (never what is computed). Not autotuned: _sb_bwd_dkdv resumes from
# sums _sb_bwd_dq stored per key tile, so the two must share BN, and those sums take T/BN floats per row and head
# twice: a larger BN halves that memory. Chosen from `mirasc kernels` compiles with the launch's specialization
# (registers / spill B), 16-bit inputs, 8 warps:
# - forward: 64 x 32 (sm_90 D = 128: 151 / 0); 32 x 32 at D = 256 (123 / 0);
# - dq and dk/dv on a GPU with ≥ 200 KB of shared memory per block (sm_90, sm_100) at D ≤ 128: 32 x 64 (177 / 0 and
#   230 / 0), snapshots of T/64 floats; elsewhere dq 64 x 32 and dk/dv 32 x 32 (sm_80 D = 128: 237 / 0 and 189 / 0;
#   32 x 64 spilled 320 B in dk/dv there), snapshots of T/32 floats; at D = 256 dq 32 x 32 (183 / 0) and dk/dv
#   16 x 32 (193 / 0; 32 x 32 spilled 40 B on sm_90, 8 B on sm_80).
# fp32 inputs (exact dots on the FMA units, as the softmax flash kernels' fp32 menu): 16 x 16, 4 warps, and 8 for
# dk/dv, whose transposed fp32 tiles go to the local stack (numbers in benchmarks/RESULTS.md), as in the softmax
# dk/dv kernel.
_SB_KERNELS = ("_sb_fwd", "_sb_bwd_dq", "_sb_bwd_dkdv")


def _sb_config(name, elt, DK, DV, smem_limit):
    """(BM, BN, warps, stages) of kernel `name` on a GPU with smem_limit bytes of shared memory per block, for
    operands of elt bytes and head sizes DK, DV."""
    if elt == 4:
        return 16, 16, (8 if name == "_sb_bwd_dkdv" else 4), 2
    wide = max(DK, DV) > 128
    if name == "_sb_fwd":
        return (32 if wide else 64), 32, 8, 2
    if smem_limit >= 200 * 1024 and not wide:
        return 32, 64, 8, 2
    if wide and name == "_sb_bwd_dkdv":
        return 16, 32, 8, 2
    return (32 if name == "_sb_bwd_dkdv" or wide else 64), 32, 8, 2


def _sb_space(name, args, smem_limit):
    """The configuration a GPU with smem_limit bytes per block launches; smem_limit None: those of every GPU."""
    limits = (smem_limit,) if smem_limit is not None else (0, 232448)
    found = dict.fromkeys(_sb_config(name, args["Q"].element_size(), args["DK"], args["DV"], lim) for lim in limits)
    return [triton.Config({"BM": BM, "BN": BN}, num_warps=w, num_stages=st) for BM, BN, w, st in found]


# kernel name -> its space at a launch's arguments (read by `mirasc kernels`)
_STICKBREAKING_AUTOTUNE = {name: (lambda args, smem_limit, name=name: _sb_space(name, args, smem_limit))
                           for name in _SB_KERNELS}


def _triton_kernels(Dk, Dv, prec, device, chunked=True, chunk=None):
    """launch_plan's kernels: each stick-breaking kernel with the configuration a GPU `device` launches."""
    elt, limit = 4 if prec == "ieee" else 2, _device_smem_limit(device)
    return {name: [dict(zip(("BM", "BN", "num_warps", "num_stages"), _sb_config(name, elt, Dk, Dv, limit)))]
            for name in _SB_KERNELS}


def _sb_launch_options(x, name, T, DK, DV):
    """Tiles and launch options: the GPU schedule above; under the interpreter 16 rows for short sequences (so
    small tests cross tiles), 32 otherwise."""
    if not x.is_cuda:
        tile = 16 if T <= 64 else 32
        return {"BM": tile, "BN": tile}
    BM, BN, warps, stages = _sb_config(name, x.element_size(), DK, DV, _device_smem_limit(x.device))
    return {"BM": BM, "BN": BN, "num_warps": warps, "num_stages": stages}


def _sb_forward(q, k, v, scale, cu=None, max_len=0):
    """q, k [B, H, T, Dk], v [B, H, T, Dv] -> o [B, H, T, Dv], r [B, H, T], both fp32; cu: None, or the int32
    offsets of sequences packed along T (B = 1), max_len the longest one's length. o stays fp32 because the
    backward's δ_t = dO_t·o_t must be the sum of the kernel's own Σ_s g_ts: ∂L/∂log(1 − β_tl) is δ_t minus a suffix
    of those terms, and for the oldest keys the two nearly cancel. For the same reason g takes w rounded as the
    forward's dot took it (measured at bf16, T = 37, D = 16: dq 4.4e-2 off float64 with δ from the bf16-rounded o;
    7.0e-3 with the fp32 o and the rounded w in g; fp16 3.6e-4)."""
    q, k, v = (t.to(q.dtype).contiguous() for t in (q, k, v))
    B, H, T, DK = q.shape
    DV = v.shape[-1]
    bdk, bdv = max(16, triton.next_power_of_2(DK)), max(16, triton.next_power_of_2(DV))
    o = torch.empty(B, H, T, DV, dtype=torch.float32, device=q.device)
    rem = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    opts = _sb_launch_options(q, "_sb_fwd", T if cu is None else max_len, DK, DV)
    t_seq, rows = _flash_rows(q, cu, max_len)
    _sb_fwd[(triton.cdiv(t_seq, opts["BM"]), rows)](
        q, k, v, o, rem, rem if cu is None else cu, scale, t_seq, T, H, DK, DV,
        q.stride(1), q.stride(2), q.stride(3), k.stride(1), k.stride(2), k.stride(3),
        v.stride(1), v.stride(2), v.stride(3), o.stride(1), o.stride(2), o.stride(3),
        WINDOW_=WINDOW, CURRENT_=ATTEND_CURRENT, VARLEN_=cu is not None, BDK=bdk, BDV=bdv,
        **_dot_options(q.dtype), **opts)
    return o, rem


def _sb_backward(q, k, v, o, rem, do, drem, scale, cu=None, max_len=0):
    k_dtype, v_dtype = k.dtype, v.dtype
    q, k, v, do = (t.to(q.dtype).contiguous() for t in (q, k, v, do))
    B, H, T, DK = q.shape
    DV = v.shape[-1]
    bdk, bdv = max(16, triton.next_power_of_2(DK)), max(16, triton.next_power_of_2(DV))
    delta = _flash_delta(o, do)  # δ_t = dO_t·o_t + dr_t·r_t
    if drem is not None:
        delta += drem.float() * rem
    opts = _sb_launch_options(q, "_sb_bwd_dq", T if cu is None else max_len, DK, DV)
    t_seq, rows = _flash_rows(q, cu, max_len)
    NB = triton.cdiv(t_seq, opts["BN"])
    # per row and key tile of its sequence: Σ log(1 − β) and Σ g over the newer tiles ([B·H, T, NB] fp32)
    stick = torch.zeros(B * H, T, NB, dtype=torch.float32, device=q.device)
    gsum = torch.zeros(B * H, T, NB, dtype=torch.float32, device=q.device)
    dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.empty(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.empty(v.shape, dtype=torch.float32, device=q.device)
    strides = (q.stride(1), q.stride(2), q.stride(3), k.stride(1), k.stride(2), k.stride(3),
               v.stride(1), v.stride(2), v.stride(3), do.stride(1), do.stride(2), do.stride(3))
    cu_arg = delta if cu is None else cu  # (never read without VARLEN_)
    _sb_bwd_dq[(triton.cdiv(t_seq, opts["BM"]), rows)](
        q, k, v, do, delta, dq, stick, gsum, cu_arg, scale, t_seq, T, H, NB, DK, DV, *strides,
        WINDOW_=WINDOW, CURRENT_=ATTEND_CURRENT, VARLEN_=cu is not None, BDK=bdk, BDV=bdv,
        **_dot_options(q.dtype), **opts)
    opts = _sb_launch_options(q, "_sb_bwd_dkdv", T if cu is None else max_len, DK, DV)
    _sb_bwd_dkdv[(NB, rows)](
        q, k, v, do, delta, dk, dv, stick, gsum, cu_arg, scale, t_seq, T, H, NB, DK, DV, *strides,
        WINDOW_=WINDOW, CURRENT_=ATTEND_CURRENT, VARLEN_=cu is not None, BDK=bdk, BDV=bdv,
        **_dot_options(q.dtype), **opts)
    return dq.to(q.dtype), dk.to(k_dtype), dv.to(v_dtype)


# torch.compile: a registered custom op with a fake (shape-only) implementation, as for the softmax kernels.
def _register_ops():
    if triton is None:
        return None

    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, cu: torch.Tensor | None,
            max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _sb_forward(q, k, v, scale, cu, max_len)

    def fwd_fake(q, k, v, scale, cu, max_len):
        return (q.new_empty(*q.shape[:3], v.shape[-1], dtype=torch.float32),
                q.new_empty(q.shape[:3], dtype=torch.float32))

    def bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, rem: torch.Tensor,
            do: torch.Tensor, drem: torch.Tensor | None, scale: float, cu: torch.Tensor | None,
            max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _sb_backward(q, k, v, o, rem, do, drem, scale, cu, max_len)

    def bwd_fake(q, k, v, o, rem, do, drem, scale, cu, max_len):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx, inputs, output):
        q, k, v, scale, cu, max_len = inputs
        o, rem = output
        ctx.save_for_backward(q, k, v, o, rem, cu)
        ctx.scale, ctx.max_len = scale, max_len

    def backward(ctx, bwd, do, drem):
        q, k, v, o, rem, cu = ctx.saved_tensors
        dq, dk, dv = bwd(q, k, v, o, rem, do, drem, ctx.scale, cu, ctx.max_len)
        return dq, dk, dv, None, None, None

    return _register_op("stickbreaking", OP_ID, fwd, fwd_fake, bwd, bwd_fake, setup_context, backward)


_SB_OP = _register_ops()


def _stickbreaking_attention(q, k, v, scale, bounds=None):
    """q, k [B, H, T, Dk], v [B, H, T, Dv] -> (o [B, H, T, Dv], r [B, H, T], fp32): the read without its
    remainder, and the stick left over (apply() adds the remainder where REMAINDER says). bounds: the offsets of
    sequences packed along T (B = 1), read in one launch each direction."""
    if _SB_OP is None:
        raise RuntimeError("backend='triton' needs the triton package (and torch.library.custom_op)")
    if bounds is None:
        return _SB_OP(q, k, v, float(scale), None, 0)
    return _SB_OP(q, k, v, float(scale), *_packed_offsets(bounds, q.device))


def _with_remainder(o, left, v, params):
    """o [B, H, T, Dv] + r_t·x_t where REMAINDER says (r = left [B, H, T], fp32; v [B, H, T, Dv])."""
    if REMAINDER == "current":
        return o + left[..., None] * v.float()
    if REMAINDER == "bias":
        return o + left[..., None] * params["remainder_bias"][None, :, None, :].float()
    return o


def _triton_read(q, k, v, scale, c, params, bounds=None):
    """The Triton read of the stick-breaking memory, [B, H, T, D] in and out (no decay: c is None): the stick-breaking
    kernels, the stick left over where REMAINDER puts it."""
    o, left = _stickbreaking_attention(q, k, v, scale, bounds)
    return _with_remainder(o, left, v, params).to(q.dtype)
