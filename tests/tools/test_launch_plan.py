"""benchmarks/launch_plan.py: its count pass on a small mirasc module under the interpreter (the launches, dot FLOPs
and bytes it records, and that its hooks are undone), its roofline model on a synthetic record (exact numbers), and
its refusal of bad arguments. The compile pass (ptxas) and the FLA side are left to the script's own runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import mirasc

pytest.importorskip("triton")
PLAN = Path(__file__).resolve().parents[2] / "benchmarks" / "launch_plan.py"


def _plan():
    spec = importlib.util.spec_from_file_location("launch_plan", PLAN)
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    return plan


def test_count_pass_mirasc_gla(tmp_path, one_torch_thread):
    import triton.runtime.interpreter as interp

    plan = _plan()
    run, dot = interp.InterpretedFunction.run, interp.InterpreterBuilder.create_dot
    module = mirasc.compile_spec(str(plan.ROOT / "specs" / "gla.miras"))  # the process's one GLA module
    settings = {n: getattr(module, n) for n in ("_check_triton_device", "_launch_prec", "FIT_SMEM_LIMIT")}
    res = plan.trace("count", "mirasc", "gla", B=1, T=128, H=2, D=32, out=tmp_path / "count.json")
    assert (tmp_path / "count.json").exists()
    assert interp.InterpretedFunction.run is run and interp.InterpreterBuilder.create_dot is dot  # hooks undone
    assert all(getattr(module, n) is v for n, v in settings.items())  # and the module's settings (shared by tests)
    launches = res["launches"]
    assert {r["phase"] for r in launches} == {"fwd", "bwd"}
    assert sum(sum(r["dots"].values()) for r in launches) > 0
    assert all(key.startswith("bf16xbf16") for r in launches for key in r["dots"])  # not widened to fp32
    nbytes = 1 * 128 * 2 * 32 * 2  # one bf16 [B, T, H, D] input
    for name in ("Q", "K", "V"):  # every element of q, k and v is read, by some launch
        assert max(r["mem"].get(name, {}).get("read_unique", 0) for r in launches) == nbytes, name
    assert all(m["read_traffic"] >= m["read_unique"] for r in launches for m in r["mem"].values())
    assert {o["phase"] for o in res["torch_ops"]} >= {"loss", "bwd"}
    rows = plan.model(None, res, 64.0)
    assert plan.totals(rows)["launches"] == len(launches) and plan.totals(rows)["t"] > 0


def _launch(name, phase, dots, read_unique=0.0, write_unique=0.0, read_traffic=0.0):
    return {"name": name, "phase": phase, "grid": [2, 1, 1], "dots": dots,
            "mem": {"X": {"read_unique": read_unique, "write_unique": write_unique, "read_traffic": read_traffic,
                          "write_traffic": 0.0}}}


def test_model_synthetic_record():
    plan = _plan()
    cfg = {"kwargs": {"BT": 64}, "num_warps": 4, "num_stages": 2}
    compiled = {"launches": [{"name": n, "mma": mma, "config": cfg, "regs": 128, "spill": 0, "smem": 1024}
                             for n, mma in (("a", {"HGMMA.BF16": 4}), ("b", {}), ("c", {"HMMA.TF32": 2}))]}
    counted = {"side": "mirasc", "case": "gla", "launches": [
        # bf16 products on HGMMA (2 µs at scale 2) and exact fp32 ones on the FMA units (2 µs); 8 µs of HBM bytes,
        # 10 µs of traffic at 7 TB/s
        _launch("a", "fwd", {"bf16xbf16:tf32": 989e6, "fp32xfp32:ieee": 67e6}, 10.05e6, 3.35e6, 35e6),
        _launch("b", "fwd", {}, 1e3),  # under the 2 µs floor
        # TF32 (2 µs) and 3xTF32 (6 µs) on HMMA.TF32
        _launch("c", "bwd", {"fp32xfp32:tf32": 495e6, "fp32xfp32:tf32x3": 495e6})],
        "torch_ops": [{"phase": "fwd", "op": "mm", "slot": 1, "flops": 989e6, "read": 6.7e6, "write": 0,
                       "dtype": "bfloat16"},  # 2 µs of bf16 FLOPs, 4 µs of bytes
                      {"phase": "loss", "op": "sum", "slot": 3, "flops": 0, "read": 1e9, "write": 4, "dtype": ""},
                      {"phase": "bwd", "op": "ones_like", "slot": 2, "flops": 0, "read": 0, "write": 0, "dtype": ""}]}
    rows = plan.model(compiled, counted, 2.0)
    assert [(r["phase"], r["name"]) for r in rows] == [("fwd", "a"), ("fwd", "mm"), ("fwd", "b"), ("bwd", "ones_like"),
                                                       ("bwd", "c")]
    a, mm, b, ones, c = rows
    assert a["flops"] == {"bf16": 1.978e9, "tf32": 0.0, "fp32": 134e6} and a["programs"] == 4
    assert a["bytes"] == pytest.approx(26.8e6) and a["t"] == pytest.approx(8e-6) and a["t_l2"] == pytest.approx(10e-6)
    assert a["tc"] == "HGMMA.BF16" and b["tc"] == "FMA" and b["t"] == 2e-6
    assert c["flops"]["tf32"] == pytest.approx(4 * 990e6) and c["t"] == pytest.approx(8e-6)
    assert mm["t"] == pytest.approx(4e-6) and ones["t"] == 0.0
    fwd, bwd, both = (plan.totals(rows, p) for p in ("fwd", "bwd", None))
    assert fwd["t"] == pytest.approx(14e-6) and fwd["t_l2"] == pytest.approx(16e-6) and bwd["t"] == pytest.approx(8e-6)
    assert (fwd["launches"], fwd["ops"], bwd["launches"], bwd["ops"]) == (2, 1, 1, 0)
    assert both["bytes"] == pytest.approx(26.8e6 + 2e3 + 13.4e6)
    counted["launches"][1]["name"] = "other"
    with pytest.raises(ValueError, match="different kernels"):
        plan.model(compiled, counted, 2.0)


@pytest.mark.parametrize("argv, message", [(["--cases", "nope"], "unknown case 'nope'"),
                                           (["--seq-len", "100"], "multiple of 64")])
def test_bad_arguments(argv, message, capsys):
    assert _plan().main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
