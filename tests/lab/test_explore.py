"""`mirasc explore` end to end at tiny size: grid -> dropped illegal cell with its reason -> trained
cells -> leaderboard files; a second run is resumed (nothing trained); evaluation scores a perfect
recaller at 1 and a constant predictor at 0."""

import csv
import json

import pytest
import torch

from mirasc.lab import cells, explore, leaderboard
from mirasc.lab import tasks as T

TINY = ["--steps", "4", "--batch-size", "4", "--d-model", "16", "--heads", "2", "--layers", "1",
        "--seq-len", "24", "--task-opt", "num_kv_pairs=4", "--eval-lengths", "24", "48", "--eval-examples", "8",
        "--seeds", "0", "1", "--threads", "1", "--quiet"]
GRID = ["--memory", "linear", "mlp", "--learner", "gd", "implicit"]


def test_explore_grid_end_to_end_and_resume(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    threads = torch.get_num_threads()
    assert explore.main(GRID + TINY + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    # 2 x 2 grid: mlp + implicit is illegal, dropped with the compiler's reason
    assert "4 designs, 3 legal" in text
    assert "mlp | l2 | none | implicit | exact: illegal combination: `implicit` needs a closed-form proximal" in text
    assert "trained 6 cell(s), resumed 0" in text
    for name in ("leaderboard.csv", "leaderboard.json"):
        assert (out / name).stat().st_size > 0
    doc = json.loads((out / "leaderboard.json").read_text())
    assert [d["label"] for d in doc["dropped"]] == ["mlp | l2 | none | implicit | exact"]
    assert "closed-form proximal step" in doc["dropped"][0]["reason"]
    assert len(doc["leaderboard"]) == 3 and len(doc["cells"]) == 6
    assert sorted(r["rank"] for r in doc["leaderboard"]) == [1, 2, 3]
    for cell in doc["cells"]:
        assert cell["status"] == "ok" and set(cell["accuracy"]) == {"24", "48"}
        assert 0 <= cell["accuracy"]["24"] <= 1 and len(cell["loss_curve"]) == 1
        assert cell["loss_curve"][0][1] == pytest.approx(5.55, abs=0.3)   # ~ln 256 after 4 steps
    with open(out / "leaderboard.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["label"] for r in rows} == {"linear | l2 | none | gd | exact", "linear | l2 | none | implicit | exact",
                                          "mlp | l2 | none | gd | exact"}
    assert all(r["seeds"] == "2" and "acc@48" in r for r in rows)
    assert len(list((out / "cells").glob("*.json"))) == 6
    try:
        import matplotlib  # noqa: F401
        assert (out / "accuracy_vs_length.png").stat().st_size > 1000
        assert (out / "loss_curves.png").stat().st_size > 1000
    except ImportError:
        pass
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*.json")}

    # second run: every cell is resumed; training must not be called at all
    def no_training(*a, **k):
        raise AssertionError("a stored cell was recomputed")

    monkeypatch.setattr(cells, "train_cell", no_training)
    assert explore.main(GRID + TINY + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "trained 0 cell(s), resumed 6, failed 0" in text
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cells").glob("*.json")} == stamps
    assert json.loads((out / "leaderboard.json").read_text())["leaderboard"] == doc["leaderboard"]
    # a changed budget is a different cell: now training is needed (and here refused)
    assert explore.main(GRID + TINY + ["--out", str(out), "--steps", "5"]) == 1
    assert "trained 0 cell(s), resumed 0, failed 6" in capsys.readouterr().out
    assert torch.get_num_threads() == threads                   # --threads is restored after the run


def test_cell_key_covers_spec_task_seed_budget():
    cfg = T.MQARConfig()
    budget = {"steps": 10, "d_model": 16}
    base = cells.cell_key("model a {}", "mqar", cfg, 0, budget)
    assert base == cells.cell_key("model a {}", "mqar", cfg, 0, dict(budget))
    assert len({base, cells.cell_key("model b {}", "mqar", cfg, 0, budget),
                cells.cell_key("model a {}", "mqar", T.MQARConfig(seq_len=32), 0, budget),
                cells.cell_key("model a {}", "noisy", cfg, 0, budget),
                cells.cell_key("model a {}", "mqar", cfg, 1, budget),
                cells.cell_key("model a {}", "mqar", cfg, 0, {**budget, "steps": 11})}) == 6


def test_grid_file_flags_win_and_errors(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"memory": ["linear"], "bias": ["l2", "huber"], "task": "noisy", "steps": 7,
                                "task_opt": {"num_kv_pairs": 4}, "seeds": [3]}))
    parser = explore.argparse.ArgumentParser()
    explore.add_arguments(parser)
    opts = explore.resolve(parser.parse_args(["--grid", str(grid), "--steps", "9"]))
    assert opts["steps"] == 9 and opts["task"] == "noisy" and opts["seeds"] == [3]
    assert opts["task_config"].num_kv_pairs == 4 and opts["bias"] == ["l2", "huber"]
    assert opts["eval_lengths"] == [opts["task_config"].seq_len, 2 * opts["task_config"].seq_len]
    toml = tmp_path / "grid.toml"
    toml.write_text('memory = ["linear", "mlp"]\ntask = "niah"\n[task_opt]\nneedle = "word"\n')
    opts = explore.resolve(parser.parse_args(["--grid", str(toml)]))
    assert opts["task_config"].needle == "word" and opts["memory"] == ["linear", "mlp"]
    cands = cells.candidates({**opts, "bias": ["l2", "lp(p=3)"], "learner": ["implicit"]})
    reasons = {c.label: c.reason for c in cands}
    assert reasons["linear | l2 | none | implicit | exact"] == ""
    assert "no closed-form proximal step for `bias = lp`" in reasons["linear | lp(p=3) | none | implicit | exact"]
    assert all(reasons[f"mlp | {b} | none | implicit | exact"] for b in ("l2", "lp(p=3)"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"memroy": ["linear"]}))
    assert explore.main(["--grid", str(bad)]) == 2
    assert explore.main(["--task-opt", "num_kv_pairs=500"]) == 2


