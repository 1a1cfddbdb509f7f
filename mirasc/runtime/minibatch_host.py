"""The host side of the mini-batch (dual-form) kernels of the parametric memories (a runtime piece: copied into the
emitted modules whose mini-batch form runs on them, by mirasc.codegen.triton_minibatch; the kernels themselves are
printed from the spec's IR there): the schedule (single-tile or streamed kernels, warps, tiles; never what is
computed), the resource model and the range backend='auto' hands them, the launches, the op, and the chunk-local
preparation of γ, b, K in torch. The spec's own names it reads (the printed kernels, the weights' shapes, the scratch
sizes) come from the emitted module; mirasc.runtime.minibatch_spec has stand-ins so that these pieces import and their
schedule can be tested as it is."""

import torch
import triton

from .custom_ops import _register_op
from .minibatch_spec import (
    _COEF_ORDER,
    _MB_DECAY,
    _MOMENTUM,
    _VECTOR_COEFS,
    _WINDOW,
    MINIBATCH,
    OP_ID,
    WEIGHTS,
    _kernel_key_width,
    _kernel_weight_shapes,
    _mb_scratch_bwd,
    _mb_scratch_fwd,
    _minibatch_bwd,
    _minibatch_fwd,
    _minibatch_stream_bwd_a,
    _minibatch_stream_bwd_b,
    _minibatch_stream_fwd,
    _minibatch_stream_fwd_end,
)
from .segments import _segment_products


def _mb_launch_prec(prec):
    """The PREC a launch passes the mini-batch kernels: `prec`, except for "bf16x3" under the interpreter, whose
    tl.dot multiplies in fp32 whatever the precision: there "bf16x3_emulated" rounds the parts to bf16 by hand and
    multiplies them exactly, so the interpreter computes what a GPU computes; and on a Triton without bf16x3
    (before 3.5) "ieee", exact products."""
    if prec != "bf16x3":
        return prec
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    if getattr(knobs, "interpret", False):
        return "bf16x3_emulated"
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        return prec if "bf16x3" in CUDAOptions.allowed_dot_input_precisions else "ieee"
    except (ImportError, AttributeError):
        return prec


def _mb_block(chunk):
    """The rows of a chunk's tile in the kernels: the mini-batch rounded up to a power of two, at least 16
    (tl.dot's minimum). The torch glue pads every chunk to this many rows with tokens that do nothing."""
    return max(16, triton.next_power_of_2(chunk))


