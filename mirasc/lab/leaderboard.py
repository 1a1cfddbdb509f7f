"""The leaderboard of `mirasc explore`: the cells' records ranked (mean accuracy over seeds per design, above chance
or not), the accuracy-state Pareto front, the table printed, and the output folder's files (leaderboard.csv and .json,
pareto.csv, and with matplotlib the plots). Grid and study both write them.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

from .cells import AXES, budget_of


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


def size_text(n: int) -> str:
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
            state = (size_text(r["state_bytes"]) + ("(T)" if r.get("state_grows") else "")
                     + ("*" if r.get("pareto") else ""))
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
        lines.append("chance: the accuracy of the best guess that ignores the context (mirasc.lab.tasks.chance); "
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
