"""`mirasc explore`: search a grid of Miras designs on a synthetic recall task and rank them.

    mirasc explore --memory linear mlp --bias l2 huber --retention decay kl --learner gd momentum \\
                   --parallel exact 'minibatch(16)' --task mqar --steps 300 --seeds 0 1 --out explore_out

The grid is the product of the axes (flags, or the same keys in a JSON/TOML file given with --grid;
flags win), plus whole spec files given with --spec. Every cell's spec text is built and compiled;
illegal combinations are dropped with the compiler's reason. Each legal spec is trained as a small
byte-level language model (`mirasc.models`, the compiled layer as mixer) on generated batches of the
task, loss on the scored positions only, under one fixed budget (steps, batch, lr, d_model, layers,
heads) for each seed, then evaluated (masked-token accuracy and exact match) at several sequence
lengths on a fixed evaluation set shared by all cells.

Output folder: `cells/<key>.json` (one per finished spec x task x seed x budget: resumable — a cell
already there is not recomputed), `leaderboard.csv`, `leaderboard.json` (also the per-cell records and
the dropped combinations with their reasons), and, with matplotlib, `accuracy_vs_length.png` and
`loss_curves.png`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import itertools
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

from .train_config import THREADS_HELP

AXES = ("memory", "bias", "retention", "learner", "parallel")
AXIS_DEFAULTS = {"memory": ["linear"], "bias": ["l2"], "retention": ["none"], "learner": ["gd"], "parallel": ["exact"]}
DEFAULTS = {
    "task": "mqar", "task_opt": {}, "seq_len": None, "eval_lengths": None, "steps": 200, "batch_size": 32,
    "lr": 1e-2, "weight_decay": 0.1, "d_model": 64, "layers": 2, "heads": 2, "layer": {}, "seeds": [0, 1],
    "eval_examples": 128, "log_every": 10, "out": "explore_out", "spec": [], "threads": None, "plots": True,
    "force": False, "quiet": False,
}
EXPLORE_VERSION = 1          # bump when training or evaluation changes meaning: invalidates stored cells


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("grid (each axis: one or more forms; quote forms with parentheses)")
    g.add_argument("--grid", metavar="FILE", help="JSON or TOML file with any of the options below as keys "
                   "(axes as lists; task_opt and layer as tables); command-line flags win")
    for axis in AXES:
        g.add_argument(f"--{axis}", nargs="+", metavar="FORM", default=None,
                       help=f"{axis} forms (default {' '.join(AXIS_DEFAULTS[axis])})")
    g.add_argument("--spec", nargs="+", metavar="FILE", default=None, help="whole .miras files added as cells")
    t = p.add_argument_group("task and budget")
    t.add_argument("--task", choices=["mqar", "niah", "noisy"], default=None, help="synthetic task (default mqar)")
    t.add_argument("--task-opt", nargs="+", metavar="KEY=VALUE", default=None,
                   help="task config fields, e.g. num_kv_pairs=16 needle=word (see mirasc.tasks)")
    t.add_argument("--seq-len", type=int, default=None, help="training sequence length (default: the task's)")
    t.add_argument("--eval-lengths", nargs="+", type=int, default=None,
                   help="evaluation sequence lengths (default: seq-len and 2x seq-len)")
    t.add_argument("--steps", type=int, default=None, help=f"training steps per cell (default {DEFAULTS['steps']})")
    t.add_argument("--batch-size", type=int, default=None, help=f"default {DEFAULTS['batch_size']}")
    t.add_argument("--lr", type=float, default=None, help=f"AdamW peak learning rate (default {DEFAULTS['lr']})")
    t.add_argument("--weight-decay", type=float, default=None, help=f"default {DEFAULTS['weight_decay']}")
    t.add_argument("--d-model", type=int, default=None, help=f"default {DEFAULTS['d_model']}")
    t.add_argument("--layers", type=int, default=None, help=f"default {DEFAULTS['layers']}")
    t.add_argument("--heads", type=int, default=None, help=f"default {DEFAULTS['heads']} (head_dim = d_model/heads)")
    t.add_argument("--layer", nargs="+", metavar="KEY=VALUE", default=None,
                   help="Layer options for every cell, e.g. conv=4 gate_rank=16 (checked as a spec's layer block is)")
    t.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds (default 0 1)")
    t.add_argument("--eval-examples", type=int, default=None, help=f"default {DEFAULTS['eval_examples']}")
    t.add_argument("--log-every", type=int, default=None, help="loss-curve resolution in steps (default 10)")
    o = p.add_argument_group("output")
    o.add_argument("--out", "-o", default=None, help="output folder (default explore_out)")
    o.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)
    o.add_argument("--no-plots", dest="plots", action="store_const", const=False, default=None, help="skip PNGs")
    o.add_argument("--force", action="store_const", const=True, default=None, help="recompute stored cells")
    o.add_argument("--quiet", "-q", action="store_const", const=True, default=None, help="no progress display")


# ----------------------------------------------------------------------------------- options
class UsageError(Exception):
    pass


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _pairs(items) -> dict:
    if isinstance(items, dict):
        return dict(items)
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip().replace("-", "_")] = _value(v.strip())
    return out


def _read_grid(path: str) -> dict:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot read grid file {path}: {err}") from None
    if p.suffix == ".json" or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as err:
            raise UsageError(f"{path}: not valid JSON: {err}") from None
    else:
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise UsageError(f"{path}: TOML needs Python >= 3.11 (tomllib); write the grid as JSON") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise UsageError(f"{path}: not valid TOML: {err}") from None
    data = {k.replace("-", "_"): v for k, v in data.items()}
    known = set(DEFAULTS) | set(AXES)
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"{path}: unknown key(s) {unknown}; keys: {sorted(known)}")
    for axis in AXES:
        if axis in data and isinstance(data[axis], str):
            data[axis] = [data[axis]]
    return data


def resolve(args: argparse.Namespace) -> dict:
    """Options: command-line flags, else the grid file, else DEFAULTS."""
    from . import tasks

    data = _read_grid(args.grid) if getattr(args, "grid", None) else {}
    opts = {}
    for key in list(DEFAULTS) + list(AXES):
        flag = getattr(args, key, None)
        opts[key] = flag if flag is not None else data.get(key, DEFAULTS.get(key))
    opts["task_opt"] = _pairs(opts["task_opt"])
    opts["layer"] = _pairs(opts["layer"])
    from .layer_options import check as check_layer_options

    problems = check_layer_options(opts["layer"])
    if problems:
        raise UsageError("--layer: " + "; ".join(problems))
    opts["spec"] = list(opts["spec"] or [])
    if opts["seq_len"] is not None:
        opts["task_opt"]["seq_len"] = opts["seq_len"]
    if opts["task"] not in tasks.TASKS:
        raise UsageError(f"unknown task {opts['task']!r}; tasks: {sorted(tasks.TASKS)}")
    try:
        cfg = tasks.make_config(opts["task"], **opts["task_opt"])
    except (TypeError, ValueError) as err:
        raise UsageError(f"task {opts['task']}: {err}") from None
    opts["task_config"] = cfg
    opts["eval_lengths"] = sorted(set(opts["eval_lengths"] or [cfg.seq_len, 2 * cfg.seq_len]))
    for L in opts["eval_lengths"]:
        try:
            tasks.at_length(opts["task"], cfg, L)
        except ValueError as err:
            raise UsageError(f"evaluation length {L}: {err}") from None
    for key in ("steps", "batch_size", "d_model", "layers", "heads", "eval_examples", "log_every"):
        if int(opts[key]) < 1:
            raise UsageError(f"{key} must be >= 1")
    if opts["d_model"] % opts["heads"]:
        raise UsageError(f"d_model={opts['d_model']} is not divisible by heads={opts['heads']}")
    if not opts["seeds"]:
        raise UsageError("need at least one seed")
    return opts


# ------------------------------------------------------------------------------------- cells
@dataclasses.dataclass
class Candidate:
    label: str
    text: str                  # spec text as built (or read)
    axes: dict
    canonical: str = ""
    reason: str = ""           # non-empty: dropped, the compiler's message
    module: object = None


def _name(label: str) -> str:
    name = re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_") or "spec"
    name = name if name[0].isalpha() else "m_" + name
    if len(name) > 80:
        name = name[:71] + "_" + hashlib.sha256(label.encode()).hexdigest()[:8]
    return name


def spec_text(name: str, axes: dict) -> str:
    lines = [f"model {name} {{"] + [f"    {axis:<9} = {axes[axis]}" for axis in AXES] + ["}"]
    return "\n".join(lines) + "\n"


def candidates(opts: dict) -> list[Candidate]:
    """The grid product (when any axis is given, or no spec file) and the spec files, each compiled."""
    import mirasc

    out = []
    grid_given = any(opts[a] for a in AXES)
    if grid_given or not opts["spec"]:
        axes_lists = [opts[a] or AXIS_DEFAULTS[a] for a in AXES]
        for combo in itertools.product(*axes_lists):
            axes = dict(zip(AXES, combo))
            label = " | ".join(combo)
            out.append(Candidate(label, spec_text(_name(label), axes), axes))
    for path in opts["spec"]:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise UsageError(f"cannot read spec file {path}: {err}") from None
        out.append(Candidate(Path(path).stem, text, {}))
    seen = set()
    for c in out:
        try:
            spec = mirasc.parse_text(c.text, c.label)
            c.canonical = spec.canonical()
            c.module = mirasc.compile_spec(c.text)
        except mirasc.SpecError as err:
            c.reason = err.message
            continue
        if not c.axes:
            c.axes = {a: line.split("=", 1)[1].strip() for a, line in
                      zip(AXES, c.canonical.splitlines()[1:6])}
        if c.canonical in seen:
            c.reason = "duplicate of an earlier cell"
        seen.add(c.canonical)
    return out


def budget_of(opts: dict) -> dict:
    return {k: opts[k] for k in ("steps", "batch_size", "lr", "weight_decay", "d_model", "layers", "heads",
                                 "layer", "eval_lengths", "eval_examples", "log_every")}


def cell_key(canonical: str, task: str, task_config, seed: int, budget: dict) -> str:
    blob = json.dumps({"version": EXPLORE_VERSION, "spec": canonical, "task": task,
                       "task_config": dataclasses.asdict(task_config), "seed": seed, "budget": budget},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


# ---------------------------------------------------------------------------------- progress
class Progress:
    def __init__(self, total: int, quiet: bool = False, stream=None):
        self.total, self.quiet, self.stream = total, quiet, stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done, self.start, self._last = 0, time.time(), 0.0

    def update(self, label: str, seed: int, step: int, steps: int, loss: float) -> None:
        if self.quiet:
            return
        now = time.time()
        final = step == steps
        if not final and now - self._last < (0.2 if self.tty else 10.0):
            return
        self._last = now
        line = (f"[{self.done + 1}/{self.total}] {label[:48]:<48} seed {seed} step {step:>5}/{steps} "
                f"loss {loss:7.4f}  {now - self.start:6.0f}s")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if not self.quiet:
            self.stream.write(text + "\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------- training
def _state_floats(module, spec, heads: int, head_dim: int, layers: int):
    if not spec.parametric:
        return None   # softmax attention: the cache grows with the sequence (2·T·head_dim per head)
    state = module.init_state(1, heads, head_dim, head_dim)
    return layers * sum(t.numel() for t in state.values())


def _model(cand: Candidate, opts: dict):
    """The cell's language model (initialised from torch's global RNG)."""
    from . import models, tasks
    from .trainloop import make_model

    return make_model(cand.module, models, tasks.VOCAB, opts["d_model"], opts["layers"], opts["heads"], opts["layer"])


def time_step(cand: Candidate, opts: dict) -> float:
    """Seconds of one training step (forward and backward) of this design at the grid's budget, measured
    on a throwaway model; the first step carries one-time costs, so a quick one is measured again."""
    import torch

    from . import tasks
    from .trainloop import TRAIN_SEED

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = _model(cand, opts)
        x, y, _ = tasks.generate(opts["task"], opts["task_config"], opts["batch_size"], seed=TRAIN_SEED)
        for _ in range(2):
            t0 = time.perf_counter()
            _, loss = model(x, y)
            loss.backward()
            seconds = time.perf_counter() - t0
            if seconds > 1.0:
                break
    return seconds


def cell_seconds(step_seconds: float, opts: dict) -> float:
    """Training steps plus evaluation (forward only, about a third of a step per batch, scaled by length)."""
    batches = math.ceil(opts["eval_examples"] / opts["batch_size"])
    lengths = sum(L / opts["task_config"].seq_len for L in opts["eval_lengths"])
    return step_seconds * (opts["steps"] + batches * lengths / 3)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# An `exact` cell this many times slower than its minibatch(C) form gets a note before training.
EXACT_SLOWDOWN_NOTE = 5.0
SIBLING_CHUNK = 16


def minibatch_sibling(cand: Candidate, candidates_: list[Candidate]) -> Candidate | None:
    """The same design under `parallel = minibatch(C)`: a grid cell if there is one, else a new candidate
    with C = 16 (None when that combination is illegal, e.g. implicit or order=pre)."""
    import mirasc

    exact_line = "    parallel  = exact\n"
    if exact_line not in cand.canonical:
        return None
    # canonical text minus its first line (the model name): the design itself
    before, after = cand.canonical.split("\n", 1)[1].split(exact_line)
    for other in candidates_:
        body = other.canonical.split("\n", 1)[1] if other.canonical else ""
        if not other.reason and body.startswith(before + "    parallel  = minibatch(") and body.endswith(
                ")\n" + after) and body.count("\n") == (before + exact_line + after).count("\n"):
            return other
    text = cand.canonical.replace(exact_line, f"    parallel  = minibatch(C={SIBLING_CHUNK})\n")
    sibling = Candidate(f"{cand.label} -> minibatch({SIBLING_CHUNK})", text, {})
    try:
        sibling.canonical = mirasc.parse_text(text).canonical()
        sibling.module = mirasc.compile_spec(text)
    except mirasc.SpecError:
        return None
    return sibling


def train_cell(cand: Candidate, opts: dict, seed: int, progress: Progress) -> dict:
    import torch

    import mirasc

    from . import tasks, trainloop

    task, cfg = opts["task"], opts["task_config"]
    steps, B = opts["steps"], opts["batch_size"]
    torch.manual_seed(seed)
    model = _model(cand, opts)
    t0 = time.time()
    curve, status = trainloop.train(
        model, tasks, task, cfg, steps=steps, batch_size=B, lr=opts["lr"], weight_decay=opts["weight_decay"],
        seed=seed, log_every=opts["log_every"],
        on_step=lambda step, loss: progress.update(cand.label, seed, step, steps, loss))
    train_s = time.time() - t0
    scored: dict[int, int] = {}
    accuracy, exact = evaluate(model, task, cfg, opts["eval_lengths"], opts["eval_examples"], B, scored)
    spec = mirasc.parse_text(cand.canonical)
    return {
        "label": cand.label, "name": spec.name, "axes": cand.axes, "spec": cand.canonical, "task": task,
        "task_config": dataclasses.asdict(cfg), "seed": seed, "budget": budget_of(opts), "status": status,
        "final_loss": curve[-1][1] if curve else float("nan"), "loss_curve": curve,
        "accuracy": {str(L): a for L, a in accuracy.items()}, "exact_match": {str(L): e for L, e in exact.items()},
        "scored": {str(L): k for L, k in scored.items()},
        "train_length": cfg.seq_len, "params": model.num_params(),
        "state_floats": _state_floats(cand.module, spec, opts["heads"], opts["d_model"] // opts["heads"],
                                      opts["layers"]),
        "train_seconds": round(train_s, 3), "seconds": round(time.time() - t0, 3),
    }


def evaluate(model, task: str, cfg, lengths, n: int, batch_size: int, scored: dict | None = None):
    """Masked-token accuracy and per-example exact match at each length, on a fixed evaluation set.
    `scored`, if given, receives the number of scored tokens at each length (mirasc.trainloop.evaluate)."""
    from . import tasks, trainloop

    return trainloop.evaluate(model, tasks, task, cfg, lengths, n, batch_size, scored)


# ------------------------------------------------------------------------------- leaderboard
def chance_levels(opts: dict) -> dict[int, float]:
    """The task's chance accuracy (tasks.chance) at each evaluation length."""
    from . import tasks

    return {L: tasks.chance(opts["task"], tasks.at_length(opts["task"], opts["task_config"], L))
            for L in opts["eval_lengths"]}


