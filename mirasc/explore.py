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
the dropped combinations with their reasons), `pareto.csv` (the accuracy-state Pareto front), and, with
matplotlib, `accuracy_vs_length.png`, `loss_curves.png` and `pareto.png`. `--state-budget` gives every design
the head size that fills one recurrent state size (`fit_head_dim`).

With `--sampler grid|tpe|random` (or `--study URL`) the same cells are trials of an Optuna study instead
(mirasc.search): pruning, worker processes, a shared storage (docs/cli.md, "A study (Optuna)").
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
    "force": False, "quiet": False, "state_budget": None, "top": 10, "device": "cpu",
    # search (mirasc.search, with Optuna): used when a sampler or a study is given
    "sampler": None, "trials": None, "workers": 1, "study": None, "study_name": "explore", "pruner": None,
    "eval_every": None, "search_lr": None, "search_layer": {}, "heartbeat": 60,
}
SAMPLERS = ("grid", "tpe", "random")
PRUNERS = ("none", "halving", "hyperband", "median")
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
    t.add_argument("--state-budget", type=int, default=None, metavar="BYTES",
                   help="recurrent state per layer: each cell's head_dim is the largest whose state fits (docs/cli.md)")
    sg = p.add_argument_group("search (Optuna: pip install mirasc[search]; see docs/cli.md)")
    sg.add_argument("--sampler", choices=SAMPLERS, default=None,
                   help="run a study: grid (the grid's cells), tpe or random over the axes given")
    sg.add_argument("--trials", type=int, default=None,
                   help="designs this invocation trains (illegal ones apart), all workers together (default: the "
                        "grid; 20 for tpe, random)")
    sg.add_argument("--workers", type=int, default=None, help="worker processes on this machine (default 1)")
    sg.add_argument("--study", metavar="URL", default=None,
                   help="Optuna storage: a database URL (default sqlite:///OUT/study.db) or a journal file "
                        "(journal:PATH, or a path ending in .log or .journal)")
    sg.add_argument("--study-name", default=None, help="study name in the storage (default explore)")
    sg.add_argument("--pruner", choices=PRUNERS, default=None,
                   help="stop losing trials on their accuracy curve (default hyperband; none for grid)")
    sg.add_argument("--eval-every", type=int, default=None, metavar="STEPS",
                   help="accuracy reported to the pruner every STEPS steps (default steps/5)")
    sg.add_argument("--search-lr", default=None, metavar="LO:HI",
                   help="sample the outer learning rate log-uniformly in [LO, HI] (or a list: A,B,C)")
    sg.add_argument("--search-layer", nargs="+", default=None, metavar="KEY=LO:HI|A,B",
                   help="sample Layer options: an int or float range LO:HI, or a list A,B,C")
    sg.add_argument("--heartbeat", type=int, default=None, metavar="SECONDS",
                   help="database storages: a worker silent for 2x this long has crashed; its trial is rerun "
                        "(default 60)")
    o = p.add_argument_group("output")
    o.add_argument("--out", "-o", default=None, help="output folder (default explore_out)")
    o.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)
    o.add_argument("--device", default=None, help="torch device to train on (default cpu); cuda in a study: worker "
                   "i takes GPU i modulo the GPUs there are, so --workers N runs one worker per GPU")
    o.add_argument("--no-plots", dest="plots", action="store_const", const=False, default=None, help="skip PNGs")
    o.add_argument("--top", type=int, default=None, metavar="N",
                   help="write the spec files of the N best designs (references apart) to OUT/top/ (default 10)")
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
    if opts["state_budget"] is not None and int(opts["state_budget"]) < 1:
        raise UsageError("state_budget must be >= 1 byte")
    opts["knobs"] = {}
    if opts["search_lr"] is not None:
        opts["knobs"]["lr"] = knob("lr", opts["search_lr"], log=True)
    layer_knobs = opts["search_layer"] if isinstance(opts["search_layer"], dict) else _split(opts["search_layer"])
    for key, text in layer_knobs.items():
        opts["knobs"][f"layer.{key}"] = knob(key, text)
    if opts["sampler"] is not None and opts["sampler"] not in SAMPLERS:
        raise UsageError(f"unknown sampler {opts['sampler']!r}; samplers: {', '.join(SAMPLERS)}")
    if opts["pruner"] is not None and opts["pruner"] not in PRUNERS:
        raise UsageError(f"unknown pruner {opts['pruner']!r}; pruners: {', '.join(PRUNERS)}")
    for key in ("workers", "heartbeat"):
        if int(opts[key]) < 1:
            raise UsageError(f"{key} must be >= 1")
    if opts["trials"] is not None and int(opts["trials"]) < 0:
        raise UsageError("trials must be >= 0 (0: only write the leaderboard of the study)")
    if opts["eval_every"] is not None and int(opts["eval_every"]) < 1:
        raise UsageError("eval_every must be >= 1")
    for name, k in opts["knobs"].items():
        if opts["sampler"] == "grid" and k.kind != "choice":
            raise UsageError(f"the grid sampler needs a list of values for {name}, not a range (A,B,C)")
    if opts["knobs"] and not (opts["sampler"] or opts["study"]):
        raise UsageError("--search-lr and --search-layer sample values in a study: give --sampler (or --study)")
    return opts


