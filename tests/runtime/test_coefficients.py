"""A parametric memory's coefficients for a call (mirasc/runtime/coefficients.py), imported as it is over the example
choices of mirasc.runtime.memory_spec and memory_hooks (gates η and α, a constant θ = 0.5, a per-head γ): the gates
checked and laid out per head, the constants and per-head constants filled in, a channel-wise η, 16-bit inputs, and a
multi-step learner's sub-steps (mirasc.runtime.multistep)."""

import pytest
import torch

from mirasc.runtime import coefficients as co
from mirasc.runtime import multistep

B, T, H, DK = 2, 6, 3, 4


def gates(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.rand(B, T, H, generator=g).to(dtype) for n in ("eta", "alpha")}


def test_gates_constants_and_per_head_constants_per_head_and_token():
    q, gs = torch.zeros(B, T, H, DK, dtype=torch.float64), gates(torch.float64)
    c = co._coefficients(gs, q)
    assert set(c) == {"eta", "alpha", "theta", "gamma"} and all(x.shape == (B, H, T) for x in c.values())
    assert torch.equal(c["eta"], gs["eta"].transpose(1, 2)) and torch.equal(c["alpha"], gs["alpha"].transpose(1, 2))
    assert torch.equal(c["theta"], torch.full((B, H, T), 0.5, dtype=torch.float64))
    assert torch.equal(c["gamma"][1, :, 4], torch.tensor([0.5, 0.75, 0.875], dtype=torch.float64))


def test_16_bit_inputs_take_their_coefficients_in_float32():
    c = co._coefficients(gates(torch.float32), torch.zeros(B, T, H, DK, dtype=torch.bfloat16))
    assert {x.dtype for x in c.values()} == {torch.float32}


@pytest.mark.parametrize("bad,message", [({"eta": torch.zeros(B, T, H)}, "missing gate 'alpha'"),
                                         ({"beta": torch.zeros(B, T, H)}, r"unknown gate\(s\) \['beta'\]")])
def test_gates_are_checked(bad, message):
    with pytest.raises(ValueError, match=message):
        co._coefficients(bad, torch.zeros(B, T, H, DK))


def test_a_channel_wise_eta_weighs_the_gradient_and_the_update_s_eta_is_one(monkeypatch):
    monkeypatch.setattr(co, "GATE_CHANNELS", {"eta": "k"})
    gs = {"eta": torch.rand(B, T, H, DK), "alpha": torch.rand(B, T, H)}
    c = co._coefficients(gs, torch.zeros(B, T, H, DK))
    assert torch.equal(c["eta_ch"], gs["eta"].transpose(1, 2)) and torch.equal(c["eta"], torch.ones(B, H, T))


def test_a_multi_step_learner_s_retention_acts_at_each_token_s_first_sub_step(monkeypatch):
    monkeypatch.setattr(co, "_substep_coefficients", multistep._substep_coefficients)
    gs = gates()
    c = co._coefficients(gs, torch.zeros(B, T, H, DK))  # (T = 6 sub-steps: 3 tokens of STEPS = 2)
    alpha = gs["alpha"].transpose(1, 2)
    assert torch.equal(c["alpha"][..., 0::2], alpha[..., 0::2]) and torch.equal(c["alpha"][..., 1::2],
                                                                                   torch.ones(B, H, T // 2))
    assert torch.equal(c["eta"], gs["eta"].transpose(1, 2))  # (every sub-step takes its own η)
