"""A parametric memory's state (mirasc/runtime/memory_state.py), imported as it is: the keys and shapes each choice
adds, and the recurrence's carry built from a state and returned as the same state."""

import pytest
import torch

from mirasc.runtime import memory_state as ms

CHOICES = ("ACCUMULATORS", "MOMENTUM_BUFFERS", "STATISTIC")


@pytest.mark.parametrize("accumulators,momentum,statistic,window", [
    (False, False, False, False), (True, False, False, False), (False, True, True, False), (True, True, False, True)])
def test_the_state_has_a_key_per_choice_and_round_trips_through_the_carry(monkeypatch, accumulators, momentum,
                                                                           statistic, window):
    for name, on in zip(CHOICES, (accumulators, momentum, statistic)):
        monkeypatch.setattr(ms, name, on)
    monkeypatch.setattr(ms, "GATE_CHANNELS", {"eta": "k"})
    monkeypatch.setattr(ms, "WINDOW_STATE", ("win_k", "win_v", "win_gamma", "win_eta") if window else ())
    shapes = ms._state_shapes(4, 3)
    expected = {"W": (3, 4)}
    expected.update({"A_W": (3, 4)} if accumulators else {})
    expected.update({"S_W": (3, 4)} if momentum else {})
    expected.update({"A": (4,)} if statistic else {})
    # the window's last WINDOW − 1 = 2 tokens: keys, values, γ per token and a channel-wise η over keys
    expected.update({"win_k": (2, 4), "win_v": (2, 3), "win_gamma": (2, 1), "win_eta": (2, 4)} if window else {})
    assert shapes == expected
    g = torch.Generator().manual_seed(0)
    state = {n: torch.randn(2, 1, *shape, generator=g) for n, shape in shapes.items() if n != "A"}
    carry = ms._start(state)
    assert carry["t"] == 0 and carry["anchor"] is carry["W"] and (carry["S"] is None) == (not momentum)
    assert (carry["Y"] is None) == (not accumulators) and (carry["win"] is None) == (not window)
    assert ms._finish(carry).keys() == state.keys()
    assert all(torch.equal(ms._finish(carry)[n], state[n]) for n in state)


def test_the_default_state_draws_each_weight_and_its_accumulator(monkeypatch):
    """init_state: each weight as WEIGHT_INIT draws it, stored as the retention's accumulator where it keeps one and
    read through it (the example retention: A_W drawn, W = A_W / (1 + |A_W|)); momentum buffers, the statistic and
    the Omega window at zero; the same state twice without a generator (seed 0); residual memories need d_k == d_v."""
    from mirasc.runtime import memory_hooks, memory_spec

    monkeypatch.setattr(ms, "STATISTIC", True)
    state = ms._init_memory_state(2, 3, 4, 5, dtype=torch.float32)
    assert list(state) == ["A_W", "W", "S_W", "A", *memory_spec.WINDOW_STATE]  # (the example's Omega window too)
    assert state["W"].shape == (2, 3, 5, 4) and state["A"].shape == (2, 3, 4)
    assert torch.allclose(state["W"], memory_hooks._readout(state["A_W"].double()).float())
    assert state["A_W"].std() > 0.3  # drawn N(0, 1/fan_in) ("normal"), fan_in 4
    assert not any(state[n].any() for n in ("S_W", "A", *memory_spec.WINDOW_STATE))
    assert state["win_k"].shape == (2, 3, memory_spec.WINDOW - 1, 4)
    again = ms._init_memory_state(2, 3, 4, 5, dtype=torch.float32)
    assert all(torch.equal(state[n], again[n]) for n in state)
    other = ms._init_memory_state(2, 3, 4, 5, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(state["A_W"], other["A_W"])
    monkeypatch.setattr(ms, "WEIGHT_INIT", "zeros")
    assert not ms._init_memory_state(1, 1, 4, 5)["W"].any()
    monkeypatch.setattr(ms, "RESIDUAL", True)
    with pytest.raises(ValueError, match="needs d_k == d_v"):
        ms._init_memory_state(1, 1, 4, 5)
