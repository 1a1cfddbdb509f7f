"""`mirasc explore`: search a grid of Miras designs on a synthetic recall task and rank them.

    mirasc explore --memory linear mlp --bias l2 huber --retention decay kl --learner gd momentum \\
                   --parallel exact 'minibatch(16)' --task mqar --steps 300 --seeds 0 1 --out explore_out

The grid is the product of the axes (flags, or the same keys in a JSON/TOML file given with --grid;
flags win), plus whole spec files given with --spec. Every cell's spec text is built and compiled;
illegal combinations are dropped with the compiler's reason. Each legal spec is trained as a small
byte-level language model (`mirasc.lab.models`, the compiled layer as mixer) on generated batches of the
task, loss on the scored positions only, under one fixed budget (steps, batch, lr, d_model, layers,
heads) for each seed, then evaluated (masked-token accuracy and exact match) at several sequence
lengths on a fixed evaluation set shared by all cells.

Output folder: `cells/<key>.json` (one per finished spec x task x seed x budget: resumable — a cell
already there is not recomputed), `leaderboard.csv`, `leaderboard.json` (also the per-cell records and
the dropped combinations with their reasons), `pareto.csv` (the accuracy-state Pareto front), and, with
matplotlib, `accuracy_vs_length.png`, `loss_curves.png` and `pareto.png`. `--state-budget` gives every design
the head size that fills one recurrent state size (`fit_head_dim`).

With `--sampler grid|tpe|random` (or `--study URL`) the same cells are trials of an Optuna study instead
(mirasc.lab.search): pruning, worker processes, a shared storage (docs/cli.md, "A study (Optuna)").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import cells as C
from . import leaderboard as B
from .cells import UsageError
from .train_config import THREADS_HELP

DEFAULTS = {
    "task": "mqar", "task_opt": {}, "seq_len": None, "eval_lengths": None, "steps": 200, "batch_size": 32,
    "lr": 1e-2, "weight_decay": 0.1, "d_model": 64, "layers": 2, "heads": 2, "layer": {}, "seeds": [0, 1],
    "eval_examples": 128, "log_every": 10, "out": "explore_out", "spec": [], "threads": None, "plots": True,
    "force": False, "quiet": False, "state_budget": None, "top": 10, "device": "cpu",
    # search (mirasc.lab.search, with Optuna): used when a sampler or a study is given
    "sampler": None, "trials": None, "workers": 1, "study": None, "study_name": "explore", "pruner": None,
    "eval_every": None, "search_lr": None, "search_layer": {}, "heartbeat": 60, "per_design": None,
    "reference_lr": None, "finalists": None, "finalist_seeds": [0, 1, 2, 3, 4],
}
SAMPLERS = ("grid", "tpe", "random")
PRUNERS = ("none", "halving", "hyperband", "median")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("grid (each axis: one or more forms; quote forms with parentheses)")
    g.add_argument("--grid", metavar="FILE", help="JSON or TOML file with any of the options below as keys "
                   "(axes as lists; task_opt and layer as tables); command-line flags win")
    for axis in C.AXES:
        g.add_argument(f"--{axis}", nargs="+", metavar="FORM", default=None,
                       help=f"{axis} forms (default {' '.join(C.AXIS_DEFAULTS[axis])})")
    g.add_argument("--spec", nargs="+", metavar="FILE", default=None, help="whole .miras files added as cells")
    t = p.add_argument_group("task and budget")
    t.add_argument("--task", choices=["mqar", "niah", "noisy"], default=None, help="synthetic task (default mqar)")
    t.add_argument("--task-opt", nargs="+", metavar="KEY=VALUE", default=None,
                   help="task config fields, e.g. num_kv_pairs=16 needle=word (see mirasc.lab.tasks)")
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
    sg.add_argument("--per-design", type=int, default=None, metavar="N",
                   help="trials one design (its axes' values) trains at most in the study; further proposals of it "
                        "are not trained and do not count (default 3 for tpe and random, 0 = no limit for grid)")
    sg.add_argument("--reference-lr", nargs="+", type=float, default=None, metavar="LR",
                   help="learning rates the --spec reference designs run at, one fixed trial each (default: --lr)")
    sg.add_argument("--finalists", type=int, default=None, metavar="K",
                   help="then re-run the study's K best sampled designs and its K best references, each at the "
                        "values of its best trial, on --finalist-seeds, unpruned (study NAME-finalists; "
                        "leaderboard in OUT/finalists/)")
    sg.add_argument("--finalist-seeds", nargs="+", type=int, default=None, metavar="SEED",
                   help="the finalists' seeds (default 0 1 2 3 4)")
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


def _pairs(items) -> dict:
    if isinstance(items, dict):
        return dict(items)
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip().replace("-", "_")] = C.parse_value(v.strip())
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
    known = set(DEFAULTS) | set(C.AXES)
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"{path}: unknown key(s) {unknown}; keys: {sorted(known)}")
    for axis in C.AXES:
        if axis in data and isinstance(data[axis], str):
            data[axis] = [data[axis]]
    return data


def resolve(args: argparse.Namespace) -> dict:
    """Options: command-line flags, else the grid file, else DEFAULTS."""
    from . import tasks

    data = _read_grid(args.grid) if getattr(args, "grid", None) else {}
    opts = {}
    for key in list(DEFAULTS) + list(C.AXES):
        flag = getattr(args, key, None)
        opts[key] = flag if flag is not None else data.get(key, DEFAULTS.get(key))
    opts["task_opt"] = _pairs(opts["task_opt"])
    opts["layer"] = _pairs(opts["layer"])
    from ..language.layer_options import check as check_layer_options

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
        opts["knobs"]["lr"] = C.knob("lr", opts["search_lr"], log=True)
    layer_knobs = opts["search_layer"]
    if not isinstance(layer_knobs, dict):
        layer_knobs = C.split_items(layer_knobs)
    for key, text in layer_knobs.items():
        opts["knobs"][f"layer.{key}"] = C.knob(key, text)
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
    if opts["per_design"] is not None and int(opts["per_design"]) < 0:
        raise UsageError("per_design must be >= 0 (0: no limit)")
    for name, k in opts["knobs"].items():
        if opts["sampler"] == "grid" and k.kind != "choice":
            raise UsageError(f"the grid sampler needs a list of values for {name}, not a range (A,B,C)")
    if opts["knobs"] and not (opts["sampler"] or opts["study"]):
        raise UsageError("--search-lr and --search-layer sample values in a study: give --sampler (or --study)")
    for name in ("reference_lr", "finalists"):
        if opts[name] is not None and not (opts["sampler"] or opts["study"]):
            raise UsageError(f"--{name.replace('_', '-')} belongs to a study: give --sampler (or --study)")
    if opts["reference_lr"] is not None:
        if not opts["reference_lr"] or any(not float(r) > 0 for r in opts["reference_lr"]):
            raise UsageError("reference_lr: each learning rate must be > 0")
        if not opts["spec"]:
            raise UsageError("--reference-lr: no reference designs (give them with --spec)")
    if opts["finalists"] is not None and int(opts["finalists"]) < 1:
        raise UsageError("finalists must be >= 1")
    if not opts["finalist_seeds"]:
        raise UsageError("need at least one finalist seed")
    return opts




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
            from . import finalists, search

            rc = search.run_study(opts)
            return finalists.run(opts) if rc != 130 and opts["finalists"] else rc
        return _grid(opts)
    finally:
        torch.set_num_threads(threads)


def _grid(opts: dict) -> int:
    out = Path(opts["out"])
    (out / "cells").mkdir(parents=True, exist_ok=True)
    cands = C.candidates(opts)
    legal = [c for c in cands if not c.reason]
    dropped = [{"label": c.label, "spec": c.text, "reason": c.reason} for c in cands if c.reason]
    print(f"explore: task {opts['task']} ({C.config_text(opts['task_config'])}), {len(cands)} designs, "
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
            per_cand[c.label] = C.cell_opts(c, opts)
        except UsageError as err:
            dropped.append({"label": c.label, "spec": c.text, "reason": str(err)})
            print(f"  dropped {c.label}: {err}")
    legal = [c for c in legal if c.label in per_cand]
    if opts["state_budget"]:
        print(f"state budget {opts['state_budget']} bytes per layer: head_dim "
              + ", ".join(f"{per_cand[c.label]['layer']['head_dim']} ({c.label})" for c in legal))
    jobs = [(c, s, C.cell_key(c.canonical, opts["task"], opts["task_config"], s, C.budget_of(per_cand[c.label])))
            for c in legal for s in opts["seeds"]]
    stored = {} if opts["force"] else _stored_cells(out, [key for _, _, key in jobs])
    todo = [j for j in jobs if j[2] not in stored]
    progress = C.Progress(len(todo), quiet=opts["quiet"])
    if stored:
        progress.note(f"resumed {len(stored)} stored cell(s) from {out / 'cells'}")
    chance = B.chance_levels(opts)
    print(f"chance level ({opts['task']}, best guess without the context): "
          + ", ".join(f"{chance[L]:.4f} at length {L}" for L in opts["eval_lengths"]))
    estimate: dict[str, float] = {}
    errors, interrupted = 0, False
    try:
        estimate = estimate_time(todo, cands, opts, per_cand)
        for cand, seed, key in todo:
            if cand.label in estimate:
                progress.note(f"[{progress.done + 1}/{len(todo)}] {cand.label} seed {seed}: "
                              f"~{C.duration_text(estimate[cand.label])}")
            try:
                record = C.train_cell(cand, per_cand[cand.label], seed, progress)
            except Exception as err:  # a cell that crashes does not stop the grid (and is not stored)
                errors += 1
                progress.note(f"error in {cand.label} seed {seed}: {type(err).__name__}: {err}")
                progress.done += 1
                continue
            record["key"] = key
            C.write_cell(out / "cells", record)
            stored[key] = record
            progress.done += 1
    except KeyboardInterrupt:  # Ctrl-C: rank what finished, so the time spent is not lost
        interrupted = True
        print(f"\ninterrupted after {progress.done} of {len(todo)} cell(s) to train", file=sys.stderr)
    cells = [C.complete_record(stored[k], c, per_cand[c.label]) for c, _, k in jobs if k in stored]
    rows = B.leaderboard(cells, opts["eval_lengths"], chance)
    print(B.format_table(rows, opts["eval_lengths"]))
    written = B.write_outputs(out, opts, rows, cells, dropped, opts["plots"])
    trained = progress.done - errors
    print(f"trained {trained} cell(s), resumed {len(jobs) - len(todo)}, failed {errors}"
          + (f", not run {len(todo) - progress.done} (interrupted)" if interrupted else "")
          + "; wrote " + ", ".join(str(p) for p in written))
    if interrupted:
        print(f"the leaderboard holds the {len(cells)} finished cell(s); run the same command again to train the "
              "rest (finished cells are reused)")
        return 130
    return 1 if errors else 0


def _stored_cells(out: Path, keys: list[str]) -> dict[str, dict]:
    """The finished cells already in OUT/cells/ (a torn file is recomputed)."""
    stored = {}
    for key in keys:
        path = out / "cells" / f"{key}.json"
        if path.exists():
            try:
                stored[key] = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                pass
    return stored


def estimate_time(todo, cands: list[C.Candidate], opts: dict, per_cand: dict | None = None) -> dict[str, float]:
    """Time one training step of each design still to train, print the expected time per cell and in all,
    and note every `exact` design whose minibatch(C) form is much cheaper. Returns label -> seconds/cell.
    `per_cand`: label -> the options a design trains under (cells.cell_opts), where they differ from `opts`."""
    designs = list({c.label: c for c, _, _ in todo}.values())
    if not designs:
        return {}
    per_step: dict[str, float] = {}
    for cand in designs:
        try:
            per_step[cand.label] = C.time_step(cand, (per_cand or {}).get(cand.label, opts))
        except Exception:  # the cell itself will report the failure when it trains
            continue
    per_cell = {label: C.cell_seconds(t, opts) for label, t in per_step.items()}
    seeds = {label: sum(1 for c, _, _ in todo if c.label == label) for label in per_cell}
    print(f"estimated time (one timed training step per design x {opts['steps']} steps, plus evaluation):")
    width = max(len(label) for label in per_cell) if per_cell else 0
    for label, seconds in per_cell.items():
        print(f"  {label:<{width}}  {per_step[label]:8.3f} s/step  ~{C.duration_text(seconds)} per seed")
    total = sum(per_cell[label] * seeds[label] for label in per_cell)
    print(f"  total ~{C.duration_text(total)} for {sum(seeds.values())} cell(s)")
    for cand in designs:
        if cand.label not in per_step:
            continue
        sibling = C.minibatch_sibling(cand, cands)
        if sibling is None:
            continue
        try:
            cheap = per_step[sibling.label] if sibling.label in per_step else C.time_step(sibling, opts)
        except Exception:
            continue
        ratio = per_step[cand.label] / max(cheap, 1e-9)
        if ratio >= C.EXACT_SLOWDOWN_NOTE:
            form = sibling.canonical.split("parallel  = ", 1)[1].split("\n", 1)[0]
            print(f"note: `{cand.label}` takes ~{per_step[cand.label]:.2f} s/step token by token (exact); with "
                  f"`parallel = {form}` it takes ~{cheap:.2f} s/step ({ratio:.0f}x cheaper): minibatch(C) takes "
                  "each chunk's gradients at the chunk's start state (TTT/Titans), which runs in parallel")
    return per_cell




def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mirasc explore", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
