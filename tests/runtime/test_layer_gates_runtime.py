"""mirasc.runtime.layer_gates, the Layer's gates every emitted module carries: where each gate sits in the one
projection, how the projection starts (each gate at its `<name>_bias` option, channel terms at 0 under a head term,
α's spread over channels) and the squashing of each gate, checked against the formulas of docs/language.md's
layer-block table."""

from __future__ import annotations

import math

import torch

from mirasc.runtime.layer_gates import _gate_projection, _gate_values, _GateLayout

OPTIONS = {"gate_rank": 0, "eta_bias": -2.0, "alpha_bias": 3.0, "theta_bias": 0.0, "delta_bias": 0.5,
           "alpha_spread": 0.0}


def test_layout_widths():
    per_head = _GateLayout(("eta", "alpha", "theta"), {}, heads=3, head_dim=4, head_term=False)
    assert per_head.widths == [3, 3, 3]
    channel = _GateLayout(("eta", "alpha"), {"alpha": "k"}, heads=3, head_dim=4, head_term=True)
    assert channel.channel_width == 5 and channel.widths == [3, 15]
    steps = _GateLayout(("eta", "alpha"), {"eta": "v"}, heads=2, head_dim=4, head_term=False, steps=3)
    assert steps.widths == [2 * 4 * 3, 2]


def test_projection_starts_each_gate_at_its_bias():
    layout = _GateLayout(("eta", "alpha", "delta"), {"alpha": "k"}, heads=2, head_dim=4, head_term=True)
    torch.manual_seed(0)
    proj = _gate_projection(8, layout, {**OPTIONS, "alpha_spread": 3.0})
    assert len(proj) == 1 and proj[0].weight.shape == (2 + 10 + 2, 8)
    eta, alpha, delta = proj[-1].bias.split(layout.widths)
    assert torch.equal(eta, torch.full((2,), -2.0)) and torch.equal(delta, torch.full((2,), 0.5))
    alpha = alpha.view(2, 5)  # per head: 4 channel terms, then the head term
    assert torch.allclose(alpha[:, :4], torch.linspace(0, 3, 4).expand(2, 4)) and torch.equal(alpha[:, 4],
                                                                                               torch.full((2,), 3.0))
    w_alpha = proj[-1].weight.split(layout.widths)[1].view(2, 5, 8)
    assert not w_alpha[:, :4].any() and w_alpha[:, 4].abs().max() < 0.1 * 1 / math.sqrt(8) + 1e-7
    low_rank = _gate_projection(8, layout, {**OPTIONS, "gate_rank": 3})
    assert [m.weight.shape for m in low_rank] == [(3, 8), (14, 3)] and low_rank[0].bias is None
    assert _gate_projection(8, _GateLayout((), {}, 2, 4, False), OPTIONS) is None


def test_values_squash_each_gate():
    layout = _GateLayout(("eta", "alpha", "theta", "delta"), {"alpha": "k"}, heads=2, head_dim=4, head_term=True)
    pre = torch.randn(3, 5, sum(layout.widths), dtype=torch.float64)
    out = _gate_values(pre, layout, torch.float64, eta_max=0.5)
    eta, alpha, theta, delta = pre.split(layout.widths, dim=-1)
    alpha = alpha.view(3, 5, 2, 5)
    assert torch.allclose(out["eta"], 0.5 * torch.sigmoid(eta))
    assert torch.allclose(out["alpha"], torch.sigmoid(alpha[..., :4] + alpha[..., 4:]))
    assert torch.allclose(out["theta"], torch.sigmoid(theta))
    assert torch.allclose(out["delta"], torch.nn.functional.softplus(delta))
    floored = _gate_values(pre, layout, torch.float64, 1.0, alpha_act="exp", alpha_min=0.9)["alpha"]
    assert torch.allclose(floored, 0.9 + 0.1 * torch.exp(-torch.exp(-(alpha[..., :4] + alpha[..., 4:]))))
    assert _gate_values(pre.float(), layout, torch.float64, 1.0)["eta"].dtype == torch.float64


def test_multistep_eta_has_one_rate_per_step():
    layout = _GateLayout(("eta", "alpha"), {}, heads=2, head_dim=4, head_term=False, steps=3)
    pre = torch.arange(2 * (3 * 2 + 2), dtype=torch.float64).view(1, 2, 8)
    eta = _gate_values(pre, layout, torch.float64, 1.0)["eta"]
    assert eta.shape == (1, 2, 2, 3)  # [B, T, H, steps]: projected step-major, read head-major
    assert torch.allclose(eta[0, 0, 1], torch.sigmoid(torch.tensor([1.0, 3.0, 5.0], dtype=torch.float64)))