# Two schedules. "tile": every weight is one register tile of a program (fast for small heads, the only
# kernels before the streamed ones). "stream": the weights stay in global memory and every dimension is
# walked in tiles (see the streamed kernels' docstring in mirasc/codegen/triton_minibatch_stream.py), so
# the on-chip footprint is a few [BC, T] / [T, T] / [BC, BC] tiles whatever the head size.
# MINIBATCH_SCHEDULE forces one ("tile" | "stream"); "auto" picks by the resource model below.
MINIBATCH_SCHEDULE = "auto"
# Resource model. Single-tile kernels: shared memory and registers grow with the state (weights and momentum,
# floats per head); measured (AOT compile, bf16): Titans at 16384 floats (D = 32) needs 186 KB (forward) /
# 474 KB (backward) on sm_90, and even at 4096 floats (D = 16) they spill on sm_80 (forward 255 registers,
# 1.4 KB spill, 73 KB shared; backward 29 KB spill, 153 KB shared). So a GPU always gets the streamed
# kernels; the interpreter (CPU) keeps the single-tile ones for states up to TILE_MAX_STATE.
# Streamed kernels: on-chip use depends on the chunk tile BC, the tile width and the warps, not on D or E;
# measured (AOT compile on a shared 2-core CPU, E = 4 D, tile 16; Titans and Yaad BC = 64 with 8 warps, TTT-MLP
# BC = 16 with 2 warps; registers / spill bytes / shared KB / compile s; limits 227 KB sm_90, 163 KB sm_80):
#   titans   D=128 sm_90 bf16/fp16 fwd 232/0/21/14.8  bwd_a 238/0/40/48.3  bwd_b 118/0/5/26.3
#   titans   D=128 sm_90 fp32      fwd 180/0/21/19.1  bwd_a 172/0/40/52.4  bwd_b 159/0/5/30.9
#   titans   D=128 sm_80 bf16/fp16 fwd 254/0/24/26.2  bwd_a 250/0/40/41.1  bwd_b 124/0/5/28.9
#   titans   D=128 sm_80 fp32      fwd 244/0/21/19.6  bwd_a 255/0/40/47.6  bwd_b 128/24/5/30.2
#   titans   D=64  sm_90 bf16/fp16 fwd 232/0/21/9.9  bwd_a 238/0/40/25.6  bwd_b 118/0/5/18.6
#   titans   D=64  sm_90 fp32      fwd 180/0/21/13.9  bwd_a 172/0/40/38.2  bwd_b 159/0/5/20.1
#   titans   D=64  sm_80 bf16/fp16 fwd 254/0/24/10.2  bwd_a 250/0/40/24.4  bwd_b 124/0/5/17.9
#   titans   D=64  sm_80 fp32      fwd 244/0/21/14.2  bwd_a 255/0/40/33.8  bwd_b 128/24/5/16.5
#   ttt_mlp  D=128 sm_90 bf16/fp16 fwd 116/0/2/4.3  bwd_a 160/0/4/9.3  bwd_b 96/8/2/9.9
#   ttt_mlp  D=128 sm_90 fp32      fwd 128/0/3/6.5  bwd_a 128/0/4/13.4  bwd_b 128/0/2/12.6
#   ttt_mlp  D=128 sm_80 bf16/fp16 fwd 128/0/2/5.1  bwd_a 158/0/4/10.5  bwd_b 126/0/2/12.8
#   ttt_mlp  D=128 sm_80 fp32      fwd 166/0/3/5.3  bwd_a 168/0/4/12.1  bwd_b 128/0/2/12.9
#   ttt_mlp  D=64  sm_90 bf16/fp16 fwd 116/0/2/5.4  bwd_a 160/0/4/10.2  bwd_b 96/8/2/9.8
#   ttt_mlp  D=64  sm_90 fp32      fwd 128/0/3/5.5  bwd_a 128/0/4/11.5  bwd_b 128/0/2/11.9
#   ttt_mlp  D=64  sm_80 bf16/fp16 fwd 128/0/2/4.8  bwd_a 158/0/4/8  bwd_b 126/0/2/9.9
#   ttt_mlp  D=64  sm_80 fp32      fwd 166/0/3/6.7  bwd_a 168/0/4/14.9  bwd_b 128/0/2/15.1
#   yaad     D=128 sm_90 bf16/fp16 fwd 232/0/20/12.2  bwd_a 221/0/40/31.1  bwd_b 122/0/5/26.5
#   yaad     D=128 sm_90 fp32      fwd 128/48/21/7.5  bwd_a 164/0/40/35.2  bwd_b 174/0/5/17.9
#   yaad     D=128 sm_80 bf16/fp16 fwd 224/0/20/13.6  bwd_a 226/0/40/34.8  bwd_b 128/16/5/45.7
#   yaad     D=128 sm_80 fp32      fwd 240/0/21/26.1  bwd_a 248/0/40/59  bwd_b 164/0/5/42.1
#   yaad     D=64  sm_90 bf16/fp16 fwd 232/0/20/6  bwd_a 221/0/40/12.9  bwd_b 122/0/5/11.8
#   yaad     D=64  sm_90 fp32      fwd 128/48/21/7.6  bwd_a 164/0/40/15.9  bwd_b 174/0/5/14.1
#   yaad     D=64  sm_80 bf16/fp16 fwd 224/0/20/5.8  bwd_a 226/0/40/13.4  bwd_b 128/16/5/12.7
#   yaad     D=64  sm_80 fp32      fwd 240/0/21/6.2  bwd_a 248/0/40/18.9  bwd_b 164/0/5/16
# With a channel-wise η (lr=gate(v): a token tile of the gradient graph, its cotangent a tile of the reverse),
# bundled Moneta/Yaad/Memora and Titans with lr=gate(v), C = 64 (compiled while other jobs shared the CPU):
#   titans lr=gate(v) D=64/128 sm_90 bf16/fp16 fwd 230/0/21/35.3  bwd_a 244/0/40/90.0  bwd_b 128/0/5/74.3
#   titans lr=gate(v) D=128    sm_80 fp32      fwd 244/0/21/28.6  bwd_a 255/0/40/72.3  bwd_b 128/16/5/41.2
#   moneta            D=64     sm_90 bf16/fp16 fwd 230/0/20/29.3  bwd_a 234/0/40/71.9  bwd_b 136/0/5/85.9
#   yaad              D=128    sm_90 bf16/fp16 fwd 234/0/20/28.8  bwd_a 221/0/40/57.6  bwd_b 116/0/5/65.9
#   memora            D=128    sm_90 bf16/fp16 fwd 242/0/20/21.0  bwd_a 234/0/40/41.0  bwd_b 128/0/5/35.7
#   (Yaad fp32 sm_90 forward with 4 warps: 246/0/21/42.1 at D = 128; the single-tile kernels at Titans
#   D = 16, sm_80, bf16: fwd 255/1400/73/8.1, bwd 32/28992/153/39.2)
TILE_MAX_STATE = 4096
# What backend="auto" hands to these kernels on a GPU: the measured range (heads up to 128 with E = 4 D, a
# chunk tile of at most 64 rows); beyond it the torch path (cuBLAS matmuls). backend="triton" always uses them.
MINIBATCH_AUTO_MAX_HEAD = 128
MINIBATCH_AUTO_MAX_STATE = 4 * 512 * 128  # Titans at D = 128: two 512 x 128 weights and their momentum


