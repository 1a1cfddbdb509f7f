"""The GPU benchmark suite's harness, run at --smoke size on the CPU (Triton under the interpreter):
a lent GPU session has minutes, so the suite must not be found broken there. Every case must run
(no FAILED row) from modules emitted into a fresh folder, as on the GPU machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("triton")
SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_suite.py"


def test_gpu_suite_smoke(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    emitted = tmp_path / "emitted"
    assert suite.main(["--emit", str(emitted)]) == 0
    out = tmp_path / "results.md"
    # (the default budget is sized for a lent GPU's minutes; on a shared CPU the interpreted smoke cases may take
    # longer, and what this test checks is that every case runs)
    assert suite.main(["--smoke", "--emit-dir", str(emitted), "--out", str(out), "--budget-s", "3600"]) == 0
    table = out.read_text(encoding="utf-8")
    assert "FAILED" not in table and "SKIPPED" not in table, table
    for case in ("flash (triton)", "stickbreaking: mirasc flash (triton)", "mirasc flash varlen",
                 "gated_deltanet: mirasc chunked (triton)",
                 "mamba2: mirasc chunked (triton)",
                 "deltanet: mirasc fused recurrent", "ttt_linear: mirasc chunked (triton)",
                 "titans memory op", "titans layer", "momentum_deltanet: mirasc chunked (triton)",
                 "gla: mirasc chunked (triton)", "kda: mirasc chunked (triton)", "moneta memory op", "memora memory op",
                 "yaad memory op"):
        assert case in table, case
    # past the time budget no new case starts (and each is listed as skipped)
    out2 = tmp_path / "skipped.md"
    assert suite.main(["--smoke", "--emit-dir", str(emitted), "--out", str(out2), "--budget-s", "0"]) == 0
    assert out2.read_text(encoding="utf-8").count("SKIPPED (time budget)") >= 8