def above_chance(acc: float, chance: float, scored: int | None) -> bool:
    """Whether a mean accuracy over `scored` tokens beats guessing: more than two binomial standard errors
    above the chance level (with an unknown count, merely above it)."""
    margin = 2 * math.sqrt(chance * (1 - chance) / scored) if scored else 0.0
    return acc > chance + margin


def leaderboard(cells: list[dict], lengths, chance: dict | None = None) -> list[dict]:
    chance = {int(L): c for L, c in (chance or {}).items()}
    groups: dict[str, list[dict]] = {}
    for c in cells:
        groups.setdefault(c["spec"], []).append(c)
    rows = []
    for group in groups.values():
        first = group[0]
        train_len = str(first["train_length"])
        accs = [c["accuracy"][train_len] for c in group]
        row = {"label": first["label"], "name": first["name"], **{a: first["axes"].get(a, "") for a in AXES},
               "seeds": len(group), "acc_mean": statistics.fmean(accs),
               "acc_std": statistics.pstdev(accs) if len(accs) > 1 else 0.0,
               "exact_mean": statistics.fmean(c["exact_match"][train_len] for c in group)}
        for L in lengths:
            row[f"acc@{L}"] = statistics.fmean(c["accuracy"][str(L)] for c in group)
            if L in chance:
                row[f"chance@{L}"] = chance[L]
        if int(train_len) in chance:
            counts = [c.get("scored", {}).get(train_len) for c in group]
            scored = sum(counts) if all(counts) else None
            row["chance"] = chance[int(train_len)]
            row["beats_chance"] = above_chance(row["acc_mean"], row["chance"], scored)
        losses = [c["final_loss"] for c in group if math.isfinite(c["final_loss"])]
        row["final_loss"] = statistics.fmean(losses) if losses else float("nan")
        row["params"], row["state_floats"] = first["params"], first["state_floats"]
        row["seconds_per_seed"] = statistics.fmean(c["seconds"] for c in group)
        bad = sorted({c["status"] for c in group if c["status"] != "ok"})
        row["status"] = "; ".join(bad) or "ok"
        rows.append(row)
    rows.sort(key=lambda r: (-r["acc_mean"], r["final_loss"] if math.isfinite(r["final_loss"]) else math.inf))
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    return rows


