"""The chunk kernels both decays share (docs/kernels.md), with `CH: tl.constexpr` selecting a log-decay per key
channel over one per head: the state scans over chunks (1) and their reverse, the output kernel (2); the rows of
a token in either layout, and the unit-lower-triangular inverse of the delta family's preparation.

Every chunk of n tokens (log-decay g_t = Σ_{r<=t} log α_r inside the chunk) is written as
    W_t = e^{g_t} W_0 - Σ_{s<=t} e^{g_t - g_s} u_s k_sᵀ,     u = Wk W_0ᵀ - U        (1)
    o_t = W_t q_t = e^{g_t} W_0 q_t - Σ_{s<=t} e^{g_t - g_s} (q_t·k_s) u_s            (2)
with the chunk-local (parallel, differentiable torch) preparation of Wk [n, Dk] and U [n, Dv] that the family
derives from its update (its `_..._preparation`, mirasc.runtime.chunk_path, with the derivation), and where a
chunk is one tile of a power of two >= 16 rows, its one-op path (mirasc.runtime.chunk_ops).
The kernels only see (1)-(2). They are split the way flash-linear-attention splits its chunk
kernels, so that no program holds more than a [BV, Dk] state tile and a few [BT, *] tiles:
  _chunk_state_fwd   grid (Dv tiles, B·H): the only sequential part, a scan over chunks. Writes W_0
                     of every chunk (O(T/n · state)), u of every token and the final state.
  _chunk_output_fwd  grid (Dv tiles, chunks, B·H): (2), every chunk in parallel, Dk in BK blocks.
  _chunk_du_local_bwd grid (Dv tiles, chunks, B·H): the chunk-local part of du, -(D∘QKᵀ)ᵀ dO.
  _chunk_state_bwd   grid (Dv tiles, B·H): the reverse scan; dW_c (cotangent of the state after chunk c)
                     for every chunk, du, and dW_0 of the first chunk.
  _chunk_grads_bwd   grid (Dk tiles, chunks, B·H): dq, dk, dWk and dg of every chunk in parallel,
                     summing over Dv in BV blocks.
Torch autograd then carries dWk, dU, dg through the preparation (solve, gates). Schedule knobs (chunk
length, tiles, warps, stages) never change what is computed; on a GPU the tiles, warps and stages are
autotuned over the configurations that `_chunk_configs` keeps (a resource model of shared memory and
registers per target, checked by `mirasc kernels` and its CI test). Where it keeps no configuration for a
kernel the path launches (`_chunk_fit_error`), _chunked_triton refuses the sizes before any launch and
backend="auto" runs torch. On the CPU interpreter the smallest tiles are used so tests cover several tiles."""

import triton
import triton.language as tl

from .dots import _chunk_dot, _out


@triton.jit
def _unit_lower_inverse(lt, BT: tl.constexpr):
    # (I + L)⁻¹ from Lᵀ (lt[j, i] = L_ij, L strictly lower) by forward substitution in fp32, one row a step:
    # row i of A is e_i - Σ_{j<i} L_ij A_j (rows j < i are final by then). Column i of Lᵀ is L's row i
    # indexed along A's rows, so no layout conversion is needed.
    rt = tl.arange(0, BT)
    a = tl.where(rt[:, None] == rt[None, :], 1.0, 0.0)
    for i in range(1, BT):
        li = tl.sum(tl.where(rt[None, :] == i, lt, 0.0), axis=1)  # L_i· over A's rows j
        row = tl.sum(li[:, None] * a, axis=0)
        a = tl.where(rt[:, None] == i, a - row[None, :], a)
    return a


