"""The chunk kernels with one log-decay per head and token (docs/kernels.md): the backward's chunk-local du and
the gradients, which form the chunk's scores themselves; and the delta family's chunk preparation (the WY/UT form)
as kernels. (The scans and the output kernel serve both decays: chunk.py.)"""

import triton
import triton.language as tl

from .chunk import _row, _unit_lower_inverse
from .dots import _chunk_dot, _out


@triton.jit
def _chunk_du_local_bwd(Q, K, G, DO, DU, T, Nk, Nv, H,
                        BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, TF: tl.constexpr):
    # The chunk-local part of du (no state in it), every chunk in parallel: du = -(D∘QKᵀ)ᵀ dO -> DU
    iv = tl.program_id(0)
    c = tl.program_id(1)
    bh = tl.program_id(2)
    rt = tl.arange(0, BT)
    rv = iv * BV + tl.arange(0, BV)
    mv = rv < Nv
    tok = c * BT + rt
    qk = tl.zeros([BT, BT], tl.float32)
    for kb in range(0, tl.cdiv(Nk, BK)):
        rk = kb * BK + tl.arange(0, BK)
        mk = rk < Nk
        q = tl.load(Q + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0)
        k = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0)
        qk += _chunk_dot(q, tl.trans(k), PREC)
    g = tl.load(G + bh * T + tok)
    causal = rt[:, None] >= rt[None, :]
    decay = tl.where(causal, tl.exp(tl.where(causal, g[:, None] - g[None, :], 0.0)), 0.0)
    do = tl.load(DO + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], mask=mv[None, :], other=0.0)
    du = -_chunk_dot(tl.trans(qk * decay), do, PREC)
    tl.store(DU + (bh * T + tok[:, None]) * Nv + rv[None, :], du, mask=mv[None, :])


@triton.jit
def _chunk_grads_bwd(Q, K, UU, G, CKPT, DH, DO, DU, DQ, DK, DWK, DG, T, Nk, Nv, H,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_WK: tl.constexpr,
                     PREC: tl.constexpr, FINAL_DK: tl.constexpr, TF: tl.constexpr):
    # One chunk, one Dk tile, summing over Dv in BV blocks; with dS = -(dO uᵀ)∘D, P = dS∘(QKᵀ):
    #   dq = dS K + e^{g}∘(dO W_0)      dk = dSᵀ Q - e^{g_n - g}∘(u dw)      dWk = du W_0
    #   dg_t = Σ_s P_ts - Σ_s P_st + e^{g_t} q_t·(dO W_0)_t + e^{g_n - g_t} k_t·(u dw)_t
    #          [t = n: + e^{g_n} ⟨dw, W_0⟩ - Σ_s e^{g_n - g_s} k_s·(u dw)_s]
    # QKᵀ, q·(dO W_0), k·(u dw) and ⟨dw, W_0⟩ are sums over Dk, so dg is this tile's partial sum.
    ik = tl.program_id(0)
    c = tl.program_id(1)
    bh = tl.program_id(2)
    NT = T // BT
    rt = tl.arange(0, BT)
    rk = ik * BK + tl.arange(0, BK)
    mk = rk < Nk
    tok = c * BT + rt
    dS = tl.zeros([BT, BT], tl.float32)
    dow = tl.zeros([BT, BK], tl.float32)
    udw = tl.zeros([BT, BK], tl.float32)
    dwk = tl.zeros([BT, BK], tl.float32)
    dw_w = 0.0
    for vb in range(0, tl.cdiv(Nv, BV)):
        rv = vb * BV + tl.arange(0, BV)
        mv = rv < Nv
        wmask = mv[:, None] & mk[None, :]
        w = tl.load(CKPT + ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk[None, :], mask=wmask, other=0.0)
        dw = tl.load(DH + ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk[None, :], mask=wmask, other=0.0)
        do = tl.load(DO + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], mask=mv[None, :], other=0.0)
        u = tl.load(UU + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)
        dS += _chunk_dot(do, tl.trans(u), PREC)
        dow += _chunk_dot(do, w, PREC)
        udw += _chunk_dot(u, dw, PREC)
        if HAS_WK:
            du = tl.load(DU + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)
            dwk += _chunk_dot(du, w, PREC)
        dw_w += tl.sum(tl.sum(dw.to(tl.float32) * w.to(tl.float32), axis=1), axis=0)
    q = tl.load(Q + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0)
    k = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0)
    g = tl.load(G + bh * T + tok)
    glast = tl.load(G + bh * T + c * BT + BT - 1)
    causal = rt[:, None] >= rt[None, :]
    decay = tl.where(causal, tl.exp(tl.where(causal, g[:, None] - g[None, :], 0.0)), 0.0)
    gam = tl.exp(g)
    to_end = tl.exp(glast - g)
    dS = -dS * decay
    dq = _chunk_dot(dS, k, PREC) + gam[:, None] * dow
    dk = _chunk_dot(tl.trans(dS), q, PREC) - to_end[:, None] * udw
    tl.store(DQ + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], _out(dq, DQ, PREC), mask=mk[None, :])
    if FINAL_DK:  # the key's whole gradient: in its layout and dtype
        tl.store(DK + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], _out(dk, DK, PREC), mask=mk[None, :])
    else:
        tl.store(DK + (bh * T + tok[:, None]) * Nk + rk[None, :], dk, mask=mk[None, :])
    if HAS_WK:
        tl.store(DWK + (bh * T + tok[:, None]) * Nk + rk[None, :], dwk, mask=mk[None, :])
    p = dS * _chunk_dot(q, tl.trans(k), PREC)
    to_end_term = to_end * tl.sum(k * udw, axis=1)
    dg = tl.sum(p, axis=1) - tl.sum(p, axis=0) + gam * tl.sum(q * dow, axis=1) + to_end_term
    dg_last = tl.exp(glast) * dw_w - tl.sum(to_end_term, axis=0)
    dg = dg + tl.where(rt == BT - 1, dg_last, 0.0)
    tl.store(DG + (ik * tl.num_programs(2) + bh) * T + tok, dg)