def _state_floats(Dk, Dv):
    floats = sum(rows * cols for rows, cols in _kernel_weight_shapes(Dk, Dv))
    return 2 * floats if _MOMENTUM else floats  # (and the momentum's)


def _minibatch_fit_reason(Dk, Dv):
    """None where backend='auto' hands these head sizes to the mini-batch kernels on a GPU (their measured range),
    else why not (_route)."""
    Dk = _kernel_key_width(Dk)
    rows = _mb_block(MINIBATCH * _WINDOW)  # (an Omega window: _WINDOW kernel rows per token)
    if max(Dk, Dv) <= MINIBATCH_AUTO_MAX_HEAD and _state_floats(Dk, Dv) <= MINIBATCH_AUTO_MAX_STATE and rows <= 64:
        return None
    return (f"backend='auto' hands the mini-batch Triton kernels heads up to {MINIBATCH_AUTO_MAX_HEAD} wide, states "
            f"up to {MINIBATCH_AUTO_MAX_STATE} floats and chunk tiles up to 64 rows, the range they were measured on "
            f"(here Dk={Dk}, Dv={Dv}: {_state_floats(Dk, Dv)} floats, {rows} rows); backend='triton' runs them anyway")


# An Omega window makes a mini-batch of C tokens one chunk tile of C·c rows (_on_chunk_kernels). On a GPU the streamed
# kernels are measured to fit chunk tiles up to 64 rows (above); omega_yaad as written (minibatch(64), window 4) is a
# 256-row tile, whose AOT compile for sm_90 (bf16, D = 64) needs 273 KB of shared memory in the forward and 544 KB in
# the first backward kernel (227 KB per block). So with a window, a GPU launch beyond MB_WINDOW_MAX_TILE rows is
# refused (algorithm='chunked') or left to the fused recurrent kernel (algorithm='auto'); the CPU interpreter has no
# such limit. (Without a window the tile is the spec's own C: backend='triton' launches it as before.)
MB_WINDOW_MAX_TILE = 64
# `mirasc kernels` sets this to its target's shared memory, so that on the CPU the window's tile is refused as a GPU
# of that target would refuse it (None: the interpreter, no limit)
FIT_SMEM_LIMIT = None


def _mb_window_fits(chunk, device):
    """Whether the mini-batch kernels take an Omega window's chunk tile of _mb_block(chunk·_WINDOW) rows on `device`."""
    gpu = device.type == "cuda" or FIT_SMEM_LIMIT is not None
    return _WINDOW == 1 or not gpu or _mb_block(chunk * _WINDOW) <= MB_WINDOW_MAX_TILE


def _mb_window_error(chunk):
    rows = _mb_block(chunk * _WINDOW)
    fit = MB_WINDOW_MAX_TILE // _WINDOW
    return (f"the Omega window makes each mini-batch of {chunk} tokens one chunk tile of {chunk}·{_WINDOW} rows "
            f"(padded to {rows}) on the mini-batch Triton kernels, beyond the {MB_WINDOW_MAX_TILE} rows they fit on a "
            "GPU (their [C, C] tiles outgrow shared memory); use algorithm='recurrent' (the fused recurrent kernel, "
            f"also what algorithm='auto' runs here), backend='torch', or a spec with minibatch(C) for C <= {fit}")


