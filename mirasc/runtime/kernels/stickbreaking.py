"""The stick-breaking attention kernels (Tan et al. 2024; docs/semantics.md): the forward, whose weights are
σ(z_ts) times the sticks of the later visible keys, walking key tiles from the query's own backwards, and the
backward's dq and dk/dv; never a T x T matrix in memory. The spec's window and whether a query reads its own pair
(the module's WINDOW and ATTEND_CURRENT) reach the visibility test, `_sb_visible`, as constexprs.

With z = scale·q_t·k_s, β = σ(z), log β = z − softplus(z) and log(1 − β) = −softplus(z); the weight of a visible
pair is
  log w_ts = log β_ts + Σ_{l>s visible} log(1 − β_tl)
and the stick left over is r_t = exp(Σ_{l visible} log(1 − β_tl)). Each query block walks its key tiles from the
newest back, carrying per row the log of the stick left, Σ log(1 − β) over the keys already passed; inside a tile
the same sum over the tile's later keys is a reversed cumulative sum. The backward carries the matching sum of the
weights' gradients the same way (derivation in _sb_bwd_dq). Precision as the softmax flash kernels: fp16/bf16
operands in the dots, fp32 accumulation and fp32 sticks; fp32 inputs with exact fp32 dots. Packed sequences
(cu_seqlens, VARLEN_) share one launch, a program per (block, sequence, head). Runs on the CPU under
TRITON_INTERPRET=1 (set before triton is imported)."""

import triton
import triton.language as tl

from .attention import _flash_sequence, _mm, _tile


@triton.jit
def _sb_visible(q_idx, k_idx, T, WINDOW_: tl.constexpr, CURRENT_: tl.constexpr):
    ok = (k_idx[None, :] < T) & (q_idx[:, None] < T)
    if CURRENT_:
        ok = ok & (k_idx[None, :] <= q_idx[:, None])
    else:
        ok = ok & (k_idx[None, :] < q_idx[:, None])
    if WINDOW_ > 0:
        ok = ok & (q_idx[:, None] - k_idx[None, :] < WINDOW_)
    return ok


@triton.jit
def _sb_weights(q, k, q_idx, k_idx, T, stick, scale,
                WINDOW_: tl.constexpr, CURRENT_: tl.constexpr, PREC: tl.constexpr, WIDEN_: tl.constexpr):
    """One [BM, BN] tile: the logits z, softplus(z), the visibility, log(1 − β) (0 where invisible: such a key
    leaves the stick whole) and the weights w, given `stick` [BM], Σ log(1 − β) over the later key tiles."""
    z = _mm(q, tl.trans(k), None, PREC, WIDEN_) * scale
    vis = _sb_visible(q_idx, k_idx, T, WINDOW_, CURRENT_)
    sp = tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))  # softplus(z), without overflow
    log_keep = tl.where(vis, -sp, 0.0)
    after = tl.cumsum(log_keep, 1, reverse=True) - log_keep + stick[:, None]  # Σ over the keys after s
    w = tl.where(vis, tl.exp(z - sp + after), 0.0)
    return z, sp, vis, log_keep, w


@triton.jit
def _sb_key_tiles(m0, T, BM: tl.constexpr, BN: tl.constexpr, WINDOW_: tl.constexpr):
    """The key tiles the query rows m0 .. m0 + BM − 1 may see: tile indices bottom .. top (newest = top)."""
    top = (tl.minimum(T, m0 + BM) - 1) // BN
    bottom = 0
    if WINDOW_ > 0:
        bottom = tl.maximum(0, m0 - WINDOW_ + 1) // BN
    return top, bottom


