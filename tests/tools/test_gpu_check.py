"""The GPU check's harness (benchmarks/gpu_check.py) at --smoke size on the CPU, Triton under the interpreter: a lent
GPU session has minutes, so the harness must not be found broken there. A spec's Triton paths run in a process of
their own and are compared with the float64 torch recurrence; a refused path is listed as refused, with its reason."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("triton")
CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_gpu_check_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    emitted = tmp_path / "emitted"
    assert check.main(["--emit", str(emitted), "--spec", "gated_deltanet", "atlas", "stickbreaking"]) == 0
    out = tmp_path / "check.md"
    assert check.main(["--smoke", "--emitted", str(emitted), "--out", str(out), "--jobs", "2"]) == 0
    rows = {tuple(cell.strip() for cell in line.split("|")[1:5]) for line in out.read_text().splitlines()
            if line.startswith("| ") and "---" not in line and "spec |" not in line}
    statuses = {(name, algorithm): status for name, _, algorithm, status in rows}
    assert statuses == {("gated_deltanet", "recurrent"): "ok", ("gated_deltanet", "chunked"): "ok",
                        ("atlas", "recurrent"): "refused", ("atlas", "chunked"): "refused",
                        # the attention kernels also read packed sequences (cu_seqlens) in one launch
                        ("stickbreaking", "recurrent"): "ok", ("stickbreaking", "chunked"): "ok",
                        ("stickbreaking", "packed"): "ok"}, rows
    # a wrong kernel is caught: the comparison sees a perturbed gradient
    mod = check.load(emitted / "gated_deltanet.py")
    case = check.make_case(mod, "float32", 1, 8, 1, 8, "cpu")
    ref = check.run_case(mod, case, "torch", "recurrent", "float64")
    got = check.run_case(mod, case, "torch", "recurrent", "float32")
    assert check.compare(got, ref)[0] < 1e-5
    got[2]["gate eta"] = got[2]["gate eta"] * 1.01
    assert check.compare(got, ref) == (pytest.approx(0.01, rel=1e-3), "d gate eta")
