"""The composite linear memory (mirasc/runtime/composite.py), imported as it is with the example memory of
mirasc/runtime/memory_hooks.py: the feature maps' defining properties, the normaliser's division and its state as W's
last row, and the located errors of a state that does not fit. The emitted composite modules are checked against the
float64 reference and FLA through tests/module/test_linear_composite.py."""

import pytest
import torch

from mirasc.runtime import composite as cp
from mirasc.runtime import memory_hooks as mh


@pytest.fixture
def feature(monkeypatch):
    def set_(name, normalize=True):
        monkeypatch.setattr(cp, "FEATURE", name)
        monkeypatch.setattr(cp, "NORMALIZE", normalize)
    return set_


def test_feature_maps(feature):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 2, 5, generator=g, dtype=torch.float64) for _ in range(2))
    feature("taylor")
    fq, fk = cp._features(q), cp._features(k)
    assert fq.shape[-1] == cp.feature_dim(5) == 1 + 5 + 15
    dot = (q * k).sum(-1)
    torch.testing.assert_close((fq * fk).sum(-1), 1 + dot + dot ** 2 / 2)  # exp's second-order Taylor kernel
    feature("elu1")
    assert bool((cp._features(q) > 0).all()) and cp.feature_dim(5) == 5
    feature("hedgehog")
    params = cp.init_params(2, 5, 5, dtype=torch.float64)
    phi = cp._features(q, params)
    assert phi.shape[-1] == cp.feature_dim(5) == 10
    torch.testing.assert_close(phi, torch.softmax(torch.cat([q, -q], -1), -1))  # U = I, c = 0 at the start
    feature("identity")
    assert cp._features(q) is q and cp.init_params(2, 5, 5) == {}


@pytest.mark.parametrize("normalize", [False, True])
def test_normaliser(feature, normalize):
    """o = W φ(q) / (z·φ(q) + ε) with z the last row of the memory run on [v, 1]; the public state splits it off."""
    feature("elu1", normalize)
    g = torch.Generator().manual_seed(1)
    B, T, H, D = 1, 6, 2, 4
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    gates = {"eta": torch.rand(B, T, H, generator=g, dtype=torch.float64) * 0.3}
    state = cp.init_state(B, H, D, D, dtype=torch.float64)
    assert set(state) == ({"W", "z"} if normalize else {"W"})
    o, final = cp.apply(q, k, v, gates, state=state)
    v_mem = torch.cat([v, torch.ones_like(v[..., :1])], -1) if normalize else v
    o_mem, mem = mh._apply_memory(cp._features(q), cp._features(k), v_mem, gates, state=cp._memory_state(state))
    want = o_mem[..., :-1] / (o_mem[..., -1:] + cp.NORM_EPS) if normalize else o_mem
    torch.testing.assert_close(o, want)
    if normalize:
        torch.testing.assert_close(final["z"], mem["W"][..., -1:, :])
        torch.testing.assert_close(cp._memory_state(final)["W"], mem["W"])
    with pytest.raises(ValueError, match="state\\['W'\\] has shape"):
        cp.apply(q, k, v, gates, state={**state, "W": state["W"][..., :-1]})
    with pytest.raises(ValueError, match="params has unknown"):
        cp.apply(q, k, v, gates, params={"feature_U": None})