@triton.jit
def _row(bh, tok, T, H, TF: tl.constexpr):
    # the rows of tokens `tok` of head bh (of B·H) in a [B, H, T, ·] tensor, or in a [B, T, H, ·] one (TF: the
    # layout layers hand over, read in place)
    if TF:
        r = ((bh // H) * T + tok) * H + bh % H
    else:
        r = bh * T + tok
    return r


@triton.jit
def _chunk_output_fwd(Q, KA, UU, G, CKPT, O, T, Nk, Nv, H,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, TF: tl.constexpr,
                      CH: tl.constexpr):
    # (2) for one chunk and one Dv tile: o = (Q ∘ e^{g}) W_0ᵀ - A u. One log-decay per head and token: KA is K,
    # A = (Q Kᵀ) ∘ D with D_ts = e^{g_t - g_s} (s <= t) formed here, and e^{g} scales the rows after the
    # product. CH (a decay over key channels, (2')): g [BT, Dk] scales Q before it, and KA is A, the chunk's
    # scores from _chunk_scores_fwd (sub-blocks, exponents <= 0).
    iv = tl.program_id(0)
    c = tl.program_id(1)
    bh = tl.program_id(2)
    NT = T // BT
    rt = tl.arange(0, BT)
    rv = iv * BV + tl.arange(0, BV)
    mv = rv < Nv
    tok = c * BT + rt
    o = tl.zeros([BT, BV], tl.float32)
    qk = tl.zeros([BT, BT], tl.float32)
    for kb in range(0, tl.cdiv(Nk, BK)):
        rk = kb * BK + tl.arange(0, BK)
        mk = rk < Nk
        q = tl.load(Q + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0)
        w = tl.load(CKPT + ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk[None, :],
                    mask=mv[:, None] & mk[None, :], other=0.0)
        if CH:
            gk = tl.load(G + (bh * T + tok[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
            o += _chunk_dot(q.to(tl.float32) * tl.exp(gk), tl.trans(w), PREC)
        else:
            k = tl.load(KA + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0)
            o += _chunk_dot(q, tl.trans(w), PREC)
            qk += _chunk_dot(q, tl.trans(k), PREC)
    if CH:
        a = tl.load(KA + ((bh * NT + c) * BT + rt[:, None]) * BT + rt[None, :])
    else:
        g = tl.load(G + bh * T + tok)
        causal = rt[:, None] >= rt[None, :]
        o = tl.exp(g)[:, None] * o
        a = qk * tl.where(causal, tl.exp(tl.where(causal, g[:, None] - g[None, :], 0.0)), 0.0)
    u = tl.load(UU + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)
    o -= _chunk_dot(a, u, PREC)
    tl.store(O + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], _out(o, O, PREC), mask=mv[None, :])


@triton.jit
def _log_decay_rows(G, bh, tok, T, Nk, rk, mk, CH: tl.constexpr):
    # the chunk-local cumulative log-decays g of tokens `tok` (of head bh): [rows, BK] over the key channels rk
    # (CH: G is [B·H, T, Nk]), else [rows, 1], one per head and token (G is [B·H, T]), to broadcast either way
    if CH:
        g = tl.load(G + (bh * T + tok[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
    else:
        g = tl.load(G + bh * T + tok)[:, None]
    return g


# The scans over chunks, the only sequential part of (1), for both decays. The chunk's rows go in sub-blocks of
# BC: u of a sub-block needs only W_0, and the update sums over sub-blocks. One log-decay per head and token
# scales rows (u's in the forward, dO's in the backward), in sub-blocks of any BC dividing BT (the whole chunk,
# BC = BT, feeds a warpgroup's HGMMA a 64-row tile; 16 rows hold fewer registers); a log-decay per key channel
# (CH, docs/semantics.md: channel-wise gates) scales the key's (or query's) columns, in sub-blocks of 16 so that
# no [BT, BK] fp32 tile is live. The state tile [BV, Dk] is one [BV, BK] block or two (TWO_K: columns
# BK..2BK-1), so that no operand is wider than BK. Which BC and BK a launch takes is a schedule choice
# (mirasc.runtime.chunk_space).
@triton.jit
def _chunk_state_fwd(K, WK, U, ETA, G, W_in, UU, W_out, CKPT, T, Nk, Nv, H,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, TWO_K: tl.constexpr,
                     HAS_WK: tl.constexpr, PREC: tl.constexpr, BC: tl.constexpr, SCALE_U: tl.constexpr,
                     TF: tl.constexpr, CH: tl.constexpr):
    # per chunk: W_0 -> CKPT; u = Wk W_0ᵀ - U -> UU; W <- W_0 e^{g_n} - uᵀ (K ∘ e^{g_n - g})
    iv = tl.program_id(0)
    bh = tl.program_id(1)
    NT = T // BT
    rs = tl.arange(0, BC)
    rk0 = tl.arange(0, BK)
    rv = iv * BV + tl.arange(0, BV)
    mv = rv < Nv
    mk0 = rk0 < Nk
    w0 = tl.load(W_in + (bh * Nv + rv[:, None]) * Nk + rk0[None, :], mask=mv[:, None] & mk0[None, :], other=0.0)
    if TWO_K:
        rk1 = BK + tl.arange(0, BK)
        mk1 = rk1 < Nk
        w1 = tl.load(W_in + (bh * Nv + rv[:, None]) * Nk + rk1[None, :], mask=mv[:, None] & mk1[None, :],
                     other=0.0)
    for c in range(NT):
        end = c * BT + BT - 1 + tl.zeros([1], tl.int32)
        tl.store(CKPT + ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk0[None, :], _out(w0, CKPT, PREC),
                 mask=mv[:, None] & mk0[None, :])
        gn0 = _log_decay_rows(G, bh, end, T, Nk, rk0, mk0, CH)
        acc0 = tl.exp(gn0) * w0
        if TWO_K:
            tl.store(CKPT + ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk1[None, :], _out(w1, CKPT, PREC),
                     mask=mv[:, None] & mk1[None, :])
            gn1 = _log_decay_rows(G, bh, end, T, Nk, rk1, mk1, CH)
            acc1 = tl.exp(gn1) * w1
        for h in range(BT // BC):
            tok = c * BT + h * BC + rs
            if SCALE_U:  # U is v as given (the layout of K): u = η v
                vt = tl.load(U + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], mask=mv[None, :], other=0.0)
                u = -tl.load(ETA + bh * T + tok)[:, None] * vt.to(tl.float32)
            else:
                u = -tl.load(U + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)
            if HAS_WK:
                wk0 = tl.load(WK + (bh * T + tok[:, None]) * Nk + rk0[None, :], mask=mk0[None, :], other=0.0)
                u += _chunk_dot(wk0, tl.trans(w0), PREC)
                if TWO_K:
                    wk1 = tl.load(WK + (bh * T + tok[:, None]) * Nk + rk1[None, :], mask=mk1[None, :],
                                  other=0.0)
                    u += _chunk_dot(wk1, tl.trans(w1), PREC)
            tl.store(UU + (bh * T + tok[:, None]) * Nv + rv[None, :], _out(u, UU, PREC), mask=mv[None, :])
            k0 = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk0[None, :], mask=mk0[None, :], other=0.0)
            g0 = _log_decay_rows(G, bh, tok, T, Nk, rk0, mk0, CH)
            if CH:
                ut = tl.trans(u)
                acc0 -= _chunk_dot(ut, k0.to(tl.float32) * tl.exp(gn0 - g0), PREC)
            else:
                ut = tl.trans(u * tl.exp(gn0 - g0))
                acc0 -= _chunk_dot(ut, k0, PREC)
            if TWO_K:
                k1 = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk1[None, :], mask=mk1[None, :],
                             other=0.0)
                if CH:
                    g1 = _log_decay_rows(G, bh, tok, T, Nk, rk1, mk1, CH)
                    acc1 -= _chunk_dot(ut, k1.to(tl.float32) * tl.exp(gn1 - g1), PREC)
                else:
                    acc1 -= _chunk_dot(ut, k1, PREC)
        w0 = acc0
        if TWO_K:
            w1 = acc1
    tl.store(W_out + (bh * Nv + rv[:, None]) * Nk + rk0[None, :], w0, mask=mv[:, None] & mk0[None, :])
    if TWO_K:
        tl.store(W_out + (bh * Nv + rv[:, None]) * Nk + rk1[None, :], w1, mask=mv[:, None] & mk1[None, :])


# Reverse scan. dw = ∂ℓ/∂(state after chunk c) -> DH[c]; per chunk, with DU holding the chunk-local
# -(D∘QKᵀ)ᵀ dO (_chunk_du_local_bwd):
#   du = DU - (K ∘ e^{g_n - g}) dwᵀ                                              -> DU
#   dw <- dw e^{g_n} + dOᵀ (Q ∘ e^{g}) + duᵀ Wk    (the cotangent of W_0)
@triton.jit
def _chunk_state_bwd(Q, K, WK, G, DO, DW_final, DH, DU, DW_init, V, ETA, DV, DETA, T, Nk, Nv, H,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, TWO_K: tl.constexpr,
                     HAS_WK: tl.constexpr, PREC: tl.constexpr, BC: tl.constexpr, SCALE_U: tl.constexpr,
                     TF: tl.constexpr, CH: tl.constexpr):
    iv = tl.program_id(0)
    bh = tl.program_id(1)
    NT = T // BT
    rs = tl.arange(0, BC)
    rk0 = tl.arange(0, BK)
    rv = iv * BV + tl.arange(0, BV)
    mv = rv < Nv
    mk0 = rk0 < Nk
    dw0 = tl.load(DW_final + (bh * Nv + rv[:, None]) * Nk + rk0[None, :], mask=mv[:, None] & mk0[None, :],
                  other=0.0)
    if TWO_K:
        rk1 = BK + tl.arange(0, BK)
        mk1 = rk1 < Nk
        dw1 = tl.load(DW_final + (bh * Nv + rv[:, None]) * Nk + rk1[None, :], mask=mv[:, None] & mk1[None, :],
                      other=0.0)
    for cc in range(NT):
        c = NT - 1 - cc
        end = c * BT + BT - 1 + tl.zeros([1], tl.int32)
        tl.store(DH + ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk0[None, :], _out(dw0, DH, PREC),
                 mask=mv[:, None] & mk0[None, :])
        gn0 = _log_decay_rows(G, bh, end, T, Nk, rk0, mk0, CH)
        acc0 = tl.exp(gn0) * dw0
        if TWO_K:
            tl.store(DH + ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk1[None, :], _out(dw1, DH, PREC),
                     mask=mv[:, None] & mk1[None, :])
            gn1 = _log_decay_rows(G, bh, end, T, Nk, rk1, mk1, CH)
            acc1 = tl.exp(gn1) * dw1
        for h in range(BT // BC):
            tok = c * BT + h * BC + rs
            k0 = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk0[None, :], mask=mk0[None, :], other=0.0)
            g0 = _log_decay_rows(G, bh, tok, T, Nk, rk0, mk0, CH)
            if CH:  # (a scale per key column: on the key)
                kdw = _chunk_dot(k0 * tl.exp(gn0 - g0), tl.trans(dw0), PREC)
            else:  # (a scale per row: on the product, so the key is an operand as loaded, no fp32 copy of it)
                kdw = _chunk_dot(k0, tl.trans(dw0), PREC)
            if TWO_K:
                k1 = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk1[None, :], mask=mk1[None, :],
                             other=0.0)
                if CH:
                    g1 = _log_decay_rows(G, bh, tok, T, Nk, rk1, mk1, CH)
                    kdw += _chunk_dot(k1 * tl.exp(gn1 - g1), tl.trans(dw1), PREC)
                else:
                    kdw += _chunk_dot(k1, tl.trans(dw1), PREC)
            if not CH:
                kdw = kdw * tl.exp(gn0 - g0)
            do = tl.load(DO + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], mask=mv[None, :], other=0.0)
            du = tl.load(DU + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0) - kdw
            _store_du(du, DU, V, ETA, DV, DETA, bh, iv, tok, rv, mv, T, Nv, H, TF, SCALE_U, PREC)
            q0 = tl.load(Q + _row(bh, tok, T, H, TF)[:, None] * Nk + rk0[None, :], mask=mk0[None, :], other=0.0)
            if CH:
                dog = tl.trans(do)
                acc0 += _chunk_dot(dog, q0.to(tl.float32) * tl.exp(g0), PREC)
            else:
                dog = tl.trans(do * tl.exp(g0))
                acc0 += _chunk_dot(dog, q0, PREC)
            if HAS_WK:
                wk0 = tl.load(WK + (bh * T + tok[:, None]) * Nk + rk0[None, :], mask=mk0[None, :], other=0.0)
                acc0 += _chunk_dot(tl.trans(du), wk0, PREC)
            if TWO_K:
                q1 = tl.load(Q + _row(bh, tok, T, H, TF)[:, None] * Nk + rk1[None, :], mask=mk1[None, :],
                             other=0.0)
                if CH:
                    acc1 += _chunk_dot(dog, q1.to(tl.float32) * tl.exp(g1), PREC)
                else:
                    acc1 += _chunk_dot(dog, q1, PREC)
                if HAS_WK:
                    wk1 = tl.load(WK + (bh * T + tok[:, None]) * Nk + rk1[None, :], mask=mk1[None, :],
                                  other=0.0)
                    acc1 += _chunk_dot(tl.trans(du), wk1, PREC)
        dw0 = acc0
        if TWO_K:
            dw1 = acc1
    tl.store(DW_init + (bh * Nv + rv[:, None]) * Nk + rk0[None, :], dw0, mask=mv[:, None] & mk0[None, :])
    if TWO_K:
        tl.store(DW_init + (bh * Nv + rv[:, None]) * Nk + rk1[None, :], dw1, mask=mv[:, None] & mk1[None, :])


@triton.jit
def _store_du(du, DU, V, ETA, DV, DETA, bh, iv, tok, rv, mv, T, Nv, H, TF: tl.constexpr, SCALE_U: tl.constexpr,
              PREC: tl.constexpr):
    # the reverse scan's du of rows `tok` -> DU; with U = η v formed in the scan (SCALE_U) its gradients instead:
    # dv = -η du (v's layout and dtype), dη = -Σ du∘v (a partial sum per Dv tile)
    if SCALE_U:
        eta = tl.load(ETA + bh * T + tok)
        vt = tl.load(V + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], mask=mv[None, :], other=0.0)
        tl.store(DV + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], _out(-eta[:, None] * du, DV, PREC),
                 mask=mv[None, :])
        tl.store(DETA + (iv * tl.num_programs(1) + bh) * T + tok, -tl.sum(du * vt.to(tl.float32), axis=1))
    else:
        tl.store(DU + (bh * T + tok[:, None]) * Nv + rv[None, :], du, mask=mv[None, :])