@triton.jit
def _sb_fwd(Q, K, V, O, REM, CU, scale, T, TT, H, DK, DV,
            sqb, sqt, sqd, skb, skt, skd, svb, svt, svd, sob, sot, sod,
            WINDOW_: tl.constexpr, CURRENT_: tl.constexpr, VARLEN_: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
            PREC: tl.constexpr, WIDEN_: tl.constexpr):
    pid_m = tl.program_id(0)
    bh, bos, T, _ = _flash_sequence(CU, tl.program_id(1), T, T, H, VARLEN_)
    m0 = pid_m * BM
    if m0 >= T:  # (varlen: a block past this sequence's end)
        return
    Q += bh * sqb + bos * sqt
    K += bh * skb + bos * skt
    V += bh * svb + bos * svt
    O += bh * sob + bos * sot
    REM += bh * TT + bos
    q_idx = m0 + tl.arange(0, BM)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    q = _tile(Q, q_idx, T, dk, DK, sqt, sqd)
    acc = tl.zeros([BM, BDV], tl.float32)
    stick = tl.zeros([BM], tl.float32)  # Σ log(1 − β) over the keys passed so far (the newer ones)
    top, bottom = _sb_key_tiles(m0, T, BM, BN, WINDOW_)
    for n in range(0, top - bottom + 1):  # newest tile first
        k_idx = (top - n) * BN + tl.arange(0, BN)
        k = _tile(K, k_idx, T, dk, DK, skt, skd)
        v = _tile(V, k_idx, T, dv, DV, svt, svd)
        z, sp, vis, log_keep, w = _sb_weights(q, k, q_idx, k_idx, T, stick, scale, WINDOW_, CURRENT_,
                                              PREC, WIDEN_)
        acc = _mm(w.to(v.dtype), v, acc, PREC, WIDEN_)
        stick += tl.sum(log_keep, 1)
    tl.store(O + q_idx[:, None] * sot + dv[None, :] * sod, acc.to(O.dtype.element_ty),
             mask=(q_idx[:, None] < T) & (dv[None, :] < DV))
    tl.store(REM + q_idx, tl.exp(stick), mask=q_idx < T)


@triton.jit
def _sb_bwd_dq(Q, K, V, DO, DELTA, DQ_, STICK, GSUM, CU, scale, T, TT, H, NB, DK, DV,
               sqb, sqt, sqd, skb, skt, skd, svb, svt, svd, sob, sot, sod,
               WINDOW_: tl.constexpr, CURRENT_: tl.constexpr, VARLEN_: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
               PREC: tl.constexpr, WIDEN_: tl.constexpr):
    """dQ, and for _sb_bwd_dkdv the two per-row sums over the key tiles newer than each tile J (STICK, GSUM
    [B·H, T, NB]). With g_ts = w_ts·(dO_t·v_s) = ∂L/∂log w_ts, the chain rule through log w gives
      ∂L/∂log(1 − β_tl) = Σ_{s<l} g_ts + dr_t·r_t = δ_t − Σ_{s≥l} g_ts,   δ_t = dO_t·o_t + dr_t·r_t
    (Σ_s g_ts = dO_t·o_t), a suffix sum again, so it follows the same newest-first walk; and
      ∂L/∂z_tl = g_tl·(1 − β_tl) − ∂L/∂log(1 − β_tl)·β_tl."""
    pid_m = tl.program_id(0)
    bh, bos, T, _ = _flash_sequence(CU, tl.program_id(1), T, T, H, VARLEN_)
    m0 = pid_m * BM
    if m0 >= T:
        return
    Q += bh * sqb + bos * sqt
    K += bh * skb + bos * skt
    V += bh * svb + bos * svt
    DO += bh * sob + bos * sot
    DQ_ += bh * sqb + bos * sqt
    DELTA += bh * TT + bos
    STICK += (bh * TT + bos) * NB
    GSUM += (bh * TT + bos) * NB
    q_idx = m0 + tl.arange(0, BM)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    q = _tile(Q, q_idx, T, dk, DK, sqt, sqd)
    do = _tile(DO, q_idx, T, dv, DV, sot, sod)
    delta = tl.load(DELTA + q_idx, mask=q_idx < T, other=0.0)
    dq_acc = tl.zeros([BM, BDK], tl.float32)
    stick = tl.zeros([BM], tl.float32)
    gsum = tl.zeros([BM], tl.float32)  # Σ g over the keys passed so far
    top, bottom = _sb_key_tiles(m0, T, BM, BN, WINDOW_)
    for n in range(0, top - bottom + 1):
        j = top - n
        carry = q_idx * NB + j
        tl.store(STICK + carry, stick, mask=q_idx < T)
        tl.store(GSUM + carry, gsum, mask=q_idx < T)
        k_idx = j * BN + tl.arange(0, BN)
        k = _tile(K, k_idx, T, dk, DK, skt, skd)
        v = _tile(V, k_idx, T, dv, DV, svt, svd)
        z, sp, vis, log_keep, w = _sb_weights(q, k, q_idx, k_idx, T, stick, scale, WINDOW_, CURRENT_,
                                              PREC, WIDEN_)
        # w as the forward's dot took it (rounded to v's dtype), so that Σ_s g_ts is dO_t·o_t, δ's first term
        g = w.to(v.dtype).to(tl.float32) * _mm(do, tl.trans(v), None, PREC, WIDEN_)
        d_keep = delta[:, None] - (tl.cumsum(g, 1, reverse=True) + gsum[:, None])
        dz = tl.where(vis, g * tl.exp(-sp) - d_keep * tl.exp(z - sp), 0.0)
        dq_acc = _mm(dz.to(k.dtype), k, dq_acc, PREC, WIDEN_)
        stick += tl.sum(log_keep, 1)
        gsum += tl.sum(g, 1)
    tl.store(DQ_ + q_idx[:, None] * sqt + dk[None, :] * sqd, dq_acc * scale,
             mask=(q_idx[:, None] < T) & (dk[None, :] < DK))


