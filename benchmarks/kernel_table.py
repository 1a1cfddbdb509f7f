"""The GPU-fit table of every bundled spec: `mirasc kernels` over specs x head sizes x targets.

    python benchmarks/kernel_table.py --out benchmarks/kernel_table.md [--d 64 128] [--target sm_90 sm_80]
        [--dtype bfloat16] [--extremes] [--specs gated_deltanet titans ...]

No GPU needed: every kernel each module launches with backend="triton" (every algorithm it has, forward
and backward) is compiled ahead of time for the target (see mirasc/lab/kernel_report.py). One row per
(spec, D, target): how many kernels, whether each has a configuration the resource model keeps that
fits, whether any kept one does not fit, the largest shared memory and spill among the best kept
configurations, whether every forward kernel has a kept configuration without spills, and the slowest
compile. MLP memories use their spec's expansion (E = 4·D for the bundled ones). Kernel sources that
several specs share are compiled once per run (Triton's cache), so their compile time shows on the first
spec only. `--extremes` compiles only the first (safest) and last (largest) kept configuration of each
autotuned kernel; without it, every configuration of every autotuning space.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


ALGORITHMS = ["chunked", "recurrent"]  # each traced apart; an algorithm a spec lacks on Triton is skipped


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="markdown file to write (default: print only)")
    ap.add_argument("--json", default=None, help="also write every compiled row as JSON")
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--target", nargs="+", default=["sm_90", "sm_80"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--extremes", action="store_true")
    ap.add_argument("--specs", nargs="+", default=None)
    ap.add_argument("--algorithm", nargs="+", default=None, choices=["chunked", "recurrent"],
                    help="trace only these algorithms (default: every algorithm each spec has)")
    a = ap.parse_args(argv)
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="mirasc-kernel-table-"))
    from mirasc.lab import kernel_report as kr

    specs = a.specs or sorted(p.stem for p in (ROOT / "specs").glob("*.miras"))
    lines = ["| spec | algorithm | D | target | kernels | every kernel fits | kept but too big | max smem KB (best) | "
             "max spill B (best) | fwd without spill | slowest compile s | worst kernel |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    every = []
    t_all = time.perf_counter()
    for name in specs:
        for d, target, algo in [(d, t, al) for d in a.d for t in a.target for al in (a.algorithm or ALGORITHMS)]:
            t0 = time.perf_counter()
            try:
                rows = kr.report(str(ROOT / "specs" / f"{name}.miras"), target=target, dk=d, dv=d, dtype=a.dtype,
                                 T=a.length, which="extremes" if a.extremes else "all", algorithms=[algo])
            except kr.NoKernels as err:  # a module without Triton kernels
                if algo == (a.algorithm or ALGORITHMS)[0]:
                    lines.append(f"| {name} | — | {d} | {target} | 0 | torch only: {str(err)[:90]} | | | | | | |")
                    print(lines[-1], flush=True)
                continue
            if not rows:  # this algorithm has no Triton kernel for the spec (torch only)
                continue
            refused = [r for r in rows if r.kernel.endswith("refused)")]
            if refused:  # a kernel the module will not launch at this size: the reason, verbatim
                lines.append(f"| {name} | {algo} | {d} | {target} | — | **refused**: {refused[0].error[:160]} "
                             "| | | | | | |")
                print(lines[-1], flush=True)
                continue
            summ = kr.summarize(rows)
            best = [s["best"] for s in summ if s["best"]]
            fits = all(s["kept_fit"] > 0 for s in summ)
            too_big = sum(s["kept_not_fit"] for s in summ)
            fwd_ok = all(any(r.spill_bytes == 0 and r.ok and r.fits and r.kept is not False
                             for r in rows if r.kernel == s["kernel"])
                         for s in summ if s["direction"] == "fwd")
            worst = max(summ, key=lambda s: (s["best"] is None, (s["best"] or {}).get("shared_bytes", 0)),
                        default=None)
            lines.append(
                f"| {name} | {algo} | {d} | {target} | {len(summ)} | {'yes' if fits else '**no**'} | {too_big} | "
                f"{max((b['shared_bytes'] for b in best), default=0) / 1024:.1f} | "
                f"{max((b['spill_bytes'] for b in best), default=0)} | {'yes' if fwd_ok else '**no**'} | "
                f"{max((r.compile_s for r in rows), default=0):.1f} | {worst['kernel'] if worst else ''} |")
            print(lines[-1], f"({time.perf_counter() - t0:.0f} s)", flush=True)
            every += [dict(r.__dict__, spec=name, algorithm=algo, d=d, target=target) for r in rows]
    flags = (" --extremes" if a.extremes else "") + (f" --algorithm {' '.join(a.algorithm)}" if a.algorithm else "")
    head = (f"`python benchmarks/kernel_table.py{flags}` — {a.dtype}, T={a.length}, "
            f"Triton {__import__('triton').__version__}, {time.perf_counter() - t_all:.0f} s on this machine\n\n")
    text = head + "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text, encoding="utf-8")
    if a.json:
        Path(a.json).write_text(json.dumps(every, indent=1), encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
