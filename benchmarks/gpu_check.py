"""Do the emitted Triton paths of every bundled spec compile, launch and compute the spec on a real GPU?

    python benchmarks/gpu_check.py --emit benchmarks/emitted                 # here: compile every spec in specs/
    python benchmarks/gpu_check.py --jobs 12 --out $OUT/gpu_check.md          # GPU machine (carry benchmarks/emitted)
    TRITON_INTERPRET=1 python benchmarks/gpu_check.py --smoke --spec gated_deltanet titans   # CPU: the harness

CI runs the kernels under the Triton interpreter, which neither allocates registers nor shared memory nor uses
the hardware's dot instructions; the ahead-of-time report (`mirasc kernels`) compiles them for sm_90 but never
launches them. This script is the step after both: on the GPU, for every emitted module in the folder and every
Triton path it has (backend="triton" with algorithm="recurrent", and "chunked" where the module has CHUNKED), it
runs the forward and the backward and compares them with the same module's torch recurrence in float64 on the
same inputs (the path CI checks against the independent float64 reference): the output, every tensor of the final
state, and the gradients of q, k, v, every gate and extra input, the initial state and the learned parameters,
under random cotangents on the output and the final state. Error: max over those of ‖a − b‖ / ‖b‖.

Two settings: float32 at B=2, T=100, H=2, D=64 (every chunk path has a ragged last chunk), and bfloat16 at B=2,
T=256, H=4, D=128 (the inputs are rounded to bf16 first; the reference runs on the rounded values in float64).
Status of a case: ok; refused (the module raised ValueError/NotImplementedError, the way a spec says a Triton
path does not exist at this size, before any launch); FAIL (any other exception: a compile error, out of
resources, a CUDA error, a process killed by the per-spec timeout); WRONG (error over max(tolerance, twice the
error of the module's torch recurrence run at the same dtype against the same reference); the tolerance is 1e-3 in
float32 and 5e-2 in bf16); cut (still running at --deadline-s, the call's own limit). Each spec runs in its
own process (a crash or a hang costs one spec), `--jobs` at a time, with a per-spec timeout; the table is rewritten
after every spec, so a call cut off by the device's time limit keeps what finished.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EMIT_DIR = HERE / "emitted"
# Ranges of the gates (docs/module-api.md: the op takes gates in their natural domains).
RANGES = {"eta": (0.05, 0.5), "alpha": (0.8, 1.0), "theta": (0.0, 0.9), "delta": (0.5, 3.0),
          "gamma": (0.5, 1.0), "nu": (0.9, 1.0), "rho": (0.05, 1.0)}
SETTINGS = {  # name: (dtype, B, T, H, D, tolerance)
    "fp32": ("float32", 2, 100, 2, 64, 1e-3),
    "bf16": ("bfloat16", 2, 256, 4, 128, 5e-2),
}
SMOKE = {"fp32": ("float32", 1, 20, 1, 16, 1e-3)}
# Checked first (a lease may cut the rest): the paths the 2026-12-04 H200 run failed or never reached, and what
# changed after it (flash kernels, exact fp32 dots in the per-head chunk kernels, refusals); then the others.
FIRST = ["transformer", "forgetting_transformer", "sliding_window", "stickbreaking", "sink_attention",
         "gated_deltanet", "deltanet", "mamba2", "linear_attention", "retnet", "memora", "based", "hedgehog",
         "titans", "ttt_linear", "ttt_mlp", "yaad", "sparse_lp", "rwkv7", "precond_kda", "comba", "longhorn",
         "deltaproduct", "gated_deltaproduct", "precond_gated_deltanet", "linear_attention_elu"]


def emit(out_dir: Path, names: list[str] | None) -> None:
    """Compile specs/NAME.miras (all of them by default) into out_dir (run where mirasc is installed)."""
    sys.path.insert(0, str(ROOT))
    from mirasc.cli import main

    paths = [ROOT / "specs" / f"{n}.miras" for n in names] if names else sorted((ROOT / "specs").glob("*.miras"))
    for path in paths:
        if main(["compile", str(path), "-o", str(out_dir)]) not in (0, None):
            raise SystemExit(f"{path}: does not compile")


def load(path: Path):
    """An emitted module, loaded from its file (the GPU machine has no mirasc package)."""
    spec = importlib.util.spec_from_file_location(f"mirasc_emitted_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rel(a, b) -> float:
    import torch

    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def make_case(mod, dtype, B, T, H, D, device, seed=0):
    """Inputs of one case, as float64 leaves on the device (already rounded to `dtype`)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype)

    def rounded(x):
        return x.to(dt).to(torch.float64).to(device)

    def unit(*shape):
        return rounded(torch.nn.functional.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1))

    sub = (mod.STEPS,) if hasattr(mod, "STEPS") else ()  # a multi-step learner: n keys, values, η, κ per token
    q, k = unit(B, T, H, D), unit(B, T, H, *sub, D)
    v = rounded(torch.randn(B, T, H, *sub, D, generator=g, dtype=torch.float64))
    channels = getattr(mod, "GATE_CHANNELS", {})
    gates = {}
    for name in mod.GATES:
        lo, hi = RANGES.get(name, (0.1, 0.9))
        shape = (B, T, H, *(sub if name == "eta" else ()), *(() if name not in channels else (D,)))
        gates[name] = rounded(lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64))
    extras = {name: unit(B, T, H, *sub, D) for name in getattr(mod, "EXTRAS", ())}
    state = None
    if getattr(mod, "WEIGHTS", ()):
        state = {n: rounded(t) for n, t in mod.init_state(B, H, D, D, dtype=torch.float64, generator=g).items()}
    params = {n: rounded(t) for n, t in mod.init_params(H, D, D, dtype=torch.float64, generator=g).items()}
    return q, k, v, gates, extras, state, params