@dataclasses.dataclass(frozen=True)
class Knob:
    """A numeric option a study samples: a range [lo, hi] (int, or float; log-uniform where `log`) or choices."""
    kind: str                  # "int" | "float" | "choice"
    lo: float | int | None = None
    hi: float | int | None = None
    log: bool = False
    choices: tuple = ()


def _split(items) -> dict:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"expected KEY=LO:HI or KEY=A,B,C, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip().replace("-", "_")] = v.strip()
    return out


def knob(name: str, text, log: bool = False) -> Knob:
    """`LO:HI` (ints: an int range; otherwise a float range, log-uniform for the learning rate), `A,B,C` or a
    JSON/TOML list (choices)."""
    if isinstance(text, list):
        return Knob("choice", choices=tuple(text))
    text = str(text)
    if ":" in text:
        lo_text, hi_text = text.split(":", 1)
        lo, hi = _value(lo_text.strip()), _value(hi_text.strip())
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (lo, hi)) or lo >= hi:
            raise UsageError(f"{name}: a range is LO:HI with numbers LO < HI, got {text!r}")
        if log and lo <= 0:
            raise UsageError(f"{name}: a log-uniform range needs LO > 0, got {text!r}")
        if isinstance(lo, int) and isinstance(hi, int) and not log:
            return Knob("int", lo, hi)
        return Knob("float", float(lo), float(hi), log)
    choices = tuple(_value(v.strip()) for v in text.split(",") if v.strip())
    if not choices:
        raise UsageError(f"{name}: no values in {text!r}")
    return Knob("choice", choices=choices)


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


def state_bytes(module, spec, heads: int, head_dim: int, seq_len: int) -> int:
    """Bytes of one layer's recurrent state for one sequence: every entry of the module's state (memory weights,
    momentum buffers, the Omega window, a preconditioner's statistic) at `heads` heads of `head_dim`; for a
    nonparametric memory, its key/value cache (and log weights) after `seq_len` tokens, or after its window."""
    try:   # shapes only: no memory is allocated
        state = module.init_state(1, heads, head_dim, head_dim, device="meta")
    except (RuntimeError, NotImplementedError, TypeError):
        state = module.init_state(1, heads, head_dim, head_dim)
    if spec.parametric:
        return sum(t.numel() * t.element_size() for t in state.values())
    window = getattr(spec.memory, "window", 0) or 0
    tokens = min(seq_len, window) if window > 0 else seq_len
    per_token = 0
    for name in ("K", "V", "log_weight"):
        if name in state:
            t = state[name]
            per_token += math.prod(t.shape[:2] + t.shape[3:]) * t.element_size()
    return per_token * tokens


MAX_HEAD_DIM = 4096