def _mb_schedule(Dk, Dv, device):
    if MINIBATCH_SCHEDULE != "auto":
        return MINIBATCH_SCHEDULE
    return "tile" if device.type == "cpu" and _state_floats(Dk, Dv) <= TILE_MAX_STATE else "stream"


def _mb_blocks(Dk, Dv):
    # tl.dot needs every dimension >= 16 on a GPU; padded lanes are masked to zero.
    Ne = _kernel_weight_shapes(Dk, Dv)[0][0] if len(WEIGHTS) > 1 else 1
    return Ne, dict(BK=max(16, triton.next_power_of_2(Dk)), BV=max(16, triton.next_power_of_2(Dv)),
                    BE=max(16, triton.next_power_of_2(Ne)))


# the streamed kernels' tile width per dimension (a power of two >= 16, at most the padded dimension);
# MB_STREAM_TILE overrides the CPU default (tests use 16 to walk several tiles at small sizes)
MB_STREAM_TILE = None


def _mb_tiles(Dk, Dv, Ne, width):
    return {t: max(16, min(width, triton.next_power_of_2(n))) for t, n in (("TK", Dk), ("TV", Dv), ("TE", Ne))}


_MB_TUNED = {}
# streamed kernels on a GPU: 16-wide tiles, and the warps by chunk tile: 8 for BC = 64 and 2 for BC = 16 compile
# without spills (benchmarks/RESULTS.md, "The MLP memories' mini-batch kernels on BF16 tensor cores"); the read
# at BC = 64 is autotuned over 8 and 4 warps, the chunk end over 4 and 2 (every kernel is idempotent, so the
# autotuner's repeated launches are harmless). 32-wide tiles spill in the forward and take 60-85 s to compile the
# backward; 4 or 8 warps on a 16-row tile leave stack spills.
MB_STREAM_WIDTH = 16
# every register a thread may hold: one program per (batch, head) fills an SM on its own, and ptxas, left to its
# occupancy heuristic, capped the backward's second kernel at 128 registers on sm_80 and spilled a pointer there
MB_STREAM_MAXNREG = 255


def _mb_stream_warps(kernel, BC):
    """The warps a streamed kernel is autotuned over (the first is the CPU's): by the chunk's tile, and for the
    forward's chunk end, whose products have 16-row operands that every warp holds whole, fewer."""
    if kernel is _minibatch_stream_fwd_end:
        return {16: (2,), 32: (2,)}.get(BC, (4, 2))
    return {16: (2,), 32: (4,)}.get(BC, (8, 4) if kernel is _minibatch_stream_fwd else (8,))


def _mb_configs(kernel, stream, chunk):
    """The configurations a GPU's autotuner tries for a mini-batch kernel: the streamed kernels' 16-wide tiles with
    the warps for the chunk's tile (`chunk` rows), the single-tile kernels' 4 or 8 warps."""
    if stream:
        width = MB_STREAM_WIDTH
        return [triton.Config({"TK": width, "TV": width, "TE": width}, num_warps=w, num_stages=1,
                              maxnreg=MB_STREAM_MAXNREG) for w in _mb_stream_warps(kernel, chunk)]
    return [triton.Config({}, num_warps=w, num_stages=1) for w in (4, 8)]


def _mb_kernel(kernel, x, stream=False, chunk=None):
    """The kernel to launch for tensors like x: on a GPU autotuned (first call per shape) over the warps; on the
    CPU interpreter the plain kernel."""
    if x.device.type == "cpu":
        return kernel
    key = (kernel, _mb_stream_warps(kernel, chunk) if stream else None)
    if key not in _MB_TUNED:
        _MB_TUNED[key] = triton.autotune(configs=_mb_configs(kernel, stream, chunk),
                                         key=["Nk", "Nv", "Ne", "BC", "PREC"])(kernel)
    return _MB_TUNED[key]


def _mb_plan(Dk, Dv, chunk, device):
    """launch_plan's kernels of the mini-batch path on a GPU `device`: each kernel with the configurations its
    autotuner tries at these sizes (`chunk` tokens per mini-batch)."""
    Dk = _kernel_key_width(Dk)
    rows = _mb_block(chunk * _WINDOW)
    if _mb_schedule(Dk, Dv, device) == "stream":
        kernels = (_minibatch_stream_fwd, _minibatch_stream_fwd_end, _minibatch_stream_bwd_a, _minibatch_stream_bwd_b)
    else:
        kernels = (_minibatch_fwd, _minibatch_bwd)
    stream = len(kernels) == 4
    return {kernel.fn.__name__: _mb_configs(kernel, stream, rows) for kernel in kernels}


