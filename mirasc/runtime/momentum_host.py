"""The momentum delta rule's chunked path (l2, momentum, gates per head; a runtime piece, copied into the emitted
modules of that family by mirasc.codegen.triton_chunked). Its state [W, S] mixes W and S through a 2x2 factor per token
that no diagonal decay expresses, so it has its own scan kernels over (W, S) (mirasc/runtime/kernels/momentum.py);
the chunk-local preparation (the solve, the factors) is torch, and the outputs are batched matmuls on the chunk states
the scan stored."""

import torch
import triton

from .chunk_host import (
    _CHUNK_TUNED,
    DECAY,
    OP_ID,
    PRE_DECAY,
    _check_chunk_fits,
    _chunk_fit_error,
    _launch_prec,
    _tile_rows,
)
from .chunk_space import SUB
from .custom_ops import _register_op
from .gpu_limits import _device_smem_limit
from .kernels.momentum import _mom_state_bwd, _mom_state_fwd
from .segments import _segment_products


def _mom_configs(Dk, Dv, prec="bf16"):
    """The GPU autotuning space of the momentum scans: the Dv tile (the state is one [BV, Dk] tile each of W and S
    and their two accumulators; Dk is never split, BK = Dk rounded up) and warps, 1 stage. Compiled for sm_90 and
    sm_80 (`mirasc kernels`, RESULTS.md): with bf16 operands (HMMA.BF16 on the chunk's 16-row sub-blocks) every
    configuration is spill-free at Dk = 128 (8 warps: 102-190 registers) and all but one at Dk = 64 (sm_90's
    backward at BV = 32 and 4 warps, held at 128 registers, spills 8 B); with full-fp32 dots (prec "ieee") only
    BV = 16 at 8 warps is spill-free. Shared memory is 12-32 KB (no pruning)."""
    full_k = max(16, triton.next_power_of_2(Dk))
    fma = prec == "ieee"
    return [triton.Config({"BV": bv}, num_warps=warps, num_stages=1)
            for bv in ((16,) if fma else (16, 32)) if bv <= max(16, triton.next_power_of_2(Dv))
            for warps in ((8,) if fma or full_k > 64 else (4, 8))]


def _mom_kernel(kernel, x, Dk, Dv, BT, prec):
    """The momentum scan to launch: on the CPU interpreter the smallest tile (BV = 16), on a GPU autotuned."""
    if x.device.type == "cpu":
        return kernel, {"BV": 16}
    key = (kernel.fn.__name__, Dk, Dv, BT, prec, x.device.index)
    if key not in _CHUNK_TUNED:
        configs = _mom_configs(Dk, Dv, prec)
        if not configs:  # (never at a tile of 16 rows of V; the same guard as _chunk_kernel's)
            raise RuntimeError(_chunk_fit_error(Dk, Dv, BT, prec, _device_smem_limit(x.device)))
        _CHUNK_TUNED[key] = triton.autotune(configs=configs, key=["Nk", "Nv", "BT"])(kernel)
    return _CHUNK_TUNED[key], {}


# kernel name -> its autotuning space at a launch's arguments (read by `mirasc kernels` and launch_plan); the
# kernels the chunked path launches, each needing a configuration at a launch's sizes
_CHUNK_AUTOTUNE = {name: (lambda args, smem_limit: _mom_configs(args["Nk"], args["Nv"], args["PREC"]))
                   for name in ("_mom_state_fwd", "_mom_state_bwd")}
_CHUNK_LAUNCHED = tuple(_CHUNK_AUTOTUNE)


def _mom_fwd(kw, ks, wkw, wks, u, mix, w0, s0, chunk, prec):
    B, H, T, Dk = kw.shape
    Dv = u.shape[-1]
    NT = T // chunk
    f32 = dict(dtype=torch.float32, device=kw.device)
    uu = torch.empty(B, H, T, Dv, **f32)
    w_final, s_final = torch.empty(B, H, Dv, Dk, **f32), torch.empty(B, H, Dv, Dk, **f32)
    ckw, cks = torch.empty(B, H, NT, Dv, Dk, **f32), torch.empty(B, H, NT, Dv, Dk, **f32)
    kernel, tile = _mom_kernel(_mom_state_fwd, kw, Dk, Dv, chunk, prec)
    kernel[lambda meta: (triton.cdiv(Dv, meta["BV"]), B * H)](
        kw, ks, wkw, wks, u, mix, w0, s0, uu, w_final, s_final, ckw, cks, T, Dk, Dv, BT=chunk,
        BK=max(16, triton.next_power_of_2(Dk)), BC=SUB, PREC=_launch_prec(prec), **tile)
    return w_final, s_final, ckw, cks, uu


