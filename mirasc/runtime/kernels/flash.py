"""The flash kernels of softmax memories (docs/kernels.md): the forward with the online softmax over key tiles
(causal, windowed, with a decay bias c and attention sinks), the backward's dk/dv over query tiles and its dq
over key tiles; never a T x T matrix in memory. The spec's mask (the module's CAUSAL and WINDOW) reaches the
visibility test, `_visible_tile`, as constexprs.

A decaying memory (DECAY_) adds log a_ts = c_t − c_s to each logit, c the running sum of log α over
the sequence (one fp32 value per token, computed outside); its gradient is one value per token too.
Precision: fp16/bf16 inputs enter every tl.dot in their own dtype (q, k, v, dO as loaded; the
probabilities P and dS rounded to it before their products, as FlashAttention-2 does), fp32 inputs
with input_precision="ieee" (exact fp32 products, no TF32); the products accumulate in fp32 and the
softmax statistics (running max, sum, logsumexp) and dS are fp32. Exponentials are base 2 with log2(e)
folded into the logit scale; the logsumexp is stored in natural log. Only the key (query) tiles that
straddle the causal diagonal, the window's edge or the end of the sequence evaluate the visibility
test. Sequences packed along time (cu_seqlens, VARLEN_) share one launch: the grid's second axis is (sequence,
head) and each program moves its base pointers to its sequence. Runs on the CPU under TRITON_INTERPRET=1 (set
before triton is imported)."""

import triton
import triton.language as tl

from .attention import _LN2, _LOG2E, _flash_sequence, _mm, _rn, _tile


@triton.jit
def _visible_tile(q_idx, k_idx, Tk, CAUSAL_: tl.constexpr, WINDOW_: tl.constexpr):
    ok = k_idx[None, :] < Tk
    if CAUSAL_:
        ok = ok & (k_idx[None, :] <= q_idx[:, None])
    if WINDOW_ > 0:
        ok = ok & (q_idx[:, None] - k_idx[None, :] < WINDOW_)
    return ok


