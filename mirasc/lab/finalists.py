"""`mirasc explore --finalists K`: a study's best designs re-run on more seeds (docs/cli.md, "Finalists").

A search ranks designs on few seeds, each at the knob values its sampler found for it (a reference at the rates
`--reference-lr` gave it), and prunes most of them early. A finding needs the best of them compared on more seeds,
unpruned: the K best sampled designs and the K best references, each at the values of its best complete trial (a
design is its function, its spec but for the name: the same axes at other knob values are the same design, and a
sampled design that is a reference under another name is that reference), run on `--finalist-seeds` as
fixed trials of a second study, NAME-finalists, in the same storage, one trial per design and seed. So the
finalists share the study's workers, resumption and storage, a later invocation may add seeds, and a cell the study
already trained (the same spec, budget and seed) is not trained again.

The verdict compares the best sampled design's mean with the best reference's: it beats it when the difference
exceeds twice its standard error (the two standard errors over seeds in quadrature).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

from . import cells as C
from . import leaderboard as B
from . import search as S
from .study_storage import journal_path, storage_url


def finalist_opts(opts: dict) -> dict:
    """The finalists' study: the search's budget, fixed trials of one seed each (so its settings do not name the
    seeds: a later invocation may add seeds), no pruning."""
    return {**opts, "study_name": f"{opts['study_name']}-finalists", "seeds": list(opts["finalist_seeds"]),
            "pruner": "none", "per_design": 0, "fixed_only": True, "out": str(Path(opts["out"]) / "finalists")}


@dataclasses.dataclass
class Finalist:
    trial: object              # the design's best complete trial in the study
    reference: str | None      # the reference (published design) it is, by its function, or None
    values: dict               # the knob values of that trial

    @property
    def label(self) -> str:
        return self.reference or " | ".join(self.trial.params[a] for a in C.AXES)


def _body(spec: str) -> tuple[str, ...]:
    """A design's function: its spec text without the model's name."""
    return tuple(spec.splitlines()[1:])


def values_of(trial) -> dict:
    """The knob values a trial trained at: a sampled trial's parameters other than the axes, a reference's own."""
    if trial.user_attrs.get("reference_spec"):
        return dict(trial.user_attrs.get("values", {}))
    return {k: v for k, v in trial.params.items() if k not in C.AXES}


def pick(study, k: int) -> list[Finalist]:
    """The K best sampled designs, then the K best references, best first (ties: the earlier trial). A design is its
    function (its spec but for the name): a sampled design that is a reference's under another name is that
    reference, at the best values of either."""
    from optuna.trial import TrialState

    best, names = {}, {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        spec = t.user_attrs.get("spec")
        if spec is None or "same_as" in t.user_attrs:
            continue
        body = _body(spec)
        if t.user_attrs.get("reference"):
            names.setdefault(body, t.user_attrs["reference"])
        if body not in best or t.value > best[body].value:
            best[body] = t
    ranked = [Finalist(t, names.get(body), values_of(t))
              for body, t in sorted(best.items(), key=lambda kv: (-kv[1].value, kv[1].number))]
    return [f for f in ranked if not f.reference][:k] + [f for f in ranked if f.reference][:k]


def enqueue(fstudy, picked: list[Finalist], out: Path, seeds: list[int]) -> int:
    """Enqueue each finalist at its values on each seed as a fixed trial of the finalists' study (once; one trial per
    design and seed, all designs on a seed before the next seed, so that an interrupted run has whole seeds and
    more seeds can be added later), and write the cells its trial already trained on a finalist seed to
    out/cells/, so that they are reused. Returns the count."""
    present = {(t.user_attrs.get("reference_spec"), S._values_key(t.user_attrs.get("values", {})),
                t.user_attrs.get("seed")) for t in fstudy.get_trials(deepcopy=False)}
    (out / "cells").mkdir(parents=True, exist_ok=True)
    for f in picked:
        for cell in f.trial.user_attrs.get("cells", []):
            path = out / "cells" / f"{cell.get('key')}.json"
            if "key" in cell and cell["seed"] in seeds and not path.exists():
                C.write_cell(out / "cells", {k: v for k, v in cell.items() if k not in ("label", "trial", "reference")})
    n = 0
    for seed in seeds:
        for f in picked:
            spec = f.trial.user_attrs["spec"]
            if (spec, S._values_key(f.values), seed) in present:
                continue
            attrs = {"reference_spec": spec, "values": f.values, "from_trial": f.trial.number, "seed": seed}
            attrs["reference" if f.reference else "fixed_label"] = f.label
            fstudy.enqueue_trial({}, user_attrs=attrs)
            n += 1
    return n


def verdict(rows: list[dict]) -> dict:
    """The best sampled design against the best reference, by mean accuracy at the training length."""
    ok = [r for r in rows if r["status"] == "ok"]
    sampled = [r for r in ok if not r.get("reference")]
    refs = [r for r in ok if r.get("reference")]
    if not sampled or not refs:
        return {"unavailable": "the finalists need a sampled design and a reference with results"}
    a, b = max(sampled, key=lambda r: r["acc_mean"]), max(refs, key=lambda r: r["acc_mean"])
    diff = a["acc_mean"] - b["acc_mean"]
    se = math.sqrt((a.get("acc_se") or 0.0) ** 2 + (b.get("acc_se") or 0.0) ** 2)
    beats = diff > 2 * se
    text = (f"best sampled design {a['label']}: {a['acc_mean']:.3f} ± {a.get('acc_se') or 0:.3f}; best reference "
            f"{b['label']}: {b['acc_mean']:.3f} ± {b.get('acc_se') or 0:.3f}; difference {diff:+.3f} ± {se:.3f} "
            f"(s.e.): " + ("the sampled design beats every reference" if beats else
                           "no sampled design beats every reference by two standard errors"))
    return {"sampled": a["label"], "reference": b["label"], "difference": diff, "se": se, "beats": beats,
            "text": text}


def run(opts: dict) -> int:
    """Pick, enqueue and run the finalists of the study; write their leaderboard. Returns the exit status (130:
    interrupted, the same command goes on)."""
    from optuna.trial import TrialState

    fopts = finalist_opts(opts)
    out = Path(fopts["out"])
    k, seeds = int(opts["finalists"]), fopts["seeds"]
    study = S.open_study(opts, create=False)
    fstudy = S.open_study(fopts, create=True)
    S.check_config(fstudy, fopts)
    if journal_path(storage_url(fopts)) is not None:
        S.recover_dead_workers(fstudy)
    picked = pick(study, k)
    enqueued = enqueue(fstudy, picked, out, seeds)
    before = {s: len(fstudy.get_trials(deepcopy=False, states=(s,))) for s in TrialState}
    waiting = before[TrialState.WAITING]
    print(f"finalists (study {fopts['study_name']!r}): the {k} best sampled designs and the {k} best references, "
          f"each at its best trial's values, on seed(s) {' '.join(map(str, seeds))}: {enqueued} trial(s) "
          f"(design, seed) enqueued, "
          f"running {waiting} trial(s) on {opts['workers']} worker(s)", flush=True)
    for f in picked:
        print(f"  {f.label} ({'reference' if f.reference else 'sampled'}): trial {f.trial.number}, "
              f"{f.trial.user_attrs.get('label')}: {f.trial.value:.3f} on seed(s) "
              f"{' '.join(map(str, opts['seeds']))}", flush=True)
    code = 0
    if waiting:
        workers = min(int(opts["workers"]), waiting)
        code = S.work(fopts, waiting, 0) if workers == 1 else S._spawn(fopts, waiting, workers)
    fstudy = S.open_study(fopts, create=False)
    rows = B.leaderboard(S.study_cells(fstudy)[0], fopts["eval_lengths"], B.chance_levels(fopts))
    v = verdict(rows)
    picks = [{"label": f.label, "reference": f.reference, "values": f.values, "trial": f.trial.number,
              "trial_label": f.trial.user_attrs.get("label"), "value": f.trial.value} for f in picked]
    rc = S.summarize(fstudy, fopts, before, [], {"verdict": v, "finalists_of": {
        "study": opts["study_name"], "seeds": opts["seeds"], "picked": picks}})
    print(v.get("text") or v["unavailable"])
    if code == 130:
        print("interrupted: the running finalists are enqueued again; run the same command to go on", file=sys.stderr)
        return 130
    return rc or code