def fit_head_dim(cand: Candidate, opts: dict) -> int:
    """The largest head_dim (at most MAX_HEAD_DIM) whose state per layer (`state_bytes` at the training length) is
    within opts["state_budget"]; 0 when even head_dim 1 exceeds it. The state grows with head_dim, so doubling and
    then bisection find it."""
    import mirasc

    spec = mirasc.parse_text(cand.canonical)
    budget, heads, T = int(opts["state_budget"]), opts["heads"], opts["task_config"].seq_len

    def fits(d):
        return state_bytes(cand.module, spec, heads, d, T) <= budget

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):           # doubling, then bisection between the last size that fits and the first that does not
        if hi >= MAX_HEAD_DIM:
            return MAX_HEAD_DIM
        lo, hi = hi, min(2 * hi, MAX_HEAD_DIM)
    while hi - lo > 1:        # fits(lo) and not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def cell_opts(cand: Candidate, opts: dict, values: dict | None = None) -> dict:
    """The options one design trains under: the sampled values of the study's knobs (`lr`, `layer.KEY`) over the
    budget, and with a state budget the head_dim that fills it. Raises UsageError when no head_dim fits."""
    out = {**opts, "layer": dict(opts["layer"])}
    for name, value in (values or {}).items():
        if name.startswith("layer."):
            out["layer"][name[len("layer."):]] = value
        else:
            out[name] = value
    if opts.get("state_budget"):
        head_dim = fit_head_dim(cand, out)
        if not head_dim:
            raise UsageError(f"the state at head_dim 1 exceeds the state budget of {opts['state_budget']} bytes")
        out["layer"]["head_dim"] = head_dim
    return out


def complete_record(record: dict, cand: Candidate, opts: dict) -> dict:
    """A stored cell with the fields a cell written by an earlier mirasc lacks (its design key, state bytes and
    head size), computed from its design and options; its training results are as stored."""
    import mirasc

    if "design" not in record:
        record["design"] = design_key(cand.canonical, opts["task"], opts["task_config"], budget_of(opts))
    if "state_bytes" not in record:
        spec = mirasc.parse_text(cand.canonical)
        head_dim = opts["layer"].get("head_dim") or opts["d_model"] // opts["heads"]
        record.update(state_bytes=state_bytes(cand.module, spec, opts["heads"], head_dim,
                                              opts["task_config"].seq_len),
                      state_grows=not spec.parametric, head_dim=head_dim)
    return record


def design_key(canonical: str, task: str, task_config, budget: dict) -> str:
    """One design at one budget, over all seeds: the leaderboard's rows."""
    return cell_key(canonical, task, task_config, -1, budget)


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

    device = opts.get("device") or "cpu"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = _model(cand, opts).to(device)
        x, y, _ = tasks.generate(opts["task"], opts["task_config"], opts["batch_size"], seed=TRAIN_SEED)
        x, y = x.to(device), y.to(device)
        for _ in range(2):
            t0 = time.perf_counter()
            _, loss = model(x, y)
            loss.backward()
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
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


def train_cell(cand: Candidate, opts: dict, seed: int, progress: Progress, eval_every: int | None = None,
               on_eval=None) -> dict:
    """Train and evaluate one design for one seed. With `eval_every`, the accuracy at the training length is
    measured every `eval_every` steps (before the last) and passed to `on_eval(step, accuracy)`, which may raise
    to stop the cell (a study's pruner); the record keeps that curve as "eval_curve"."""
    import torch

    import mirasc

    from . import tasks, trainloop

    task, cfg = opts["task"], opts["task_config"]
    steps, B = opts["steps"], opts["batch_size"]
    torch.manual_seed(seed)
    device = opts.get("device") or "cpu"
    on = {} if device == "cpu" else {"device": device}      # batches are generated on the CPU and moved
    model = _model(cand, opts).to(device)
    eval_curve: list[list] = []
    eval_s = [0.0]

    def on_step(step, loss):
        progress.update(cand.label, seed, step, steps, loss)
        if eval_every and step % eval_every == 0 and step < steps:
            t = time.time()
            acc, _ = evaluate(model, task, cfg, [cfg.seq_len], opts["eval_examples"], B, **on)
            eval_s[0] += time.time() - t
            eval_curve.append([step, acc[cfg.seq_len]])
            if on_eval is not None:
                on_eval(step, acc[cfg.seq_len])

    t0 = time.time()
    curve, status = trainloop.train(
        model, tasks, task, cfg, steps=steps, batch_size=B, lr=opts["lr"], weight_decay=opts["weight_decay"],
        seed=seed, log_every=opts["log_every"], on_step=on_step, **on)
    train_s = time.time() - t0 - eval_s[0]          # training alone: the intermediate evaluations apart
    scored: dict[int, int] = {}
    accuracy, exact = evaluate(model, task, cfg, opts["eval_lengths"], opts["eval_examples"], B, scored, **on)
    spec = mirasc.parse_text(cand.canonical)
    head_dim = opts["layer"].get("head_dim") or opts["d_model"] // opts["heads"]
    budget = budget_of(opts)
    record = {
        "label": cand.label, "name": spec.name, "axes": cand.axes, "spec": cand.canonical, "task": task,
        "task_config": dataclasses.asdict(cfg), "seed": seed, "budget": budget, "status": status,
        "design": design_key(cand.canonical, task, cfg, budget),
        "final_loss": curve[-1][1] if curve else float("nan"), "loss_curve": curve,
        "accuracy": {str(L): a for L, a in accuracy.items()}, "exact_match": {str(L): e for L, e in exact.items()},
        "scored": {str(L): k for L, k in scored.items()},
        "train_length": cfg.seq_len, "params": model.num_params(),
        "state_floats": _state_floats(cand.module, spec, opts["heads"], head_dim, opts["layers"]),
        "state_bytes": state_bytes(cand.module, spec, opts["heads"], head_dim, cfg.seq_len),
        "state_grows": not spec.parametric, "head_dim": head_dim,
        "train_seconds": round(train_s, 3), "seconds": round(time.time() - t0, 3),
        "seconds_per_step": train_s / max(1, curve[-1][0] if curve else steps), "device": device,
    }
    if eval_every:
        record["eval_curve"] = eval_curve
    return record