@triton.jit
def _full_key_tiles(m0, lo, Tk, BM: tl.constexpr, BN: tl.constexpr,
                    CAUSAL_: tl.constexpr, WINDOW_: tl.constexpr):
    """[f0, f1): the key tiles (starts lo + j·BN) every query row m0 .. m0 + BM − 1 sees whole: keys below
    Tk, at or before m0 (causal), at or after m0 + BM − WINDOW_ (window). f1 >= f0; the tiles of
    [lo, f0) and [f1, hi) take the visibility test."""
    vis_end = Tk
    if CAUSAL_:
        vis_end = tl.minimum(Tk, m0 + 1)
    f0 = lo
    if WINDOW_ > 0:
        f0 = lo + tl.cdiv(tl.maximum(m0 + BM - WINDOW_ - lo, 0), BN) * BN
    return f0, tl.maximum(f0, vis_end // BN * BN)


@triton.jit
def _flash_fwd_tiles(acc, l_i, m_i, q, cq, q_idx, lo, hi, K, V, C, Tk, DK, DV, qk_scale,
                     skb, skt, skd, svb, svt, svd,
                     CAUSAL_: tl.constexpr, WINDOW_: tl.constexpr, DECAY_: tl.constexpr, MASK_: tl.constexpr,
                     BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                     PREC: tl.constexpr, WIDEN_: tl.constexpr):
    """The online softmax over the key tiles lo, lo + BN, .. < hi; logits in log2 units (s · log2 e).
    MASK_: the tiles take the visibility test (otherwise every pair of them is visible)."""
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    for start in range(lo, hi, BN):
        k_idx = start + tl.arange(0, BN)
        k = _tile(K, k_idx, Tk, dk, DK, skt, skd)
        v = _tile(V, k_idx, Tk, dv, DV, svt, svd)
        s = _mm(q, tl.trans(k), None, PREC, WIDEN_) * qk_scale
        if DECAY_:  # log2 of the pair's decayed weight, <= 0 where visible
            ck = tl.load(C + k_idx, mask=k_idx < Tk, other=0.0)
            s += (cq[:, None] - ck[None, :]) * _LOG2E
        if MASK_:
            s = tl.where(_visible_tile(q_idx, k_idx, Tk, CAUSAL_, WINDOW_), s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == -float("inf"), 0.0, m_new)  # rows with nothing visible yet
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
        p = tl.math.exp2(s - m_use[:, None])
        corr = tl.math.exp2(m_i - m_use)
        l_i = l_i * corr + tl.sum(p, 1)
        acc = _mm(p.to(v.dtype), v, acc * corr[:, None], PREC, WIDEN_)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_fwd(Q, K, V, O, LSE, C, CU, SINKS, scale, Tq, Tk, TQ_ROW, TK_ROW, H, DK, DV,
               sqb, sqt, sqd, skb, skt, skd, svb, svt, svd, sob, sot, sod, sqz, skz, svz, soz,
               CAUSAL_: tl.constexpr, WINDOW_: tl.constexpr, DECAY_: tl.constexpr, VARLEN_: tl.constexpr,
               SINK_: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
               PREC: tl.constexpr, WIDEN_: tl.constexpr):
    pid_m = tl.program_id(0)
    bh, bos, Tq, Tk = _flash_sequence(CU, tl.program_id(1), Tq, Tk, H, VARLEN_)
    m0 = pid_m * BM
    if m0 >= Tq:  # (varlen: a block past this sequence's end)
        return
    Q += (bh // H) * sqz + (bh % H) * sqb + bos * sqt
    K += (bh // H) * skz + (bh % H) * skb + bos * skt
    V += (bh // H) * svz + (bh % H) * svb + bos * svt
    O += (bh // H) * soz + (bh % H) * sob + bos * sot
    LSE += bh * TQ_ROW + bos
    C += bh * TK_ROW + bos
    q_idx = m0 + tl.arange(0, BM)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    q = _tile(Q, q_idx, Tq, dk, DK, sqt, sqd)
    cq = m0  # unused without a decay
    if DECAY_:
        cq = tl.load(C + q_idx, mask=q_idx < Tq, other=0.0)
    qk_scale = scale * _LOG2E
    m_i = tl.full([BM], -float("inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    if SINK_:  # the sink is one more logit b_h, with value 0: the online softmax starts from it
        m_i = tl.zeros([BM], tl.float32) + tl.load(SINKS + bh % H).to(tl.float32) * _LOG2E
        l_i = tl.full([BM], 1.0, tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    lo = 0
    hi = Tk
    if CAUSAL_:
        hi = tl.minimum(Tk, m0 + BM)
    if WINDOW_ > 0:
        lo = tl.maximum(0, m0 - WINDOW_ + 1) // BN * BN
    f0, f1 = _full_key_tiles(m0, lo, Tk, BM, BN, CAUSAL_, WINDOW_)
    if WINDOW_ > 0:  # the window's lower edge
        acc, l_i, m_i = _flash_fwd_tiles(acc, l_i, m_i, q, cq, q_idx, lo, tl.minimum(f0, hi), K, V, C, Tk,
                                         DK, DV, qk_scale, skb, skt, skd, svb, svt, svd, CAUSAL_, WINDOW_,
                                         DECAY_, True, BN, BDK, BDV, PREC, WIDEN_)
    acc, l_i, m_i = _flash_fwd_tiles(acc, l_i, m_i, q, cq, q_idx, f0, f1, K, V, C, Tk, DK, DV, qk_scale,
                                     skb, skt, skd, svb, svt, svd, CAUSAL_, WINDOW_, DECAY_, False,
                                     BN, BDK, BDV, PREC, WIDEN_)
    # the diagonal (causal), the end of the keys
    acc, l_i, m_i = _flash_fwd_tiles(acc, l_i, m_i, q, cq, q_idx, f1, hi, K, V, C, Tk, DK, DV, qk_scale,
                                     skb, skt, skd, svb, svt, svd, CAUSAL_, WINDOW_, DECAY_, True,
                                     BN, BDK, BDV, PREC, WIDEN_)
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # padding rows past Tq see no key
    o = acc / l_safe[:, None]
    tl.store(O + q_idx[:, None] * sot + dv[None, :] * sod, _rn(o, O, WIDEN_).to(O.dtype.element_ty),
             mask=(q_idx[:, None] < Tq) & (dv[None, :] < DV))
    # natural log: m_i and log2 l_i are in log2 units
    tl.store(LSE + q_idx, tl.where(l_i > 0, (m_i + tl.math.log2(l_safe)) * _LN2, 0.0), mask=q_idx < Tq)


@triton.jit
def _flash_p(q, k, lse, cq, ck, q_idx, k_idx, Tk, qk_scale,
             CAUSAL_: tl.constexpr, WINDOW_: tl.constexpr, DECAY_: tl.constexpr, MASK_: tl.constexpr,
             PREC: tl.constexpr, WIDEN_: tl.constexpr):
    """P of one (query tile, key tile) pair in the backward, recomputed from the forward's LSE (log2 units here).
    MASK_: the pair takes the visibility test."""
    s = _mm(q, tl.trans(k), None, PREC, WIDEN_) * qk_scale
    if DECAY_:
        s += (cq[:, None] - ck[None, :]) * _LOG2E
    p = tl.math.exp2(s - lse[:, None])
    if MASK_:
        p = tl.where(_visible_tile(q_idx, k_idx, Tk, CAUSAL_, WINDOW_), p, 0.0)
    return p


@triton.jit
def _flash_dkdv_tiles(dk_acc, dv_acc, dc_acc, k, v, ck, k_idx, lo, hi, Q, DO, LSE, DELTA, C, Tq, Tk, DK, DV,
                      qk_scale, sqb, sqt, sqd, sob, sot, sod,
                      CAUSAL_: tl.constexpr, WINDOW_: tl.constexpr, DECAY_: tl.constexpr, MASK_: tl.constexpr,
                      BM: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                      PREC: tl.constexpr, WIDEN_: tl.constexpr):
    """The query tiles lo, lo + BM, .. < hi of one key tile: dV += Pᵀ dO, dK += dSᵀ Q (unscaled), the column
    sums of dS. A query row past Tq has LSE = +inf, so P = 0 on it without a test."""
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    for start in range(lo, hi, BM):
        q_idx = start + tl.arange(0, BM)
        q = _tile(Q, q_idx, Tq, dk, DK, sqt, sqd)
        do = _tile(DO, q_idx, Tq, dv, DV, sot, sod)
        lse = tl.load(LSE + q_idx, mask=q_idx < Tq, other=float("inf")) * _LOG2E
        delta = tl.load(DELTA + q_idx, mask=q_idx < Tq, other=0.0)
        cq = q_idx  # unused without a decay
        if DECAY_:
            cq = tl.load(C + q_idx, mask=q_idx < Tq, other=0.0)
        p = _flash_p(q, k, lse, cq, ck, q_idx, k_idx, Tk, qk_scale, CAUSAL_, WINDOW_, DECAY_, MASK_, PREC, WIDEN_)
        dv_acc = _mm(tl.trans(p.to(do.dtype)), do, dv_acc, PREC, WIDEN_)
        dp = _mm(do, tl.trans(v), None, PREC, WIDEN_)
        ds = p * (dp - delta[:, None])
        dk_acc = _mm(tl.trans(ds.to(q.dtype)), q, dk_acc, PREC, WIDEN_)
        if DECAY_:  # ∂L/∂c_s as a key: −Σ_t ds_ts (a column sum of this tile)
            dc_acc -= tl.sum(ds, 0)
    return dk_acc, dv_acc, dc_acc


@triton.jit
def _flash_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK_, DV_, C, DC_, CU, scale, Tq, Tk, TQ_ROW, TK_ROW, H, DK, DV,
                    sqb, sqt, sqd, skb, skt, skd, svb, svt, svd, sob, sot, sod, sqz, skz, svz, soz,
                    CAUSAL_: tl.constexpr, WINDOW_: tl.constexpr, DECAY_: tl.constexpr, VARLEN_: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                    PREC: tl.constexpr, WIDEN_: tl.constexpr):
    pid_n = tl.program_id(0)
    bh, bos, Tq, Tk = _flash_sequence(CU, tl.program_id(1), Tq, Tk, H, VARLEN_)
    n0 = pid_n * BN
    if n0 >= Tk:  # (varlen: a block past this sequence's end)
        return
    Q += (bh // H) * sqz + (bh % H) * sqb + bos * sqt
    K += (bh // H) * skz + (bh % H) * skb + bos * skt
    V += (bh // H) * svz + (bh % H) * svb + bos * svt
    DO += (bh // H) * soz + (bh % H) * sob + bos * sot
    DK_ += (bh // H) * skz + (bh % H) * skb + bos * skt
    DV_ += (bh // H) * svz + (bh % H) * svb + bos * svt
    LSE += bh * TQ_ROW + bos
    DELTA += bh * TQ_ROW + bos
    C += bh * TK_ROW + bos
    DC_ += bh * TK_ROW + bos
    k_idx = n0 + tl.arange(0, BN)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    k = _tile(K, k_idx, Tk, dk, DK, skt, skd)
    v = _tile(V, k_idx, Tk, dv, DV, svt, svd)
    dk_acc = tl.zeros([BN, BDK], tl.float32)
    dv_acc = tl.zeros([BN, BDV], tl.float32)
    dc_acc = tl.zeros([BN], tl.float32)
    ck = n0  # unused without a decay
    if DECAY_:
        ck = tl.load(C + k_idx, mask=k_idx < Tk, other=0.0)
    qk_scale = scale * _LOG2E
    lo = 0
    hi = Tq
    if CAUSAL_:
        lo = n0 // BM * BM
    if WINDOW_ > 0:
        hi = tl.minimum(Tq, n0 + BN + WINDOW_ - 1)
    # [f0, f1): the query tiles whose every row sees every key of this tile (rows past Tq see none: P = 0)
    f0 = lo
    if CAUSAL_:  # rows at or after the tile's last key
        f0 = lo + tl.cdiv(tl.maximum(n0 + BN - 1 - lo, 0), BM) * BM
    f1 = tl.maximum(f0, hi)
    if WINDOW_ > 0:  # rows before the last key's window ends: start + BM <= n0 + WINDOW_
        f1 = f0 + tl.maximum(n0 + WINDOW_ - f0, 0) // BM * BM
    f1 = tl.where(n0 + BN > Tk, f0, f1)  # keys past Tk (the last tile): every query tile takes the test
    if CAUSAL_:  # the diagonal
        dk_acc, dv_acc, dc_acc = _flash_dkdv_tiles(dk_acc, dv_acc, dc_acc, k, v, ck, k_idx, lo, tl.minimum(f0, hi),
                                                   Q, DO, LSE, DELTA, C, Tq, Tk, DK, DV, qk_scale,
                                                   sqb, sqt, sqd, sob, sot, sod, CAUSAL_, WINDOW_, DECAY_, True,
                                                   BM, BDK, BDV, PREC, WIDEN_)
    dk_acc, dv_acc, dc_acc = _flash_dkdv_tiles(dk_acc, dv_acc, dc_acc, k, v, ck, k_idx, f0, tl.minimum(f1, hi),
                                               Q, DO, LSE, DELTA, C, Tq, Tk, DK, DV, qk_scale,
                                               sqb, sqt, sqd, sob, sot, sod, CAUSAL_, WINDOW_, DECAY_, False,
                                               BM, BDK, BDV, PREC, WIDEN_)
    # the window's upper edge, the end of the keys
    dk_acc, dv_acc, dc_acc = _flash_dkdv_tiles(dk_acc, dv_acc, dc_acc, k, v, ck, k_idx, f1, hi,
                                               Q, DO, LSE, DELTA, C, Tq, Tk, DK, DV, qk_scale,
                                               sqb, sqt, sqd, sob, sot, sod, CAUSAL_, WINDOW_, DECAY_, True,
                                               BM, BDK, BDV, PREC, WIDEN_)
    tl.store(DK_ + k_idx[:, None] * skt + dk[None, :] * skd, _rn(dk_acc * scale, DK_, WIDEN_),
             mask=(k_idx[:, None] < Tk) & (dk[None, :] < DK))
    if DECAY_:  # the row sums (c_s as a query) are added by _flash_bwd_dq, launched after this kernel
        tl.store(DC_ + k_idx, dc_acc, mask=k_idx < Tk)
    tl.store(DV_ + k_idx[:, None] * svt + dv[None, :] * svd, _rn(dv_acc, DV_, WIDEN_),
             mask=(k_idx[:, None] < Tk) & (dv[None, :] < DV))


@triton.jit
def _flash_dq_tiles(dq_acc, dc_acc, q, do, lse, delta, cq, q_idx, lo, hi, K, V, C, Tk, DK, DV, qk_scale,
                    skb, skt, skd, svb, svt, svd,
                    CAUSAL_: tl.constexpr, WINDOW_: tl.constexpr, DECAY_: tl.constexpr, MASK_: tl.constexpr,
                    BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                    PREC: tl.constexpr, WIDEN_: tl.constexpr):
    """The key tiles lo, lo + BN, .. < hi of one query tile: dQ += dS K (unscaled), the row sums of dS."""
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    for start in range(lo, hi, BN):
        k_idx = start + tl.arange(0, BN)
        k = _tile(K, k_idx, Tk, dk, DK, skt, skd)
        v = _tile(V, k_idx, Tk, dv, DV, svt, svd)
        ck = k_idx  # unused without a decay
        if DECAY_:
            ck = tl.load(C + k_idx, mask=k_idx < Tk, other=0.0)
        p = _flash_p(q, k, lse, cq, ck, q_idx, k_idx, Tk, qk_scale, CAUSAL_, WINDOW_, DECAY_, MASK_, PREC, WIDEN_)
        dp = _mm(do, tl.trans(v), None, PREC, WIDEN_)
        ds = p * (dp - delta[:, None])
        dq_acc = _mm(ds.to(k.dtype), k, dq_acc, PREC, WIDEN_)
        if DECAY_:
            dc_acc += tl.sum(ds, 1)
    return dq_acc, dc_acc


@triton.jit
def _flash_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ_, C, DC_, CU, scale, Tq, Tk, TQ_ROW, TK_ROW, H, DK, DV,
                  sqb, sqt, sqd, skb, skt, skd, svb, svt, svd, sob, sot, sod, sqz, skz, svz, soz,
                  CAUSAL_: tl.constexpr, WINDOW_: tl.constexpr, DECAY_: tl.constexpr, VARLEN_: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                  PREC: tl.constexpr, WIDEN_: tl.constexpr):
    pid_m = tl.program_id(0)
    bh, bos, Tq, Tk = _flash_sequence(CU, tl.program_id(1), Tq, Tk, H, VARLEN_)
    m0 = pid_m * BM
    if m0 >= Tq:  # (varlen: a block past this sequence's end)
        return
    Q += (bh // H) * sqz + (bh % H) * sqb + bos * sqt
    K += (bh // H) * skz + (bh % H) * skb + bos * skt
    V += (bh // H) * svz + (bh % H) * svb + bos * svt
    DO += (bh // H) * soz + (bh % H) * sob + bos * sot
    DQ_ += (bh // H) * sqz + (bh % H) * sqb + bos * sqt
    LSE += bh * TQ_ROW + bos
    DELTA += bh * TQ_ROW + bos
    C += bh * TK_ROW + bos
    DC_ += bh * TK_ROW + bos
    q_idx = m0 + tl.arange(0, BM)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    q = _tile(Q, q_idx, Tq, dk, DK, sqt, sqd)
    do = _tile(DO, q_idx, Tq, dv, DV, sot, sod)
    # rows past Tq: LSE = +inf, so P = 0 on them without a test
    lse = tl.load(LSE + q_idx, mask=q_idx < Tq, other=float("inf")) * _LOG2E
    delta = tl.load(DELTA + q_idx, mask=q_idx < Tq, other=0.0)
    dq_acc = tl.zeros([BM, BDK], tl.float32)
    dc_acc = tl.zeros([BM], tl.float32)
    cq = m0  # unused without a decay
    if DECAY_:
        cq = tl.load(C + q_idx, mask=q_idx < Tq, other=0.0)
    qk_scale = scale * _LOG2E
    lo = 0
    hi = Tk
    if CAUSAL_:
        hi = tl.minimum(Tk, m0 + BM)
    if WINDOW_ > 0:
        lo = tl.maximum(0, m0 - WINDOW_ + 1) // BN * BN
    f0, f1 = _full_key_tiles(m0, lo, Tk, BM, BN, CAUSAL_, WINDOW_)
    if WINDOW_ > 0:  # the window's lower edge
        dq_acc, dc_acc = _flash_dq_tiles(dq_acc, dc_acc, q, do, lse, delta, cq, q_idx, lo, tl.minimum(f0, hi),
                                         K, V, C, Tk, DK, DV, qk_scale, skb, skt, skd, svb, svt, svd,
                                         CAUSAL_, WINDOW_, DECAY_, True, BN, BDK, BDV, PREC, WIDEN_)
    dq_acc, dc_acc = _flash_dq_tiles(dq_acc, dc_acc, q, do, lse, delta, cq, q_idx, f0, f1,
                                     K, V, C, Tk, DK, DV, qk_scale, skb, skt, skd, svb, svt, svd,
                                     CAUSAL_, WINDOW_, DECAY_, False, BN, BDK, BDV, PREC, WIDEN_)
    # the diagonal (causal), the end of the keys
    dq_acc, dc_acc = _flash_dq_tiles(dq_acc, dc_acc, q, do, lse, delta, cq, q_idx, f1, hi,
                                     K, V, C, Tk, DK, DV, qk_scale, skb, skt, skd, svb, svt, svd,
                                     CAUSAL_, WINDOW_, DECAY_, True, BN, BDK, BDV, PREC, WIDEN_)
    tl.store(DQ_ + q_idx[:, None] * sqt + dk[None, :] * sqd, _rn(dq_acc * scale, DQ_, WIDEN_),
             mask=(q_idx[:, None] < Tq) & (dk[None, :] < DK))
    if DECAY_:
        # ∂L/∂c_t = Σ_s ds_ts (as a query) − Σ_u ds_ut (as a key, from _flash_bwd_dkdv). The row sum is zero
        # in exact arithmetic (Σ_s P_ts = 1 and δ_t = Σ_s P_ts dP_ts), but with δ taken from an fp16/bf16 O it
        # is what cancels δ's rounding in the column sums (measured: bf16 O, d log α error 2.3e-3 with it,
        # 8.1e-3 without), so it is kept. Causal: Tq = Tk, and this program owns rows q_idx of DC_.
        dc_cols = tl.load(DC_ + q_idx, mask=q_idx < Tq, other=0.0)
        tl.store(DC_ + q_idx, dc_cols + dc_acc, mask=q_idx < Tq)
