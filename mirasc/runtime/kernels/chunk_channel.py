"""The chunk kernels with a log-decay per key channel (docs/kernels.md; GLA, HGRN2, KDA): the backward's
chunk-local du and the gradients, the cumulative log-decays, the chunk's scores in 16-row sub-blocks and their
backward; and the delta family's preparation on those scores. (The scans and the output kernel serve both
decays: chunk.py.)"""

import triton
import triton.language as tl

from .chunk import _row, _unit_lower_inverse
from .dots import _chunk_dot, _out


# Key-channel decay (alpha=gate(k), docs/semantics.md: channel-wise gates): g_t ∈ R^Dk, and (1)-(2) become
#     W_t = W_0 diag(e^{g_t}) - Σ_{s<=t} u_s (k_s ∘ e^{g_t - g_s})ᵀ                        (1')
#     o_t = W_0 (q_t ∘ e^{g_t}) - Σ_{s<=t} A_ts u_s,   A_ts = Σ_j q_tj k_sj e^{g_tj - g_sj}   (2')
# Every exponent the kernels take is <= 0 (g falls along the chunk), so a tiny α cannot overflow. The state
# terms need no care (e^{g_t}, e^{g_n - g_s} <= 1); the scores A do: a chunk is cut into sub-blocks of BC = 16
# rows, and the scores of rows in sub-block i with columns in earlier sub-blocks go through its reference point
# ρ_i = the last row before it:
#     A_ts = Σ_j (q_tj e^{g_tj - g_ρj}) (k_sj e^{g_ρj - g_sj})          (s <= ρ_i < t)
# the [BC, BC] diagonal ones from a materialised [BC, BC, BK] factor e^{g_t - g_s} (s <= t, masked before the
# exp). _chunk_scores_fwd computes A once per chunk (one program per sub-block); the output kernel and the
# backward's du (-Aᵀ dO) read it over whole chunks, and the gradients kernel takes dA's rows and columns of
# its sub-block through ρ_i and through r_i (its last row) the same way. The scans (chunk.py) hold the state exactly
# as in the per-head case, with the decay as a vector over columns. The written key (the kernels' K) is η ⊙ k
# for lr=gate(k). The delta family's preparation takes its channel-contracted scores Σ_j k_tj w_sj
# e^{x_tj - g_sj} from _chunk_scores_fwd/_bwd too.
@triton.jit
def _chunk_du_local_bwd(A, UU, DO, DU, DA, T, Nk, Nv, H,
                        BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, TF: tl.constexpr):
    # One chunk, every Dv tile: the chunk-local part of du, du = -Aᵀ dO -> DU, and the scores' cotangent
    # dA_ts = -dO_t·u_s (s <= t, 0 above the diagonal) -> DA, summed over Dv here once for the gradients
    # kernel's programs (Nk and BK: the chunk kernels' autotuning key and space; unused here)
    c = tl.program_id(0)
    bh = tl.program_id(1)
    NT = T // BT
    rt = tl.arange(0, BT)
    tok = c * BT + rt
    sq = ((bh * NT + c) * BT + rt[:, None]) * BT + rt[None, :]
    a = tl.load(A + sq)
    da = tl.zeros([BT, BT], tl.float32)
    for vb in range(0, tl.cdiv(Nv, BV)):
        rv = vb * BV + tl.arange(0, BV)
        mv = rv < Nv
        do = tl.load(DO + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], mask=mv[None, :], other=0.0)
        u = tl.load(UU + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)
        tl.store(DU + (bh * T + tok[:, None]) * Nv + rv[None, :], -_chunk_dot(tl.trans(a), do, PREC),
                 mask=mv[None, :])
        da -= _chunk_dot(do, tl.trans(u), PREC)
    tl.store(DA + sq, tl.where(rt[:, None] >= rt[None, :], da, 0.0))


