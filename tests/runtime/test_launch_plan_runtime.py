"""launch_plan's runtime piece (mirasc.runtime.launch_plan, mirasc.runtime.gpu_limits) as a unit, with stand-in hooks
for the spec-dependent parts, and the plan of every bundled spec's emitted module (docs/module-api.md,
"launch_plan")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mirasc.runtime import gpu_limits
from mirasc.runtime import launch_plan as lp

SPECS = sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.miras"))


def _hooks(calls):
    def route(Dk, Dv, dtype, device, backend, algorithm, chunk_size):
        calls.append(("route", Dk, Dv, dtype, device.type, backend, algorithm, chunk_size))
        if backend == "auto":
            return ("triton", True, 64, None) if device.type == "cuda" else ("torch", True, 64, "CPU inputs")
        return backend, algorithm != "recurrent", 64 if algorithm != "recurrent" else None, None

    def kernels(Dk, Dv, prec, device, chunked, chunk):
        calls.append(("kernels", Dk, Dv, prec, device.smem_limit, chunked, chunk))
        return {"_k": [{"BV": 16, "num_warps": 4}]}

    return route, kernels, (lambda dtype: "bf16" if dtype == torch.bfloat16 else "ieee"), (lambda a, b: (2 * a, b + 1))


def test_a_plan_asks_the_hooks_at_the_memory_widths():
    calls = []
    plan = lp._plan(*_hooks(calls), 8, 4, torch.bfloat16, "sm_80", "auto", "auto", None)
    assert plan == {"backend": "triton", "algorithm": "chunked", "chunk": 64, "precision": "bf16",
                    "kernels": {"_k": [{"BV": 16, "num_warps": 4}]}, "reason": None}
    assert calls == [("route", 16, 5, torch.bfloat16, "cuda", "auto", "auto", None),
                     ("kernels", 16, 5, "bf16", gpu_limits.SMEM_LIMIT[(8, 0)], True, 64)]


def test_torch_and_cpu_plans_list_no_kernels():
    calls = []
    plan = lp._plan(*_hooks(calls), 8, 4, torch.float32, "cpu", "auto", "auto", None)
    assert plan["backend"] == "torch" and plan["reason"] == "CPU inputs" and plan["precision"] is None
    plan = lp._plan(*_hooks(calls), 8, 4, torch.float32, torch.device("cpu"), "triton", "recurrent", None)
    assert plan["backend"] == "triton" and plan["precision"] == "ieee" and plan["kernels"] == {}
    assert plan["algorithm"] == "recurrent" and plan["chunk"] is None
    assert not [c for c in calls if c[0] == "kernels"]


@pytest.mark.parametrize("args,match", [
    ((0, 4, torch.float32, "sm_90", "auto", "auto"), "d_k must be an int >= 1"),
    ((8, 2.5, torch.float32, "sm_90", "auto", "auto"), "d_v must be an int >= 1"),
    ((8, 4, torch.int32, "sm_90", "auto", "auto"), "dtype must be"),
    ((8, 4, torch.float32, "sm_75", "auto", "auto"), "unknown GPU target 'sm_75'; one of sm_80"),
    ((8, 4, torch.float32, "gpu0", "auto", "auto"), "device must be a torch device or a GPU target"),
    pytest.param((8, 4, torch.float32, "cuda", "auto", "auto"), "'cuda' is not available here; name a GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")),
    ((8, 4, torch.float32, "sm_90", "cuda", "auto"), "backend must be"),
    ((8, 4, torch.float32, "sm_90", "auto", "parallel"), "algorithm must be"),
])
def test_bad_arguments_are_refused_with_the_reason(args, match):
    with pytest.raises(ValueError, match=match):
        lp._plan(*_hooks([]), *args, None)


def test_a_named_gpu_is_a_cuda_device_with_its_shared_memory():
    target = gpu_limits._GPUTarget("sm_90")
    assert target.type == "cuda" and target.capability == (9, 0)
    assert gpu_limits._device_smem_limit(target) == gpu_limits.SMEM_LIMIT[(9, 0)] == 232448
    assert lp._plan_device("sm_86").smem_limit == 101376 and lp._plan_device("cpu") == torch.device("cpu")


def test_auto_reasons():
    cuda, cpu = gpu_limits._GPUTarget("sm_90"), torch.device("cpu")
    assert lp._auto_reason(object(), cuda) is None
    assert "not importable" in lp._auto_reason(None, cuda)
    assert "CUDA inputs (these are on cpu)" in lp._auto_reason(object(), cpu)
    assert "fused recurrent kernel" in lp._auto_reason(object(), cuda, "recurrent")


def test_every_bundled_spec_has_a_plan():
    """Every emitted module answers launch_plan for an sm_90 GPU and for CPU inputs: on the CPU always torch, with
    the reason; on the GPU the Triton kernels with a non-empty space for each, or torch with the reason."""
    pytest.importorskip("triton")
    import mirasc

    seen = set()
    for path in SPECS:
        mod = mirasc.compile_spec(path)
        gpu = mod.launch_plan(32, 32, dtype=torch.bfloat16, device="sm_90")
        assert (gpu["backend"] == "triton") == (gpu["reason"] is None), path.stem
        assert gpu["backend"] == "torch" or (gpu["kernels"] and all(gpu["kernels"].values())), path.stem
        cpu = mod.launch_plan(32, 32, device="cpu")
        assert cpu["backend"] == "torch" and cpu["reason"] and cpu["kernels"] == {}, path.stem
        seen.add(gpu["backend"])
    assert seen == {"triton", "torch"}
