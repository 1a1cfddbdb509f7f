"""`mirasc explore --sampler grid|tpe|random`: the explore grid as an Optuna study (docs/cli.md, "mirasc explore").

Each trial is one design: a value per axis (categorical; the compiler's legality check prunes an illegal combination
at once, its reason recorded as the trial's user attribute "illegal"), plus the sampled knobs (the outer learning
rate, Layer options). It trains every seed in turn as `mirasc explore` trains a cell (mirasc.lab.cells.train_cell),
reports the accuracy at the training length every `eval_every` steps (step index seed_index·steps + step, so every
trial is compared at the same seed and step) and may be pruned there; its value is the mean accuracy over seeds.

The study lives in an Optuna storage (SQLite in the output folder by default, any database URL, or a journal file),
so that any number of `mirasc explore --study URL` processes, here (`--workers N`) or on other machines, add trials
to one study. A finished cell is also written to OUT/cells/ as in grid mode and reused from there. The spec files
given with --spec are the study's fixed reference trials: enqueued once per study, never pruned.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import statistics
import sys
import warnings
from pathlib import Path

from . import cells as C
from . import leaderboard as B
from .cells import UsageError
from .study_storage import _optuna, _serialize_ask, journal_path, make_storage, storage_url

DEFAULT_TRIALS = 20
REDUCTION_FACTOR = 3
MAX_ATTEMPTS = 50          # sampled trials per counted (legal, new) one before a worker gives up
FIXED_ATTRS = ("reference", "reference_spec", "fixed_label", "values", "from_trial", "seed")  # what a fixed trial is
PER_DESIGN = 3             # trials one design trains at most under tpe and random (--per-design)


# --------------------------------------------------------------------------------- search space
def axis_choices(opts: dict) -> dict[str, list[str]]:
    """The categorical choices per axis: the axes given, the others at their defaults; none when only spec
    files are given (then the study is its reference trials alone)."""
    if opts.get("fixed_only") or (not any(opts[a] for a in C.AXES) and opts["spec"]):
        return {}
    return {a: list(opts[a] or C.AXIS_DEFAULTS[a]) for a in C.AXES}


def study_config(opts: dict) -> dict:
    """What trials of one study must share: a second invocation on the study must give the same."""
    return json.loads(json.dumps({
        "version": C.EXPLORE_VERSION, "task": opts["task"], "task_config": dataclasses.asdict(opts["task_config"]),
        "budget": C.budget_of(opts), "seeds": None if opts.get("fixed_only") else opts["seeds"],
        "state_budget": opts["state_budget"],
        "axes": axis_choices(opts), "knobs": {k: dataclasses.asdict(v) for k, v in opts["knobs"].items()},
        "eval_every": eval_every(opts)}, default=str))


def eval_every(opts: dict) -> int | None:
    if pruner_name(opts) == "none" and not opts["eval_every"]:
        return None
    return int(opts["eval_every"] or max(1, opts["steps"] // 5))


def per_design(opts: dict) -> int:
    """The most trials one design trains in the study (0: no limit). A sampler that keeps proposing the design it
    believes best with a new value of a knob (TPE does, over categorical axes) would otherwise spend the study on one
    cell: a repeated proposal is pruned at once, untrained, and TPE reads it as a poor result there."""
    if opts.get("per_design") is not None:
        return int(opts["per_design"])
    return 0 if opts["sampler"] == "grid" else PER_DESIGN


def pruner_name(opts: dict) -> str:
    return opts["pruner"] or ("none" if opts["sampler"] in (None, "grid") else "hyperband")


def make_sampler(opts: dict):
    optuna = _optuna()
    name = opts["sampler"] or "tpe"
    if name == "grid":
        space = dict(axis_choices(opts))
        for key, k in opts["knobs"].items():   # lists only (explore.resolve refuses ranges for the grid)
            space[key] = list(k.choices)
        return optuna.samplers.GridSampler(space) if space else optuna.samplers.RandomSampler()
    if name == "random":
        return optuna.samplers.RandomSampler()
    # constant liar: a running trial counts as a poor result, so that workers running at once spread out
    return optuna.samplers.TPESampler(constant_liar=True)


def make_pruner(opts: dict):
    optuna = _optuna()
    name, every = pruner_name(opts), eval_every(opts)
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=every, reduction_factor=REDUCTION_FACTOR)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=every, max_resource=opts["steps"] * len(opts["seeds"]),
                                              reduction_factor=REDUCTION_FACTOR)
    return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=every)


def open_study(opts: dict, create: bool):
    optuna = _optuna()
    storage = make_storage(storage_url(opts), int(opts["heartbeat"]))
    kwargs = {"study_name": opts["study_name"], "storage": storage, "sampler": make_sampler(opts),
              "pruner": make_pruner(opts)}
    if create:
        return optuna.create_study(direction="maximize", load_if_exists=True, **kwargs)
    return optuna.load_study(**kwargs)


def check_config(study, opts: dict) -> None:
    config = study_config(opts)
    stored = study.user_attrs.get("config")
    if stored is None:
        study.set_user_attr("config", config)
        return
    if stored != config:
        diff = sorted(k for k in set(config) | set(stored) if config.get(k) != stored.get(k))
        raise UsageError(f"study {opts['study_name']!r} in {storage_url(opts)} was made with other settings "
                         f"({', '.join(diff)} differ): give the same options, or another --study-name")


def enqueue_references(study, opts: dict) -> tuple[int, list[dict]]:
    """Enqueue each --spec file, at each --reference-lr rate, not yet in the study as a fixed trial (at the study's
    lr: no knob values, as the references of a study made before --reference-lr). Returns (enqueued, dropped)."""
    import mirasc

    present = {(t.user_attrs.get("reference_spec"), _values_key(t.user_attrs.get("values", {})))
               for t in study.get_trials(deepcopy=False)}
    rates = [float(r) for r in opts.get("reference_lr") or [opts["lr"]]]
    enqueued, dropped = 0, []
    for path in opts["spec"]:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise UsageError(f"cannot read spec file {path}: {err}") from None
        try:
            canonical = mirasc.parse_text(text, path).canonical()
            mirasc.compile_spec(text)
        except mirasc.SpecError as err:
            dropped.append({"label": Path(path).stem, "spec": text, "reason": err.message})
            continue
        for rate in dict.fromkeys(rates):
            values = {} if rate == float(opts["lr"]) else {"lr": rate}
            if (canonical, _values_key(values)) in present:
                continue
            present.add((canonical, _values_key(values)))
            study.enqueue_trial({}, user_attrs={"reference": Path(path).stem, "reference_spec": canonical,
                                                "values": values})
            enqueued += 1
    return enqueued, dropped


def _values_key(values: dict) -> str:
    return json.dumps(values, sort_keys=True)


# ------------------------------------------------------------------------------------- trials
def _suggest(trial, name: str, k: C.Knob):
    if k.kind == "choice":
        return trial.suggest_categorical(name, list(k.choices))
    if k.kind == "int":
        return trial.suggest_int(name, int(k.lo), int(k.hi))
    return trial.suggest_float(name, k.lo, k.hi, log=k.log)


def _label(base: str, values: dict) -> str:
    if not values:
        return base
    text = " ".join(f"{k.removeprefix('layer.')}={v:.3g}" if isinstance(v, float) else f"{k.removeprefix('layer.')}={v}"
                    for k, v in values.items())
    return f"{base} | {text}"


class Objective:
    """One trial: the design it samples, trained over every seed with intermediate reports (module docstring)."""

    def __init__(self, opts: dict, worker: int = 0):
        self.opts, self.worker = opts, worker
        self.every = eval_every(opts)
        self.illegal = False       # whether the last trial was an illegal combination or a design tried enough

    def candidate(self, trial):
        import mirasc

        a = trial.user_attrs
        if a.get("reference_spec"):   # a fixed trial: a reference, or a finalist (mirasc.lab.finalists)
            cand = C.Candidate(a.get("reference") or a["fixed_label"], a["reference_spec"], {})
            values = dict(a.get("values", {}))
        else:
            space = axis_choices(self.opts)
            axes = {a: trial.suggest_categorical(a, space[a]) for a in C.AXES}
            values = {name: _suggest(trial, name, k) for name, k in self.opts["knobs"].items()}
            label = " | ".join(axes[a] for a in C.AXES)
            cand = C.Candidate(label, C.spec_text(C.model_name(label), axes), axes)
        try:
            spec = mirasc.parse_text(cand.text, cand.label)
            cand.canonical = spec.canonical()
            cand.module = mirasc.compile_spec(cand.text)
        except mirasc.SpecError as err:
            return cand, values, err.message
        if not cand.axes:
            cand.axes = {a: line.split("=", 1)[1].strip() for a, line in zip(C.AXES, cand.canonical.splitlines()[1:6])}
        return cand, values, ""

    def __call__(self, trial):
        optuna = _optuna()
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")  # (recover_dead_workers reads it)
        try:
            return self._run(trial, optuna)
        except optuna.TrialPruned:
            raise
        except Exception as err:  # the trial fails (Optuna records it); the message is kept for the leaderboard
            trial.set_user_attr("error", f"{type(err).__name__}: {err}")
            raise
        except KeyboardInterrupt:
            # the trial ends FAILED; a copy waits in the study, so that the next invocation runs it again
            _enqueue_again(trial.study, trial.study._storage.get_trial(trial._trial_id), optuna)
            trial.set_user_attr("interrupted", True)
            raise

    def _run(self, trial, optuna):
        opts = self.opts
        self.illegal = False
        cand, values, reason = self.candidate(trial)
        if not reason:
            try:
                copts = C.cell_opts(cand, opts, values)
            except UsageError as err:
                reason = str(err)
        self.illegal = bool(reason)
        if reason:
            trial.set_user_attr("illegal", reason)
            trial.set_user_attr("label", _label(cand.label, values))
            raise optuna.TrialPruned(f"illegal: {reason}")
        cand.label = _label(cand.label, values)
        reference = trial.user_attrs.get("reference")
        fixed = bool(trial.user_attrs.get("reference_spec"))
        budget = C.budget_of(copts)
        design = C.design_key(cand.canonical, opts["task"], opts["task_config"], budget)
        for name, value in (("label", cand.label), ("design", design), ("spec", cand.canonical),
                            ("head_dim", copts["layer"].get("head_dim") or opts["d_model"] // opts["heads"])):
            trial.set_user_attr(name, value)
        seeds = [trial.user_attrs["seed"]] if "seed" in trial.user_attrs else opts["seeds"]  # a finalist: one seed
        for t in trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            if "seed" not in trial.user_attrs and t.user_attrs.get("design") == design and t.number != trial.number:
                trial.set_user_attr("same_as", t.number)
                trial.set_user_attr("cells", t.user_attrs.get("cells", []))
                return t.value
        tried = 0 if fixed else self.tried(trial, cand.canonical, optuna)
        if tried:
            self.illegal = True  # (it takes no time and does not count)
            trial.set_user_attr("repeat", tried)
            raise optuna.TrialPruned(f"the design has {tried} trials already")
        out = Path(opts["out"]) / "cells"
        out.mkdir(parents=True, exist_ok=True)
        progress = C.Progress(len(seeds), quiet=opts["quiet"])
        steps, cells = opts["steps"], []
        for i, seed in enumerate(seeds):
            key = C.cell_key(cand.canonical, opts["task"], opts["task_config"], seed, budget)
            path = out / f"{key}.json"
            record = None
            if path.exists() and not opts["force"]:
                try:
                    record = json.loads(path.read_text(encoding="utf-8"))
                except ValueError:
                    record = None  # a torn file: train again
            if record is not None:
                C.complete_record(record, cand, copts)
                for step, acc in record.get("eval_curve", []):
                    self._report(trial, optuna, acc, i * steps + step, seed, step, fixed)
            else:
                record = C.train_cell(cand, copts, seed, progress, self.every,
                                      lambda step, acc, i=i, seed=seed: self._report(
                                          trial, optuna, acc, i * steps + step, seed, step, fixed))
                record["key"] = key
                C.write_cell(out, record)
            record["label"] = cand.label
            if reference:
                record["reference"] = reference
            record["trial"] = trial.number
            cells.append(record)
            progress.done += 1
            trial.set_user_attr("cells", cells)
            for name in ("params", "state_bytes", "seconds_per_step"):
                trial.set_user_attr(name, record.get(name))
            acc = record["accuracy"][str(record["train_length"])]
            if self.every and i + 1 < len(seeds):
                self._report(trial, optuna, acc, (i + 1) * steps, seed, steps, fixed)
        return statistics.fmean(c["accuracy"][str(c["train_length"])] for c in cells)

    def tried(self, trial, canonical: str, optuna) -> int:
        """The trials (complete, pruned on their curve or running) that trained the design of spec text `canonical`,
        where they reach the --per-design limit; else 0. (A proposal of a design and knob values the study has
        finished takes that trial's value untrained, `same_as`, before this is asked.)"""
        limit = per_design(self.opts)
        if not limit:
            return 0
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
        n = sum(1 for t in trial.study.get_trials(deepcopy=False, states=states)
                if t.number != trial.number and t.user_attrs.get("spec") == canonical
                and not {"illegal", "repeat", "same_as"} & set(t.user_attrs))
        return n if n >= limit else 0

    def _report(self, trial, optuna, acc: float, index: int, seed: int, step: int, fixed: bool) -> None:
        trial.report(acc, index)
        if not fixed and trial.should_prune():
            trial.set_user_attr("pruned_at", {"seed": seed, "step": step, "accuracy": acc})
            raise optuna.TrialPruned(f"accuracy {acc:.3f} at step {step} of seed {seed}")


def _enqueue_again(study, frozen, optuna) -> None:
    """A waiting copy of trial `frozen` (its parameters, and a reference's spec), run by the next worker."""
    system = {k: v for k, v in frozen.system_attrs.items() if k != "fixed_params"}
    keep = {k: v for k, v in frozen.user_attrs.items() if k in FIXED_ATTRS}
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING, params=frozen.params, distributions=frozen.distributions,
        user_attrs=keep, system_attrs={**system, "fixed_params": frozen.params, "interrupted_trial": frozen.number}))


