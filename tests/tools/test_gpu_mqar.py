"""benchmarks/gpu_mqar.py: the GPU MQAR runner trains and evaluates exactly as `mirasc explore`, from an
emitted folder, with the `mirasc` package (and the compiler's dependencies) blocked."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from isolation import blocker_prelude

from mirasc.lab import explore

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_mqar.py"
SPEC = ROOT / "specs" / "deltanet.miras"
BLOCKED = ("mirasc", "lark", "sympy", "pydantic", "networkx")
# A tiny budget: explore's flags and the runner's, the same run.
STEPS, LR, SEED, SEQ, PAIRS, LENGTHS, EVAL_N = 30, 3e-2, 1, 16, 2, (16, 32), 16
LAYER = ("conv=2", "gate_head_term=true")    # Layer options, read alike by both

BLOCKED_RUNNER = blocker_prelude(BLOCKED) + textwrap.dedent('''
    import json, runpy

    script, report = sys.argv[1], sys.argv[2]
    sys.argv = [script] + sys.argv[3:]
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    with open(report, "w") as fh:
        json.dump({"blocked": BLOCKER_WORKS, "leaked": leaked, "code": code}, fh)
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_mqar")
    emitted = tmp / "emitted"
    res = subprocess.run([sys.executable, str(SCRIPT), "--emit", str(emitted), "--spec", str(SPEC)],
                         capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (emitted / "deltanet.py").exists()
    # the runner, from the emitted folder, in an isolated interpreter (-I: no PYTHONPATH, no cwd) with mirasc blocked
    records, report, table = tmp / "records.json", tmp / "report.json", tmp / "table.md"
    runner = subprocess.run(
        [sys.executable, "-I", "-c", BLOCKED_RUNNER, str(SCRIPT), str(report), "--emitted", str(emitted),
         "--spec", "deltanet", "--steps", str(STEPS), "--lr", str(LR), "--seeds", str(SEED), "--seq-len", str(SEQ),
         "--num-kv-pairs", str(PAIRS), "--eval-lengths", *map(str, LENGTHS), "--eval-examples", str(EVAL_N),
         "--log-every", "1", "--threads", "1", "--device", "cpu", "--quiet", "--layer", *LAYER, "--json", str(records),
         "--out", str(table)],
        capture_output=True, text=True, timeout=300, cwd=str(tmp))
    assert runner.returncode == 0, runner.stdout[-2000:] + runner.stderr[-3000:]
    # explore, in this process, at the same budget
    out = tmp / "explore"
    rc = explore.main(["--task", "mqar", "--spec", str(SPEC), "--seq-len", str(SEQ), "--task-opt",
                       f"num_kv_pairs={PAIRS}", "--eval-lengths", *map(str, LENGTHS), "--eval-examples", str(EVAL_N),
                       "--steps", str(STEPS), "--lr", str(LR), "--seeds", str(SEED), "--log-every", "1",
                       "--threads", "1", "--no-plots", "--quiet", "--layer", *LAYER, "--out", str(out)])
    assert rc == 0
    cells = [json.loads(p.read_text()) for p in (out / "cells").glob("*.json")]
    assert len(cells) == 1
    return {"gpu": json.loads(records.read_text()), "report": json.loads(report.read_text()),
            "explore": cells[0], "table": table.read_text(),
            "emitted": emitted, "stdout": runner.stdout}


def test_runner_never_imports_mirasc(runs):
    assert sorted(runs["report"]["blocked"]) == sorted(BLOCKED)   # the blocker really blocks
    assert runs["report"]["leaked"] == []
    assert runs["report"]["code"] == 0
    # sympy is blocked too (the GPU image lacks it): torch.optim's torch._dynamo import took the eager stand-in
    assert "sympy is missing: torch._dynamo replaced" in runs["stdout"]


def test_same_losses_and_accuracies_as_explore_bit_for_bit(runs):
    (rec,) = runs["gpu"]
    cell = runs["explore"]
    assert rec["status"] == cell["status"] == "ok"
    assert len(rec["loss_curve"]) == STEPS
    assert len({loss for _, loss in rec["loss_curve"]}) > STEPS // 2       # the loss moves: a real comparison
    assert rec["loss_curve"] == cell["loss_curve"]                          # exact float equality, every step
    assert rec["final_loss"] == cell["final_loss"]
    assert rec["accuracy"] == cell["accuracy"]
    assert rec["exact_match"] == cell["exact_match"]
    assert rec["scored"] == cell["scored"] and all(v > 0 for v in rec["scored"].values())
    assert rec["params"] == cell["params"]


def test_markdown_table(runs):
    text = runs["table"]
    assert ("| design | lr | seed | acc@16 | acc@32 | final loss | s/step | s/run | peak GiB | device | date | status |"
            in text)
    rec = runs["gpu"][0]
    row = next(line for line in text.splitlines() if line.startswith("| deltanet |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == [f"{LR:g}", str(SEED)]
    assert cells[3:5] == [f"{rec['accuracy'][str(L)]:.3f}" for L in LENGTHS]
    assert cells[5] == f"{rec['final_loss']:.4f}"
    assert cells[8] == "—" and cells[11] == "ok"     # no CUDA peak memory on the CPU


def test_missing_module_and_time_budget(tmp_path, runs):
    res = subprocess.run([sys.executable, str(SCRIPT), "--emitted", str(tmp_path), "--spec", "nonexistent"],
                         capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert res.returncode == 2 and "--emit" in res.stderr          # says how to make the folder, no traceback
    res = subprocess.run([sys.executable, str(SCRIPT), "--emitted", str(runs["emitted"]), "--spec", "deltanet",
                          "--time-budget-s", "0", "--device", "cpu", "--out", str(tmp_path / "t.md")],
                         capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert res.returncode == 1 and "time budget: not starting deltanet" in res.stdout
    assert not (tmp_path / "t.md").exists()
