"""CPU speed of the chunk readouts (docs/semantics.md: chunk readouts): Moneta and Memora with readout=chunk
against Titans (same MLP memory, same C = 64), forward + backward through apply(..., backend="torch",
algorithm="chunked"); the per-token forms (moneta_token, memora_token) for comparison. torch, float32, one thread;
the best of N interleaved runs.

    PYTHONPATH=. python benchmarks/chunk_readout_cpu.py [--reps 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import mirasc

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["titans", "moneta", "memora", "moneta_token", "memora_token"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-B", type=int, default=2)
    ap.add_argument("-T", type=int, default=256)
    ap.add_argument("-H", type=int, default=2)
    ap.add_argument("-D", type=int, default=32)
    ap.add_argument("--names", nargs="*", default=NAMES)
    args = ap.parse_args()
    torch.set_num_threads(1)
    B, T, H, D = args.B, args.T, args.H, args.D
    g = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, D, generator=g)
    mods = {n: mirasc.compile_spec(ROOT / "specs" / f"{n}.miras") for n in args.names}

    def step(mod):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        channels = getattr(mod, "GATE_CHANNELS", {})  # channel-wise gates (lr=gate(v)): [B, T, H, D]
        gates = {n: (0.2 + 0.7 * torch.rand(B, T, H, *([D] if n in channels else []),
                                            generator=torch.Generator().manual_seed(1))).requires_grad_(True)
                 for n in mod.GATES}
        o, final = mod.apply(*leaves, gates, backend="torch", algorithm="chunked")
        loss = o.square().sum() + sum(x.square().sum() for x in final.values())
        loss.backward()

    for mod in mods.values():  # warm-up
        step(mod)
    best = {n: float("inf") for n in mods}
    for _ in range(args.reps):
        for n, mod in mods.items():
            t0 = time.perf_counter()
            step(mod)
            best[n] = min(best[n], time.perf_counter() - t0)
    print(f"forward+backward, apply(backend='torch', algorithm='chunked'), B={B} T={T} H={H} D={D} "
          f"(MLP hidden {4 * D}), float32, 1 thread, best of {args.reps}; torch {torch.__version__}")
    ref = best.get("titans")
    for n, t in best.items():
        rel = f"{t / ref:.2f}x Titans" if ref else ""
        print(f"  {n:<14} {1e3 * t:8.1f} ms  {rel}")


if __name__ == "__main__":
    main()
