"""`mirasc explore` as an Optuna study at tiny size: the grid sampler gives the grid's cells, illegal combinations are
pruned with their reason, the pruner stops losing trials on their accuracy curve, an interrupted or crashed run is
resumed, two invocations (and two worker processes) add to one study, and every row has its state size."""

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna  # the test extra installs it: these tests run, never skip
import pytest
import torch
from test_explore import ctrl_c_on_second_cell

from mirasc.lab import cells, explore, leaderboard, search

ROOT = Path(__file__).resolve().parents[2]
ONE = ["--steps", "4", "--batch-size", "4", "--d-model", "16", "--heads", "2", "--layers", "1", "--seq-len", "24",
       "--task-opt", "num_kv_pairs=4", "--eval-lengths", "24", "--eval-examples", "8", "--seeds", "0",
       "--threads", "1", "--quiet", "--no-plots"]
GRID = ["--memory", "linear", "mlp", "--learner", "gd", "implicit"]   # 4 combinations, 3 legal


def _study(url, name="explore"):
    return optuna.load_study(study_name=name, storage=url)


def _states(study):
    return sorted(t.state.name for t in study.get_trials())


def _rows(out):
    return json.loads((out / "leaderboard.json").read_text())["leaderboard"]


def test_grid_sampler_gives_the_grid_cells(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert explore.main(GRID + ONE + ["--seeds", "0", "1", "--out", str(out)]) == 0        # today's grid
    grid_rows = _rows(out)
    capsys.readouterr()

    def no_training(*a, **k):
        raise AssertionError("a cell the grid trained was trained again")

    monkeypatch.setattr(cells, "train_cell", no_training)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    argv = GRID + ONE + ["--seeds", "0", "1", "--out", str(out), "--sampler", "grid", "--study", url]
    assert explore.main(argv) == 0
    text = capsys.readouterr().out
    assert "illegal: illegal combination: `implicit` needs a closed-form proximal" in text
    study = _study(url)
    assert _states(study) == ["COMPLETE"] * 3 + ["PRUNED"]
    pruned = [t for t in study.get_trials() if t.state.name == "PRUNED"][0]
    assert pruned.params["memory"] == "mlp" and pruned.params["learner"] == "implicit"
    assert "closed-form proximal step" in pruned.user_attrs["illegal"] and "cells" not in pruned.user_attrs
    rows = _rows(out)
    assert [r["rank"] for r in rows] == [1, 2, 3]
    key = lambda r: r["label"]  # noqa: E731
    assert [(r["label"], r["acc_mean"], r["seeds"]) for r in sorted(rows, key=key)] == \
           [(r["label"], r["acc_mean"], r["seeds"]) for r in sorted(grid_rows, key=key)]
    doc = json.loads((out / "leaderboard.json").read_text())
    assert [d["label"] for d in doc["dropped"]] == ["mlp | l2 | none | implicit | exact"]
    assert doc["study"]["trials"]["complete"] == 3
    import mirasc

    top = sorted((out / "top").glob("*.miras"))                  # the designs' specs, best first, to rerun
    assert [p.name[:4] for p in top] == ["001_", "002_", "003_"]
    assert [mirasc.parse_text(p.read_text()).canonical() for p in top] == [r["spec"] for r in rows]
    # the grid is done: a second invocation runs nothing
    assert explore.main(argv) == 0
    assert "this run: 0 complete, 0 pruned" in capsys.readouterr().out
    assert len(study.get_trials()) == 4


def test_pruner_stops_a_losing_trial_on_its_accuracy_curve(tmp_path, capsys, monkeypatch):
    """The first design trained scores 1 at every evaluation, every other one 0: successive halving prunes each
    of those at its first report (step --eval-every), and a pruned trial has no row in the leaderboard."""
    first = []

    def evaluate(model, task, cfg, lengths, n, batch_size, scored=None):
        if not first:
            first.append(model)
        acc = 1.0 if model is first[0] else 0.0
        if scored is not None:
            scored.update({L: 100 for L in lengths})
        return {L: acc for L in lengths}, {L: acc for L in lengths}

    monkeypatch.setattr(cells, "evaluate", evaluate)
    out = tmp_path / "run"
    url = f"sqlite:///{tmp_path / 'study.db'}"
    argv = ["--memory", "linear", "--learner", "gd", "momentum", "--bias", "l2", "dot"] + ONE + [
        "--steps", "6", "--eval-every", "2", "--out", str(out), "--sampler", "grid", "--pruner", "halving",
        "--study", url]
    assert explore.main(argv) == 0
    text = capsys.readouterr().out
    study = _study(url)
    assert _states(study) == ["COMPLETE"] + ["PRUNED"] * 3
    winner = [t for t in study.get_trials() if t.state.name == "COMPLETE"][0]
    assert winner.value == 1.0 and winner.intermediate_values == {2: 1.0, 4: 1.0}
    for t in study.get_trials():
        if t.state.name == "PRUNED":
            assert t.user_attrs["pruned_at"] == {"seed": 0, "step": 2, "accuracy": 0.0}
            assert t.intermediate_values == {2: 0.0}
    assert text.count("pruned at step 2 of seed 0 (accuracy 0.000)") == 3
    doc = json.loads((out / "leaderboard.json").read_text())
    assert [r["label"] for r in doc["leaderboard"]] == [winner.user_attrs["label"]]
    assert len(doc["pruned"]) == 3 and all(p["step"] == 2 for p in doc["pruned"])


def test_interrupted_study_resumes_with_the_interrupted_trial(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    url = f"sqlite:///{tmp_path / 'study.db'}"
    argv = GRID + ONE + ["--out", str(out), "--sampler", "grid", "--study", url]
    real = cells.train_cell
    ctrl_c_on_second_cell(monkeypatch)
    assert explore.main(argv) == 130
    assert "run the same command to go on" in capsys.readouterr().err
    study = _study(url)
    waiting = [t for t in study.get_trials() if t.state.name == "WAITING"]
    failed = [t for t in study.get_trials() if t.state.name == "FAIL"]
    assert len(waiting) == 1 and len(failed) == 1 and failed[0].user_attrs["interrupted"]
    assert waiting[0].params == failed[0].params
    assert waiting[0].system_attrs["grid_id"] == failed[0].system_attrs["grid_id"]
    assert len(_rows(out)) == 1                         # the leaderboard of what finished
    monkeypatch.setattr(cells, "train_cell", real)
    assert explore.main(argv) == 0
    text = capsys.readouterr().out
    assert "this run: 2 complete" in text
    study = _study(url)
    assert _states(study) == ["COMPLETE"] * 3 + ["FAIL", "PRUNED"]
    done = {tuple(sorted(t.params.items())) for t in study.get_trials() if t.state.name == "COMPLETE"}
    assert tuple(sorted(failed[0].params.items())) in done
    assert len(_rows(out)) == 3


def test_illegal_combinations_do_not_count_as_trials(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    argv = ["--memory", "mlp", "--learner", "implicit", "gd"] + ONE + [
        "--steps", "2", "--out", str(tmp_path / "run"), "--sampler", "random", "--trials", "3", "--study", url]
    assert explore.main(argv) == 0
    trials = _study(url).get_trials()
    assert sum("illegal" not in t.user_attrs for t in trials) == 3
    assert all(t.params["learner"] == "implicit" for t in trials if "illegal" in t.user_attrs)
    assert all(t.state.name == "COMPLETE" for t in trials if "illegal" not in t.user_attrs)
    # every sampled design trained once: the others take its value
    assert sum("same_as" in t.user_attrs for t in trials) == 2


def test_a_design_trains_at_most_per_design_trials(tmp_path, capsys, monkeypatch):
    """TPE proposes the design it believes best again and again with a new learning rate: after --per-design trials
    of one design its further proposals are pruned untrained and do not count, and a worker that finds nothing new
    stops with the reason."""
    monkeypatch.setattr(search, "MAX_ATTEMPTS", 3)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    argv = ["--memory", "linear", "--learner", "gd"] + ONE + [
        "--steps", "2", "--out", str(tmp_path / "run"), "--sampler", "tpe", "--search-lr", "1e-3:1e-2",
        "--per-design", "2", "--trials", "2", "--study", url]
    assert explore.main(argv) == 0
    assert _states(_study(url)) == ["COMPLETE", "COMPLETE"]
    assert explore.main(argv[:-4] + ["--trials", "1", "--study", url]) == 0
    captured = capsys.readouterr()
    trials = _study(url).get_trials()
    repeats = [t for t in trials if "repeat" in t.user_attrs]
    assert len(trials) == 2 + 3 and len(repeats) == 3
    assert all(t.state.name == "PRUNED" and t.user_attrs["repeat"] == 2 and not t.intermediate_values
               for t in repeats)
    assert captured.out.count("not trained: its design has had 2 trials (--per-design)") == 3
    assert "only 0 legal and new: stopping" in captured.err
    doc = json.loads((tmp_path / "run" / "leaderboard.json").read_text())
    assert doc["pruned"] == []  # (a repeated proposal was never trained: not a trial pruned on its curve)
    assert search.per_design({"sampler": "grid"}) == 0 and search.per_design({"sampler": "tpe"}) == 3
    assert explore.main(["--memory", "linear", "--sampler", "tpe", "--per-design", "-1"]) == 2
    assert "per_design must be >= 0" in capsys.readouterr().err


def test_two_invocations_and_two_workers_add_to_one_study(tmp_path, capsys):
    """Two worker processes on a SQLite study, then a second invocation on the same study with another sampler:
    the trials add up; every row has its state size, parameters and time per step; reference specs are fixed
    trials, enqueued once."""
    out = tmp_path / "run"
    url = f"sqlite:///{tmp_path / 'study.db'}"
    base = ["--memory", "linear", "mlp", "--retention", "none", "decay"] + ONE + [
        "--out", str(out), "--study", url, "--spec", str(ROOT / "specs" / "deltanet.miras"), "--eval-every", "2"]
    assert explore.main(base + ["--sampler", "tpe", "--trials", "3", "--workers", "2"]) == 0
    text = capsys.readouterr().out
    assert "1 reference design(s) enqueued; running 4 trial(s) on 2 worker(s)" in text
    study = _study(url)
    assert len(study.get_trials()) == 4
    assert sum(t.user_attrs.get("reference") == "deltanet" for t in study.get_trials()) == 1
    assert explore.main(base + ["--sampler", "random", "--trials", "2"]) == 0
    text = capsys.readouterr().out
    assert "0 reference design(s) enqueued; running 2 trial(s)" in text
    study = _study(url)
    assert len(study.get_trials()) == 6
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in study.get_trials())
    with open(out / "leaderboard.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(int(r["state_bytes"]) > 0 and int(r["params"]) > 0 and float(r["seconds_per_step"]) > 0
                        for r in rows)
    assert any(r["reference"] == "deltanet" for r in rows)
    assert "state" in next(line for line in text.splitlines() if line.startswith("#  design")).split()
    with open(out / "pareto.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) >= 1


def test_a_study_made_with_other_settings_is_refused_and_journal_storage(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    argv = ["--memory", "linear"] + ONE + ["--out", str(tmp_path / "run"), "--sampler", "random", "--study", url]
    assert explore.main(argv + ["--trials", "0"]) == 0
    assert explore.main(argv + ["--trials", "1", "--steps", "5"]) == 2
    assert "was made with other settings (budget differ)" in capsys.readouterr().err
    journal = tmp_path / "study.journal"
    assert explore.main(argv[:-1] + [str(journal), "--trials", "1"]) == 0
    assert journal.stat().st_size > 0
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    study = optuna.load_study(study_name="explore", storage=JournalStorage(JournalFileBackend(str(journal))))
    assert _states(study) == ["COMPLETE"]
    other = ["--out", str(tmp_path / "other")]
    assert explore.main(["--memory", "linear", "--sampler", "grid", "--search-lr", "1e-3:1e-2"] + ONE + other) == 2
    assert "the grid sampler needs a list of values for lr" in capsys.readouterr().err
    assert explore.main(["--memory", "linear", "--search-lr", "1e-3:1e-2"] + ONE + other) == 2   # knobs need a study
    assert not (tmp_path / "other").exists()                    # refused before anything is written


def test_a_journal_study_recovers_the_trial_of_a_worker_that_is_gone(tmp_path, capsys):
    """A journal file has no heartbeat: a worker killed outright leaves a RUNNING trial. Each trial records its
    worker (host:pid); the next invocation fails the trial of a worker on this host that is gone and runs it again,
    and leaves alone a trial whose worker still runs."""
    journal = tmp_path / "study.journal"
    argv = ["--memory", "linear", "mlp"] + ONE + ["--out", str(tmp_path / "run"), "--sampler", "grid",
                                                   "--study", str(journal)]
    assert explore.main(argv + ["--trials", "1"]) == 0
    study = optuna.load_study(study_name="explore", storage=search.make_storage(f"journal:{journal}", 60))
    done = study.get_trials()[0]
    host = done.user_attrs["worker"].rpartition(":")[0]
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for pid in (int(gone.stdout), os.getpid()):  # a worker that has exited, and one that runs (this process)
        t = study.ask({"memory": optuna.distributions.CategoricalDistribution(["linear", "mlp"])})
        t.set_user_attr("worker", f"{host}:{pid}")
    assert explore.main(argv + ["--trials", "1"]) == 0
    assert "trial(s) 1 of a worker that is gone: enqueued again" in capsys.readouterr().out
    trials = {t.number: t for t in study.get_trials()}
    assert trials[1].state.name == "FAIL" and trials[1].user_attrs["interrupted"]
    assert trials[2].state.name == "RUNNING"                     # its worker is alive: not touched
    rerun = [t for t in trials.values() if t.system_attrs.get("interrupted_trial") == 1]
    assert len(rerun) == 1 and rerun[0].state.name == "COMPLETE"
    assert rerun[0].params["memory"] == trials[1].params["memory"]  # (its sampled values, the rest sampled now)


def test_a_crashed_worker_loses_only_its_running_trial(tmp_path):
    """A worker killed mid-trial (SIGKILL: no chance to clean up) leaves a RUNNING trial; once its heartbeat is
    stale, the next invocation fails it and runs it again."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    argv = [sys.executable, "-m", "mirasc.cli", "explore", "--memory", "linear"] + ONE + [
        "--steps", "600", "--out", str(tmp_path / "run"), "--sampler", "grid", "--study", url, "--heartbeat", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def heartbeats():
        try:
            with sqlite3.connect(tmp_path / "study.db") as db:
                return db.execute("SELECT COUNT(*) FROM trial_heartbeats").fetchone()[0]
        except sqlite3.OperationalError:  # the study is not created yet
            return 0

    try:
        deadline = time.time() + 120
        while not heartbeats():                                  # the trial runs and has sent its first heartbeat
            assert proc.poll() is None, "the worker ended before it could be killed"
            assert time.time() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert _states(_study(url)) == ["RUNNING"]
    time.sleep(2.5)                                              # past the grace period (2 heartbeats)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    study = _study(url)
    assert _states(study) == ["COMPLETE", "FAIL"]
    retried = [t for t in study.get_trials() if t.state.name == "COMPLETE"][0]
    crashed = study.trials[0]
    assert retried.system_attrs["failed_trial"] == 0
    assert retried.system_attrs["grid_id"] == crashed.system_attrs["grid_id"]
    assert crashed.params.items() <= retried.params.items()     # it may have been killed before all were sampled


def test_state_budget_picks_the_largest_head_dim_that_fits():
    import mirasc
    from mirasc.lab import tasks

    opts = {"heads": 2, "d_model": 16, "layer": {}, "state_budget": 4096,
            "task_config": tasks.make_config("mqar", seq_len=24, num_kv_pairs=4)}
    sizes = {}
    for path in ("deltanet", "titans", "transformer", "sliding_window"):
        text = (ROOT / "specs" / f"{path}.miras").read_text()
        cand = cells.Candidate(path, text, {}, mirasc.parse_text(text).canonical(), "", mirasc.compile_spec(text))
        spec = mirasc.parse_text(text)
        d = cells.fit_head_dim(cand, opts)
        size = cells.state_bytes(cand.module, spec, 2, d, 24)
        assert 0 < size <= 4096 < cells.state_bytes(cand.module, spec, 2, d + 1, 24), path
        sizes[path] = (d, size)
        assert cells.cell_opts(cand, opts)["layer"]["head_dim"] == d
    assert sizes["deltanet"] == (22, 2 * 22 * 22 * 4)            # W: H·D·D float32
    assert sizes["transformer"] == (10, 24 * 2 * 2 * 10 * 4)     # the K, V cache at the training length
    assert sizes["sliding_window"] == sizes["transformer"]        # its window (64) is longer than 24 tokens
    assert sizes["titans"] == (5, 2 * 4 * 4 * 5 * 5 * 4)         # W1, W2 (D·4D each) and their momenta
    with pytest.raises(cells.UsageError, match="exceeds the state budget"):
        cells.cell_opts(cand, {**opts, "state_budget": 8})


def test_state_budget_in_a_grid_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert explore.main(["--memory", "linear", "mlp"] + ONE + ["--out", str(out), "--state-budget", "3000"]) == 0
    assert "state budget 3000 bytes per layer: head_dim" in capsys.readouterr().out
    cells = json.loads((out / "leaderboard.json").read_text())["cells"]
    # linear: W is H·D·D (2·19²·4 = 2888 bytes); mlp: W1, W2 are D·4D each (2·2·4·6²·4 = 2304 bytes)
    assert {c["head_dim"]: c["state_bytes"] for c in cells} == {19: 2888, 6: 2304}
    assert all(c["budget"]["layer"]["head_dim"] == c["head_dim"] for c in cells)


def test_leaderboard_standard_error_and_pareto_front():
    def cell(spec, seed, acc, state):
        return {"spec": spec, "label": spec, "name": "m", "axes": {}, "train_length": 24, "seed": seed,
                "accuracy": {"24": acc}, "exact_match": {"24": 0.0}, "scored": {"24": 100}, "final_loss": 1.0,
                "params": 1, "state_floats": state // 4, "state_bytes": state, "seconds": 1.0, "status": "ok",
                "seconds_per_step": 0.1}

    rows = leaderboard.leaderboard([cell("a", 0, 0.5, 100), cell("a", 1, 0.7, 100), cell("b", 0, 0.9, 400),
                                cell("c", 0, 0.4, 400), cell("d", 0, 0.3, 50)], [24])
    by = {r["label"]: r for r in rows}
    assert by["a"]["acc_mean"] == pytest.approx(0.6) and by["a"]["acc_se"] == pytest.approx(0.1)
    assert {r["label"] for r in rows if r["pareto"]} == {"a", "b", "d"}       # c: b beats it at the same size
    assert leaderboard.pareto_front(rows) == {by[k]["rank"] for k in "abd"}
    table = leaderboard.format_table(rows, [24])
    assert "400*" in table and "100*" in table and "50*" in table


def test_study_needs_optuna_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(cells.UsageError, match=r"pip install 'mirasc\[search\]'"):
        search._optuna()
    assert torch.get_num_threads() >= 1


def test_references_at_several_rates_then_finalists_on_more_seeds(tmp_path, capsys, monkeypatch):
    """--reference-lr: one fixed trial per reference and rate, enqueued once. --finalists K: the K best sampled designs
    and the K best references, each at its best trial's values (a sampled design with a reference's function is that
    reference), re-run unpruned on --finalist-seeds in the study NAME-finalists; a cell the study trained is reused;
    the verdict compares the best of each kind over the seeds."""
    now, trained = {}, []
    real_train = cells.train_cell

    def train_cell(cand, opts, seed, *args, **kwargs):
        now.update(spec=cand.canonical, lr=opts["lr"], seed=seed)
        trained.append((cand.label, seed))
        return real_train(cand, opts, seed, *args, **kwargs)

    def evaluate(model, task, cfg, lengths, n, batch_size, scored=None):
        spec, lr = now["spec"], now["lr"]
        linear, gd = "memory    = linear" in spec, "learner   = gd(" in spec
        if "retention = decay" in spec:                 # retnet
            acc = 0.4
        elif linear:
            acc = (0.5 + 0.2 * (lr == 0.02)) if gd else 0.3   # linear · l2 · gd is DeltaNet's function
        else:
            acc = 0.6 if gd else 0.8 - 0.05 * (lr == 0.02)
        acc += 0.01 * now["seed"]
        if scored is not None:
            scored.update({L: 1000 for L in lengths})
        return {L: acc for L in lengths}, {L: acc for L in lengths}

    monkeypatch.setattr(cells, "train_cell", train_cell)
    monkeypatch.setattr(cells, "evaluate", evaluate)
    out = tmp_path / "run"
    url = f"sqlite:///{tmp_path / 'study.db'}"
    argv = ["--memory", "linear", "mlp", "--learner", "gd", "momentum", "--search-lr", "0.004,0.02"] + ONE + [
        "--out", str(out), "--study", url, "--sampler", "grid", "--spec", str(ROOT / "specs" / "deltanet.miras"),
        str(ROOT / "specs" / "retnet.miras"), "--reference-lr", "0.005", "0.01"]
    assert explore.main(argv) == 0
    assert "4 reference design(s) enqueued" in capsys.readouterr().out
    study = _study(url)
    refs = sorted((t.user_attrs["reference"], json.dumps(t.user_attrs["values"])) for t in study.get_trials()
                  if t.user_attrs.get("reference"))
    assert refs == [("deltanet", '{"lr": 0.005}'), ("deltanet", "{}"), ("retnet", '{"lr": 0.005}'), ("retnet", "{}")]
    assert len(study.get_trials()) == 12 and _states(study) == ["COMPLETE"] * 12
    trained.clear()
    assert explore.main(argv + ["--trials", "0", "--finalists", "1", "--finalist-seeds", "0", "1"]) == 0
    text = capsys.readouterr().out
    assert "0 reference design(s) enqueued" in text and "4 trial(s) (design, seed) enqueued, running 4" in text
    assert sorted(trained) == [("deltanet | lr=0.02", 1), ("mlp | l2 | none | momentum | exact | lr=0.004", 1)]
    finals = _study(url, "explore-finalists")
    assert _states(finals) == ["COMPLETE"] * 4
    by_label = {(t.user_attrs.get("reference") or t.user_attrs["fixed_label"], t.user_attrs["seed"]): t
                for t in finals.get_trials()}
    assert set(by_label) == {(d, s) for d in ("deltanet", "mlp | l2 | none | momentum | exact") for s in (0, 1)}
    assert [t.user_attrs["seed"] for t in finals.get_trials()] == [0, 0, 1, 1]   # whole seeds first
    assert by_label["deltanet", 1].user_attrs["values"] == {"lr": 0.02}
    assert by_label["mlp | l2 | none | momentum | exact", 0].user_attrs["values"] == {"lr": 0.004}
    assert by_label["deltanet", 0].value == pytest.approx(0.7) and by_label["deltanet", 1].value == pytest.approx(0.71)
    assert by_label["mlp | l2 | none | momentum | exact", 1].value == pytest.approx(0.81)
    doc = json.loads((out / "finalists" / "leaderboard.json").read_text())
    assert [r["seeds"] for r in doc["leaderboard"]] == [2, 2]
    assert [r.get("reference") for r in doc["leaderboard"]] == [None, "deltanet"]
    v = doc["verdict"]
    assert v["beats"] and v["difference"] == pytest.approx(0.1) and v["se"] == pytest.approx(0.005 * 2 ** 0.5)
    assert "the sampled design beats every reference" in text
    trained.clear()                               # a second invocation: nothing new to run
    assert explore.main(argv + ["--trials", "0", "--finalists", "1", "--finalist-seeds", "0", "1"]) == 0
    assert "0 trial(s) (design, seed) enqueued, running 0" in capsys.readouterr().out and not trained
    assert explore.main(argv + ["--trials", "0", "--finalists", "1", "--finalist-seeds", "0", "1", "2"]) == 0
    assert "2 trial(s) (design, seed) enqueued, running 2" in capsys.readouterr().out    # one more seed
    assert sorted(trained) == [("deltanet | lr=0.02", 2), ("mlp | l2 | none | momentum | exact | lr=0.004", 2)]
    rows = json.loads((out / "finalists" / "leaderboard.json").read_text())["leaderboard"]
    assert [r["seeds"] for r in rows] == [3, 3]


def test_finalists_and_reference_rates_are_refused_outside_a_study(capsys):
    assert explore.main(["--finalists", "2"] + ONE) == 2
    assert "--finalists belongs to a study" in capsys.readouterr().err
    assert explore.main(["--sampler", "tpe", "--reference-lr", "0.01"] + ONE) == 2
    assert "no reference designs (give them with --spec)" in capsys.readouterr().err
    assert explore.main(["--sampler", "tpe", "--finalists", "0"] + ONE) == 2
    assert "finalists must be >= 1" in capsys.readouterr().err