def recover_dead_workers(study) -> list[int]:
    """A journal file has no heartbeat: a worker killed outright (SIGKILL, a crash) leaves its trial RUNNING. Each
    trial records its worker (host:pid); a RUNNING one whose worker on this host is gone is failed, marked
    interrupted, and enqueued again, as an interrupted trial is. Returns the trial numbers recovered."""
    optuna = _optuna()
    host, recovered = socket.gethostname(), []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        where, _, pid = t.user_attrs.get("worker", "").rpartition(":")
        if where != host or not pid.isdigit() or _alive(int(pid)):
            continue
        _enqueue_again(study, t, optuna)
        study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        recovered.append(t.number)
    return recovered


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _announce(study, trial) -> None:
    a = trial.user_attrs
    label = a.get("label", "?")
    if trial.state.name == "COMPLETE":
        extra = f" (as trial {a['same_as']})" if "same_as" in a else ""
        state = a.get("state_bytes")
        print(f"trial {trial.number}: {label}: accuracy {trial.value:.3f}{extra}"
              + (f", state {B.size_text(state)} B/layer (head_dim {a.get('head_dim')})" if state is not None else ""),
              flush=True)
    elif trial.state.name == "PRUNED":
        if "illegal" in a:
            print(f"trial {trial.number}: {label}: illegal: {a['illegal']}", flush=True)
        elif "repeat" in a:
            print(f"trial {trial.number}: {label}: not trained: its design has had {a['repeat']} trials "
                  "(--per-design)", flush=True)
        else:
            at = a.get("pruned_at", {})
            print(f"trial {trial.number}: {label}: pruned at step {at.get('step')} of seed {at.get('seed')} "
                  f"(accuracy {at.get('accuracy', float('nan')):.3f})", flush=True)
    elif trial.state.name == "FAIL" and not a.get("interrupted"):
        print(f"trial {trial.number}: {label}: failed: {a.get('error', '?')}", flush=True)


