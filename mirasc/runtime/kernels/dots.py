"""Every product of the chunk kernels (docs/semantics.md "Numerics"): the operands' precision as a `tl.constexpr`
(PREC: "bf16", "fp16", "bf16x2", "tf32", "ieee", and the interpreter's "_widened" forms of the bf16 ones, which
the host picks: `_launch_prec` in the emitted module), accumulation in fp32."""

import triton
import triton.language as tl


@triton.jit
def _to_bf16(x, WIDEN: tl.constexpr):
    # x rounded to bf16, to nearest (ties to even) as the GPU's conversion does. WIDEN (the interpreter, see
    # _launch_prec): kept as fp32 holding the bf16 value, rounded by hand, because the interpreter's fp32 ->
    # bf16 conversion truncates (twice the error of the GPU's)
    if WIDEN:
        if x.dtype == tl.bfloat16:
            out = x.to(tl.float32)
        else:
            b = x.to(tl.float32).to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            out = b.to(tl.float32, bitcast=True)
    else:
        out = x.to(tl.bfloat16)
    return out

@triton.jit
def _bf16_dot(a, b, WIDEN: tl.constexpr):  # a·b on bf16 operands (see _to_bf16), fp32 accumulation
    if WIDEN:
        out = tl.dot(_to_bf16(a, WIDEN), _to_bf16(b, WIDEN), input_precision="ieee")  # (exact in fp32)
    else:
        out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    return out

@triton.jit
def _out(x, P, PREC: tl.constexpr):
    # a result about to be stored at P: into bf16 under the interpreter rounded to nearest here (the store's
    # own conversion would truncate; see _to_bf16), else as it is (the store converts)
    if (PREC == "bf16_widened" or PREC == "bf16x2_widened") and P.dtype.element_ty == tl.bfloat16:
        out = _to_bf16(x, True)
    else:
        out = x
    return out

@triton.jit
def _chunk_dot(a, b, PREC: tl.constexpr):
    # Every product of the chunk kernels, accumulated in fp32 (docs/semantics.md "Numerics"): "bf16" and
    # "fp16" round both operands to the inputs' 16-bit type (tensor cores; the running state is fp32 and
    # is rounded only as an operand), "tf32" and "ieee" multiply fp32 operands as TF32 or exactly.
    if PREC == "bf16" or PREC == "bf16_widened":  # (widened: the interpreter's bf16 products, _launch_prec)
        out = _bf16_dot(a, b, PREC == "bf16_widened")
    elif PREC == "fp16":
        out = tl.dot(a.to(tl.float16), b.to(tl.float16))
    elif PREC == "bf16x2" or PREC == "bf16x2_widened":
        # about fp32 accuracy on bf16 tensor cores: an operand that is not bf16 is split into bf16 hi + lo
        # (the lo·lo product dropped), so products with the fp32 triangular inverse and fp32 gradients keep
        # ~16 significant bits where one bf16 rounding would keep 8
        wide: tl.constexpr = PREC == "bf16x2_widened"
        ah = _to_bf16(a, wide)
        bh = _to_bf16(b, wide)
        out = _bf16_dot(ah, bh, wide)
        if a.dtype != tl.bfloat16:
            out += _bf16_dot(a.to(tl.float32) - ah.to(tl.float32), bh, wide)
        if b.dtype != tl.bfloat16:
            out += _bf16_dot(ah, b.to(tl.float32) - bh.to(tl.float32), wide)
    else:  # (16-bit tiles read in place are widened first: exact)
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)
    return out
