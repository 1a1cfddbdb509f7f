"""Nonparametric memories (docs/semantics.md: nonparametric memories): the causal Nadaraya-Watson estimator with the
softmax kernel,
against a float64 reference written out here and against torch's scaled_dot_product_attention."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import mirasc

SPECS = Path(__file__).resolve().parents[2] / "specs"


def nadaraya_watson(q, k, v, scale, window=0):
    """o_t = Σ_{s<=t} κ(q_t,k_s) v_s / Σ κ, κ = exp(scale q·k), restricted to t-window < s when window > 0."""
    B, T, H, D = q.shape
    out = torch.empty(B, T, H, v.shape[-1], dtype=q.dtype)
    for t in range(T):
        lo = max(0, t - window + 1) if window else 0
        kappa = torch.exp(scale * torch.einsum("bhd,bshd->bhs", q[:, t], k[:, lo:t + 1]))
        out[:, t] = torch.einsum("bhs,bshd->bhd", kappa, v[:, lo:t + 1]) / kappa.sum(-1)[..., None]
    return out


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name,window", [("transformer", 0), ("sliding_window", 64)])
@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
def test_matches_nadaraya_watson(name, window, algorithm):
    mod = mirasc.compile_spec(SPECS / f"{name}.miras")
    assert mod.GATES == () and mod.WINDOW == window
    g = torch.Generator().manual_seed(0)
    B, T, H, Dk, Dv = 2, 90, 2, 8, 5
    q, k = (torch.randn(B, T, H, Dk, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=g, dtype=torch.float64, requires_grad=True)
    o, state = mod.apply(q, k, v, algorithm=algorithm)
    ref = nadaraya_watson(q, k, v, 1 / math.sqrt(Dk), window)
    assert rel(o, ref) < 1e-12
    w = torch.randn_like(o)
    grads = torch.autograd.grad((o * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        assert rel(a, b) < 1e-10
    assert state["K"].shape[2] == (window or T)


def test_full_attention_matches_sdpa_float32():
    mod = mirasc.compile_spec(SPECS / "transformer.miras")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 70, 3, 16, generator=g) for _ in range(3))
    o, _ = mod.apply(q, k, v, algorithm="recurrent")
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    assert rel(o, ref.transpose(1, 2)) < 1e-5


@pytest.mark.parametrize("name", ["transformer", "sliding_window"])
def test_state_carries_across_calls(name):
    """Running [0:40] then [40:100] with the returned cache equals one call over [0:100]."""
    mod = mirasc.compile_spec(SPECS / f"{name}.miras")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 100, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    full, _ = mod.apply(q, k, v)
    a, cache = mod.apply(q[:, :40], k[:, :40], v[:, :40])
    b, _ = mod.apply(q[:, 40:], k[:, 40:], v[:, 40:], state=cache, algorithm="recurrent")
    assert rel(torch.cat([a, b], 1), full) < 1e-12


def test_explicit_scale_and_errors():
    mod = mirasc.compile_spec("model s { memory = nonparametric(kernel=softmax, scale=0.5)\n bias = l2 }")
    q, k, v = (torch.randn(1, 10, 1, 4, dtype=torch.float64) for _ in range(3))
    o, _ = mod.apply(q, k, v)
    assert rel(o, nadaraya_watson(q, k, v, 0.5)) < 1e-12
    with pytest.raises(ValueError, match="no gates"):
        mod.apply(q, k, v, {"eta": torch.ones(1, 10, 1)})
    with pytest.raises(mirasc.SpecError, match="nonparametric"):
        mirasc.parse_text("model s { memory = nonparametric\n bias = l2\n learner = gd }")
