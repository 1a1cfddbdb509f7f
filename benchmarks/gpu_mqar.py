"""MQAR rows on a lent GPU: `mirasc explore`'s training and evaluation for emitted modules, torch only.

    python benchmarks/gpu_mqar.py --emit benchmarks/emitted_mqar --spec atlas        # here (needs the compiler)
    python benchmarks/gpu_mqar.py --spec atlas --lr 1e-2 3e-3 --seeds 0 1 \\
        --time-budget-s 540 --out $OUT/gpu_mqar.md                                   # GPU machine (carry the folder)

The GPU image has torch and triton but not lark/sympy/pydantic, and nothing from this package is installed there.
So `--emit DIR` compiles the specs here into standalone files (as benchmarks/gpu_suite.py does; DIR is ignored by
git: carry it), and the run imports only torch, the emitted files (which import triton), and mirasc/lab/tasks.py,
mirasc/runtime/lm.py and mirasc/lab/trainloop.py loaded by file path — never the `mirasc` package
(tests/tools/test_gpu_mqar.py runs it with mirasc, lark, sympy, pydantic and networkx blocked). torch.optim imports
torch._dynamo, which imports sympy: where sympy is missing, an eager stand-in for torch._dynamo is installed (see
eager_optimizers_without_sympy; nothing is compiled, so the numbers do not change).

Same run as `mirasc explore --task mqar --spec FILE --seq-len 64 --task-opt num_kv_pairs=8 --eval-lengths 64 128
256 --eval-examples 64 --steps 1000 --lr LR --seeds S`: d_model 64, 2 blocks, 2 heads, batch 32, AdamW (weight
decay 0.1) with warm-up and cosine, the same training batches, initialisation and evaluation set per seed (the
loop and the evaluation are mirasc/lab/trainloop.py, which explore calls too). On the CPU with the same thread count
the losses and accuracies equal explore's bit for bit (the test checks it). On CUDA the model runs in float32 as
on the CPU, but the kernels differ (cuBLAS, the emitted Triton paths where `backend="auto"` picks them), so a GPU
row is the same experiment up to float rounding, not the same bits; `--tf32` allows TF32 matmuls (faster, ~1e-3
relative rounding: say so next to a row made with it). After every run the table so far is written to
OUT.partial (OUT: the --out file), so a call cut off by the device's time limit keeps the finished rows; at the
end the table is appended to OUT and the .partial file removed.

GPU plan for Atlas (specs/atlas.miras at the RESULTS setting; benchmarks/RESULTS.md: "Atlas at the RESULTS
setting: out of reach on this CPU", 2026-12-04, and "GPU"):
  1. here: `python benchmarks/gpu_mqar.py --emit benchmarks/emitted_mqar --spec atlas` (40 KB; ignored by git).
  2. probe, run(carry=["benchmarks/emitted_mqar"], timeout_s=150):
     `python benchmarks/gpu_mqar.py --spec atlas --steps 20 --eval-examples 32 --out $OUT/probe.md`
     (s/step is printed for steps 1-5 and every 25th; the table gives s/step over the run and peak GiB).
  3. the rows, same carry, timeout_s=600: `python benchmarks/gpu_mqar.py --spec atlas --lr 1e-2 3e-3 --seeds 0 1
     --time-budget-s 540 --out $OUT/gpu_mqar.md`: lr 1e-2 seeds 0 and 1, then lr 3e-3 seeds 0 and 1; a run is
     not started when the time spent plus the last run's time passes the budget, and the table so far is in
     $OUT/gpu_mqar.md.partial after every run (a timeout keeps it). Add `--tf32` if the probe shows more than
     ~0.5 s/step (and say "TF32" next to the rows). Copy the table into RESULTS.md.
  Cost. Muon orthogonalises every token's momentum: W1 of each head is 128 x 1057 (degree-2 polynomial features
  of a 32-wide head, expansion 4), and the emitted `_chunked` runs the 5 Newton–Schulz iterations on all
  B·H·T = 4096 of them at once, per layer. Counting only those products a training step is ≈ 9 TFLOP
  (5 x ≈ 74 MFLOP x 4096 x 2 layers x 3 for forward and backward). Measured on this CPU (2026-12-04, 1 thread)
  at the RESULTS model with batch 1 instead of 32 (`--batch-size 1 --steps 2`): 12.6 s per step (≈ 22 GFLOP/s
  on 9/32 TFLOP: the Newton–Schulz count is the cost) and 2.56 GB peak resident memory, i.e. ≈ 2.1 GB of
  activations per sequence kept for the backward, ≈ 70 GB at batch 32: it should fit the H200's 139 GiB.
  Expected time per step, an estimate from the FLOP count, not a measurement: batched GEMMs (4096 x [128 x 1057]
  @ [1057 x 128], and [128 x 128] @ [128 x 1057]), not one large GEMM, in float32 by default (no tensor cores,
  ~67 TFLOP/s FP32 peak). At 40–70 % of that the matmuls take 0.2–0.35 s; the elementwise work around them (each
  iterate is 2.2 GB per layer, read and written several times per iteration: ~0.3–0.5 TB per step with the
  backward, at 3–4 TB/s achieved) adds ~0.1–0.15 s; launches are few (the tokens are batched). So ~0.3–0.5 s per
  step, 1000 steps in ~5–9 minutes, and up to ~1 s per step (17 minutes) if the batched GEMMs run far below peak:
  one or two of the four runs per 15-minute lease in float32. With --tf32 the matmuls drop to ~0.03–0.1 s and the
  step is memory-bound, ~0.15–0.3 s: 3–5 minutes per run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EMIT_DIR = HERE / "emitted_mqar"
SETTING = {"seq_len": 64, "num_kv_pairs": 8, "eval_lengths": [64, 128, 256], "eval_examples": 64, "steps": 1000,
           "batch_size": 32, "weight_decay": 0.1, "d_model": 64, "layers": 2, "heads": 2, "log_every": 10}


def emit(out_dir: Path, specs: list[str]) -> list[Path]:
    """Compile the specs (names under specs/ or paths) into out_dir (run where mirasc is installed)."""
    sys.path.insert(0, str(ROOT))
    from mirasc.cli import main

    written = []
    for spec in specs:
        path = spec_path(spec)
        if main(["compile", str(path), "-o", str(out_dir)]) != 0:
            raise SystemExit(f"gpu_mqar: compiling {path} failed")
        written.append(out_dir / f"{path.stem}.py")
    return written


def spec_path(spec: str) -> Path:
    p = Path(spec)
    return p if p.suffix == ".miras" else ROOT / "specs" / f"{spec}.miras"


def load_file(name: str, path: Path):
    """A module from its file, registered under `name` (dataclasses look their module up), no package import."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def helpers(src: Path):
    """`src` (the mirasc folder)'s lab/tasks.py, runtime/lm.py and lab/trainloop.py by file path: torch and the
    standard library only."""
    return (load_file("_gpu_mqar_tasks", src / "lab" / "tasks.py"),
            load_file("_gpu_mqar_lm", src / "runtime" / "lm.py"),
            load_file("_gpu_mqar_trainloop", src / "lab" / "trainloop.py"))