def _mb_stream_args(kernel, Dk, Dv, Ne, x, chunk):
    """Tile widths and warps on the CPU (the first configuration; MB_STREAM_TILE overrides the width); on a GPU
    the autotuner's."""
    if x.device.type != "cpu":
        return {}
    width = MB_STREAM_TILE or MB_STREAM_WIDTH
    return dict(_mb_tiles(Dk, Dv, Ne, width), num_warps=_mb_stream_warps(kernel, chunk)[0], num_stages=1,
                maxnreg=MB_STREAM_MAXNREG)


def _mb_fwd(q, k, v, coefs, vecs, kmat, gam, bm, kl, kml, sc, weights, moms, chunk, prec):
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    NCH = T // chunk
    Ne, blocks = _mb_blocks(Dk, Dv)
    o = torch.empty(B, H, T, Dv, dtype=torch.float32, device=q.device)
    tokens = [q, k, v, coefs, *vecs, kmat, gam, bm, kl, kml, sc, o]
    args = list(tokens)
    ckw, cks = [], []
    for i, w in enumerate(weights):
        ckw.append(torch.empty(B, H, NCH + 1, *w.shape[2:], dtype=torch.float32, device=q.device))
        cks.append(torch.empty_like(ckw[-1]) if moms else ckw[-1])
        args += [w, moms[i] if moms else w, ckw[-1], cks[-1]]
    if _mb_schedule(Dk, Dv, q.device) == "stream":
        # two kernels per chunk, in chunk order: the read from the anchor CKW[c], then the chunk end CKW[c + 1]
        s_args = list(tokens)
        for i, w in enumerate(weights):
            ckw[i][:, :, 0].copy_(w)
            if moms:
                cks[i][:, :, 0].copy_(moms[i])
            s_args += [ckw[i], cks[i]]
        sstr = _mb_scratch_fwd(Dk, Dv, Ne, chunk)
        scr = torch.empty(B * H, sstr, dtype=torch.float32, device=q.device)
        kw = dict(NC=coefs.shape[-1], BC=chunk, PREC=_mb_launch_prec(prec))
        kern_read = _mb_kernel(_minibatch_stream_fwd, q, True, chunk)
        kern_end = _mb_kernel(_minibatch_stream_fwd_end, q, True, chunk)
        kw_read = dict(kw, **_mb_stream_args(_minibatch_stream_fwd, Dk, Dv, Ne, q, chunk))
        kw_end = dict(kw, **_mb_stream_args(_minibatch_stream_fwd_end, Dk, Dv, Ne, q, chunk))
        for cc in range(NCH):
            kern_read[(B * H,)](*s_args, scr, cc, T, Dk, Dv, Ne, NCH, sstr, **kw_read)
            kern_end[(B * H,)](*s_args, scr, cc, T, Dk, Dv, Ne, NCH, sstr, **kw_end)
    else:
        _mb_kernel(_minibatch_fwd, q)[(B * H,)](*args, T, Dk, Dv, Ne, NCH, NC=coefs.shape[-1], BC=chunk, **blocks,
                                                PREC=_mb_launch_prec(prec))
    return o, ckw, cks if moms else []


