"""The flash kernels' autotuning spaces and resource model (mirasc.runtime.flash_space) as a unit, and the emitted
attention modules that carry it (docs/kernels.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")
from mirasc.codegen.standalone import runtime_source  # noqa: E402
from mirasc.compiler import compile_text  # noqa: E402
from mirasc.runtime import flash_space as fs  # noqa: E402

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _key(c):
    return c.kwargs["BM"], c.kwargs["BN"], c.num_warps, c.num_stages


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("smem_limit", [101376, 166912, 232448])
@pytest.mark.parametrize("elt", [2, 4])
def test_flash_autotuning_space_keeps_a_configuration(D, smem_limit, elt):
    """Every flash kernel keeps at least one configuration on GPUs with 99 KB (sm_86/89), 163 KB (sm_80) and
    227 KB (sm_90) of shared memory per block, each within the limit by the model, safest first, for 16-bit
    (elt = 2 bytes) and fp32 operands; fp32 operands only from their own tile menu (exact dots on FMA units)."""
    for name in fs._FLASH_KERNELS:
        kept = [_key(c) for c in fs._flash_configs(name, D, D, smem_limit, elt)]
        assert kept, name
        assert [c for c in map(_key, fs._flash_configs(name, D, D, None, elt)) if c in kept] == kept  # same order
        for bm, bn, warps, stages in kept:
            assert fs._flash_smem_estimate(name, bm, bn, D, D, stages, elt) <= smem_limit
            live = fs._flash_live_values(name, bm, bn, D, D, elt) / (32 * warps)
            assert live <= fs._FLASH_REG_BUDGET[name]
            if elt == 4:
                assert (bm, bn, warps) in fs._FLASH_TILES_FP32[name]
        per_thread = [fs._flash_live_values(name, bm, bn, D, D, elt) / (32 * w) for bm, bn, w, _ in kept]
        assert per_thread == sorted(per_thread)  # safest first


def test_softmax_modules_carry_this_module_and_stick_breaking_does_not():
    softmax = compile_text((SPECS / "transformer.miras").read_text()).source
    stick = compile_text((SPECS / "stickbreaking.miras").read_text()).source
    assert softmax.count(runtime_source("flash_space")) == 1
    assert "def _flash_configs(" not in stick
