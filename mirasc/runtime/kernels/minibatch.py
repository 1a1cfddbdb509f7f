"""What the mini-batch (dual-form) kernels of MLP memories share, whose bodies are printed from the spec's IR
(mirasc/codegen/triton_minibatch.py, triton_minibatch_stream.py): every product, with fp32 operands split in two
bf16 parts on the tensor cores or exact (docs/semantics.md "Numerics")."""

import triton
import triton.language as tl


@triton.jit
def _mb_bf16(x):
    # x rounded to bf16 to nearest (ties to even), as the GPU's conversion does, held as fp32 (the interpreter's
    # own conversion truncates)
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _mb_dot(a, b, PREC: tl.constexpr):
    # every product of the mini-batch kernels, accumulated in fp32 (docs/semantics.md "Numerics"). Their operands
    # are fp32 intermediates (activations, weights, factors): "bf16x3" takes each as two bf16 parts, hi + lo, on
    # the tensor cores (hi·hi + hi·lo + lo·hi, about 16 significant bits); "bf16x3_emulated" computes the same
    # three products exactly in fp32 (the interpreter, whose tl.dot ignores the precision: _mb_launch_prec);
    # "tf32" and "ieee" multiply fp32 operands as TF32 or exactly
    if PREC == "bf16x3_emulated":
        ah = _mb_bf16(a)
        bh = _mb_bf16(b)
        out = tl.dot(ah, bh, input_precision="ieee")
        out += tl.dot(_mb_bf16(a.to(tl.float32) - ah), bh, input_precision="ieee")
        out += tl.dot(ah, _mb_bf16(b.to(tl.float32) - bh), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PREC)
    return out
