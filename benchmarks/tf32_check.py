"""One gpu_check case on the CPU, per leaf, with TF32 dots emulated: does a GPU error come from TF32?

    python benchmarks/gpu_check.py --emit /tmp/em --spec memora
    TRITON_INTERPRET=1 python benchmarks/tf32_check.py /tmp/em/memora.py bfloat16 1 256 1 128 \\
        torch:chunked torch:chunked:tf32-trunc triton:chunked triton:chunked:tf32-trunc

Inputs, reference and error are gpu_check's (make_case, run_case: the module's float64 torch recurrence;
‖a − b‖ / ‖b‖ for the output, every final-state tensor and every gradient), printed per leaf as JSON lines.
A path is BACKEND:ALGORITHM[:tf32-KIND], KIND "trunc" (the low 13 mantissa bits dropped, what tensor cores do
with fp32 operands) or "rna" (rounded to nearest, ties away). With it, on the torch backend every float32
mm/bmm/addmm/baddbmm (forward and backward, torch dispatch) takes TF32 operands; on the triton backend (under
TRITON_INTERPRET=1) every tl.dot with input_precision="tf32" does (the kernels' PREC for bf16/fp16 inputs); the
interpreter otherwise computes those dots exactly. Accumulation stays float32 in both. Run the triton paths
without emulation before those with it (the interpreter is patched for the rest of the process).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as gc  # noqa: E402

KIND = {"kind": "trunc"}
_MASK = 0xFFFFE000  # sign, exponent and the top 10 mantissa bits of a float32


def tf32_np(x):
    if x.dtype != np.float32:
        return x
    i = np.ascontiguousarray(x).view(np.uint32)
    if KIND["kind"] == "rna":
        i = i + np.uint32(0x1000)
    return (i & np.uint32(_MASK)).view(np.float32).reshape(x.shape)


def tf32_torch(x):
    if not torch.is_tensor(x) or x.dtype != torch.float32:
        return x
    i = x.contiguous().view(torch.int32)
    if KIND["kind"] == "rna":
        i = i + 0x1000
    return (i & (_MASK - (1 << 32))).view(torch.float32)


def patch_interpreter():
    import triton.runtime.interpreter as interp
    from triton._C.libtriton import ir

    orig = interp.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32:
            a = interp.TensorHandle(tf32_np(a.data), a.dtype)
            b = interp.TensorHandle(tf32_np(b.data), b.dtype)
        return orig(self, a, b, d, input_precision, max_num_imprecise_acc)

    interp.InterpreterBuilder.create_dot = create_dot


class TF32Matmuls(TorchDispatchMode):
    """Every float32 matrix product (forward and backward) with TF32 operands, float32 accumulation."""

    PLAIN = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)
    ADD = (torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.PLAIN:
            args = tuple(tf32_torch(a) for a in args)
        elif func in self.ADD:
            args = (args[0], tf32_torch(args[1]), tf32_torch(args[2]), *args[3:])
        return func(*args, **(kwargs or {}))


def errors(got, ref) -> dict:
    out, finals, grads = got
    r_out, r_finals, r_grads = ref
    errs = {"out": gc.rel(out, r_out)}
    for n, t in r_finals.items():
        errs[f"final {n}"] = gc.rel(finals[n], t) if n in finals else float("inf")
    for n, t in r_grads.items():
        if t is not None and float(t.norm()) != 0.0:
            errs[f"d {n}"] = gc.rel(grads[n], t) if grads.get(n) is not None else float("inf")
    return errs


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 7:
        print(__doc__)
        return 2
    path, dtype, (B, T, H, D), paths = Path(argv[0]), argv[1], map(int, argv[2:6]), argv[6:]
    mod = gc.load(path)
    inputs = gc.make_case(mod, dtype, B, T, H, D, "cpu")
    t0 = time.perf_counter()
    ref = gc.run_case(mod, inputs, "torch", "recurrent", "float64")
    print(json.dumps({"reference_s": round(time.perf_counter() - t0, 1)}), flush=True)
    patched = False
    for p in paths:
        backend, algorithm, *opt = p.split(":")
        ctx = contextlib.nullcontext()
        if opt:
            KIND["kind"] = opt[0].removeprefix("tf32-")
            if backend == "torch":
                ctx = TF32Matmuls()
            elif not patched:
                patch_interpreter()
                patched = True
        t0 = time.perf_counter()
        with ctx:
            got = gc.run_case(mod, inputs, backend, algorithm, dtype)
        errs = errors(got, ref)
        worst = max(errs, key=errs.get)
        print(json.dumps({"spec": path.stem, "dtype": dtype, "shape": [B, T, H, D], "path": p,
                          "s": round(time.perf_counter() - t0, 1), "worst": worst, "max": errs[worst],
                          "errs": {n: float(f"{e:.3g}") for n, e in errs.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