def _grid_left(study) -> bool:
    """Whether a grid study has grid points not finished, or trials waiting."""
    from optuna.trial import TrialState

    sampler = study.sampler
    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return True
    if not hasattr(sampler, "_all_grids"):
        return True
    done = {t.system_attrs.get("grid_id") for t in study.get_trials(deepcopy=False)
            if t.state.is_finished() and "grid_id" in t.system_attrs}
    return len(done) < len(sampler._all_grids)


def work(opts: dict, n_trials: int | None, worker: int = 0) -> int:
    """One worker: run trials of the study until `n_trials` (None: the grid) have run. Returns 130 when
    interrupted, else 0."""
    import torch

    if opts["threads"]:
        torch.set_num_threads(int(opts["threads"]))
    if opts["device"] == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: torch sees no GPU here")
        opts = {**opts, "device": f"cuda:{worker % torch.cuda.device_count()}"}
    study = open_study(opts, create=False)
    _serialize_ask(study, storage_url(opts))
    if n_trials == 0:
        return 0
    if n_trials is None and opts["sampler"] == "grid" and not _grid_left(study):
        return 0
    objective = Objective(opts, worker)
    try:
        if n_trials is None:
            study.optimize(objective, n_trials=None, callbacks=[_announce], catch=(Exception,))
            return 0
        counted = attempts = 0
        while counted < n_trials:      # an illegal combination takes no time and does not count
            if opts["sampler"] == "grid" and not _grid_left(study):
                break
            if attempts >= MAX_ATTEMPTS * n_trials:
                print(f"worker {worker}: {attempts} trials sampled, only {counted} legal and new: stopping (the axes "
                      "given have few legal combinations, or every one has had --per-design trials; widen them, or "
                      "use the grid sampler)", file=sys.stderr)
                break
            study.optimize(objective, n_trials=1, callbacks=[_announce], catch=(Exception,))
            attempts += 1
            counted += not objective.illegal
    except KeyboardInterrupt:
        return 130
    return 0