# ---- the delta family's chunk preparation as kernels (per-head gates): with S = K Wᵀ (the read keys
# against the written ones), m_ts = e^{x_t - g_s} and L = (β ∘ m ∘ S) strictly lower,
#     (I + L) [Wk | U] = [(β e^{x}) ∘ K | β ∘ V], A = (I + L)⁻¹, Wk = A (β e^{x} ∘ K), U = A (β ∘ V).
# One program per (chunk, B·H) reads K, W and V once in the inputs' dtype; A is never stored: the backward
# recomputes it from K and W.
@triton.jit
def _wy_scores(K, W, BETA, X, G, bh, c, T, Nk, H, BT: tl.constexpr, BK: tl.constexpr, SAME_W: tl.constexpr,
               PREC: tl.constexpr, TF: tl.constexpr):
    # m ∘ S (S = K Wᵀ over the chunk's rows, Dk in BK blocks; m zero on and above the diagonal) and β, x, g
    rt = tl.arange(0, BT)
    tok = c * BT + rt
    s = tl.zeros([BT, BT], tl.float32)
    for kb in range(0, tl.cdiv(Nk, BK)):
        rk = kb * BK + tl.arange(0, BK)
        mk = rk < Nk
        k = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0)
        if SAME_W:
            w = k
        else:
            w = tl.load(W + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0)
        s += _chunk_dot(k, tl.trans(w), PREC)
    beta = tl.load(BETA + bh * T + tok)
    x = tl.load(X + bh * T + tok)
    g = tl.load(G + bh * T + tok)
    return _wy_decay(x, g, BT) * s, beta, x, g


@triton.jit
def _wy_decay(x, g, BT: tl.constexpr):  # m_ts = e^{x_t - g_s} for s < t (x_t <= g_s there), else 0
    rt = tl.arange(0, BT)
    strict = rt[:, None] > rt[None, :]
    return tl.where(strict, tl.exp(tl.where(strict, x[:, None] - g[None, :], 0.0)), 0.0)


@triton.jit
def _wy_fwd(K, W, V, BETA, X, G, WK, U, T, Nk, Nv, H,
            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SAME_W: tl.constexpr, PREC: tl.constexpr,
            PREC_A: tl.constexpr, TF: tl.constexpr):
    c = tl.program_id(0)
    bh = tl.program_id(1)
    rt = tl.arange(0, BT)
    tok = c * BT + rt
    ms, beta, x, g = _wy_scores(K, W, BETA, X, G, bh, c, T, Nk, H, BT, BK, SAME_W, PREC, TF)
    a = _unit_lower_inverse(tl.trans(beta[:, None] * ms), BT)
    bx = beta * tl.exp(x)
    for kb in range(0, tl.cdiv(Nk, BK)):
        rk = kb * BK + tl.arange(0, BK)
        mk = rk < Nk
        k = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0)
        wk = _chunk_dot(a * bx[None, :], k, PREC_A)  # A diag(β e^{x}) K: K stays exact
        tl.store(WK + (bh * T + tok[:, None]) * Nk + rk[None, :], _out(wk, WK, PREC), mask=mk[None, :])
    for vb in range(0, tl.cdiv(Nv, BV)):
        rv = vb * BV + tl.arange(0, BV)
        mv = rv < Nv
        v = tl.load(V + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], mask=mv[None, :], other=0.0)
        u = _chunk_dot(a * beta[None, :], v, PREC_A)
        tl.store(U + (bh * T + tok[:, None]) * Nv + rv[None, :], u, mask=mv[None, :])


