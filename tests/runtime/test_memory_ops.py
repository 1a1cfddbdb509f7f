"""mirasc/runtime/memory_ops.py on its own, in float64: the pieces every parametric memory's module carries (how a
weight set is applied, the LayerNorm and its backward, Newton–Schulz, the polynomial features, the coefficients'
layout), against autograd or a direct computation."""

import math

import pytest
import torch

from mirasc.runtime import memory_ops as ops
from mirasc.runtime import memory_spec


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_dense_and_per_token_apply_a_weight_set():
    g = _gen()
    W = [torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64)]
    h = torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64)
    assert torch.allclose(ops._dense(W)(0, h), torch.einsum("bhoi,bhni->bhno", W[0], h))
    Wt = [torch.randn(2, 3, 6, 5, 4, generator=g, dtype=torch.float64)]
    assert torch.allclose(ops._per_token(Wt)(0, h), torch.einsum("bhnoi,bhni->bhno", Wt[0], h))


def test_layernorm_backward_is_the_layernorm_vjp():
    g = _gen(1)
    z = torch.randn(3, 4, 7, 9, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(3, 4, 7, 9, generator=g, dtype=torch.float64)
    (expected,) = torch.autograd.grad(ops._layernorm(z), z, dy)
    assert torch.allclose(ops._layernorm_backward(z.detach(), dy), expected, atol=1e-12)


@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (8, 8)])
def test_newton_schulz_pushes_singular_values_towards_one_and_keeps_the_vectors(shape):
    g = _gen(2)
    G = torch.randn(2, *shape, generator=g, dtype=torch.float64) * 3.0
    X = ops._newton_schulz(G)
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    inner = U.transpose(-1, -2) @ X @ Vh.transpose(-1, -2)  # diagonal: the same singular vectors
    diag = torch.diagonal(inner, dim1=-2, dim2=-1)
    assert torch.allclose(inner, torch.diag_embed(diag), atol=1e-8)
    assert memory_spec.NS_STEPS == 5 and bool(((diag > 0.6) & (diag < 1.3)).all()), diag


def test_polynomial_features_give_the_taylor_kernel():
    g = _gen(3)
    q, k = torch.randn(2, 5, generator=g, dtype=torch.float64), torch.randn(2, 5, generator=g, dtype=torch.float64)
    p = memory_spec.POLY_DEGREE
    phi_q, phi_k = ops._poly_features(q), ops._poly_features(k)
    assert phi_q.shape[-1] == ops._feature_width(5) == 1 + 5 + 25
    dot = (q * k).sum(-1)
    assert torch.allclose((phi_q * phi_k).sum(-1), sum(dot ** i / math.factorial(i) for i in range(p + 1)))


def test_token_coefficients_and_their_place_on_a_weight(monkeypatch):
    c = {"eta": torch.rand(2, 3, 8), "alpha": torch.rand(2, 3, 8, 4)}
    t = ops._token_coefs(c, 2, 5)
    assert t["eta"].shape == (2, 3, 3, 1) and torch.equal(t["eta"][..., 0], c["eta"][:, :, 2:5])
    assert t["alpha"].shape == (2, 3, 3, 4) and torch.equal(t["alpha"], c["alpha"][:, :, 2:5])
    x = torch.rand(2, 3, 1, 4)
    assert ops._on_weight("alpha", x) is x  # key channels scale the columns of [Dv, Dk]
    monkeypatch.setattr(ops, "GATE_CHANNELS", {"alpha": "v"})
    assert ops._on_weight("alpha", x).shape == (2, 3, 4, 1)  # value channels its rows
