"""The mini-batch kernels' host side (mirasc/runtime/minibatch_host.py), imported as it is with the stand-ins of
mirasc/runtime/minibatch_spec.py (a two-layer MLP memory with momentum): the schedule a launch takes, the range
backend='auto' hands the kernels, the Omega window's tile limit, and the chunk matrices of the torch preparation.
The launches run through emitted modules (tests/triton_backend/test_triton_minibatch*.py)."""

import torch

from mirasc.runtime import minibatch_host as mb
from mirasc.runtime.chunk_forms import _chunk_matrices
from mirasc.runtime.gpu_limits import _GPUTarget
from mirasc.runtime.segments import _segment_products

CPU = torch.device("cpu")


def test_chunk_tiles_and_schedule():
    assert [mb._mb_block(n) for n in (1, 16, 17, 64)] == [16, 16, 32, 64]
    assert mb._state_floats(8, 8) == 2 * (32 * 8 + 8 * 32)  # the weights and their momentum
    assert mb._mb_schedule(8, 8, CPU) == "tile"  # the interpreter keeps single-tile kernels for small states
    assert mb._mb_schedule(64, 64, CPU) == "stream" and mb._mb_schedule(128, 128, CPU) == "stream"
    assert mb._mb_schedule(8, 8, _GPUTarget("sm_90")) == "stream"  # a GPU always streams


def test_auto_range():
    """backend='auto' hands the kernels the measured range: heads up to 128, Titans' state at D = 128."""
    assert mb._minibatch_fit_reason(128, 128) is None
    msg = mb._minibatch_fit_reason(256, 256)
    assert "heads up to 128 wide" in msg and "Dk=256" in msg


def test_warps_and_plan():
    """The streamed kernels' warps by chunk tile (8 or 4 for the read at 64 rows, 4 or 2 for the chunk end, 2 at
    16 rows), 255 registers a thread, 16-wide tiles; launch_plan names the four streamed kernels on a GPU."""
    fwd = mb._mb_configs(mb._minibatch_stream_fwd, True, 64)
    assert [c.num_warps for c in fwd] == [8, 4] and all(c.maxnreg == 255 for c in fwd)
    assert [c.num_warps for c in mb._mb_configs(mb._minibatch_stream_fwd_end, True, 64)] == [4, 2]
    assert [c.num_warps for c in mb._mb_configs(mb._minibatch_stream_bwd_a, True, 16)] == [2]
    assert fwd[0].kwargs == {"TK": 16, "TV": 16, "TE": 16}
    plan = mb._mb_plan(64, 64, 16, _GPUTarget("sm_90"))
    assert list(plan) == ["_minibatch_stream_fwd", "_minibatch_stream_fwd_end", "_minibatch_stream_bwd_a",
                          "_minibatch_stream_bwd_b"]


def test_omega_window_tile(monkeypatch):
    """An Omega window makes a mini-batch of C tokens a tile of C·c rows: on a GPU at most 64, on the CPU any."""
    monkeypatch.setattr(mb, "_WINDOW", 4)
    assert mb._mb_window_fits(64, CPU)
    assert mb._mb_window_fits(16, _GPUTarget("sm_90")) and not mb._mb_window_fits(17, _GPUTarget("sm_90"))  # 68 -> 128
    assert not mb._mb_window_fits(64, _GPUTarget("sm_90"))
    assert "minibatch(C) for C <= 16" in mb._mb_window_error(64)


def test_momentum_matrices_match_the_dual_form():
    """The preparation's K, b and chunk-end rows equal the dual form's chunk matrices (mirasc.runtime.chunk_forms)."""
    g = torch.Generator().manual_seed(0)
    B, H, NCH, n = 1, 2, 3, 5
    eta, alpha, theta = (torch.rand(B, H, NCH, n, generator=g, dtype=torch.float64) for _ in range(3))
    last_row = lambda x, fill: x[:, :, :, -1]  # noqa: E731 (every row of these chunks is real)
    kmat, b_flat, kml, bl, thl = mb._momentum_matrices(theta, eta, _segment_products(alpha), last_row)
    gamma, b, kmat_ref, kmom, big_theta = _chunk_matrices(eta, alpha, theta)
    torch.testing.assert_close(kmat, kmat_ref)
    torch.testing.assert_close(b_flat, b.reshape(B, H, -1))
    torch.testing.assert_close(kml, kmom[:, :, :, -1])
    torch.testing.assert_close(thl, big_theta[:, :, :, -1])


def test_split_products_need_a_triton_with_bf16x3(monkeypatch):
    """bf16x3 came in Triton 3.5: an older Triton's GPU launch multiplies exactly ("ieee"); the interpreter always
    computes the three products by hand."""
    import triton
    from triton.backends.nvidia.compiler import CUDAOptions

    monkeypatch.setattr(triton.knobs.runtime, "interpret", False)
    assert mb._mb_launch_prec("bf16x3") == "bf16x3" and mb._mb_launch_prec("ieee") == "ieee"
    monkeypatch.setattr(CUDAOptions, "allowed_dot_input_precisions", ("tf32", "tf32x3", "ieee"))
    assert mb._mb_launch_prec("bf16x3") == "ieee"
    monkeypatch.setattr(triton.knobs.runtime, "interpret", True)
    assert mb._mb_launch_prec("bf16x3") == "bf16x3_emulated"
