"""What the flash kernels of softmax memories and the stick-breaking kernels share: exp through exp2,
the products (16-bit operands or exact fp32, PREC and WIDEN_ from the host's `_dot_options`), tile loads, the sequence a
program reads when sequences are packed, and the backward's δ = rowsum(dO ∘ O)."""

import triton
import triton.language as tl

_LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x · log2 e)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _mm(a, b, acc, PREC: tl.constexpr, WIDEN_: tl.constexpr):
    """a @ b (+ acc), fp32 out; a and b in their own dtype (see _dot_options for PREC and WIDEN_)."""
    if WIDEN_:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=PREC)
    return out


@triton.jit
def _tile(P, rows, n_rows, cols, n_cols, s_row, s_col):
    """The tile P[rows, cols] of a strided matrix (element (r, c) at P + r·s_row + c·s_col) in its own dtype, zero
    at rows >= n_rows and columns >= n_cols."""
    return tl.load(P + rows[:, None] * s_row + cols[None, :] * s_col,
                   mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)


@triton.jit
def _rn(x, P, WIDEN_: tl.constexpr):
    """x about to be stored at P: into bf16 under the interpreter rounded to nearest (ties to even) here, as a
    GPU's conversion rounds (the interpreter's own conversion truncates), else as it is (the store converts)."""
    if WIDEN_ and P.dtype.element_ty == tl.bfloat16:
        b = x.to(tl.float32).to(tl.uint32, bitcast=True)
        out = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    else:
        out = x
    return out


@triton.jit
def _flash_sequence(CU, bh, Tq, Tk, H, VARLEN_: tl.constexpr):
    """The program's head row in the [B·H, T] layouts, its sequence's first token and its query and key
    lengths: with VARLEN_ the grid's second axis is (sequence, head) over N causal sequences packed along time
    in one row (B = 1, offsets CU)."""
    bh = bh.to(tl.int64)  # (offsets of B·H·T·D elements may pass 2^31)
    if VARLEN_:
        seq = bh // H
        bos = tl.load(CU + seq).to(tl.int64)
        n = tl.load(CU + seq + 1) - bos
        return bh % H, bos, n, n
    return bh, 0, Tq, Tk


@triton.jit
def _flash_bwd_delta(O, DO, DELTA, T, H, DV, sob, sot, sod, soz, sdb, sdt, sdd, sdz,
                     BM: tl.constexpr, BDV: tl.constexpr):
    """δ_t = rowsum(dO_t ∘ O_t) in fp32, read from O and dO in their own dtype and layout; DELTA [B·H, T]. One
    program per BM rows of one (batch, head), the feature axis in BDV-wide steps."""
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, BDV)
    acc = tl.zeros([BM], tl.float32)
    for d0 in range(0, DV, BDV):
        mask = (rows[:, None] < T) & ((d0 + cols)[None, :] < DV)
        o = tl.load(O + (bh // H) * soz + (bh % H) * sob + rows[:, None] * sot + (d0 + cols)[None, :] * sod,
                    mask=mask, other=0.0).to(tl.float32)
        do = tl.load(DO + (bh // H) * sdz + (bh % H) * sdb + rows[:, None] * sdt + (d0 + cols)[None, :] * sdd,
                     mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(o * do, 1)
    tl.store(DELTA + bh * T + rows, acc, mask=rows < T)
