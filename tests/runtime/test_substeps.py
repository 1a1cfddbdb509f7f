"""The multi-step learner's sub-steps (mirasc/runtime/multistep.py), imported as it is with the examples of
mirasc/runtime/memory_spec.py (STEPS = 2, gates η and α) and memory_hooks.py: the layout of the sub-step sequence,
the read after each token's last sub-step, and the located errors. The emitted multi-step modules are checked against
the float64 reference in tests/module/test_multistep.py."""

import pytest
import torch

from mirasc.runtime import memory_hooks as mh
from mirasc.runtime import multistep as ms


def _inputs(B=1, T=3, H=2, D=4, S=2):
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    gates = {"eta": torch.rand(B, T, H, S, generator=g, dtype=torch.float64) * 0.3,
             "alpha": torch.rand(B, T, H, generator=g, dtype=torch.float64)}
    return rnd(B, T, H, D), rnd(B, T, H, S, D), rnd(B, T, H, S, D), gates


def test_substeps_layout():
    q, k, v, gates = _inputs()
    q_sub, k_sub, v_sub, g_sub, _ = ms.substeps(q, k, v, gates)
    assert q_sub.shape[1] == k_sub.shape[1] == 6
    torch.testing.assert_close(q_sub[:, 1::2], q)  # the query on each token's last sub-step
    assert bool((q_sub[:, 0::2] == 0).all())
    torch.testing.assert_close(k_sub[:, 0::2], k[:, :, :, 0])  # sub-step j of token t at t·STEPS + j
    torch.testing.assert_close(g_sub["eta"][:, 1::2], gates["eta"][..., 1])  # one η per inner step
    torch.testing.assert_close(g_sub["alpha"][:, 0::2], g_sub["alpha"][:, 1::2])  # per-token gates repeated
    o, _ = ms.apply(q, k, v, {"eta": gates["eta"]})
    o_sub, _ = mh._apply_memory(q_sub, k_sub, v_sub, {"eta": g_sub["eta"]})
    torch.testing.assert_close(o, o_sub[:, 1::2])


def test_located_errors():
    q, k, v, gates = _inputs()
    with pytest.raises(ValueError, match="a key and a value per inner step"):
        ms.substeps(q, k[:, :, :, :1], v, gates)
    with pytest.raises(ValueError, match="one per inner step"):
        ms.substeps(q, k, v, {"eta": gates["eta"][..., 0]})
    with pytest.raises(ValueError, match="unknown gate 'beta'"):
        ms.substeps(q, k, v, {"beta": gates["alpha"]})