# Sub-block i of one chunk, one Dk tile, summing over Dv in BV blocks. With dA from _chunk_du_local_bwd,
# ρ the row before the sub-block, r its last row, n the chunk's last row, dw = DH (the cotangent of
# the state after the chunk):
#   dq_t = e^{g_t} ∘ (dO_t W_0) + Σ_{s<=t} dA_ts k_s ∘ e^{g_t - g_s}
#   dk_s = -e^{g_n - g_s} ∘ (u_s dw) + Σ_{t>=s} dA_ts q_t ∘ e^{g_t - g_s}
#   dWk = du W_0
# the sums over earlier (later) sub-blocks through ρ (r): e^{g_t - g_ρ} ∘ Σ_s dA_ts (k_s ∘ e^{g_ρ - g_s}),
# e^{g_r - g_s} ∘ Σ_t dA_ts (q_t ∘ e^{g_t - g_r}); the diagonal sub-block from the materialised
# e^{g_t - g_s}: no exponent above 0. dg, per channel, from (1')-(2') by differentiating in g_t:
# g_t enters o_t through q_t ∘ e^{g_t} and A_t· (as q does), A_·t and the state through
# e^{-g_t} (as k does), and g_n the state through e^{g_n}; hence
#   dg_t = q_t ∘ dq_t - k_t ∘ dk_t
#          [t = n: + e^{g_n} ∘ colsum(dw ∘ W_0) - colsum(dw ∘ uᵀ(K ∘ e^{g_n - g}))]
# (the last bracket is Σ_s k_s ∘ dk_s's state part, which -k ∘ dk took away from g_n). Every term
# is per channel: no partial sums over Dk tiles. Torch turns dg into d log α (cumsum's reverse).
@triton.jit
def _chunk_grads_bwd(Q, K, UU, G, CKPT, DH, DO, DU, DA, DQ, DK, DWK, DG, T, Nk, Nv, H,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_WK: tl.constexpr,
                     PREC: tl.constexpr, BC: tl.constexpr, FINAL_DK: tl.constexpr, TF: tl.constexpr):
    ik = tl.program_id(0)
    NC = BT // BC
    c = tl.program_id(1) // NC
    i = tl.program_id(1) % NC
    bh = tl.program_id(2)
    NT = T // BT
    rt = tl.arange(0, BT)
    rs = tl.arange(0, BC)
    rk = ik * BK + tl.arange(0, BK)
    mk = rk < Nk
    tok_c = c * BT + rt
    tok = c * BT + i * BC + rs
    before = rt < i * BC
    after = rt >= (i + 1) * BC
    g_ref = tl.where(i > 0, tl.load(G + (bh * T + tl.maximum(c * BT + i * BC - 1, 0)) * Nk + rk, mask=mk,
                                    other=0.0), 0.0)
    g_r = tl.load(G + (bh * T + c * BT + (i + 1) * BC - 1) * Nk + rk, mask=mk, other=0.0)
    g_n = tl.load(G + (bh * T + c * BT + BT - 1) * Nk + rk, mask=mk, other=0.0)
    is_last = i == NC - 1
    dq = tl.zeros([BC, BK], tl.float32)
    dk = tl.zeros([BC, BK], tl.float32)
    dwk = tl.zeros([BC, BK], tl.float32)
    dg_n = tl.zeros([BK], tl.float32)
    for vb in range(0, tl.cdiv(Nv, BV)):
        rv = vb * BV + tl.arange(0, BV)
        mv = rv < Nv
        w = tl.load(CKPT + ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk[None, :],
                    mask=mv[:, None] & mk[None, :], other=0.0)
        dw = tl.load(DH + ((bh * NT + c) * Nv + rv[:, None]) * Nk + rk[None, :],
                     mask=mv[:, None] & mk[None, :], other=0.0)
        u = tl.load(UU + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)
        do = tl.load(DO + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], mask=mv[None, :], other=0.0)
        dq += _chunk_dot(do, w, PREC)
        dk -= _chunk_dot(u, dw, PREC)
        if HAS_WK:
            du = tl.load(DU + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)
            dwk += _chunk_dot(du, w, PREC)
        if is_last:
            u_c = tl.load(UU + (bh * T + tok_c[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)
            k_n = tl.load(K + _row(bh, tok_c, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                          other=0.0).to(tl.float32)
            k_n = k_n * tl.exp(g_n[None, :] - tl.load(G + (bh * T + tok_c[:, None]) * Nk + rk[None, :],
                                                      mask=mk[None, :], other=0.0))
            dg_n += tl.sum(dw * (tl.exp(g_n)[None, :] * w - _chunk_dot(tl.trans(u_c), k_n, PREC)), axis=0)
    q = tl.load(Q + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0).to(tl.float32)
    k = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :], other=0.0).to(tl.float32)
    g = tl.load(G + (bh * T + tok[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
    q_c = tl.load(Q + _row(bh, tok_c, T, H, TF)[:, None] * Nk + rk[None, :],
                  mask=mk[None, :], other=0.0).to(tl.float32)
    k_c = tl.load(K + _row(bh, tok_c, T, H, TF)[:, None] * Nk + rk[None, :],
                  mask=mk[None, :], other=0.0).to(tl.float32)
    g_c = tl.load(G + (bh * T + tok_c[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
    k_ref = k_c * tl.exp(tl.where(before[:, None], g_ref[None, :] - g_c, float("-inf")))
    q_r = q_c * tl.exp(tl.where(after[:, None], g_c - g_r[None, :], float("-inf")))
    sq = (bh * NT + c) * BT
    da_rows = tl.load(DA + (sq + i * BC + rs[:, None]) * BT + rt[None, :], mask=before[None, :], other=0.0)
    da_cols = tl.load(DA + (sq + rt[:, None]) * BT + i * BC + rs[None, :], mask=after[:, None], other=0.0)
    da = tl.load(DA + (sq + i * BC + rs[:, None]) * BT + i * BC + rs[None, :])
    dq = dq * tl.exp(g) + tl.exp(g - g_ref[None, :]) * _chunk_dot(da_rows, k_ref, PREC)
    dk = dk * tl.exp(g_n[None, :] - g) + tl.exp(g_r[None, :] - g) * _chunk_dot(tl.trans(da_cols), q_r, PREC)
    causal = (rs[:, None] >= rs[None, :])[:, :, None]
    e = tl.exp(tl.where(causal, g[:, None, :] - g[None, :, :], float("-inf")))  # [t, s, BK]
    dae = da[:, :, None] * e
    dq += tl.sum(dae * k[None, :, :], axis=1)
    dk += tl.sum(dae * q[:, None, :], axis=0)
    dg = q * dq - k * dk + tl.where((rs == BC - 1)[:, None], dg_n[None, :], 0.0)
    tl.store(DQ + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], _out(dq, DQ, PREC), mask=mk[None, :])
    if FINAL_DK:  # the key's whole gradient: in its layout and dtype
        tl.store(DK + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], _out(dk, DK, PREC), mask=mk[None, :])
    else:
        tl.store(DK + (bh * T + tok[:, None]) * Nk + rk[None, :], dk, mask=mk[None, :])
    tl.store(DG + (bh * T + tok[:, None]) * Nk + rk[None, :], dg, mask=mk[None, :])
    if HAS_WK:
        tl.store(DWK + (bh * T + tok[:, None]) * Nk + rk[None, :], dwk, mask=mk[None, :])


@triton.jit
def _log_decay_fwd(A, G, T, Nk, n, s_b, s_h, s_t, s_k, H, BT: tl.constexpr, BK: tl.constexpr):
    # g = Σ_{r<=t in the chunk} log max(α_r, tiny) per key channel, from α in any layout (strides) into
    # [B, H, NT·n, Dk] fp32; tokens past T have α = 1 (g stays put). Grid (Dk tiles, chunks, B·H).
    ik = tl.program_id(0)
    c = tl.program_id(1)
    bh = tl.program_id(2)
    rt = tl.arange(0, BT)
    rk = ik * BK + tl.arange(0, BK)
    tok = c * n + rt
    rows = rt < n
    a = tl.load(A + (bh // H) * s_b + (bh % H) * s_h + tok[:, None] * s_t + rk[None, :] * s_k,
                mask=(rows & (tok < T))[:, None] & (rk < Nk)[None, :], other=1.0).to(tl.float32)
    g = tl.cumsum(tl.log(tl.maximum(a, 1.1754943508222875e-38)), axis=0)
    tl.store(G + (bh * tl.num_programs(1) * n + tok[:, None]) * Nk + rk[None, :], g,
             mask=rows[:, None] & (rk < Nk)[None, :])


@triton.jit
def _log_decay_bwd(A, DG, DA, T, Nk, n, s_b, s_h, s_t, s_k, d_b, d_h, d_t, d_k, H, BT: tl.constexpr,
                   BK: tl.constexpr):
    # dα_t = (Σ_{s>=t in the chunk} dg_s) / α_t where α_t >= tiny (the clamp passes no gradient below it)
    ik = tl.program_id(0)
    c = tl.program_id(1)
    bh = tl.program_id(2)
    rt = tl.arange(0, BT)
    rk = ik * BK + tl.arange(0, BK)
    tok = c * n + rt
    m = ((rt < n) & (tok < T))[:, None] & (rk < Nk)[None, :]
    dg = tl.load(DG + (bh * tl.num_programs(1) * n + tok[:, None]) * Nk + rk[None, :],
                 mask=(rt < n)[:, None] & (rk < Nk)[None, :], other=0.0)
    a = tl.load(A + (bh // H) * s_b + (bh % H) * s_h + tok[:, None] * s_t + rk[None, :] * s_k, mask=m,
                other=1.0).to(tl.float32)
    da = tl.where(a >= 1.1754943508222875e-38, tl.cumsum(dg, axis=0, reverse=True) / a, 0.0)
    tl.store(DA + (bh // H) * d_b + (bh % H) * d_h + tok[:, None] * d_t + rk[None, :] * d_k, da, mask=m)


@triton.jit
def _chunk_scores_fwd(A, Bw, X, Y, P, Q2, P2, T, Nk, H,
                      BT: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr, TF: tl.constexpr,
                      DIAG: tl.constexpr, WITH_Q2: tl.constexpr):
    # The channel-contracted scores of one chunk, rows of sub-block i:
    #   P_ts = Σ_j a_tj b_sj e^{x_tj - y_sj}   (s < t, or s <= t with DIAG; 0 elsewhere, written here)
    # with y the cumulative log-decay and x <= y_s for s < t (x = y, or y one row back for order=post):
    # the output's A (a = q, b = k, DIAG) and the delta rule's preparation's P (a = b = k).
    # Earlier sub-blocks through ρ = y at the row before sub-block i: (a ∘ e^{x - y_ρ}) (b ∘ e^{y_ρ - y})ᵀ;
    # the diagonal sub-block from the materialised e^{x_t - y_s} (s < t or s <= t). No exponent above 0.
    # WITH_Q2: also P2_ts = Σ_j q2_tj b_sj e^{y_tj - y_sj} (s <= t) from the same b, y tiles (the key-channel
    # delta rule's output scores beside its preparation's).
    NC = BT // BC
    c = tl.program_id(0) // NC
    i = tl.program_id(0) % NC
    bh = tl.program_id(1)
    NT = T // BT
    rt = tl.arange(0, BT)
    rs = tl.arange(0, BC)
    tok_c = c * BT + rt
    tok = c * BT + i * BC + rs
    before = rt < i * BC
    ref = bh * T + tl.maximum(c * BT + i * BC - 1, 0)
    p = tl.zeros([BC, BT], tl.float32)
    d = tl.zeros([BC, BC], tl.float32)
    p2 = tl.zeros([BC, BT], tl.float32)
    d2 = tl.zeros([BC, BC], tl.float32)
    incl = (rs[:, None] >= rs[None, :])[:, :, None]
    if DIAG:
        kept = incl
    else:
        kept = (rs[:, None] > rs[None, :])[:, :, None]
    for kb in range(0, tl.cdiv(Nk, BK)):
        rk = kb * BK + tl.arange(0, BK)
        mk = rk < Nk
        y_ref = tl.where(i > 0, tl.load(Y + ref * Nk + rk, mask=mk, other=0.0), 0.0)
        b_c = tl.load(Bw + _row(bh, tok_c, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                  other=0.0).to(tl.float32)
        y_c = tl.load(Y + (bh * T + tok_c[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
        a = tl.load(A + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                  other=0.0).to(tl.float32)
        b = tl.load(Bw + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                  other=0.0).to(tl.float32)
        x = tl.load(X + (bh * T + tok[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
        y = tl.load(Y + (bh * T + tok[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
        right = b_c * tl.exp(tl.where(before[:, None], y_ref[None, :] - y_c, float("-inf")))
        p += _chunk_dot(a * tl.exp(x - y_ref[None, :]), tl.trans(right), PREC)
        e = tl.exp(tl.where(kept, x[:, None, :] - y[None, :, :], float("-inf")))
        d += tl.sum(a[:, None, :] * b[None, :, :] * e, axis=2)
        if WITH_Q2:
            q2 = tl.load(Q2 + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                         other=0.0).to(tl.float32)
            p2 += _chunk_dot(q2 * tl.exp(y - y_ref[None, :]), tl.trans(right), PREC)
            d2 += tl.sum(q2[:, None, :] * b[None, :, :] * tl.exp(tl.where(incl, y[:, None, :] - y[None, :, :],
                                                                            float("-inf"))), axis=2)
    row = (bh * NT + c) * BT + i * BC + rs
    _store_score_rows(P, row, i, p, d, BT, BC, PREC)
    if WITH_Q2:
        _store_score_rows(P2, row, i, p2, d2, BT, BC, PREC)


@triton.jit
def _store_score_rows(P, row, i, p, d, BT: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    # rows `row` (sub-block i) of a chunk's [BT, BT] scores: p on the columns of earlier sub-blocks, the
    # diagonal block d, zeros after it (the whole row written: callers allocate without filling)
    rt = tl.arange(0, BT)
    rs = tl.arange(0, BC)
    tl.store(P + row[:, None] * BT + rt[None, :], _out(p, P, PREC), mask=(rt < i * BC)[None, :])
    tl.store(P + row[:, None] * BT + i * BC + rs[None, :], _out(d, P, PREC))
    tl.store(P + row[:, None] * BT + rt[None, :], tl.zeros([BC, BT], tl.float32),
             mask=(rt >= (i + 1) * BC)[None, :])


@triton.jit
def _chunk_scores_bwd(A, Bw, X, Y, DP, DA, DB, DX, DY, DK_IN, T, Nk, H,
                      BT: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr, TF: tl.constexpr,
                      FUSED: tl.constexpr):
    # The reverse of _chunk_scores_fwd for sub-block i of one chunk and one Dk tile, from dP (s < t read):
    #   da_t = Σ_{s<t} dP_ts b_s ∘ e^{x_t - y_s}      db_s = Σ_{t>s} dP_ts a_t ∘ e^{x_t - y_s}
    #   dx_t = a_t ∘ da_t                              dy_s = -b_s ∘ db_s
    # da of rows i through ρ (the row before i), db of columns i through r (i's last row), exponents <= 0.
    ik = tl.program_id(0)
    NC = BT // BC
    c = tl.program_id(1) // NC
    i = tl.program_id(1) % NC
    bh = tl.program_id(2)
    NT = T // BT
    rt = tl.arange(0, BT)
    rs = tl.arange(0, BC)
    rk = ik * BK + tl.arange(0, BK)
    mk = rk < Nk
    tok_c = c * BT + rt
    tok = c * BT + i * BC + rs
    before = rt < i * BC
    after = rt >= (i + 1) * BC
    y_ref = tl.where(i > 0, tl.load(Y + (bh * T + tl.maximum(c * BT + i * BC - 1, 0)) * Nk + rk, mask=mk,
                                    other=0.0), 0.0)
    y_r = tl.load(Y + (bh * T + c * BT + (i + 1) * BC - 1) * Nk + rk, mask=mk, other=0.0)
    a_c = tl.load(A + _row(bh, tok_c, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                  other=0.0).to(tl.float32)
    b_c = tl.load(Bw + _row(bh, tok_c, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                  other=0.0).to(tl.float32)
    x_c = tl.load(X + (bh * T + tok_c[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
    y_c = tl.load(Y + (bh * T + tok_c[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
    a = tl.load(A + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                  other=0.0).to(tl.float32)
    b = tl.load(Bw + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                  other=0.0).to(tl.float32)
    x = tl.load(X + (bh * T + tok[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
    y = tl.load(Y + (bh * T + tok[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)
    base = (bh * NT + c) * BT
    dp_rows = tl.load(DP + (base + i * BC + rs[:, None]) * BT + rt[None, :], mask=before[None, :], other=0.0)
    dp_cols = tl.load(DP + (base + rt[:, None]) * BT + i * BC + rs[None, :], mask=after[:, None], other=0.0)
    dp = tl.load(DP + (base + i * BC + rs[:, None]) * BT + i * BC + rs[None, :])
    right = b_c * tl.exp(tl.where(before[:, None], y_ref[None, :] - y_c, float("-inf")))
    left = a_c * tl.exp(tl.where(after[:, None], x_c - y_r[None, :], float("-inf")))
    da = tl.exp(x - y_ref[None, :]) * _chunk_dot(dp_rows, right, PREC)
    db = tl.exp(y_r[None, :] - y) * _chunk_dot(tl.trans(dp_cols), left, PREC)
    strict = (rs[:, None] > rs[None, :])[:, :, None]
    dpe = dp[:, :, None] * tl.exp(tl.where(strict, x[:, None, :] - y[None, :, :], float("-inf")))  # [t, s, BK]
    da += tl.sum(dpe * b[None, :, :], axis=1)
    db += tl.sum(dpe * a[:, None, :], axis=0)
    out = (bh * T + tok[:, None]) * Nk + rk[None, :]
    if FUSED:  # a = b = k, x = y = g (the key-channel delta op): the key's and g's whole gradients, adding the
        # other kernels' parts in DK_IN and DY (fp32), dk in the key's layout and dtype
        dk = da + db + tl.load(DK_IN + out, mask=mk[None, :], other=0.0)
        tl.store(DA + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], _out(dk, DA, PREC), mask=mk[None, :])
        tl.store(DY + out, a * da - b * db + tl.load(DY + out, mask=mk[None, :], other=0.0), mask=mk[None, :])
    else:
        tl.store(DA + out, da, mask=mk[None, :])
        tl.store(DB + out, db, mask=mk[None, :])
        tl.store(DX + out, a * da, mask=mk[None, :])
        tl.store(DY + out, -b * db, mask=mk[None, :])


# ---- the delta rule's chunk preparation with a key-channel decay: the scores P_ts = Σ_j k_tj w_sj e^{x_tj -
# g_sj} (s < t) come from _chunk_scores_fwd; with L = β ∘ P, A = (I + L)⁻¹ and the right sides
# R = [β e^{x} ∘ K | β ∘ V] (e^{x} per key channel): Wk = A R_k, U = A R_v. The backward returns dP for the
# scores kernels' backward, and dK, dx (per channel), dV, dβ of the right sides.
@triton.jit
def _wy_fwd(P, K, X, V, BETA, WK, U, T, Nk, Nv, H,
            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, PREC_A: tl.constexpr,
            TF: tl.constexpr):
    c = tl.program_id(0)
    bh = tl.program_id(1)
    NT = T // BT
    rt = tl.arange(0, BT)
    tok = c * BT + rt
    beta = tl.load(BETA + bh * T + tok)
    p = tl.load(P + ((bh * NT + c) * BT + rt[:, None]) * BT + rt[None, :])
    a = _unit_lower_inverse(tl.trans(beta[:, None] * p), BT)
    for kb in range(0, tl.cdiv(Nk, BK)):
        rk = kb * BK + tl.arange(0, BK)
        mk = rk < Nk
        rows = (bh * T + tok[:, None]) * Nk + rk[None, :]
        k = tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                    other=0.0).to(tl.float32)
        x = tl.load(X + rows, mask=mk[None, :], other=0.0)
        wk = _chunk_dot(a, beta[:, None] * tl.exp(x) * k, PREC_A)
        tl.store(WK + rows, _out(wk, WK, PREC), mask=mk[None, :])
    for vb in range(0, tl.cdiv(Nv, BV)):
        rv = vb * BV + tl.arange(0, BV)
        mv = rv < Nv
        rows = (bh * T + tok[:, None]) * Nv + rv[None, :]
        vt = tl.load(V + _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :], mask=mv[None, :], other=0.0)
        u = _chunk_dot(a * beta[None, :], vt, PREC_A)
        tl.store(U + rows, _out(u, U, PREC), mask=mv[None, :])


@triton.jit
def _wy_bwd(P, K, X, V, BETA, WK, U, DWK, DU, DP, DK, DX, DV, DBETA, T, Nk, Nv, H,
            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, PREC_A: tl.constexpr,
            TF: tl.constexpr, FUSED: tl.constexpr):
    # dR = Aᵀ [dWk | dU], dL = -(dR [Wk | U]ᵀ) strictly lower, dP = β ∘ dL;
    # dβ_t = Σ_s dL_ts P_ts + Σ dR_t R_t / β_t
    # FUSED (the key-channel delta op): DU holds du, whose negative is U's cotangent, and dK, dx are added to
    # what DK and DX hold (the scan's parts); dV goes out in v's layout and dtype
    c = tl.program_id(0)
    bh = tl.program_id(1)
    NT = T // BT
    rt = tl.arange(0, BT)
    tok = c * BT + rt
    beta = tl.load(BETA + bh * T + tok)
    ptile = ((bh * NT + c) * BT + rt[:, None]) * BT + rt[None, :]
    p = tl.load(P + ptile)
    at = tl.trans(_unit_lower_inverse(tl.trans(beta[:, None] * p), BT))
    dl = tl.zeros([BT, BT], tl.float32)
    dbeta = tl.zeros([BT], tl.float32)
    for kb in range(0, tl.cdiv(Nk, BK)):
        rk = kb * BK + tl.arange(0, BK)
        mk = rk < Nk
        rows = (bh * T + tok[:, None]) * Nk + rk[None, :]
        dr = _chunk_dot(at, tl.load(DWK + rows, mask=mk[None, :], other=0.0), PREC_A)
        dl -= _chunk_dot(dr, tl.trans(tl.load(WK + rows, mask=mk[None, :], other=0.0)), PREC_A)
        ex = tl.exp(tl.load(X + rows, mask=mk[None, :], other=0.0))
        ek = ex * tl.load(K + _row(bh, tok, T, H, TF)[:, None] * Nk + rk[None, :], mask=mk[None, :],
                          other=0.0).to(tl.float32)
        dbeta += tl.sum(dr * ek, axis=1)
        dk = dr * (beta[:, None] * ex)
        dx = dr * beta[:, None] * ek
        if FUSED:
            dk += tl.load(DK + rows, mask=mk[None, :], other=0.0)
            dx += tl.load(DX + rows, mask=mk[None, :], other=0.0)
        tl.store(DK + rows, dk, mask=mk[None, :])
        tl.store(DX + rows, dx, mask=mk[None, :])
    for vb in range(0, tl.cdiv(Nv, BV)):
        rv = vb * BV + tl.arange(0, BV)
        mv = rv < Nv
        rows = (bh * T + tok[:, None]) * Nv + rv[None, :]
        du = tl.load(DU + rows, mask=mv[None, :], other=0.0)
        if FUSED:
            du = -du
        dr = _chunk_dot(at, du, PREC_A)
        dl -= _chunk_dot(dr, tl.trans(tl.load(U + rows, mask=mv[None, :], other=0.0)), PREC_A)
        vrows = _row(bh, tok, T, H, TF)[:, None] * Nv + rv[None, :]
        dbeta += tl.sum(dr * tl.load(V + vrows, mask=mv[None, :], other=0.0).to(tl.float32), axis=1)
        tl.store(DV + vrows, _out(dr * beta[:, None], DV, PREC), mask=mv[None, :])
    dl = tl.where(rt[:, None] > rt[None, :], dl, 0.0)
    tl.store(DBETA + bh * T + tok, dbeta + tl.sum(dl * p, axis=1))
    tl.store(DP + ptile, beta[:, None] * dl)
