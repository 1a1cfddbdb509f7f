"""The attention reads' host side (mirasc/runtime/attention_host.py, stickbreaking_host.py), imported as it is: the
launch options a dtype gives, packed sequences' offsets and programs, and the GPU schedules launch_plan reports. The
launches themselves are checked through the emitted modules (tests/attention, under the interpreter)."""

import torch

from mirasc.runtime import attention_host as ah
from mirasc.runtime import stickbreaking_host as sb
from mirasc.runtime.gpu_limits import _GPUTarget


def test_dot_options_and_packing():
    assert ah._dot_options(torch.float32) == {"PREC": "ieee", "WIDEN_": False}  # exact fp32 products, never TF32
    # (16-bit operands multiply exactly whatever PREC says; the interpreter, which these tests run under, multiplies
    # bf16 tiles as raw bit patterns, so they are widened to fp32 there)
    assert ah._dot_options(torch.bfloat16) == {"PREC": "tf32", "WIDEN_": True}
    cu, longest = ah._packed_offsets([0, 3, 10, 12], "cpu")
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 10, 12] and longest == 7
    q = torch.zeros(1, 4, 12, 8)
    assert ah._flash_rows(q, None, 0) == (12, 4)
    assert ah._flash_rows(q, cu, longest) == (7, 3 * 4)  # a program per (sequence, head), the longest's length


def test_flash_plan_on_gpu_targets():
    """Every flash kernel has configurations on sm_80 and sm_90 at the common head sizes, each fitting the target's
    shared memory by the resource model."""
    for target in ("sm_80", "sm_90"):
        for d in (64, 128):
            for prec in ("bf16", "ieee"):
                kernels = ah._triton_kernels(d, d, prec, _GPUTarget(target))
                assert set(kernels) == set(ah._FLASH_KERNELS) and all(kernels.values()), (target, d, prec)


def test_stickbreaking_schedule():
    """One configuration per kernel and GPU: dq and dk/dv share BN (dk/dv resumes from dq's per-tile sums); 32 x 64
    on GPUs with >= 200 KB of shared memory per block at D <= 128; fp32 inputs 16 x 16."""
    for limit in (101376, 166912, 232448):
        for d in (64, 128, 256):
            assert sb._sb_config("_sb_bwd_dq", 2, d, d, limit)[1] == sb._sb_config("_sb_bwd_dkdv", 2, d, d, limit)[1]
    assert sb._sb_config("_sb_bwd_dq", 2, 128, 128, 232448)[:2] == (32, 64)
    assert sb._sb_config("_sb_bwd_dq", 2, 128, 128, 166912)[:2] == (64, 32)
    assert sb._sb_config("_sb_fwd", 4, 128, 128, 232448)[:2] == (16, 16)
    plan = sb._triton_kernels(128, 128, "bf16", _GPUTarget("sm_90"))
    assert plan["_sb_bwd_dkdv"] == [{"BM": 32, "BN": 64, "num_warps": 8, "num_stages": 2}]
