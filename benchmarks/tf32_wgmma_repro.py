"""The smallest kernel with the shape of the chunk state scan whose TF32 build faulted on an H200, and what its
TF32, bf16-operand and exact-fp32 builds compile to for sm_90.

On 2026-12-04 (H200, Triton 3.6; benchmarks/RESULTS.md "GPU") the per-head chunk kernels' TF32 build stopped with
"out-of-range shared or local address" at the store of u after `u += tl.dot(wk, tl.trans(w))` in the state scan.
This file keeps that pattern alone: a [BV, BK] fp32 state tile carried in registers across chunks, the product
with the transposed state, the store of u, and the rank-BT update of the state.

    python benchmarks/tf32_wgmma_repro.py            # ahead of time, no GPU: what each build lowers the dots to
    python benchmarks/tf32_wgmma_repro.py --run      # on a GPU: run each build against float64 (a fault is a row)

Ahead of time (Triton 3.9, sm_90, BT = 64, BK = 64, BV = 16, 8 warps), read from the TTGIR and PTX:
- TF32 (`input_precision="tf32"` on fp32 tiles): u += Wk·Wᵀ becomes an asynchronous warpgroup MMA
  (`wgmma ... m64n8k8.f32.tf32.tf32`) whose BOTH operands are read from 128-byte-swizzled shared memory: the
  loaded Wk tile is copied there, and the register-resident state W is written there and read through a
  transposed view of a 32-bit layout; its result then goes back through shared scratch (a layout conversion)
  before the store of u. Shared memory: 20 KB.
- bf16 operands (tiles rounded to bf16 in registers, fp32 accumulation): the same product reads Wk from
  registers and only W from shared memory (`m64n8k16.f32.bf16.bf16`, the form flash-linear-attention's kernels
  run); 16 KB.
- exact fp32 (`"ieee"`): no matrix instruction (FMA units); 192 registers here (255 and 88 B of spill in the
  full scan, which carries the state as two K blocks).
The GPU run that would tell which of the TF32 build's shared-memory accesses is out of range has not been made
(no device since); the chunk kernels therefore never take TF32 operands: fp16/bf16 inputs run the bf16 build.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _scan(K, WK, U, UU, W, T, N, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, MODE: tl.constexpr):
    # w [BV, BK] carried in registers; per chunk: u = Wk wᵀ - U -> UU; w <- w - uᵀ K
    rt = tl.arange(0, BT)
    rk = tl.arange(0, BK)
    rv = tl.program_id(0) * BV + tl.arange(0, BV)
    w = tl.load(W + rv[:, None] * N + rk[None, :])
    for c in range(T // BT):
        tok = c * BT + rt
        k = tl.load(K + tok[:, None] * N + rk[None, :])
        wk = tl.load(WK + tok[:, None] * N + rk[None, :])
        if MODE == "bf16":
            u = tl.dot(wk.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)))
        else:
            u = tl.dot(wk, tl.trans(w), input_precision=MODE)
        u -= tl.load(U + tok[:, None] * N + rv[None, :])
        tl.store(UU + tok[:, None] * N + rv[None, :], u)
        if MODE == "bf16":
            w -= tl.dot(tl.trans(u).to(tl.bfloat16), k.to(tl.bfloat16))
        else:
            w -= tl.dot(tl.trans(u), k, input_precision=MODE)
    tl.store(W + rv[:, None] * N + rk[None, :], w)


MODES = ("tf32", "bf16", "ieee")


def reference(k, wk, u, w, bt):
    k, wk, u, w = (x.double() for x in (k, wk, u, w))
    uu = torch.empty_like(u)
    for c in range(k.shape[0] // bt):
        s = slice(c * bt, (c + 1) * bt)
        uu[s] = wk[s] @ w.T - u[s]
        w = w - uu[s].T @ k[s]
    return uu, w


def inputs(T=256, N=64, device="cpu"):
    g = torch.Generator().manual_seed(0)
    k = torch.nn.functional.normalize(torch.randn(T, N, generator=g), dim=-1) * 0.5
    return [x.to(device) for x in (k, 0.5 * k, torch.randn(T, N, generator=g), 0.1 * torch.randn(N, N, generator=g))]


def compile_facts(mode, bt=64, n=64, bv=16):
    """What the sm_90 build of one mode lowers to: matrix instructions, where each wgmma reads its operands from,
    shared memory, registers and spills (cuobjdump)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from mirasc.lab.kernel_report import _cubin_resources, _sass_mma_kinds

    sig = {"K": "*fp32", "WK": "*fp32", "U": "*fp32", "UU": "*fp32", "W": "*fp32", "T": "i32", "N": "i32",
           "BT": "constexpr", "BK": "constexpr", "BV": "constexpr", "MODE": "constexpr"}
    src = ASTSource(fn=_scan, signature=sig, constexprs={"BT": bt, "BK": n, "BV": bv, "MODE": mode})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 1})
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    regs, spill = _cubin_resources(k.asm["cubin"])
    shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+\.\w+\.\w+\.\w+)", ptx)))
    both_shared = len(re.findall(r"warp_group_dot %\S+, %\S+, %\S+ \{[^}]*\} : !ttg\.memdesc", ttgir))
    return {"mode": mode, "mma": _sass_mma_kinds(k.asm["cubin"]), "wgmma": shapes,
            "wgmma_A_from_shared": both_shared, "shared_bytes": int(k.metadata.shared), "registers": regs,
            "spill_bytes": spill}


def run_all():
    k, wk, u, w = inputs(device="cuda")
    ref_u, ref_w = reference(k, wk, u, w, 64)
    for mode in MODES:
        uu, w_out = torch.empty_like(u), w.clone()
        try:
            _scan[(w.shape[0] // 16,)](k, wk, u, uu, w_out, k.shape[0], k.shape[1], BT=64, BK=64, BV=16, MODE=mode,
                                       num_warps=8, num_stages=1)
            torch.cuda.synchronize()
            err_u = ((uu.double() - ref_u).norm() / ref_u.norm()).item()
            err_w = ((w_out.double() - ref_w).norm() / ref_w.norm()).item()
            print(f"{mode:5s} ok     u {err_u:.2e}  W {err_w:.2e}")
        except Exception as err:  # the fault itself is the finding: reported, then the next mode (a new context
            print(f"{mode:5s} FAILED {type(err).__name__}: {str(err).splitlines()[0][:200]}")  # may be needed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="run each build on the GPU against float64")
    args = ap.parse_args(argv)
    if args.run:
        run_all()
        return 0
    for mode in MODES:
        print(compile_facts(mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
