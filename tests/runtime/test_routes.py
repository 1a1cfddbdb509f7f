"""Which backend runs a call (mirasc/runtime/routes.py), imported as it is: each Triton family's route and the
dots' precision. The routes of every bundled spec are checked through their modules' launch_plan
(tests/plan/test_chunk_fit.py, tests/tools/test_launch_plan.py)."""

import pytest
import torch

from mirasc.runtime import minibatch_host, routes
from mirasc.runtime.gpu_limits import _GPUTarget

CPU = torch.device("cpu")


def test_torch_and_recurrent_routes():
    with pytest.raises(RuntimeError, match="no Triton kernel for this spec: an example; use backend='torch'"):
        routes._torch_route(8, 8, torch.float32, CPU, "triton", "auto", False, None)
    assert routes._torch_route(8, 8, torch.float32, CPU, "auto", "auto", True, 64)[:2] == ("torch", True)
    with pytest.raises(RuntimeError, match="no chunked Triton kernel"):
        routes._recurrent_route(8, 8, torch.float32, CPU, "triton", "chunked", True, 64)
    backend, chunked, why = routes._recurrent_route(8, 8, torch.float32, CPU, "auto", "auto", True, 64)
    assert backend == "torch" and "fused recurrent kernel only" in why
    assert routes._recurrent_route(8, 8, torch.float32, CPU, "triton", "auto", False, None) == ("triton", False, None)


def test_chunk_and_minibatch_routes(monkeypatch):
    """backend='auto' on CPU inputs runs torch, saying why; an Omega window's tile beyond a GPU's is refused
    (algorithm='chunked') or left to the fused recurrent kernel (algorithm='auto')."""
    backend, _, why = routes._chunk_route(64, 64, torch.float32, CPU, "auto", "auto", True, 64)
    assert backend == "torch" and "CUDA inputs" in why
    monkeypatch.setattr(minibatch_host, "_WINDOW", 4)
    gpu = _GPUTarget("sm_90")
    with pytest.raises(RuntimeError, match="Omega window"):
        routes._minibatch_route(64, 64, torch.bfloat16, gpu, "triton", "chunked", True, 64)
    backend, chunked, why = routes._minibatch_route(64, 64, torch.bfloat16, gpu, "triton", "auto", True, 64)
    assert (backend, chunked) == ("triton", False) and "Omega window" in why
    assert routes._minibatch_route(64, 64, torch.bfloat16, gpu, "triton", "auto", True, 16) == ("triton", True, None)


def test_dot_precision(monkeypatch):
    assert routes._dot_precision(torch.float32) == "ieee"
    for half_dots, bf16 in (("input", "bf16"), ("split", "bf16x3"), ("input_split", "bf16x2"), ("tf32", "tf32"),
                            ("ieee", "ieee")):
        monkeypatch.setattr(routes, "HALF_DOTS", half_dots)
        assert routes._dot_precision(torch.bfloat16) == bf16
    monkeypatch.setattr(routes, "HALF_DOTS", "input")
    assert routes._dot_precision(torch.float16) == "fp16"