@triton.jit
def _sb_bwd_dkdv(Q, K, V, DO, DELTA, DK_, DV_, STICK, GSUM, CU, scale, T, TT, H, NB, DK, DV,
                 sqb, sqt, sqd, skb, skt, skd, svb, svt, svd, sob, sot, sod,
                 WINDOW_: tl.constexpr, CURRENT_: tl.constexpr, VARLEN_: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                 PREC: tl.constexpr, WIDEN_: tl.constexpr):
    """dK, dV of key tile J over the query tiles that see it, each row resuming from the sums _sb_bwd_dq
    stored for it at tile J (launched after it, with the same BN)."""
    pid_n = tl.program_id(0)
    bh, bos, T, _ = _flash_sequence(CU, tl.program_id(1), T, T, H, VARLEN_)
    n0 = pid_n * BN
    if n0 >= T:
        return
    Q += bh * sqb + bos * sqt
    K += bh * skb + bos * skt
    V += bh * svb + bos * svt
    DO += bh * sob + bos * sot
    DK_ += bh * skb + bos * skt
    DV_ += bh * svb + bos * svt
    DELTA += bh * TT + bos
    STICK += (bh * TT + bos) * NB
    GSUM += (bh * TT + bos) * NB
    k_idx = n0 + tl.arange(0, BN)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    k = _tile(K, k_idx, T, dk, DK, skt, skd)
    v = _tile(V, k_idx, T, dv, DV, svt, svd)
    dk_acc = tl.zeros([BN, BDK], tl.float32)
    dv_acc = tl.zeros([BN, BDV], tl.float32)
    hi = T
    if WINDOW_ > 0:  # the last row that sees this tile's last key
        hi = tl.minimum(T, n0 + BN + WINDOW_ - 1)
    for start in range(n0 // BM * BM, hi, BM):
        q_idx = start + tl.arange(0, BM)
        q = _tile(Q, q_idx, T, dk, DK, sqt, sqd)
        do = _tile(DO, q_idx, T, dv, DV, sot, sod)
        delta = tl.load(DELTA + q_idx, mask=q_idx < T, other=0.0)
        carry = q_idx * NB + pid_n
        stick = tl.load(STICK + carry, mask=q_idx < T, other=0.0)
        gsum = tl.load(GSUM + carry, mask=q_idx < T, other=0.0)
        z, sp, vis, log_keep, w = _sb_weights(q, k, q_idx, k_idx, T, stick, scale, WINDOW_, CURRENT_,
                                              PREC, WIDEN_)
        dv_acc = _mm(tl.trans(w.to(do.dtype)), do, dv_acc, PREC, WIDEN_)
        # w as the forward's dot took it (rounded to v's dtype), so that Σ_s g_ts is dO_t·o_t, δ's first term
        g = w.to(v.dtype).to(tl.float32) * _mm(do, tl.trans(v), None, PREC, WIDEN_)
        d_keep = delta[:, None] - (tl.cumsum(g, 1, reverse=True) + gsum[:, None])
        dz = tl.where(vis, g * tl.exp(-sp) - d_keep * tl.exp(z - sp), 0.0)
        dk_acc = _mm(tl.trans(dz.to(q.dtype)), q, dk_acc, PREC, WIDEN_)
    tl.store(DK_ + k_idx[:, None] * skt + dk[None, :] * skd, dk_acc * scale,
             mask=(k_idx[:, None] < T) & (dk[None, :] < DK))
    tl.store(DV_ + k_idx[:, None] * svt + dv[None, :] * svd, dv_acc,
             mask=(k_idx[:, None] < T) & (dv[None, :] < DV))