def _worker_main(opts: dict, n_trials: int | None, worker: int, threads: int) -> None:
    if threads:
        opts = {**opts, "threads": threads}
    try:
        code = work(opts, n_trials, worker)
    except KeyboardInterrupt:
        code = 130
    except UsageError as err:
        print(f"mirasc explore (worker {worker}): {err}", file=sys.stderr)
        code = 2
    sys.exit(code)


def _shares(total: int | None, workers: int) -> list[int | None]:
    if total is None:
        return [None] * workers
    return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


def run_study(opts: dict) -> int:
    _optuna()
    from optuna.trial import TrialState

    out = Path(opts["out"])
    out.mkdir(parents=True, exist_ok=True)
    if opts["sampler"] is None:
        opts = {**opts, "sampler": "tpe"}
    study = open_study(opts, create=True)
    check_config(study, opts)
    if journal_path(storage_url(opts)) is not None:
        recovered = recover_dead_workers(study)
        if recovered:
            print(f"trial(s) {', '.join(map(str, recovered))} of a worker that is gone: enqueued again", flush=True)
    enqueued, dropped = enqueue_references(study, opts)
    before = {s: len(study.get_trials(deepcopy=False, states=(s,))) for s in TrialState}
    trials = opts["trials"]
    if trials is None and opts["sampler"] != "grid":
        trials = DEFAULT_TRIALS
    if trials is not None and trials:
        trials += enqueued
    if not axis_choices(opts) and trials != 0:
        trials = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))  # only the references
    workers = int(opts["workers"])
    every = eval_every(opts)
    print(f"explore study {opts['study_name']!r} in {storage_url(opts)}: sampler {opts['sampler']}, pruner "
          f"{pruner_name(opts)}" + (f" (accuracy every {every} steps)" if every else "")
          + f"; task {opts['task']} ({C.config_text(opts['task_config'])}), budget {opts['steps']} steps x batch "
          f"{opts['batch_size']}, d_model {opts['d_model']}, {opts['layers']} layer(s), {opts['heads']} head(s), "
          f"{len(opts['seeds'])} seed(s)" + (f", state budget {opts['state_budget']} B/layer"
                                            if opts["state_budget"] else ""))
    print(f"the study holds {before[TrialState.COMPLETE]} complete, {before[TrialState.PRUNED]} pruned, "
          f"{before[TrialState.FAIL]} failed, {before[TrialState.RUNNING]} running and {before[TrialState.WAITING]} "
          f"waiting trial(s); {enqueued} reference design(s) enqueued; running "
          + ("the rest of the grid" if trials is None else f"{trials} trial(s)") + f" on {workers} worker(s)",
          flush=True)
    for d in dropped:
        print(f"  reference {d['label']} dropped: {d['reason']}")
    code = 0
    if workers == 1:
        code = work(opts, trials, 0)
    else:
        code = _spawn(opts, trials, workers)
    study = open_study(opts, create=False)
    rc = summarize(study, opts, before, dropped)
    if code == 130:
        print("interrupted: the running trials are enqueued again; run the same command to go on", file=sys.stderr)
        return 130
    return rc