def format_table(rows: list[dict], lengths) -> str:
    with_chance = any("chance" in r for r in rows)
    heads = ["#", "design", "acc", "±", *(["chance"] if with_chance else []), *[f"@{L}" for L in lengths], "exact",
             "loss", "params", "state", "s/seed"]
    body, notes = [], []
    for r in rows:
        state = "O(T)" if r["state_floats"] is None else f"{r['state_floats']}"
        body.append([str(r["rank"]), r["label"], f"{r['acc_mean']:.3f}", f"{r['acc_std']:.3f}",
                     *([f"{r['chance']:.3f}" if "chance" in r else "?"] if with_chance else []),
                     *[f"{r[f'acc@{L}']:.3f}" for L in lengths], f"{r['exact_mean']:.3f}", f"{r['final_loss']:.3f}",
                     f"{r['params']}", state, f"{r['seconds_per_seed']:.1f}"])
        note = [] if r["status"] == "ok" else [r["status"]]
        if r.get("beats_chance") is False:
            note.append("NOT ABOVE CHANCE")
        notes.append("; ".join(note))
    widths = [max(len(x) for x in col) for col in zip(heads, *body)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 1 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [fmt(heads), "  ".join("-" * w for w in widths)]
    lines += [fmt(b) + ("  " + n if n else "") for b, n in zip(body, notes)]
    if with_chance:
        lines.append("chance: the accuracy of the best guess that ignores the context (mirasc.tasks.chance); "
                     "NOT ABOVE CHANCE: the mean accuracy is within two standard errors of it")
        flagged = sum(r.get("beats_chance") is False for r in rows)
        if flagged:
            lines.append(f"warning: {flagged} of {len(rows)} design(s) did not beat chance: their order says nothing "
                         "about the designs; train longer (--steps), or on an easier task (--task-opt)")
    return "\n".join(lines)


def write_outputs(out: Path, opts: dict, rows, cells, dropped, plots: bool) -> list[Path]:
    written = []
    lengths = opts["eval_lengths"]
    cols = ["rank", "label", "name", *AXES, "seeds", "acc_mean", "acc_std", "chance", "beats_chance",
            *[f"acc@{L}" for L in lengths], *[f"chance@{L}" for L in lengths], "exact_mean", "final_loss", "params",
            "state_floats", "seconds_per_seed", "status"]
    with open(out / "leaderboard.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    written.append(out / "leaderboard.csv")
    doc = {"task": opts["task"], "task_config": dataclasses.asdict(opts["task_config"]), "budget": budget_of(opts),
           "seeds": opts["seeds"], "leaderboard": rows, "dropped": dropped, "cells": cells}
    (out / "leaderboard.json").write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    written.append(out / "leaderboard.json")
    if plots and rows:
        written += _plots(out, rows, cells, lengths, opts["task"])
    return written


def _plots(out: Path, rows, cells, lengths, task) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return []
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ax.plot(lengths, [r[f"acc@{L}"] for L in lengths], marker="o", label=r["label"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(L) for L in lengths])
    ax.set(xlabel="sequence length", ylabel="accuracy (scored tokens)", ylim=(-0.02, 1.02),
           title=f"{task}: accuracy vs sequence length (mean over seeds)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(out / "accuracy_vs_length.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    paths.append(out / "accuracy_vs_length.png")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        curves = [c["loss_curve"] for c in cells if c["label"] == r["label"] and c["loss_curve"]]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        ax.plot([p[0] for p in curves[0][:n]], [statistics.fmean(c[i][1] for c in curves) for i in range(n)],
                marker="o" if n <= 3 else None, label=r["label"])
    ax.set(xlabel="step", ylabel="training loss (nats, scored tokens)",
           title=f"{task}: training loss (mean over seeds)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(out / "loss_curves.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    paths.append(out / "loss_curves.png")
    return paths


# --------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    try:
        opts = resolve(args)
        return _run(opts)
    except UsageError as err:
        print(f"mirasc explore: {err}", file=sys.stderr)
        return 2


def _run(opts: dict) -> int:
    import torch

    from .train_config import apply_threads

    threads = torch.get_num_threads()
    try:
        apply_threads(None if opts["threads"] is None else int(opts["threads"]))
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        return _grid(opts)
    finally:
        torch.set_num_threads(threads)


def _grid(opts: dict) -> int:
    out = Path(opts["out"])
    (out / "cells").mkdir(parents=True, exist_ok=True)
    cands = candidates(opts)
    legal = [c for c in cands if not c.reason]
    dropped = [{"label": c.label, "spec": c.text, "reason": c.reason} for c in cands if c.reason]
    print(f"explore: task {opts['task']} ({_short(opts['task_config'])}), {len(cands)} designs, "
          f"{len(legal)} legal, {len(opts['seeds'])} seed(s); budget {opts['steps']} steps x batch "
          f"{opts['batch_size']}, d_model {opts['d_model']}, {opts['layers']} layer(s), {opts['heads']} head(s)")
    if dropped:
        print(f"dropped {len(dropped)} illegal combination(s):")
        for d in dropped:
            print(f"  {d['label']}: {d['reason']}")
    if not legal:
        print("nothing to train: every combination is illegal", file=sys.stderr)
        return 2
    budget = budget_of(opts)
    jobs = [(c, s, cell_key(c.canonical, opts["task"], opts["task_config"], s, budget))
            for c in legal for s in opts["seeds"]]
    stored = {}
    for _, _, key in jobs:
        path = out / "cells" / f"{key}.json"
        if path.exists() and not opts["force"]:
            try:
                stored[key] = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                pass  # a torn file: recompute
    todo = [j for j in jobs if j[2] not in stored]
    progress = Progress(len(todo), quiet=opts["quiet"])
    if stored:
        progress.note(f"resumed {len(stored)} stored cell(s) from {out / 'cells'}")
    chance = chance_levels(opts)
    print(f"chance level ({opts['task']}, best guess without the context): "
          + ", ".join(f"{chance[L]:.4f} at length {L}" for L in opts["eval_lengths"]))
    estimate: dict[str, float] = {}
    errors, interrupted = 0, False
    try:
        estimate = estimate_time(todo, cands, opts)
        for cand, seed, key in todo:
            if cand.label in estimate:
                progress.note(f"[{progress.done + 1}/{len(todo)}] {cand.label} seed {seed}: "
                              f"~{_duration(estimate[cand.label])}")
            try:
                record = train_cell(cand, opts, seed, progress)
            except Exception as err:  # a cell that crashes does not stop the grid (and is not stored)
                errors += 1
                progress.note(f"error in {cand.label} seed {seed}: {type(err).__name__}: {err}")
                progress.done += 1
                continue
            record["key"] = key
            tmp = out / "cells" / f"{key}.json.tmp"
            tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            tmp.replace(out / "cells" / f"{key}.json")
            stored[key] = record
            progress.done += 1
    except KeyboardInterrupt:  # Ctrl-C: rank what finished, so the time spent is not lost
        interrupted = True
        print(f"\ninterrupted after {progress.done} of {len(todo)} cell(s) to train", file=sys.stderr)
    cells = [stored[k] for _, _, k in jobs if k in stored]
    rows = leaderboard(cells, opts["eval_lengths"], chance)
    print(format_table(rows, opts["eval_lengths"]))
    written = write_outputs(out, opts, rows, cells, dropped, opts["plots"])
    trained = progress.done - errors
    print(f"trained {trained} cell(s), resumed {len(jobs) - len(todo)}, failed {errors}"
          + (f", not run {len(todo) - progress.done} (interrupted)" if interrupted else "")
          + "; wrote " + ", ".join(str(p) for p in written))
    if interrupted:
        print(f"the leaderboard holds the {len(cells)} finished cell(s); run the same command again to train the "
              "rest (finished cells are reused)")
        return 130
    return 1 if errors else 0


def estimate_time(todo, cands: list[Candidate], opts: dict) -> dict[str, float]:
    """Time one training step of each design still to train, print the expected time per cell and in all,
    and note every `exact` design whose minibatch(C) form is much cheaper. Returns label -> seconds/cell."""
    designs = list({c.label: c for c, _, _ in todo}.values())
    if not designs:
        return {}
    per_step: dict[str, float] = {}
    for cand in designs:
        try:
            per_step[cand.label] = time_step(cand, opts)
        except Exception:  # the cell itself will report the failure when it trains
            continue
    per_cell = {label: cell_seconds(t, opts) for label, t in per_step.items()}
    seeds = {label: sum(1 for c, _, _ in todo if c.label == label) for label in per_cell}
    print(f"estimated time (one timed training step per design x {opts['steps']} steps, plus evaluation):")
    width = max(len(label) for label in per_cell) if per_cell else 0
    for label, seconds in per_cell.items():
        print(f"  {label:<{width}}  {per_step[label]:8.3f} s/step  ~{_duration(seconds)} per seed")
    total = sum(per_cell[label] * seeds[label] for label in per_cell)
    print(f"  total ~{_duration(total)} for {sum(seeds.values())} cell(s)")
    for cand in designs:
        if cand.label not in per_step:
            continue
        sibling = minibatch_sibling(cand, cands)
        if sibling is None:
            continue
        try:
            cheap = per_step[sibling.label] if sibling.label in per_step else time_step(sibling, opts)
        except Exception:
            continue
        ratio = per_step[cand.label] / max(cheap, 1e-9)
        if ratio >= EXACT_SLOWDOWN_NOTE:
            form = sibling.canonical.split("parallel  = ", 1)[1].split("\n", 1)[0]
            print(f"note: `{cand.label}` takes ~{per_step[cand.label]:.2f} s/step token by token (exact); with "
                  f"`parallel = {form}` it takes ~{cheap:.2f} s/step ({ratio:.0f}x cheaper): minibatch(C) takes "
                  "each chunk's gradients at the chunk's start state (TTT/Titans), which runs in parallel")
    return per_cell


def _short(cfg) -> str:
    return ", ".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mirasc explore", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
