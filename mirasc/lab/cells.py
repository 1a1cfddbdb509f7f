"""The cells of `mirasc explore` (docs/cli.md, "mirasc explore"): one cell is one design trained and evaluated for
one seed under one budget. A design is a spec text built from a value per axis (or a spec file); its head size may be
fitted to a state budget; its cell key names the spec, task, seed and budget, so a finished cell is reused. Both the
grid (mirasc.lab.explore) and the study (mirasc.lab.search) run their cells here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import sys
import time
from pathlib import Path

AXES = ("memory", "bias", "retention", "learner", "parallel")
AXIS_DEFAULTS = {"memory": ["linear"], "bias": ["l2"], "retention": ["none"], "learner": ["gd"], "parallel": ["exact"]}
EXPLORE_VERSION = 1          # bump when training or evaluation changes meaning: invalidates stored cells


class UsageError(Exception):
    pass


def parse_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclasses.dataclass(frozen=True)
class Knob:
    """A numeric option a study samples: a range [lo, hi] (int, or float; log-uniform where `log`) or choices."""
    kind: str                  # "int" | "float" | "choice"
    lo: float | int | None = None
    hi: float | int | None = None
    log: bool = False
    choices: tuple = ()


def split_items(items) -> dict:
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
        lo, hi = parse_value(lo_text.strip()), parse_value(hi_text.strip())
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (lo, hi)) or lo >= hi:
            raise UsageError(f"{name}: a range is LO:HI with numbers LO < HI, got {text!r}")
        if log and lo <= 0:
            raise UsageError(f"{name}: a log-uniform range needs LO > 0, got {text!r}")
        if isinstance(lo, int) and isinstance(hi, int) and not log:
            return Knob("int", lo, hi)
        return Knob("float", float(lo), float(hi), log)
    choices = tuple(parse_value(v.strip()) for v in text.split(",") if v.strip())
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


def model_name(label: str) -> str:
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
            out.append(Candidate(label, spec_text(model_name(label), axes), axes))
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


def write_cell(folder: Path, record: dict) -> Path:
    """Write a finished cell to folder/<its key>.json whole or not at all (a temporary file per process, renamed),
    so that several workers, and an interrupted one, never leave a torn cell. Returns the path."""
    path = Path(folder) / f"{record['key']}.json"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def design_key(canonical: str, task: str, task_config, budget: dict) -> str:
    """One design at one budget, over all seeds: the leaderboard's rows."""
    return cell_key(canonical, task, task_config, -1, budget)


def _model(cand: Candidate, opts: dict):
    """The cell's language model (initialised from torch's global RNG)."""
    from ..runtime import lm
    from . import tasks
    from .trainloop import make_model

    return make_model(cand.module, lm, tasks.VOCAB, opts["d_model"], opts["layers"], opts["heads"], opts["layer"])


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


def duration_text(seconds: float) -> str:
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
    `scored`, if given, receives the number of scored tokens at each length (mirasc.lab.trainloop.evaluate)."""
    from . import tasks, trainloop

    return trainloop.evaluate(model, tasks, task, cfg, lengths, n, batch_size, scored, device=device)


def config_text(cfg) -> str:
    return ", ".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg))
