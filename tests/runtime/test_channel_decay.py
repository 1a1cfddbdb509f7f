"""The torch chunk pieces every emitted module's chunked algorithms build on (mirasc.runtime.segments,
mirasc.runtime.channel_decay), as units against their definitions written as loops in float64, and the emitted
modules that carry them (docs/semantics.md: chunked algorithms, channel-wise gates)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from mirasc.codegen.standalone import runtime_source
from mirasc.compiler import compile_text
from mirasc.runtime import channel_decay as cd
from mirasc.runtime import segments

SPECS = Path(__file__).resolve().parents[2] / "specs"
D64 = torch.float64


def test_segment_products_are_the_products_of_a_segment_with_zeros_allowed():
    a = torch.rand(2, 3, 7, dtype=D64)
    a[0, 1, 3] = 0.0  # a gate of exactly 0: no division, no log
    p = segments._segment_products(a)
    for t in range(7):
        for s in range(7):
            want = math.prod(a[..., s + 1:t + 1].unbind(-1)) if s <= t else torch.zeros(2, 3, dtype=D64)
            assert torch.allclose(p[..., t, s], torch.as_tensor(want, dtype=D64).expand(2, 3), rtol=1e-14, atol=0)


def test_chunk_decay_per_channel_and_per_head():
    """Γ_t = a_1⋯a_t and D[t, s, j] = a_{s+1, j}⋯a_{t, j} per channel; a per-head coefficient broadcast to `width`."""
    c = {"alpha": 0.5 + 0.5 * torch.rand(1, 2, 9, 4, dtype=D64), "beta": torch.rand(1, 2, 9, dtype=D64)}
    gamma, seg = cd._chunk_decay(c, "alpha", 2, 8)
    a = c["alpha"][:, :, 2:8]
    assert torch.allclose(gamma, torch.cumprod(a, dim=2), rtol=1e-14)
    assert seg.shape == (1, 2, 6, 6, 4)
    assert torch.allclose(seg[:, :, 4, 1], a[:, :, 2] * a[:, :, 3] * a[:, :, 4], rtol=1e-14)
    assert torch.equal(seg[:, :, 1, 4], torch.zeros(1, 2, 4, dtype=D64))
    gamma, seg = cd._chunk_decay(c, "beta", 0, 5, width=3)
    assert gamma.shape == (1, 2, 5, 3) and torch.equal(gamma[..., 0], gamma[..., 2])
    assert torch.allclose(gamma[..., 0], torch.cumprod(c["beta"][:, :, :5], dim=2), rtol=1e-14)


def test_log_decay_clamps_a_zero_gate_at_the_smallest_normal():
    c = {"alpha": torch.tensor([[[[0.5, 0.0], [0.25, 1.0]]]], dtype=D64)}
    g = cd._log_decay(c, "alpha", 0, 2)
    assert torch.allclose(g[0, 0, :, 0], torch.log(torch.tensor([0.5, 0.125], dtype=D64)))
    assert g[0, 0, 0, 1] == math.log(torch.finfo(D64).tiny) and torch.isfinite(g).all()


def test_decay_scores_match_the_exponent_written_out():
    """P[t, s] = Σ_j a_tj b_sj exp(ga_tj − gb_sj) for s <= t (s < t strict), on sub-blocks of every size: the
    factoring through each block's first row changes no number, however fast the decay."""
    g = torch.Generator().manual_seed(0)
    n, d = 19, 5
    a, b = torch.randn(2, n, d, generator=g, dtype=D64), torch.randn(2, n, d, generator=g, dtype=D64)
    ga = torch.cumsum(-3.0 * torch.rand(2, n, d, generator=g, dtype=D64), dim=1)  # down to about e^-57
    for strict in (False, True):
        want = torch.einsum("xtj,xsj,xtsj->xts", a, b, torch.exp(ga[:, :, None] - ga[:, None, :]))
        want = want * torch.ones(n, n, dtype=torch.bool).tril(-1 if strict else 0)
        for sub in (1, 4, 8, 32):
            got = cd._decay_scores(a, ga, b, ga, strict, sub=sub)
            assert torch.allclose(got, want, rtol=1e-12, atol=1e-14), (strict, sub)


def test_scores_and_mix_with_a_channel_or_a_head_factor():
    g = torch.Generator().manual_seed(1)
    n, d = 6, 3
    a, b, u = (torch.randn(n, d, generator=g, dtype=D64) for _ in range(3))
    p = torch.randn(n, n, generator=g, dtype=D64)
    for width in (1, d):
        f = torch.rand(n, n, width, generator=g, dtype=D64)
        fe = f.expand(n, n, d)
        scores = torch.tensor([[sum(a[t, j] * b[s, j] * fe[t, s, j] for j in range(d)) for s in range(n)]
                               for t in range(n)], dtype=D64)
        mixed = torch.tensor([[sum(p[t, s] * fe[t, s, i] * u[s, i] for s in range(n)) for i in range(d)]
                              for t in range(n)], dtype=D64)
        assert torch.allclose(cd._scores(a, b, f), scores, rtol=1e-12)
        assert torch.allclose(cd._mix(p, f, u), mixed, rtol=1e-12)


def test_modules_carry_the_pieces_they_use():
    """Every memory module carries the segment products once; the channel-decay pieces only where a chunked
    algorithm has a coefficient over channels (GLA, KDA), not Gated DeltaNet's per-head decay."""
    src = {name: compile_text((SPECS / f"{name}.miras").read_text()).source
           for name in ("gla", "kda", "gated_deltanet")}
    for name, text in src.items():
        assert text.count(runtime_source("segments")) == 1, name
    assert src["gla"].count(runtime_source("channel_decay")) == 1
    assert src["kda"].count(runtime_source("channel_decay")) == 1
    assert "def _decay_scores(" not in src["gated_deltanet"]
