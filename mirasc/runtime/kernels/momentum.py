"""The momentum delta rule's scan kernels over the state [W, S] (docs/semantics.md, the momentum learner), forward
and reverse: the sequential part of its chunked path; the emitted module prepares their inputs and computes the
chunk-parallel parts in torch. It does not run on the chunk form of the other families: its state [W, S] mixes W
and S through a 2x2 factor per token, so it has these scans over (W, S) of its own, and the outputs are torch matmuls
on the chunk states they store (_chunked_triton, mirasc.runtime.momentum_host)."""

import triton
import triton.language as tl

from .dots import _chunk_dot


# ---- Momentum delta rule (linear memory, l2 bias, momentum, none/decay; gates per head). Per token, with
# δ_t = η_t v_t - β_t W_{t-1} k_t (β = η, or α η for order=pre): S_t = θ_t S_{t-1} + δ_t k_tᵀ,
# W_t = α_t W_{t-1} + S_t, i.e. [W, S]_t = [W, S]_{t-1} (G_t ⊗ I) + δ_t [k_t; k_t]ᵀ, G_t = [[α_t, 0], [θ_t, θ_t]].
# G_t = diag(α_t, θ_t) [[1, 0], [1, 1]] couples S into W with a full-rank term every token, and the G_t share
# no eigenbasis (a basis that decouples them divides by θ), so the state [W, S] is not (1) under any diagonal
# decay: it gets its own scans. Over a chunk from [W_0, S_0] (A, Θ the segment products of α, θ;
# P = A·Θ, C = P - A; docs/semantics.md) and with u = -δ:
#     u_t = Wkw_t W_0ᵀ + Wks_t S_0ᵀ - U_t,  (I + L) [Wkw | Wks | U] = [β A(t-1,0) K | β C(t-1,0) K | η V]
#     W_e = A(e,0) W_0 + C(e,0) S_0 - Σ_s u_s (P(e,s) k_s)ᵀ,   S_e = Θ(e,0) S_0 - Σ_s u_s (Θ(e,s) k_s)ᵀ   (3)
#     o_t = A(t,0) W_0 q_t + C(t,0) S_0 q_t - Σ_{s<=t} P(t,s) (q_t·k_s) u_s                             (4)
# with L_ts = β_t P(t-1,s) (k_s·k_t) (s < t). The kernels are only the sequential part, (3): the scan over
# chunks (per Dv tile, one [BV, Dk] tile each of W and S, the chunk's rows in 16-row sub-blocks) writing W_0,
# S_0 of every chunk and u of every token, and its reverse. Everything chunk-parallel — the solve, (4) as
# batched matmuls on the stored W_0, S_0 and u, and the gradients of Wkw, Wks, the written keys and the
# per-chunk factors from the reverse scan's cotangents — is torch, which autograd differentiates.
@triton.jit
def _mom_state_fwd(KW, KS, WKW, WKS, U, MIX, W_in, S_in, UU, W_out, S_out, CKW, CKS, T, Nk, Nv,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    # per chunk: W_0, S_0 -> CKW, CKS; u = Wkw W_0ᵀ + Wks S_0ᵀ - U -> UU; (3) with MIX = (A, C, Θ)(e, 0)
    iv = tl.program_id(0)
    bh = tl.program_id(1)
    NT = T // BT
    rs = tl.arange(0, BC)
    rk = tl.arange(0, BK)
    rv = iv * BV + tl.arange(0, BV)
    mv = rv < Nv
    mk = rk < Nk
    msk = mv[:, None] & mk[None, :]
    st = (bh * Nv + rv[:, None]) * Nk + rk[None, :]
    w = tl.load(W_in + st, mask=msk, other=0.0)
    s = tl.load(S_in + st, mask=msk, other=0.0)
    for c in range(NT):
        ck = ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk[None, :]
        tl.store(CKW + ck, w, mask=msk)
        tl.store(CKS + ck, s, mask=msk)
        fa = tl.load(MIX + (bh * NT + c) * 3)
        fc = tl.load(MIX + (bh * NT + c) * 3 + 1)
        ft = tl.load(MIX + (bh * NT + c) * 3 + 2)
        acc_w = fa * w + fc * s
        acc_s = ft * s
        for h in range(BT // BC):
            tok = c * BT + h * BC + rs
            row = (bh * T + tok[:, None]) * Nk + rk[None, :]
            vrow = (bh * T + tok[:, None]) * Nv + rv[None, :]
            wkw = tl.load(WKW + row, mask=mk[None, :], other=0.0)
            wks = tl.load(WKS + row, mask=mk[None, :], other=0.0)
            u = _chunk_dot(wkw, tl.trans(w), PREC) + _chunk_dot(wks, tl.trans(s), PREC)
            u -= tl.load(U + vrow, mask=mv[None, :], other=0.0)
            tl.store(UU + vrow, u, mask=mv[None, :])
            ut = tl.trans(u)
            kw = tl.load(KW + row, mask=mk[None, :], other=0.0)
            ks = tl.load(KS + row, mask=mk[None, :], other=0.0)
            acc_w -= _chunk_dot(ut, kw, PREC)
            acc_s -= _chunk_dot(ut, ks, PREC)
        w = acc_w
        s = acc_s
    tl.store(W_out + st, w, mask=msk)
    tl.store(S_out + st, s, mask=msk)

@triton.jit
def _mom_state_bwd(KW, KS, WKW, WKS, MIX, DCKW, DCKS, DUU, DW_final, DS_final, DHW, DHS, DU, DW_init, DS_init,
                   T, Nk, Nv, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,
                   PREC: tl.constexpr):
    # Reverse of (3). dw, ds = ∂ℓ/∂(W, S after chunk c) -> DHW[c], DHS[c]; per chunk:
    #   du = dUU - Kw dwᵀ - Ks dsᵀ                                      -> DU
    #   dw <- A dw + dCKW[c] + duᵀ Wkw,   ds <- C dw + Θ ds + dCKS[c] + duᵀ Wks   (cotangents of W_0, S_0)
    iv = tl.program_id(0)
    bh = tl.program_id(1)
    NT = T // BT
    rs = tl.arange(0, BC)
    rk = tl.arange(0, BK)
    rv = iv * BV + tl.arange(0, BV)
    mv = rv < Nv
    mk = rk < Nk
    msk = mv[:, None] & mk[None, :]
    st = (bh * Nv + rv[:, None]) * Nk + rk[None, :]
    dw = tl.load(DW_final + st, mask=msk, other=0.0)
    ds = tl.load(DS_final + st, mask=msk, other=0.0)
    for cc in range(NT):
        c = NT - 1 - cc
        ck = ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk[None, :]
        tl.store(DHW + ck, dw, mask=msk)
        tl.store(DHS + ck, ds, mask=msk)
        fa = tl.load(MIX + (bh * NT + c) * 3)
        fc = tl.load(MIX + (bh * NT + c) * 3 + 1)
        ft = tl.load(MIX + (bh * NT + c) * 3 + 2)
        acc_w = fa * dw + tl.load(DCKW + ck, mask=msk, other=0.0)
        acc_s = fc * dw + ft * ds + tl.load(DCKS + ck, mask=msk, other=0.0)
        for h in range(BT // BC):
            tok = c * BT + h * BC + rs
            row = (bh * T + tok[:, None]) * Nk + rk[None, :]
            vrow = (bh * T + tok[:, None]) * Nv + rv[None, :]
            kw = tl.load(KW + row, mask=mk[None, :], other=0.0)
            ks = tl.load(KS + row, mask=mk[None, :], other=0.0)
            du = tl.load(DUU + vrow, mask=mv[None, :], other=0.0)
            du -= _chunk_dot(kw, tl.trans(dw), PREC) + _chunk_dot(ks, tl.trans(ds), PREC)
            tl.store(DU + vrow, du, mask=mv[None, :])
            dut = tl.trans(du)
            wkw = tl.load(WKW + row, mask=mk[None, :], other=0.0)
            wks = tl.load(WKS + row, mask=mk[None, :], other=0.0)
            acc_w += _chunk_dot(dut, wkw, PREC)
            acc_s += _chunk_dot(dut, wks, PREC)
        dw = acc_w
        ds = acc_s
    tl.store(DW_init + st, dw, mask=msk)
    tl.store(DS_init + st, ds, mask=msk)