def run_case(mod, inputs, backend, algorithm, dtype, seed=1, cu_seqlens=None):
    """(output, final-state tensors, gradients of every leaf) of one run at `dtype` (float64 for the reference);
    cu_seqlens: sequences packed in the one row of the inputs (B = 1; the caches, a list, are not compared)."""
    import torch

    dt = getattr(torch, dtype)
    q, k, v, gates, extras, state, params = inputs
    leaves = {"q": q, "k": k, "v": v, **{f"gate {n}": t for n, t in gates.items()},
              **{f"extra {n}": t for n, t in extras.items()},
              **{f"state {n}": t for n, t in (state or {}).items() if t.is_floating_point()},
              **{f"param {n}": t for n, t in params.items() if t.is_floating_point()}}
    # q, k, v and extra keys at the run's dtype; gates, state and parameters in float32 (float64 for the reference)
    wide = dt if dt == torch.float64 else torch.float32

    def dtype_of(n):
        return dt if n in ("q", "k", "v") or n.startswith("extra") else wide

    cast = {n: t.detach().to(dtype_of(n)).requires_grad_() for n, t in leaves.items()}
    kw = {"backend": backend, "algorithm": algorithm}
    if cu_seqlens is not None:
        kw["cu_seqlens"] = torch.tensor(cu_seqlens)
    if extras:
        kw["extras"] = {n: cast[f"extra {n}"] for n in extras}
    if state is not None:
        kw["state"] = {n: cast.get(f"state {n}", t) for n, t in state.items()}
    if params:
        kw["params"] = {n: cast.get(f"param {n}", t) for n, t in params.items()}
    out, final = mod.apply(cast["q"], cast["k"], cast["v"], {n: cast[f"gate {n}"] for n in gates}, **kw)
    finals = {n: t for n, t in (final.items() if isinstance(final, dict) else []) if torch.is_tensor(t)
              and t.is_floating_point() and t.requires_grad}
    g = torch.Generator(device="cpu").manual_seed(seed)
    loss = (out.double() * torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device)).sum()
    for n in sorted(finals):  # a fixed order: backends may return the state's keys in different orders
        t = finals[n]
        loss = loss + (t.double() * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.device)).sum()
    wrt = [n for n, t in cast.items()]
    grads = torch.autograd.grad(loss, [cast[n] for n in wrt], allow_unused=True)
    return out.detach(), {n: t.detach() for n, t in finals.items()}, dict(zip(wrt, grads))