def _mom_bwd(kw, ks, wkw, wks, mix, dckw, dcks, duu, dw_final, ds_final, chunk, prec):
    B, H, T, Dk = kw.shape
    Dv = duu.shape[-1]
    NT = T // chunk
    f32 = dict(dtype=torch.float32, device=kw.device)
    dhw, dhs = torch.empty(B, H, NT, Dv, Dk, **f32), torch.empty(B, H, NT, Dv, Dk, **f32)
    du = torch.empty(B, H, T, Dv, **f32)
    dw0, ds0 = torch.empty(B, H, Dv, Dk, **f32), torch.empty(B, H, Dv, Dk, **f32)
    kernel, tile = _mom_kernel(_mom_state_bwd, kw, Dk, Dv, chunk, prec)
    kernel[lambda meta: (triton.cdiv(Dv, meta["BV"]), B * H)](
        kw, ks, wkw, wks, mix, dckw, dcks, duu, dw_final, ds_final, dhw, dhs, du, dw0, ds0, T, Dk, Dv, BT=chunk,
        BK=max(16, triton.next_power_of_2(Dk)), BC=SUB, PREC=_launch_prec(prec), **tile)
    return dhw, dhs, du, dw0, ds0


def _register_mom_op():
    if triton is None:
        return None

    def op(kw: torch.Tensor, ks: torch.Tensor, wkw: torch.Tensor, wks: torch.Tensor, u: torch.Tensor,
           mix: torch.Tensor, w0: torch.Tensor, s0: torch.Tensor, chunk: int, prec: str) -> list[torch.Tensor]:
        return list(_mom_fwd(kw, ks, wkw, wks, u, mix, w0, s0, chunk, prec))

    def op_fake(kw, ks, wkw, wks, u, mix, w0, s0, chunk, prec):
        B, H, T = kw.shape[:3]
        ck = w0.new_empty(B, H, T // chunk, *w0.shape[2:])
        # W, S at the end; W_0, S_0 of every chunk; u of every token
        return [w0.new_empty(w0.shape), s0.new_empty(s0.shape), ck, ck.new_empty(ck.shape), u.new_empty(u.shape)]

    def backward_op(kw: torch.Tensor, ks: torch.Tensor, wkw: torch.Tensor, wks: torch.Tensor, mix: torch.Tensor,
                    dckw: torch.Tensor, dcks: torch.Tensor, duu: torch.Tensor, dw_final: torch.Tensor,
                    ds_final: torch.Tensor, chunk: int, prec: str) -> list[torch.Tensor]:
        return list(_mom_bwd(kw, ks, wkw, wks, mix, dckw, dcks, duu, dw_final, ds_final, chunk, prec))

    def backward_fake(kw, ks, wkw, wks, mix, dckw, dcks, duu, dw_final, ds_final, chunk, prec):
        return [dckw.new_empty(dckw.shape), dcks.new_empty(dcks.shape), duu.new_empty(duu.shape),
                dw_final.new_empty(dw_final.shape), ds_final.new_empty(ds_final.shape)]

    def setup_context(ctx, inputs, output):
        kw, ks, wkw, wks, u, mix, w0, s0, chunk, prec = inputs
        ctx.save_for_backward(kw, ks, wkw, wks, mix, output[2], output[3], output[4])
        ctx.chunk, ctx.prec = chunk, prec

    def backward(ctx, backward_op, grads_out):
        kw, ks, wkw, wks, mix, ckw, cks, uu = ctx.saved_tensors
        like = (ckw[:, :, 0], cks[:, :, 0], ckw, cks, uu)
        dw_final, ds_final, dckw, dcks, duu = (torch.zeros_like(t) if g is None else g.float().contiguous()
                                               for g, t in zip(grads_out, like))
        dhw, dhs, du, dw0, ds0 = backward_op(kw, ks, wkw, wks, mix, dckw, dcks, duu, dw_final, ds_final,
                                             ctx.chunk, ctx.prec)
        B, H, T, Dk = kw.shape
        NT, n = T // ctx.chunk, ctx.chunk
        duc, uc = du.view(B, H, NT, n, -1), uu.view(B, H, NT, n, -1)
        # u = Wkw W_0ᵀ + Wks S_0ᵀ - U and (3), chunk by chunk, with dhw, dhs the cotangents of W_e, S_e
        dwkw, dwks = (duc @ ckw).view(B, H, T, Dk), (duc @ cks).view(B, H, T, Dk)
        dkw, dks = -(uc @ dhw).view(B, H, T, Dk), -(uc @ dhs).view(B, H, T, Dk)
        dmix = torch.stack([(dhw * ckw).sum((-1, -2)), (dhw * cks).sum((-1, -2)), (dhs * cks).sum((-1, -2))], -1)
        return dkw, dks, dwkw, dwks, -du, dmix, dw0, ds0, None, None

    return _register_op("mom", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


_MOM_OP = _register_mom_op()


def _chunked_triton(q, k, v, c, state, chunk, prec="ieee"):
    """The momentum delta rule's chunk-local preparation in torch (differentiable: the solve, the factors), the
    scan kernels (3), and the outputs (4) as batched matmuls on the chunk states the scan stored."""
    if _MOM_OP is None:
        raise RuntimeError("backend='triton' needs the triton package (and torch.library.custom_op)")
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    _check_chunk_fits(Dk, Dv, chunk, prec, q.device)  # before any launch (forward and backward kernels)
    n, pad = chunk, (-T) % chunk
    NT = (T + pad) // n

    def chunks(x, fill=0.0):  # [B, H, T, ...] -> [B, H, NT, n, ...], padded at the end with `fill`
        x = torch.nn.functional.pad(x.float(), (0, 0) * (x.dim() - 3) + (0, pad), value=fill)
        return x.view(B, H, NT, n, *x.shape[3:])

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    eta, theta = chunks(c["eta"]), chunks(c["theta"], 1.0)  # padded tokens: η = 0, α = θ = 1 (no-ops)
    alpha = chunks(c["alpha"], 1.0) if DECAY else torch.ones_like(eta)
    beta = alpha * eta if PRE_DECAY else eta  # order=pre: the gradient is taken at the decayed state α_t W_{t-1}
    one = torch.ones_like(alpha[..., :1])
    seg_a = _segment_products(torch.cat([one, alpha], dim=-1))  # A(t, s), index 0 the chunk start
    seg_t = _segment_products(torch.cat([one, theta], dim=-1))  # Θ(t, s)
    prod = seg_a @ seg_t  # P = A·Θ: how δ_s k_sᵀ reaches W_t
    cross = prod - seg_a  # C(t, 0): S_0 in W_t
    lower = beta.unsqueeze(-1) * (prod[..., :-1, 1:] * (kc @ kc.transpose(-1, -2))).tril(-1)
    rhs = torch.cat([(beta * seg_a[..., :-1, 0]).unsqueeze(-1) * kc, (beta * cross[..., :-1, 0]).unsqueeze(-1) * kc,
                     eta.unsqueeze(-1) * vc], dim=-1)
    eye = torch.eye(n, dtype=torch.float32, device=q.device)
    sol = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
    wkw, wks, u = sol[..., :Dk], sol[..., Dk:2 * Dk], sol[..., 2 * Dk:]
    # A chunk ends at its last real token e: padding (T past the sequence, or a packed row's end) is no no-op
    # here (W_t = W_{t-1} + S_t for α = θ = 1), so the factors of (3) are read at row e (e = 0: the identity)
    real = torch.ones(B, H, T, device=q.device) if "valid" not in c else c["valid"].float().expand(B, H, T)
    ends = chunks(real).sum(-1).long()[..., None, None].expand(B, H, NT, 1, n + 1)  # e per chunk

    def at_end(x):  # [B, H, NT, n+1, n+1] -> row e: [B, H, NT, n+1]
        return x.gather(-2, ends).squeeze(-2)

    p_e, a_e, c_e, t_e = at_end(prod), at_end(seg_a), at_end(cross), at_end(seg_t)
    kw, ks = p_e[..., 1:, None] * kc, t_e[..., 1:, None] * kc  # P(e, s) k_s, Θ(e, s) k_s (0 for s > e)
    mix = torch.stack([a_e[..., 0], c_e[..., 0], t_e[..., 0]], dim=-1).contiguous()  # [B, H, NT, 3]
    BT = _tile_rows(n)  # rows past a chunk's n tokens are zero (they write nothing)

    def tile(x):  # [B, H, NT, n, ...] -> [B, H, NT·BT, ...]
        if BT > n:
            x = torch.cat([x, x.new_zeros(*x.shape[:3], BT - n, *x.shape[4:])], dim=3)
        return x.reshape(B, H, NT * BT, *x.shape[4:]).contiguous()

    w_final, s_final, ckw, cks, uu = _MOM_OP(tile(kw), tile(ks), tile(wkw), tile(wks), tile(u), mix,
                                             state["W"].float().contiguous(), state["S_W"].float().contiguous(),
                                             BT, prec)
    uu = uu.view(B, H, NT, BT, Dv)[:, :, :, :n]
    # (4): o_t = A(t,0) W_0 q_t + C(t,0) S_0 q_t - Σ_{s<=t} P(t,s) (q_t·k_s) u_s
    o = (seg_a[..., 1:, 0, None] * (qc @ ckw.transpose(-1, -2)) + cross[..., 1:, 0, None] * (qc @ cks.transpose(-1, -2))
         - (prod[..., 1:, 1:] * (qc @ kc.transpose(-1, -2))) @ uu)
    o = o.reshape(B, H, NT * n, Dv)
    return o[:, :, :T].to(q.dtype), {"W": w_final.to(state["W"].dtype), "S_W": s_final.to(state["S_W"].dtype)}