def _mb_bwd(q, k, v, coefs, vecs, kmat, gam, bm, kl, kml, sc, ckw, cks, do, dw_final, ds_final, chunk, prec):
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    NCH = T // chunk
    Ne, blocks = _mb_blocks(Dk, Dv)
    f32 = dict(dtype=torch.float32, device=q.device)
    args = [q, k, v, coefs, *vecs, kmat, gam, bm, kl, kml, sc, do]
    dw0, ds0 = [], []
    for i, ck in enumerate(ckw):
        dw0.append(torch.empty(B, H, *ck.shape[3:], **f32))
        ds0.append(torch.empty_like(dw0[-1]) if cks else dw0[-1])
        args += [ck, cks[i] if cks else ck, dw_final[i], ds_final[i] if cks else dw_final[i], dw0[-1], ds0[-1]]
    grads = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.zeros_like(coefs),
             torch.empty_like(kmat), torch.empty_like(gam), torch.zeros_like(bm), torch.empty_like(kl),
             torch.zeros_like(kml), torch.zeros_like(sc)]
    dvecs = [torch.empty_like(x) for x in vecs]  # the channel-wise η / δ (every row is written)
    # the kernels' order of the gradient pointers: dq, dk, dv, the per-head coefficients, the vectors, the rest
    kernel_grads = grads[:4] + dvecs + grads[4:]
    if _mb_schedule(Dk, Dv, q.device) == "stream":
        # two kernels per chunk, in reverse chunk order; DW0/DS0 carry the cotangent from chunk to chunk
        for i, d in enumerate(dw0):
            d.copy_(dw_final[i])
            if cks:
                ds0[i].copy_(ds_final[i])
        sstr = _mb_scratch_bwd(Dk, Dv, Ne, chunk)
        scr = torch.empty(B * H, sstr, **f32)
        a_args = [q, k, v, coefs, *vecs, kmat, gam, bm, kl, kml, sc, do]
        for i, ck in enumerate(ckw):
            a_args += [ck, cks[i] if cks else ck, dw0[i], ds0[i]]
        a_args += [*kernel_grads, scr]
        kw = dict(NC=coefs.shape[-1], BC=chunk, PREC=_mb_launch_prec(prec),
                  **_mb_stream_args(_minibatch_stream_bwd_a, Dk, Dv, Ne, q, chunk))
        kern_a = _mb_kernel(_minibatch_stream_bwd_a, q, True, chunk)
        kern_b = _mb_kernel(_minibatch_stream_bwd_b, q, True, chunk)
        for cc in range(NCH):
            kern_a[(B * H,)](*a_args, cc, T, Dk, Dv, Ne, NCH, sstr, **kw)
            kern_b[(B * H,)](*a_args, cc, T, Dk, Dv, Ne, NCH, sstr, **kw)
    else:
        _mb_kernel(_minibatch_bwd, q)[(B * H,)](*args, *kernel_grads, T, Dk, Dv, Ne, NCH, NC=coefs.shape[-1],
                                                BC=chunk, **blocks, PREC=_mb_launch_prec(prec))
    return grads + dvecs, dw0, ds0 if cks else []