def compare(got, ref) -> tuple[float, str]:
    """Worst relative error over output, final state and gradients, and what it was."""
    out, finals, grads = got
    r_out, r_finals, r_grads = ref
    errs = {"out": rel(out, r_out)}
    for n, t in r_finals.items():
        errs[f"final {n}"] = rel(finals[n], t) if n in finals else float("inf")
    for n, t in r_grads.items():
        if t is None or float(t.norm()) == 0.0:
            continue
        errs[f"d {n}"] = rel(grads[n], t) if grads.get(n) is not None else float("inf")
    worst = max(errs, key=errs.get)
    return errs[worst], worst


def refusal(err: Exception) -> bool:
    """Whether the module declined the path, with its reason, before any launch: its argument checks raise
    ValueError, and its "no Triton kernel for ..." and resource-model refusals raise RuntimeError naming the way out.
    Everything else (Triton's compile errors and OutOfResources, CUDA errors, wrong shapes inside) is a failure."""
    msg = str(err)
    if isinstance(err, (ValueError, NotImplementedError)):
        return True
    return type(err) is RuntimeError and ("backend='torch'" in msg or msg.startswith(("no ", "causal=false")))


def check_spec(path: Path, settings: dict, device: str) -> list[dict]:
    """Every Triton path of one emitted module at every setting; one record per case, printed as JSON lines."""
    import torch

    mod = load(path)
    algorithms = ["recurrent"] + (["chunked"] if getattr(mod, "CHUNKED", False) else [])
    # the attention memories' flash kernels also read sequences packed along time in one launch (their varlen
    # grid): "packed" runs B·T tokens as one row of three sequences, one of them empty, against the torch
    # recurrence run per sequence
    if hasattr(mod, "_triton_read"):
        algorithms.append("packed")
    records = []
    for setting, (dtype, B, T, H, D, tol) in settings.items():
        inputs = make_case(mod, dtype, B, T, H, D, device)
        ref, own = None, 0.0
        for algorithm in algorithms:
            rec = {"spec": path.stem, "setting": setting, "algorithm": algorithm, "shape": [B, T, H, D]}
            run = {"cu_seqlens": None}
            if algorithm == "packed":
                inputs = make_case(mod, dtype, 1, B * T, H, D, device)
                run = {"cu_seqlens": [0, B * T // 3, B * T // 3, B * T]}
                algorithm, ref, rec["shape"] = "auto", None, [1, B * T, H, D]
            try:
                t0 = time.perf_counter()  # the Triton path first: a refusal needs no reference
                got = run_case(mod, inputs, "triton", algorithm, dtype, **run)
                if device == "cuda":
                    torch.cuda.synchronize()
                rec["first_s"] = round(time.perf_counter() - t0, 2)  # compile (and autotune) + run
                if ref is None:
                    t0 = time.perf_counter()
                    ref = run_case(mod, inputs, "torch", "recurrent", "float64", **run)
                    rec["ref_s"] = round(time.perf_counter() - t0, 2)
                    # the torch recurrence's own error at this dtype (fp16/bf16 outputs and their cotangents are
                    # rounded): a kernel is judged against max(tolerance, 2x that)
                    own = compare(run_case(mod, inputs, "torch", "recurrent", dtype, **run), ref)[0]
                t0 = time.perf_counter()
                got = run_case(mod, inputs, "triton", algorithm, dtype, **run)
                if device == "cuda":
                    torch.cuda.synchronize()
                rec["warm_ms"] = round(1e3 * (time.perf_counter() - t0), 2)
                err, where = compare(got, ref)
                rec.update(err=err, worst=where, torch_err=own, status="ok" if err <= max(tol, 2 * own) else "WRONG")
            except Exception as e:
                if refusal(e):
                    rec.update(status="refused", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
                    records.append(rec)
                    print(json.dumps(rec), flush=True)
                    continue
                # a compile error, out of resources, a CUDA error: what this script is for
                rec.update(status="FAIL", error=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
                           if str(e).strip() else type(e).__name__, trace=traceback.format_exc()[-2000:])
                if device == "cuda":
                    try:
                        torch.cuda.synchronize()
                    except Exception as e2:  # a sticky CUDA error: the rest of this process is lost
                        rec["error"] += f" (then {type(e2).__name__})"
                        records.append(rec)
                        print(json.dumps(rec), flush=True)
                        return records
            records.append(rec)
            print(json.dumps(rec), flush=True)
    return records


def table(records: list[dict], header: str) -> str:
    lines = [header, "", "| spec | setting | algorithm | status | max rel. error (where) | first call s | warm ms | "
             "reference s | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r["spec"], r["setting"], r["algorithm"])):
        err = f"{r['err']:.1e} ({r['worst']}; torch {r['torch_err']:.0e})" if "err" in r else "—"
        lines.append(f"| {r['spec']} | {r['setting']} {tuple(r['shape'])} | {r['algorithm']} | {r['status']} | {err} | "
                     f"{r.get('first_s', '—')} | {r.get('warm_ms', '—')} | {r.get('ref_s', '—')} | "
                     f"{r.get('error', '').replace('|', '/')} |")
    counts = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines += ["", "cases: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emit", type=Path, metavar="DIR", help="compile the specs into DIR and exit (needs mirasc)")
    ap.add_argument("--emitted", type=Path, default=EMIT_DIR, help=f"the emitted modules (default {EMIT_DIR})")
    ap.add_argument("--spec", nargs="+", help="only these (file stems); default: every module in the folder")
    ap.add_argument("--jobs", type=int, default=4, help="specs checked at once, each in its own process")
    ap.add_argument("--spec-timeout-s", type=float, default=240.0, help="a spec's process is killed after this")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="start no spec after this many seconds")
    ap.add_argument("--deadline-s", type=float, default=float("inf"),
                    help="kill the specs still running after this many seconds and write the table")
    ap.add_argument("--smoke", action="store_true", help="one tiny float32 setting (CPU, TRITON_INTERPRET=1)")
    ap.add_argument("--out", type=Path, help="write the markdown table here (rewritten after every spec)")
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # internal: check one module, JSON lines out
    args = ap.parse_args(argv)
    if args.emit:
        emit(args.emit, args.spec)
        return 0
    if args.one:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        check_spec(args.one, SMOKE if args.smoke else SETTINGS, device)
        return 0

    paths = sorted(args.emitted.glob("*.py"), key=lambda p: (p.stem not in FIRST, FIRST.index(p.stem)
                                                             if p.stem in FIRST else 0, p.stem))
    if args.spec:
        paths = [args.emitted / f"{n}.py" for n in args.spec]
    start = time.perf_counter()
    records: list[dict] = []
    lock = threading.Lock()
    pending = list(paths)
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (interpreter)"
    header = (f"### gpu_check — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {device}, torch "
              f"{torch.__version__}, triton {triton_version()}")

    def write():
        text = table(records, header)
        if args.out:
            args.out.write_text(text, encoding="utf-8")
        return text

    def worker():
        while True:
            with lock:
                if not pending or time.perf_counter() - start > args.budget_s:
                    return
                path = pending.pop(0)
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(path)] + (["--smoke"] if args.smoke
                                                                                        else [])
            limit = min(args.spec_timeout_s, args.deadline_s - (time.perf_counter() - start))
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, limit),
                                      env=os.environ.copy())
                lines, tail, code = proc.stdout.splitlines(), proc.stderr[-1500:], proc.returncode
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                why = "the spec timeout" if limit == args.spec_timeout_s else "the deadline"
                lines, tail, code = out.splitlines(), f"killed at {why} after {max(1.0, limit):.0f} s", None
            got = [json.loads(x) for x in lines if x.startswith("{")]
            if code != 0:  # a crash or a timeout (a hang or an endless compile is a finding; the deadline is not)
                cut = code is None and "deadline" in tail
                got.append({"spec": path.stem, "setting": "—", "algorithm": "—", "shape": [],
                            "status": "cut" if cut else "FAIL",
                            "error": f"process exit {code}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"})
            with lock:
                records.extend(got)
                write()
                bad = [r for r in got if r["status"] in ("FAIL", "WRONG")]
                print(f"[{time.perf_counter() - start:6.1f} s] {path.stem}: "
                      + ", ".join(f"{r['setting']}/{r['algorithm']} {r['status']}" for r in got), flush=True)
                for r in bad:
                    print("   ", r.get("error", ""), r.get("trace", "")[-600:], flush=True)

    threads = [threading.Thread(target=worker) for _ in range(max(1, args.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    skipped = [p.stem for p in pending]
    text = write()
    print(text)
    if skipped:
        print("not started (time budget):", " ".join(skipped))
    return 0


def triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "none"


if __name__ == "__main__":
    sys.exit(main())
