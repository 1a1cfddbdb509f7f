"""mirasc/runtime/precond.py on its own, in float64: the preconditioned learner's statistic scan against the token
recurrence, its multiplier and the learning rate it makes (docs/semantics.md, "Preconditioned learner")."""

import pytest
import torch

from mirasc.runtime import precond


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("per_channel", [False, True])
def test_statistic_scan_is_the_token_recurrence(per_channel):
    g = _gen(4)
    B, H, T, D = 2, 3, 11, 4
    nu = torch.rand(B, H, T, *((D,) if per_channel else ()), generator=g, dtype=torch.float64)
    nu[:, :, 4] = 0.0  # ν = 0 forgets everything: exact with the cumulative products
    x = torch.rand(B, H, T, D, generator=g, dtype=torch.float64)
    a0 = torch.rand(B, H, D, generator=g, dtype=torch.float64)
    a, expected = a0, []
    for t in range(T):
        a = (nu[:, :, t] if per_channel else nu[:, :, t, None]) * a + x[:, :, t]
        expected.append(a)
    got = precond._statistic_scan(nu, x, a0, chunk=3)  # chunks of 3 over 11 tokens: a partial last one
    assert torch.allclose(got, torch.stack(expected, dim=2), atol=1e-12)


def test_the_preconditioner_multiplier_and_learning_rate(monkeypatch):
    a = torch.tensor([0.0, 1e-3, 1.0, 100.0], dtype=torch.float64)
    assert torch.allclose(precond._multiplier(a), (a + 1e-6) ** -0.5)  # rms: (a + eps)^(-1/2)
    monkeypatch.setattr(precond, "PRECOND", {"transform": "atk", "eps": 1e-6, "base": 1.5, "center": -0.2})
    r = torch.log(a + 1e-6) + 0.2
    m = precond._multiplier(a)
    assert torch.allclose(m, 1.5 ** (-r / (1 + r.abs()))) and bool(((m > 1 / 1.5) & (m < 1.5)).all())
    g = _gen(5)
    B, H, T, D = 1, 2, 5, 3
    c = {"eta": torch.rand(B, H, T, generator=g, dtype=torch.float64), "nu": torch.rand(B, H, T, generator=g,
         dtype=torch.float64), "rho": torch.rand(B, H, T, generator=g, dtype=torch.float64)}
    k = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    a0 = torch.rand(B, H, D, generator=g, dtype=torch.float64)
    pad = torch.tensor([[True, True, False, True, True]])
    out, a_T = precond._precondition(c, k, a0, pad)
    assert set(out) == {"eta", "eta_ch"} and torch.equal(out["eta"], torch.ones_like(c["eta"]))
    a, stats = a0, []
    for t in range(T):  # the padding token leaves the statistic as it was
        if pad[0, t]:
            a = c["nu"][:, :, t, None] * a + c["rho"][:, :, t, None] * k[:, :, t] ** 2
        stats.append(a)
    stats = torch.stack(stats, dim=2)
    assert torch.allclose(a_T, stats[:, :, -1])
    assert torch.allclose(out["eta_ch"], c["eta"][..., None] * precond._multiplier(stats))


def test_statistic_scan_is_exact_and_stable():
    """The chunked scan of a_t = ν_t a_{t−1} + x_t against a token loop, over several chunks, with ν = 0 on some
    tokens (a reset), ν = 1 on others (a plain sum) and ν far below 1 (no underflow trouble: no log, no division)."""
    gen = torch.Generator().manual_seed(0)
    nu = torch.rand(2, 3, 150, generator=gen, dtype=torch.float64) ** 8
    nu[:, :, ::7], nu[:, :, 3::11] = 0.0, 1.0
    x = torch.rand(2, 3, 150, 4, generator=gen, dtype=torch.float64)
    a0 = torch.rand(2, 3, 4, generator=gen, dtype=torch.float64)
    a, want = a0, []
    for t in range(150):
        a = nu[:, :, t, None] * a + x[:, :, t]
        want.append(a)
    got = precond._statistic_scan(nu, x, a0)  # chunks of 64 over 150 tokens
    want = torch.stack(want, 2)
    assert ((got - want).norm() / want.norm()).item() < 1e-14  # (relative error, as tests/reference.py's rel)
