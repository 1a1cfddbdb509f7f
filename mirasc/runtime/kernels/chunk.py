"""The chunk kernels' shared pieces (docs/kernels.md): the rows of a token in either layout, the output kernel
(2) of both decay variants (CH: a decay over key channels), and the unit-lower-triangular inverse of the
delta family's preparation."""

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