def _spawn(opts: dict, trials: int | None, workers: int) -> int:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    threads = int(opts["threads"] or max(1, (os.cpu_count() or 1) // workers))
    procs = [ctx.Process(target=_worker_main, args=(opts, n, i, threads), name=f"explore-worker-{i}")
             for i, n in enumerate(_shares(trials, workers)) if n is None or n > 0]
    for p in procs:
        p.start()
    interrupted = False
    while True:
        try:
            for p in procs:
                p.join()
            break
        except KeyboardInterrupt:  # the workers got it too: they enqueue their trials again and stop
            interrupted = True
    if interrupted or any(p.exitcode == 130 for p in procs):
        return 130
    failed = [p.name for p in procs if p.exitcode not in (0, 130)]
    if failed:
        print(f"worker(s) {', '.join(failed)} stopped with an error (their running trials are rerun by the next "
              "invocation on a database storage)", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------- leaderboard
def study_cells(study) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """(cells of complete trials, one per design and seed; pruned trials; illegal designs; failed trials)."""
    from optuna.trial import TrialState

    cells, seen, pruned, illegal, failed = [], set(), [], {}, []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        if t.state == TrialState.COMPLETE:
            for c in a.get("cells", []):
                ident = (c.get("design"), c["seed"])
                if ident not in seen:
                    seen.add(ident)
                    cells.append(c)
        elif t.state == TrialState.PRUNED and "illegal" in a:
            illegal.setdefault(a.get("label", "?"), {"label": a.get("label", "?"), "reason": a["illegal"],
                                                      "trials": []})["trials"].append(t.number)
        elif t.state == TrialState.PRUNED and "repeat" not in a:
            pruned.append({"trial": t.number, "label": a.get("label"), **a.get("pruned_at", {}),
                           "state_bytes": a.get("state_bytes")})
        elif t.state == TrialState.FAIL and not a.get("interrupted"):
            failed.append({"trial": t.number, "label": a.get("label"), "error": a.get("error", "")})
    return cells, pruned, list(illegal.values()), failed


def importance(study) -> dict:
    """Optuna's parameter importances over the complete trials that sampled parameters (not the references)."""
    import optuna

    sampled = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)) if t.params]
    if len(sampled) < 2:
        return {"unavailable": f"{len(sampled)} complete trial(s) with sampled parameters: too few"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {k: float(v) for k, v in optuna.importance.get_param_importances(
                study, params=sorted(sampled[0].params)).items()}
    except Exception as err:  # e.g. a single value per parameter
        return {"unavailable": f"{type(err).__name__}: {err}"}


def summarize(study, opts: dict, before: dict, dropped: list[dict], more: dict | None = None) -> int:
    from optuna.trial import TrialState

    cells, pruned, illegal, failed = study_cells(study)
    chance = B.chance_levels(opts)
    rows = B.leaderboard(cells, opts["eval_lengths"], chance)
    print(B.format_table(rows, opts["eval_lengths"]))
    after = {s: len(study.get_trials(deepcopy=False, states=(s,))) for s in TrialState}
    imp = importance(study)
    extra = {"study": {"name": opts["study_name"], "storage": storage_url(opts), "sampler": opts["sampler"],
                       "pruner": pruner_name(opts), "eval_every": eval_every(opts),
                       "trials": {s.name.lower(): after[s] for s in TrialState}},
             "pruned": pruned, "failed": failed, "importance": imp, **(more or {})}
    out = Path(opts["out"])
    written = B.write_outputs(out, opts, rows, cells, dropped + illegal, opts["plots"], extra)
    if "unavailable" not in imp:
        print("parameter importance (Optuna): " + ", ".join(f"{k} {v:.2f}" for k, v in imp.items()))
    new = {s: after[s] - before[s] for s in TrialState}
    print(f"this run: {new[TrialState.COMPLETE]} complete, {new[TrialState.PRUNED]} pruned (illegal and repeated "
          "designs included), "
          f"{new[TrialState.FAIL]} failed; the study: {after[TrialState.COMPLETE]} complete, "
          f"{after[TrialState.PRUNED]} pruned ({len(illegal)} illegal design(s)), {after[TrialState.FAIL]} failed; "
          "wrote " + ", ".join(str(p) for p in written))
    return 1 if [f for f in failed if f["trial"] >= sum(before.values())] else 0