@triton.jit
def _wy_bwd(K, W, V, BETA, X, G, WK, U, DWK, DU, DKC, DK, DW, DV, DBETA, DX, DG, T, Nk, Nv, H,
            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SAME_W: tl.constexpr, PREC: tl.constexpr,
            PREC_A: tl.constexpr, TF: tl.constexpr):
    # With R = [β e^{x} ∘ K | β ∘ V] the right sides: dR = Aᵀ [dWk | dU], dL = -(dR [Wk | U]ᵀ) strictly
    # lower; dS = β ∘ m ∘ dL gives dK += dS W, dW += dSᵀ K; m gives dx_t = Σ_s dL_ts L_ts (+ the right
    # side's), dg_s = -Σ_t dL_ts L_ts; β and x reach R too. DU holds -dU (the scan's du); DKC the scan's
    # gradient of its K (the written key), added here so that the key's gradient is written once. The
    # scores' dots take PREC (16-bit keys: exact products), every product with A or a gradient PREC_A
    # (bf16x2 for 16-bit inputs, see _chunk_dot).
    c = tl.program_id(0)
    bh = tl.program_id(1)
    rt = tl.arange(0, BT)
    tok = c * BT + rt
    ms, beta, x, g = _wy_scores(K, W, BETA, X, G, bh, c, T, Nk, H, BT, BK, SAME_W, PREC, TF)
    a = _unit_lower_inverse(tl.trans(beta[:, None] * ms), BT)
    at = tl.trans(a)
    ex = tl.exp(x)
    dl = tl.zeros([BT, BT], tl.float32)
    dbeta = tl.zeros([BT], tl.float32)
    dx = tl.zeros([BT], tl.float32)
    for kb in range(0, tl.cdiv(Nk, BK)):
        rk = kb * BK + tl.arange(0, BK)
        mk = rk < Nk
        rows = (bh * T + tok[:, None]) * Nk + rk[None, :]
        io = _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :]  # (q, k, v, w and their gradients: TF)
        dr = _chunk_dot(at, tl.load(DWK + rows, mask=mk[None, :], other=0.0), PREC_A)
        dl -= _chunk_dot(dr, tl.trans(tl.load(WK + rows, mask=mk[None, :], other=0.0)), PREC_A)
        rk_ = tl.sum(dr * tl.load(K + io, mask=mk[None, :], other=0.0), axis=1) * ex  # Σ_j dR_tj e^{x_t} k_tj
        dbeta += rk_
        dx += beta * rk_
    for vb in range(0, tl.cdiv(Nv, BV)):
        rv = vb * BV + tl.arange(0, BV)
        mv = rv < Nv
        rows = (bh * T + tok[:, None]) * Nv + rv[None, :]
        dr = -_chunk_dot(at, tl.load(DU + rows, mask=mv[None, :], other=0.0), PREC_A)
        dl -= _chunk_dot(dr, tl.trans(tl.load(U + rows, mask=mv[None, :], other=0.0)), PREC_A)
        io = _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :]
        v = tl.load(V + io, mask=mv[None, :], other=0.0)
        dbeta += tl.sum(dr * v, axis=1)
        tl.store(DV + io, _out(dr * beta[:, None], DV, PREC), mask=mv[None, :])
    dl = tl.where(rt[:, None] > rt[None, :], dl, 0.0)
    dlm = dl * ms  # ∂ℓ/∂L_ts · L_ts / β_t
    dbeta += tl.sum(dlm, axis=1)
    dx += beta * tl.sum(dlm, axis=1)
    tl.store(DBETA + bh * T + tok, dbeta)
    tl.store(DX + bh * T + tok, dx)
    tl.store(DG + bh * T + tok, -tl.sum(beta[:, None] * dlm, axis=0))
    ds = beta[:, None] * _wy_decay(x, g, BT) * dl  # (m again, not held through the loops)
    bx = beta * ex
    for kb in range(0, tl.cdiv(Nk, BK)):
        rk = kb * BK + tl.arange(0, BK)
        mk = rk < Nk
        rows = (bh * T + tok[:, None]) * Nk + rk[None, :]
        io = _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :]
        k = tl.load(K + io, mask=mk[None, :], other=0.0)
        dk = bx[:, None] * _chunk_dot(at, tl.load(DWK + rows, mask=mk[None, :], other=0.0), PREC_A)
        dw = _chunk_dot(tl.trans(ds), k, PREC_A) + tl.load(DKC + rows, mask=mk[None, :], other=0.0)
        if SAME_W:
            dk += _chunk_dot(ds, k, PREC_A) + dw
        else:
            dk += _chunk_dot(ds, tl.load(W + io, mask=mk[None, :], other=0.0), PREC_A)
            tl.store(DW + io, _out(dw, DW, PREC), mask=mk[None, :])
        tl.store(DK + io, _out(dk, DK, PREC), mask=mk[None, :])