class _Recaller(torch.nn.Module):
    """Predicts, at each position, the token after the first earlier occurrence of the current token."""

    def forward(self, x):
        guess = T.oracle_mqar(x, torch.ones_like(x)).clamp(min=0)
        return torch.nn.functional.one_hot(guess, 256).float()


def test_evaluate_scores_perfect_and_constant_models():
    cfg = T.MQARConfig(seq_len=32, num_kv_pairs=4)
    acc, exact = cells.evaluate(_Recaller(), "mqar", cfg, [32, 64], 8, 4)
    assert acc == {32: 1.0, 64: 1.0} and exact == {32: 1.0, 64: 1.0}

    class Constant(torch.nn.Module):
        def forward(self, x):
            return torch.zeros(*x.shape, 256)

    acc, exact = cells.evaluate(Constant(), "mqar", cfg, [32], 8, 4)
    assert acc == {32: 0.0} and exact == {32: 0.0}


ONE = ["--steps", "2", "--batch-size", "4", "--d-model", "16", "--heads", "2", "--layers", "1", "--seq-len", "24",
       "--task-opt", "num_kv_pairs=4", "--eval-lengths", "24", "--eval-examples", "8", "--seeds", "0",
       "--threads", "1", "--quiet", "--no-plots"]


def test_chance_level_beside_every_score_and_flagged_cells(tmp_path, capsys):
    out = tmp_path / "run"
    assert explore.main(["--memory", "linear"] + ONE + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    chance = 1 / T.MQARConfig().num_keys
    assert f"chance level (mqar, best guess without the context): {chance:.4f} at length 24" in text
    header = next(line for line in text.splitlines() if line.startswith("#  design"))
    assert header.split()[:6] == ["#", "design", "acc", "±", "chance", "@24"]
    assert "NOT ABOVE CHANCE" in text and "did not beat chance" in text   # 2 steps learn nothing
    row = json.loads((out / "leaderboard.json").read_text())["leaderboard"][0]
    assert row["chance"] == pytest.approx(chance) and row["chance@24"] == pytest.approx(chance)
    assert row["beats_chance"] is False
    with open(out / "leaderboard.csv", newline="") as f:
        assert list(csv.DictReader(f))[0]["beats_chance"] == "False"


def test_beating_chance_needs_two_standard_errors():
    def cell(acc):
        return {"spec": f"model m{acc} {{}}", "label": str(acc), "name": "m", "axes": {}, "train_length": 24,
                "accuracy": {"24": acc}, "exact_match": {"24": 0.0}, "scored": {"24": 100}, "final_loss": 1.0,
                "params": 1, "state_floats": 1, "seconds": 1.0, "status": "ok"}

    rows = leaderboard.leaderboard([cell(1.0), cell(0.05), cell(0.2)], [24], {24: 0.05})
    assert {r["label"]: r["beats_chance"] for r in rows} == {"1.0": True, "0.05": False, "0.2": True}
    # 0.09 over 100 tokens is within 2 standard errors (0.044) of 0.05; over 10 000 it is far above
    assert not leaderboard.above_chance(0.09, 0.05, 100) and leaderboard.above_chance(0.09, 0.05, 10_000)


def ctrl_c_on_second_cell(monkeypatch):
    """Make the second call of cells.train_cell raise KeyboardInterrupt (a user's Ctrl-C mid-run); the first
    trains for real. Returns the list of calls made."""
    real, calls = cells.train_cell, []

    def train_cell(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cells, "train_cell", train_cell)
    return calls


def test_interrupt_writes_the_leaderboard_of_finished_cells(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    ctrl_c_on_second_cell(monkeypatch)
    assert explore.main(["--memory", "linear", "--bias", "l2", "dot"] + ONE + ["--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert "interrupted after 1 of 2 cell(s) to train" in captured.err
    assert "trained 1 cell(s), resumed 0, failed 0, not run 1 (interrupted)" in captured.out
    with open(out / "leaderboard.csv", newline="") as f:
        assert [r["label"] for r in csv.DictReader(f)] == ["linear | l2 | none | gd | exact"]
    assert len(list((out / "cells").glob("*.json"))) == 1


def test_time_estimate_and_note_on_a_costly_exact_cell(tmp_path, capsys, monkeypatch):
    """Before training: seconds per step and per cell for each design, a total, and a note when an exact
    design's minibatch(C) form is >= 5x cheaper (here the timing is set: the real one depends on the machine)."""
    def fake_step(cand, opts):
        return 2.0 if "parallel  = exact" in cand.canonical else 0.1

    monkeypatch.setattr(cells, "time_step", fake_step)
    monkeypatch.setattr(cells, "train_cell", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no training")))
    argv = ["--memory", "mlp", "linear", "--learner", "gd", "implicit"] + ONE + ["--out", str(tmp_path / "run")]
    assert explore.main(argv) == 1
    text = capsys.readouterr().out
    # 2 steps + evaluation (2 batches at 1/3 of a step): 5.3 s
    assert "mlp | l2 | none | gd | exact              2.000 s/step  ~5 s per seed" in text
    assert "total ~" in text and "for 3 cell(s)" in text
    assert "note: `mlp | l2 | none | gd | exact` takes ~2.00 s/step token by token (exact); with " \
           "`parallel = minibatch(C=16)` it takes ~0.10 s/step (20x cheaper)" in text
    assert "note: `linear | l2 | none | gd | exact` takes ~2.00 s/step" in text
    assert "note: `linear | l2 | none | implicit" not in text    # implicit has no minibatch form