def evaluate(model, task: str, cfg, lengths, n: int, batch_size: int, scored: dict | None = None, device=None):
    """Masked-token accuracy and per-example exact match at each length, on a fixed evaluation set.
    `scored`, if given, receives the number of scored tokens at each length (mirasc.trainloop.evaluate)."""
    from . import tasks, trainloop

    return trainloop.evaluate(model, tasks, task, cfg, lengths, n, batch_size, scored, device=device)


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
        groups.setdefault(c.get("design", c["spec"]), []).append(c)
    rows = []
    for group in groups.values():
        first = group[0]
        train_len = str(first["train_length"])
        accs = [c["accuracy"][train_len] for c in group]
        row = {"label": first["label"], "name": first["name"], **{a: first["axes"].get(a, "") for a in AXES},
               "spec": first["spec"],
               "seeds": len(group), "acc_mean": statistics.fmean(accs),
               "acc_std": statistics.pstdev(accs) if len(accs) > 1 else 0.0,
               "acc_se": statistics.stdev(accs) / math.sqrt(len(accs)) if len(accs) > 1 else 0.0,
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
        row["state_bytes"], row["state_grows"] = first.get("state_bytes"), first.get("state_grows", False)
        row["head_dim"] = first.get("head_dim")
        row["lr"] = first.get("budget", {}).get("lr")
        if first.get("reference"):
            row["reference"] = first["reference"]
        row["seconds_per_seed"] = statistics.fmean(c["seconds"] for c in group)
        per_step = [c["seconds_per_step"] for c in group if c.get("seconds_per_step") is not None]
        row["seconds_per_step"] = statistics.fmean(per_step) if per_step else None
        bad = sorted({c["status"] for c in group if c["status"] != "ok"})
        row["status"] = "; ".join(bad) or "ok"
        rows.append(row)
    rows.sort(key=lambda r: (-r["acc_mean"], r["final_loss"] if math.isfinite(r["final_loss"]) else math.inf))
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    front = pareto_front(rows)
    for r in rows:
        r["pareto"] = r["rank"] in front
    return rows


def pareto_front(rows: list[dict], cost: str = "state_bytes") -> set[int]:
    """Ranks of the rows no other row dominates: none has at least the accuracy at no more `cost` (state bytes per
    layer, or seconds per step), better in one. Rows without the cost are left out."""
    known = [r for r in rows if r.get(cost) is not None]
    front = set()
    for r in known:
        if not any(o["acc_mean"] >= r["acc_mean"] and o[cost] <= r[cost]
                   and (o["acc_mean"] > r["acc_mean"] or o[cost] < r[cost]) for o in known):
            front.add(r["rank"])
    return front


def _size(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= 10 * scale:
            return f"{n / scale:.0f}{unit}"
    return str(n)


def format_table(rows: list[dict], lengths) -> str:
    with_chance = any("chance" in r for r in rows)
    heads = ["#", "design", "acc", "±", *(["chance"] if with_chance else []), *[f"@{L}" for L in lengths], "exact",
             "loss", "params", "state", "s/step", "s/seed"]
    body, notes = [], []
    for r in rows:
        if r.get("state_bytes") is not None:
            state = _size(r["state_bytes"]) + ("(T)" if r.get("state_grows") else "") + ("*" if r.get("pareto") else "")
        else:
            state = "O(T)" if r["state_floats"] is None else f"{4 * r['state_floats']}"
        per_step = f"{r['seconds_per_step']:.3f}" if r.get("seconds_per_step") is not None else "?"
        body.append([str(r["rank"]), r["label"], f"{r['acc_mean']:.3f}", f"{r.get('acc_se', r['acc_std']):.3f}",
                     *([f"{r['chance']:.3f}" if "chance" in r else "?"] if with_chance else []),
                     *[f"{r[f'acc@{L}']:.3f}" for L in lengths], f"{r['exact_mean']:.3f}", f"{r['final_loss']:.3f}",
                     f"{r['params']}", state, per_step, f"{r['seconds_per_seed']:.1f}"])
        note = [] if r["status"] == "ok" else [r["status"]]
        if r.get("reference"):
            note.append(f"reference: {r['reference']}")
        if r.get("beats_chance") is False:
            note.append("NOT ABOVE CHANCE")
        notes.append("; ".join(note))
    widths = [max(len(x) for x in col) for col in zip(heads, *body)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 1 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [fmt(heads), "  ".join("-" * w for w in widths)]
    lines += [fmt(b) + ("  " + n if n else "") for b, n in zip(body, notes)]
    lines.append("acc ± s.e.: mean over seeds ± its standard error; state: recurrent state bytes per layer for one "
                 "sequence ((T): a cache at the training length), * on the accuracy-state Pareto front")
    if with_chance:
        lines.append("chance: the accuracy of the best guess that ignores the context (mirasc.tasks.chance); "
                     "NOT ABOVE CHANCE: the mean accuracy is within two standard errors of it")
        flagged = sum(r.get("beats_chance") is False for r in rows)
        if flagged:
            lines.append(f"warning: {flagged} of {len(rows)} design(s) did not beat chance: their order says nothing "
                         "about the designs; train longer (--steps), or on an easier task (--task-opt)")
    return "\n".join(lines)


def write_outputs(out: Path, opts: dict, rows, cells, dropped, plots: bool, extra: dict | None = None) -> list[Path]:
    """leaderboard.csv and .json, pareto.csv, and with `plots` the PNGs; `extra`: more keys for the JSON."""
    written = []
    lengths = opts["eval_lengths"]
    cols = ["rank", "label", "name", *AXES, "reference", "seeds", "acc_mean", "acc_se", "acc_std", "chance",
            "beats_chance", *[f"acc@{L}" for L in lengths], *[f"chance@{L}" for L in lengths], "exact_mean",
            "final_loss", "params", "state_bytes", "state_grows", "head_dim", "lr", "pareto", "state_floats",
            "seconds_per_step", "seconds_per_seed", "status"]
    with open(out / "leaderboard.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    written.append(out / "leaderboard.csv")
    front = [r for r in rows if r.get("pareto")]
    with open(out / "pareto.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["rank", "label", "acc_mean", "acc_se", "state_bytes", "state_grows",
                                          "head_dim", "params", "seconds_per_step"], extrasaction="ignore")
        w.writeheader()
        for r in sorted(front, key=lambda r: r["state_bytes"]):
            w.writerow(r)
    written.append(out / "pareto.csv")
    doc = {"task": opts["task"], "task_config": dataclasses.asdict(opts["task_config"]), "budget": budget_of(opts),
           "seeds": opts["seeds"], "state_budget": opts.get("state_budget"), "leaderboard": rows,
           "pareto": [r["rank"] for r in front], "dropped": dropped, "cells": cells, **(extra or {})}
    (out / "leaderboard.json").write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    written.append(out / "leaderboard.json")
    top = [r for r in rows if not r.get("reference") and r["status"] == "ok"][:int(opts.get("top") or 0)]
    if top:
        folder = out / "top"
        folder.mkdir(exist_ok=True)
        for old in folder.glob("*.miras"):
            old.unlink()
        for r in top:
            (folder / f"{r['rank']:03d}_{r['name']}.miras").write_text(_top_spec(r), encoding="utf-8")
        written.append(folder)
    if plots and rows:
        written += _plots(out, rows, cells, lengths, opts["task"])
    return written


def _top_spec(row: dict) -> str:
    """A leaderboard row's spec, headed by its score and the options it was trained with besides the spec."""
    extra = f", lr {row['lr']}" if row.get("lr") is not None else ""
    extra += f", head_dim {row['head_dim']}" if row.get("head_dim") else ""
    return (f"# rank {row['rank']}: accuracy {row['acc_mean']:.3f} ± {row.get('acc_se', 0.0):.3f} over "
            f"{row['seeds']} seed(s){extra}; {row['label']}\n" + row["spec"])


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
    known = [r for r in rows if r.get("state_bytes") is not None]
    if known:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for ax, cost, xlabel in ((axes[0], "state_bytes", "recurrent state per layer (bytes)"),
                                 (axes[1], "seconds_per_step", "training time per step (s)")):
            pts = [r for r in known if r.get(cost) is not None]
            ax.errorbar([r[cost] for r in pts], [r["acc_mean"] for r in pts], yerr=[r.get("acc_se", 0) for r in pts],
                        fmt="o", alpha=0.6)
            front = sorted((r for r in pts if r["rank"] in pareto_front(pts, cost)), key=lambda r: r[cost])
            ax.step([r[cost] for r in front], [r["acc_mean"] for r in front], where="post", color="C3",
                    label="Pareto front")
            for r in front:
                ax.annotate(r["label"], (r[cost], r["acc_mean"]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
            ax.set_xscale("log")
            ax.set(xlabel=xlabel, ylabel="accuracy (mean ± s.e. over seeds)", ylim=(-0.02, 1.02))
            ax.legend(fontsize=7)
        fig.suptitle(f"{task}: accuracy vs state size and vs time")
        fig.savefig(out / "pareto.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(out / "pareto.png")
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
        if opts["sampler"] or opts["study"]:
            from . import search

            return search.run_study(opts)
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
    per_cand = {}
    for c in legal:
        try:
            per_cand[c.label] = cell_opts(c, opts)
        except UsageError as err:
            dropped.append({"label": c.label, "spec": c.text, "reason": str(err)})
            print(f"  dropped {c.label}: {err}")
    legal = [c for c in legal if c.label in per_cand]
    if opts["state_budget"]:
        print(f"state budget {opts['state_budget']} bytes per layer: head_dim "
              + ", ".join(f"{per_cand[c.label]['layer']['head_dim']} ({c.label})" for c in legal))
    jobs = [(c, s, cell_key(c.canonical, opts["task"], opts["task_config"], s, budget_of(per_cand[c.label])))
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
        estimate = estimate_time(todo, cands, opts, per_cand)
        for cand, seed, key in todo:
            if cand.label in estimate:
                progress.note(f"[{progress.done + 1}/{len(todo)}] {cand.label} seed {seed}: "
                              f"~{_duration(estimate[cand.label])}")
            try:
                record = train_cell(cand, per_cand[cand.label], seed, progress)
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
    cells = [complete_record(stored[k], c, per_cand[c.label]) for c, _, k in jobs if k in stored]
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


def estimate_time(todo, cands: list[Candidate], opts: dict, per_cand: dict | None = None) -> dict[str, float]:
    """Time one training step of each design still to train, print the expected time per cell and in all,
    and note every `exact` design whose minibatch(C) form is much cheaper. Returns label -> seconds/cell.
    `per_cand`: label -> the options a design trains under (cell_opts), where they differ from `opts`."""
    designs = list({c.label: c for c, _, _ in todo}.values())
    if not designs:
        return {}
    per_step: dict[str, float] = {}
    for cand in designs:
        try:
            per_step[cand.label] = time_step(cand, (per_cand or {}).get(cand.label, opts))
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