def run_one(module, label: str, lr: float, seed: int, opts: dict, device: str, src: Path = ROOT / "mirasc") -> dict:
    """One (spec, lr, seed) run, as explore's train_cell: seed, build on the CPU, move, train, evaluate."""
    tasks, lm, loop = helpers(src)
    cfg = tasks.make_config("mqar", seq_len=opts["seq_len"], num_kv_pairs=opts["num_kv_pairs"])
    lengths = sorted(set(opts["eval_lengths"]))
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(torch.device(device))
    torch.manual_seed(seed)
    model = loop.make_model(module, lm, tasks.VOCAB, opts["d_model"], opts["layers"], opts["heads"],
                            opts.get("layer", {})).to(device)
    steps = opts["steps"]
    t0 = time.time()
    last = [t0]

    def on_step(step, loss):
        now = time.time()
        if opts.get("verbose", True) and (step <= 5 or step % 25 == 0 or step == steps):
            print(f"  {label} lr {lr:g} seed {seed}: step {step}/{steps} loss {loss:.4f}  "
                  f"{now - last[0]:.3f} s/step  {now - t0:.0f} s", flush=True)
        last[0] = now

    curve, status = loop.train(model, tasks, "mqar", cfg, steps=steps, batch_size=opts["batch_size"], lr=lr,
                               weight_decay=opts["weight_decay"], seed=seed, log_every=opts["log_every"],
                               on_step=on_step, device=device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    train_s = time.time() - t0
    scored: dict[int, int] = {}
    acc, exact = loop.evaluate(model, tasks, "mqar", cfg, lengths, opts["eval_examples"], opts["batch_size"],
                               scored, device=device)
    return {"label": label, "lr": lr, "seed": seed, "status": status, "loss_curve": curve,
            "final_loss": curve[-1][1] if curve else float("nan"),
            "accuracy": {str(L): a for L, a in acc.items()}, "exact_match": {str(L): e for L, e in exact.items()},
            "scored": {str(L): k for L, k in scored.items()}, "params": model.num_params(),
            "train_seconds": round(train_s, 3), "seconds": round(time.time() - t0, 3),
            "peak_gib": (torch.cuda.max_memory_allocated(torch.device(device)) / 2**30
                         if device.startswith("cuda") else None),
            "s_per_step": train_s / max(1, len(curve) and curve[-1][0])}


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({torch.get_num_threads()} thread(s))"


def table(records: list[dict], opts: dict, device: str, tf32: bool) -> str:
    lengths = sorted(set(opts["eval_lengths"]))
    head = (f"\n### gpu_mqar — {time.strftime('%Y-%m-%d %H:%M')}, {device_name(device)}, torch {torch.__version__}"
            f"{', TF32 matmuls' if tf32 else ', float32'}; MQAR seq {opts['seq_len']}, {opts['num_kv_pairs']} pairs, "
            f"{opts['steps']} steps, batch {opts['batch_size']}, d_model {opts['d_model']}, {opts['layers']} blocks, "
            f"{opts['heads']} heads, {opts['eval_examples']} eval examples\n")
    lines = [head, "| design | lr | seed | " + " | ".join(f"acc@{L}" for L in lengths)
             + " | final loss | s/step | s/run | peak GiB | device | date | status |",
             "|---|---|---|" + "---|" * len(lengths) + "---|---|---|---|---|---|---|"]
    for r in records:
        peak = "—" if r.get("peak_gib") is None else f"{r['peak_gib']:.1f}"
        lines.append(f"| {r['label']} | {r['lr']:g} | {r['seed']} | "
                     + " | ".join(f"{r['accuracy'][str(L)]:.3f}" for L in lengths)
                     + f" | {r['final_loss']:.4f} | {r['s_per_step']:.3f} | {r['seconds']:.0f} | {peak} | "
                     f"{device_name(device)} | {time.strftime('%Y-%m-%d')} | {r['status']} |")
    return "\n".join(lines) + "\n"


def layer_options(items) -> dict:
    """KEY=VALUE pairs as `mirasc explore --layer` reads them (JSON values, else the text)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"gpu_mqar: --layer expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        try:
            value = json.loads(v.strip())
        except ValueError:
            value = v.strip()
        out[k.strip().replace("-", "_")] = value
    return out


def eager_optimizers_without_sympy() -> bool:
    """torch.optim imports torch._dynamo on every step (graph breaks, `disable`), and torch._dynamo imports sympy.
    Where sympy is missing (the GPU image is said to lack it), stand in a torch._dynamo with the two eager no-ops
    the optimizers use: `graph_break()` does nothing and `disable(fn)` is fn outside torch.compile. Nothing is
    compiled here, so eager results are unchanged. Returns whether the stand-in was installed."""
    if "torch._dynamo" in sys.modules:
        return False
    try:
        if importlib.util.find_spec("sympy") is not None:
            return False
    except ImportError:
        pass
    import types

    shim = types.ModuleType("torch._dynamo")
    shim.graph_break = lambda *a, **k: None
    shim.disable = lambda fn=None, recursive=True, **k: fn if fn is not None else (lambda f: f)
    shim.is_compiling = lambda: False
    sys.modules["torch._dynamo"] = shim
    torch._dynamo = shim
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", nargs="+", default=["atlas"], help="spec names (specs/NAME.miras) or .miras paths")
    ap.add_argument("--emit", type=Path, metavar="DIR", help="compile the specs into DIR and exit (needs mirasc)")
    ap.add_argument("--emitted", type=Path, default=EMIT_DIR, help=f"the emitted modules (default {EMIT_DIR})")
    ap.add_argument("--src", type=Path, default=ROOT / "mirasc", help="the mirasc folder: lab/tasks.py, runtime/lm.py "
                    "and lab/trainloop.py are loaded by path")
    ap.add_argument("--steps", type=int, default=SETTING["steps"])
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-2])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--eval-examples", type=int, default=SETTING["eval_examples"])
    ap.add_argument("--eval-lengths", type=int, nargs="+", default=SETTING["eval_lengths"])
    ap.add_argument("--seq-len", type=int, default=SETTING["seq_len"])
    ap.add_argument("--num-kv-pairs", type=int, default=SETTING["num_kv_pairs"])
    ap.add_argument("--log-every", type=int, default=SETTING["log_every"])
    ap.add_argument("--layer", nargs="+", metavar="KEY=VALUE", default=[],
                    help="Layer options as explore's --layer (values read as JSON, else text)")
    other = "(not the RESULTS setting if changed)"
    ap.add_argument("--batch-size", type=int, default=SETTING["batch_size"], help=other)
    ap.add_argument("--d-model", type=int, default=SETTING["d_model"], help=other)
    ap.add_argument("--layers", type=int, default=SETTING["layers"], help=other)
    ap.add_argument("--heads", type=int, default=SETTING["heads"], help=other)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA (not float32 rounding)")
    ap.add_argument("--time-budget-s", type=float, default=math.inf,
                    help="start no new run after this many seconds (nor one the last run's time says would pass it)")
    ap.add_argument("--out", type=Path, help="append the markdown table here (after every run)")
    ap.add_argument("--json", type=Path, help="write the per-run records here (after every run)")
    ap.add_argument("--quiet", action="store_true", help="no per-step lines")
    args = ap.parse_args(argv)
    if args.emit:
        for p in emit(args.emit, args.spec):
            print(f"wrote {p}")
        return 0
    start = time.time()
    if eager_optimizers_without_sympy():
        print("sympy is missing: torch._dynamo replaced by eager no-ops for torch.optim (nothing is compiled)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    opts = dict(SETTING, steps=args.steps, eval_examples=args.eval_examples, eval_lengths=args.eval_lengths,
                seq_len=args.seq_len, num_kv_pairs=args.num_kv_pairs, log_every=args.log_every,
                batch_size=args.batch_size, d_model=args.d_model, layers=args.layers, heads=args.heads,
                verbose=not args.quiet, layer=layer_options(args.layer))
    modules = {}
    for spec in args.spec:
        name = Path(spec).stem
        path = args.emitted / f"{name}.py"
        if not path.exists():
            print(f"gpu_mqar: {path} is missing: run `python benchmarks/gpu_mqar.py --emit {args.emitted} --spec "
                  f"{spec}` where mirasc is installed, and carry the folder", file=sys.stderr)
            return 2
        modules[name] = load_file(f"_gpu_mqar_emitted_{name}", path)
    records, last_s = [], 0.0
    for name, module in modules.items():
        for lr in args.lr:
            for seed in args.seeds:
                elapsed = time.time() - start
                if elapsed + last_s > args.time_budget_s:
                    print(f"time budget: not starting {name} lr {lr:g} seed {seed} ({elapsed:.0f} s spent, the "
                          f"last run took {last_s:.0f} s, budget {args.time_budget_s:.0f} s)", flush=True)
                    continue
                try:
                    rec = run_one(module, name, lr, seed, opts, args.device, args.src)
                except Exception as err:  # e.g. out of memory: report it and go on
                    print(f"{name} lr {lr:g} seed {seed}: {type(err).__name__}: {err}", flush=True)
                    rec = {"label": name, "lr": lr, "seed": seed, "status": f"{type(err).__name__}: {err}"[:200],
                           "loss_curve": [], "final_loss": float("nan"), "params": 0, "seconds": 0.0,
                           "s_per_step": float("nan"),
                           "accuracy": {str(L): float("nan") for L in opts["eval_lengths"]}}
                    if args.device.startswith("cuda"):
                        torch.cuda.empty_cache()
                last_s = rec["seconds"]
                records.append(rec)
                text = table(records, opts, args.device, args.tf32)
                print(text, flush=True)
                if args.json:
                    args.json.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
                if args.out:
                    (args.out.parent).mkdir(parents=True, exist_ok=True)
                    tmp = args.out.with_name(args.out.name + ".partial")
                    tmp.write_text(text, encoding="utf-8")
    if args.out and records:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(table(records, opts, args.device, args.tf32))
        args.out.with_name(args.out.name + ".partial").unlink(missing_ok=True)
    if records:
        ok = [r for r in records if r["status"] == "ok"]
        if ok:
            mean = statistics.fmean(r["accuracy"][str(opts["seq_len"])] for r in ok)
            print(f"mean acc@{opts['seq_len']} over {len(ok)} run(s): {mean:.3f}")
    return 0 if records and all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
