"""CPU benchmarks for the core: one command, one table of ratios against peers measured in
the same run.

    python benchmarks/run.py            # full sizes (a few minutes on 2 cores)
    python benchmarks/run.py --quick    # smaller sizes, for a smoke run

1. emitted `chunked` vs `recurrent`, per spec (forward, float32);
2. Gated DeltaNet `chunked` vs flash-linear-attention `naive_chunk_gated_delta_rule`
   (B=1, T=2048, H=4, D=64; forward and forward+backward);
3. a Titans layer vs titans-pytorch `NeuralMemory` at an equal configuration (dim 256, 4 heads of
   a depth-2 expansion-4 MLP memory over 256-d heads, chunk 64, T=2048; forward and forward+backward);
4. compile time per spec: cold (fresh process, imports included) and cached (same text again).
Timings are the median of `--repeat` runs after one warm-up.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import mirasc  # noqa: E402


def timeit(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def inputs(mod, B, T, H, D, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    sub = [mod.STEPS] if hasattr(mod, "STEPS") else []  # multi-step learners: n keys, values, η, κ per token
    q = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, *sub, D, generator=g), dim=-1)
    v = torch.randn(B, T, H, *sub, D, generator=g)
    lo_hi = {"eta": (0.05, 0.5), "alpha": (0.9, 1.0), "theta": (0.0, 0.9), "delta": (0.2, 1.0)}
    channels = getattr(mod, "GATE_CHANNELS", {})  # channel-wise gates are [B, T, H, D] (Dk = Dv = D here)
    gates = {n: lo_hi[n][0] + (lo_hi[n][1] - lo_hi[n][0])
             * torch.rand(B, T, H, *(sub if n == "eta" else []), *([D] if n in channels else []), generator=g)
             for n in mod.GATES}
    for n in getattr(mod, "EXTRAS", ()):  # key inputs besides q, k (κ): unit-norm rows, passed with the gates
        gates[n] = torch.nn.functional.normalize(torch.randn(B, T, H, *sub, D, generator=g), dim=-1)
    if requires_grad:
        for t in (q, k, v, *gates.values()):
            t.requires_grad_(True)
    return q, k, v, gates


def call(mod, q, k, v, gates, **kw):
    """mod.apply with the key inputs in EXTRAS taken out of `gates`."""
    extras = {n: gates[n] for n in getattr(mod, "EXTRAS", ())}
    gates = {n: x for n, x in gates.items() if n not in extras}
    return mod.apply(q, k, v, gates, **({"extras": extras} if extras else {}), **kw)


def bench_chunked_vs_recurrent(args, rows):
    B, T, H, D = 1, args.T_small, 4, 32
    for path in sorted(glob.glob(str(ROOT / "specs" / "*.miras"))):
        mod = mirasc.compile_spec(path)
        if not mod.CHUNKED:
            rows.append((f"{Path(path).stem}: chunked vs recurrent", "—", "—", "no chunked form (exact nonlinear)"))
            continue
        q, k, v, gates = inputs(mod, B, T, H, D)
        def run(algorithm, mod=mod, q=q, k=k, v=v, gates=gates):
            return call(mod, q, k, v, gates, algorithm=algorithm)

        t_rec = timeit(lambda: run("recurrent"), args.repeat)
        t_chk = timeit(lambda: run("chunked"), args.repeat)
        rows.append((f"{Path(path).stem}: chunked vs recurrent (fwd)", f"{t_chk * 1e3:.1f} ms",
                     f"{t_rec * 1e3:.1f} ms", f"{t_rec / t_chk:.1f}x"))


def bench_gdn_vs_fla(args, rows):
    try:
        from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule
    except ImportError:
        rows.append(("gated_deltanet vs fla naive_chunk", "—", "—", "fla not installed: pip install fla-core einops"))
        return
    mod = mirasc.compile_spec(ROOT / "specs" / "gated_deltanet.miras")
    B, T, H, D = 1, args.T_large, 4, 64
    q, k, v, gates = inputs(mod, B, T, H, D, requires_grad=True)
    W0 = torch.zeros(B, H, D, D)

    def ours(backward):
        o, s = mod.apply(q, k, v, gates, state={"W": W0}, algorithm="chunked", chunk_size=64)
        if backward:
            (o.sum() + s["W"].sum()).backward()

    def theirs(backward):
        o, s = naive_chunk_gated_delta_rule(q=q, k=k, v=v, g=gates["alpha"].log(), beta=gates["eta"], chunk_size=64,
                                            scale=1.0, initial_state=W0.transpose(-1, -2), output_final_state=True)
        if backward:
            (o.sum() + s.sum()).backward()

    for backward, label in ((False, "fwd"), (True, "fwd+bwd")):
        with torch.set_grad_enabled(backward):
            t_ours = timeit(lambda b=backward: ours(b), args.repeat)
            t_fla = timeit(lambda b=backward: theirs(b), args.repeat)
        rows.append((f"gated_deltanet chunked vs fla naive_chunk_gated_delta_rule ({label}, T={T})",
                     f"{t_ours * 1e3:.1f} ms", f"{t_fla * 1e3:.1f} ms", f"{t_fla / t_ours:.2f}x"))


def bench_titans(args, rows):
    try:
        from titans_pytorch import NeuralMemory
    except ImportError:
        rows.append(("titans layer vs titans-pytorch", "—", "—", "titans-pytorch not installed"))
        return
    T, dim, heads = args.T_large, 256, 4
    torch.manual_seed(0)
    mod = mirasc.compile_spec(ROOT / "specs" / "titans.miras")
    ours = mod.Layer(dim, heads, head_dim=dim)
    theirs = NeuralMemory(dim=dim, chunk_size=64, heads=heads, default_model_kwargs=dict(depth=2, expansion_factor=4.0))
    x = torch.randn(1, T, dim)

    def run(layer, backward, peer):
        out = layer(x)[0] if peer else layer(x)
        if backward:
            out.sum().backward()

    repeat = max(1, args.repeat // 2)
    for backward, label in ((False, "fwd"), (True, "fwd+bwd")):
        with torch.set_grad_enabled(backward):
            t_ours = timeit(lambda b=backward: run(ours, b, False), repeat)
            t_peer = timeit(lambda b=backward: run(theirs, b, True), 1)
        rows.append((f"titans layer vs titans-pytorch NeuralMemory ({label}, T={T}, dim 256, 4 heads)",
                     f"{t_ours * 1e3:.0f} ms", f"{t_peer * 1e3:.0f} ms", f"{t_peer / t_ours:.1f}x"))


def bench_compile(args, rows):
    specs = sorted(glob.glob(str(ROOT / "specs" / "*.miras")))
    code = ("import time, sys; t = time.perf_counter(); import mirasc; "
            "mirasc.compile_text(open(sys.argv[1]).read()); print(time.perf_counter() - t)")
    colds, cached = [], []
    for path in specs:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, env=env, check=True)
        colds.append(float(out.stdout.strip()))
        text = Path(path).read_text()
        mirasc.compile_spec(text)
        t = time.perf_counter()
        mirasc.compile_spec(text)
        cached.append(time.perf_counter() - t)
    rows.append((f"compile, cold (fresh process incl. imports; max over {len(specs)} specs)",
                 f"{max(colds) * 1e3:.0f} ms", "target 1000 ms", f"median {statistics.median(colds) * 1e3:.0f} ms"))
    rows.append(("compile, cached (same spec text again; max)", f"{max(cached) * 1e3:.3f} ms", "target 50 ms", ""))
    slow = max(specs, key=lambda p: colds[specs.index(p)])
    rows.append(("  slowest cold spec", Path(slow).stem, "", ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=["chunked", "gdn", "titans", "compile"], action="append")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    args = ap.parse_args()
    args.T_small = 256 if args.quick else 1024
    args.T_large = 512 if args.quick else 2048
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    rows: list[tuple[str, str, str, str]] = []
    steps = {"chunked": bench_chunked_vs_recurrent, "gdn": bench_gdn_vs_fla, "titans": bench_titans,
             "compile": bench_compile}
    for name in args.only or list(steps):
        steps[name](args, rows)
    print(f"\nmirasc benchmarks — {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, CPU\n")
    w = max(len(r[0]) for r in rows)
    print(f"{'case':<{w}}  {'mirasc':>12}  {'peer/other':>14}  speed-up")
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:>12}  {r[2]:>14}  {r[3]}")


if __name__ == "__main__":
    main()