def _register_minibatch_op():
    if triton is None:
        return None

    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, coefs: torch.Tensor, vecs: list[torch.Tensor],
           kmat: torch.Tensor, gam: torch.Tensor, bm: torch.Tensor, kl: torch.Tensor, kml: torch.Tensor,
           sc: torch.Tensor, weights: list[torch.Tensor], moms: list[torch.Tensor], chunk: int,
           prec: str) -> list[torch.Tensor]:
        o, ckw, cks = _mb_fwd(q, k, v, coefs, vecs, kmat, gam, bm, kl, kml, sc, weights, moms, chunk, prec)
        # outputs: o, the checkpoints (W_0 of every chunk, then the final state) of each weight, then of S
        return [o, *ckw, *cks]

    def op_fake(q, k, v, coefs, vecs, kmat, gam, bm, kl, kml, sc, weights, moms, chunk, prec):
        B, H, T, _ = q.shape
        cks = [w.new_empty(B, H, T // chunk + 1, *w.shape[2:]) for w in weights]
        return [v.new_empty(B, H, T, v.shape[-1]), *cks, *[torch.empty_like(c) for c in cks[:len(moms)]]]

    # the backward is an op of its own, so compiled graphs trace it through its fake implementation
    def backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, coefs: torch.Tensor, vecs: list[torch.Tensor],
                    kmat: torch.Tensor, gam: torch.Tensor, bm: torch.Tensor, kl: torch.Tensor, kml: torch.Tensor,
                    sc: torch.Tensor, ckw: list[torch.Tensor], cks: list[torch.Tensor], do: torch.Tensor,
                    dw_final: list[torch.Tensor], ds_final: list[torch.Tensor], chunk: int,
                    prec: str) -> list[torch.Tensor]:
        grads, dw0, ds0 = _mb_bwd(q, k, v, coefs, vecs, kmat, gam, bm, kl, kml, sc, ckw, cks, do, dw_final,
                                  ds_final, chunk, prec)
        return [*grads, *dw0, *ds0]

    def backward_fake(q, k, v, coefs, vecs, kmat, gam, bm, kl, kml, sc, ckw, cks, do, dw_final, ds_final, chunk, prec):
        grads = [torch.empty_like(t) for t in (q, k, v, coefs, kmat, gam, bm, kl, kml, sc, *vecs)]
        return grads + [torch.empty_like(g) for g in dw_final] + [torch.empty_like(g) for g in ds_final]

    def setup_context(ctx, inputs, output):
        q, k, v, coefs, vecs, kmat, gam, bm, kl, kml, sc, weights, moms, chunk, prec = inputs
        n_w = len(weights)
        ctx.save_for_backward(q, k, v, coefs, kmat, gam, bm, kl, kml, sc, *vecs, *output[1:])
        ctx.n_w, ctx.n_s, ctx.n_v, ctx.chunk, ctx.prec = n_w, len(moms), len(vecs), chunk, prec
        ctx.set_materialize_grads(False)  # only the last checkpoint reaches the caller: no zero cotangents for the rest

    def backward(ctx, backward_op, grads_out):
        saved = ctx.saved_tensors
        inputs, vecs, ck = saved[:10], list(saved[10:10 + ctx.n_v]), saved[10 + ctx.n_v:]
        ckw, cks = list(ck[:ctx.n_w]), list(ck[ctx.n_w:])
        q, v = inputs[0], inputs[2]
        do = grads_out[0]
        do = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float32, device=q.device) if do is None else do
        # only the final state (the last checkpoint) reaches the caller: the others get no gradient
        finals = [torch.zeros_like(c[:, :, -1]) if g is None else g[:, :, -1] for c, g in zip(ck, grads_out[1:])]
        outs = backward_op(*inputs[:4], vecs, *inputs[4:], ckw, cks, do.float().contiguous(),
                           [f.contiguous() for f in finals[:ctx.n_w]], [f.contiguous() for f in finals[ctx.n_w:]],
                           ctx.chunk, ctx.prec)
        nv = 10 + ctx.n_v
        return (*outs[:4], list(outs[10:nv]), *outs[4:10], list(outs[nv:nv + ctx.n_w]),
                list(outs[nv + ctx.n_w:]) if ctx.n_s else [], None, None)

    return _register_op("minibatch", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


_MINIBATCH_OP = _register_minibatch_op()


def _minibatch_triton(q, k, v, c, state, chunk, prec="ieee", lengths=None):
    """The chunk-local preparation of γ, b, K in torch (differentiable), then the mini-batch kernels.
    lengths [B] (optional): real tokens per row; the rest of a row is padding that must not touch its state."""
    if _MINIBATCH_OP is None:
        raise RuntimeError("backend='triton' needs the triton package (and torch.library.custom_op)")
    B, H, T, Dk = q.shape
    n, pad = chunk, (-T) % chunk
    NCH = (T + pad) // n
    if lengths is None:
        lengths = torch.full((B,), T, device=q.device)
    # real tokens of each row in each chunk; a chunk's end is taken at its last real token (padding after it
    # never reaches the rows before it), and a chunk with none leaves the state as it is
    n_real = (lengths.view(B, 1) - n * torch.arange(NCH, device=q.device).view(1, NCH)).clamp(0, n)  # [B, NCH]
    at_end = (n_real - 1).clamp_min(0).view(B, 1, NCH, 1).expand(B, H, NCH, 1)
    empty = (n_real == 0).view(B, 1, NCH).expand(B, H, NCH)

    def chunks(x, fill):  # [B, H, T] -> [B, H, NCH, n], padded at the end with a harmless value
        return torch.nn.functional.pad(x.float(), (0, pad), value=fill).view(B, H, NCH, n)

    def last(x, if_empty):  # the row of each chunk's last real token ([B, H, NCH, n, ...] -> [B, H, NCH, ...])
        idx = at_end.view(B, H, NCH, 1, *([1] * (x.dim() - 4))).expand(B, H, NCH, 1, *x.shape[4:])
        row = x.gather(3, idx).squeeze(3)
        return torch.where(empty.view(B, H, NCH, *([1] * (row.dim() - 3))), torch.full_like(row, if_empty), row)

    eta = chunks(c["eta"], 0.0)
    if _MB_DECAY:
        alpha = chunks(c["alpha"], 1.0)
        decay = _segment_products(alpha)  # decay[t, s] = α_{s+1}…α_t
        gamma = torch.cumprod(alpha, dim=-1)
    else:
        decay = torch.ones(n, n, dtype=torch.float32, device=q.device).tril()
        gamma = torch.ones_like(eta)
    if _MOMENTUM:
        kmat, b_flat, kml, bl, thl = _momentum_matrices(chunks(c["theta"], 1.0), eta, decay, last)
    else:
        kmat = -decay * eta.unsqueeze(-2)
        kml = torch.zeros(B, H, NCH, n, dtype=torch.float32, device=q.device)
        b_flat, bl, thl = torch.zeros_like(eta).view(B, H, -1), torch.zeros_like(eta[..., 0]), \
            torch.zeros_like(eta[..., 0])
    gl = last(gamma, 1.0)
    sc = torch.stack([gl, bl, thl], dim=-1).contiguous()
    # Each chunk becomes a tile of BC >= n rows: rows n..BC-1 are padding with zero K rows and columns, zero
    # γ, b and chunk-end weights, so they change no real row and no state; their outputs are dropped.
    BC = _mb_block(n)

    def blk(x, fill=0.0):  # [B, H, NCH, n, ...] -> [B, H, NCH * BC, ...], each chunk padded to BC rows
        if BC != n:
            x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 4) + (0, BC - n), value=fill)
        return x.reshape(B, H, NCH * BC, *x.shape[4:]).contiguous()

    def tok(x):  # [B, H, T, D] tokens -> [B, H, NCH * BC, D]
        return blk(torch.nn.functional.pad(x.float(), (0, 0, 0, pad)).view(B, H, NCH, n, x.shape[-1]))

    per_head = [name for name in _COEF_ORDER if name not in _VECTOR_COEFS]
    coefs = torch.stack([torch.nn.functional.pad(c[name].float(), (0, pad), value=1.0) for name in per_head],
                        dim=-1) if per_head else torch.zeros(B, H, T + pad, 1, device=q.device)
    coefs = blk(coefs.view(B, H, NCH, n, coefs.shape[-1]), 1.0)
    # channel-wise η / δ (docs/semantics.md: channel-wise gates): [B, H, T, D] token rows the gradient graph reads
    # like k and v
    vecs = [blk(torch.nn.functional.pad(c[name].float(), (0, 0, 0, pad), value=1.0).view(B, H, NCH, n, -1), 1.0)
            for name in _VECTOR_COEFS]
    kl = last(kmat, 0.0)  # the chunk end's row of K
    if BC != n:
        kmat = torch.nn.functional.pad(kmat, (0, BC - n))
    weights = [state[name].float().contiguous() for name in WEIGHTS]
    moms = [state["S_" + name].float().contiguous() for name in WEIGHTS] if _MOMENTUM else []
    outs = _MINIBATCH_OP(tok(q), tok(k), tok(v), coefs, vecs, blk(kmat), blk(gamma), blk(b_flat.view(B, H, NCH, n)),
                         blk(kl), blk(kml), sc, weights, moms, BC, prec)
    n_w = len(WEIGHTS)
    final = {name: outs[1 + i][:, :, -1].to(state[name].dtype) for i, name in enumerate(WEIGHTS)}
    for i, name in enumerate(WEIGHTS[:len(moms)]):
        final["S_" + name] = outs[1 + n_w + i][:, :, -1].to(state["S_" + name].dtype)
    o = outs[0].view(B, H, NCH, BC, -1)[:, :, :, :n].reshape(B, H, NCH * n, -1)
    return o[:, :, :T].to(q.dtype), final


def _momentum_matrices(theta, eta, decay, last):
    """With momentum: K, b and the chunk ends' rows of Kₘ, b and Θ (`last` picks a chunk's last real row) from θ, η
    [B, H, NCH, n] and the decay's segment products. S_t = Θ_t S_0 + Σ_r Kₘ[t, r] δ_r x_rᵀ and
    W_t = Γ_t W_0 + Σ_{u<=t} decay[t, u] S_u. With an Omega window a step is _WINDOW rows (_on_chunk_kernels; a chunk
    starts at a step's row 0): S sums the step's rows (θ_t on row 0, 1 on the others), and only its last row, where S
    is the step's S_t, adds S to W (the rows before it hold partial sums of the step's update)."""
    B, H, NCH, n = eta.shape
    kmom = -_segment_products(theta) * eta.unsqueeze(-2)
    into_w = decay if _WINDOW == 1 else decay * (torch.arange(n, device=eta.device) % _WINDOW == _WINDOW - 1).float()
    kmat = into_w @ kmom
    big_theta = torch.cumprod(theta, dim=-1)
    b = (into_w @ big_theta.unsqueeze(-1)).squeeze(-1)
    return kmat, b.reshape(B, H, -1), last(kmom, 0.0), last(b, 0.0), last(big_theta, 1.0)
