"""A parametric memory's torch pieces that do not depend on the update rule (a runtime piece: the functions a spec
needs are copied into its emitted module by mirasc.codegen.torch_backend): how a weight set is applied, the LayerNorm
of an MLP memory and its backward, muon's Newton–Schulz orthogonalisation, Atlas' polynomial features, the
coefficients of a token range and their place on a weight. They read the spec's choices as module constants
(mirasc.runtime.memory_spec)."""

import math

import torch
import torch.nn.functional as F

from .memory_spec import GATE_CHANNELS, NS_COEFFICIENTS, NS_STEPS, POLY_DEGREE


def _dense(weights):
    """layer(i, h) = h @ W_iᵀ for one weight set shared by all tokens."""
    return lambda i, h: h @ weights[i].transpose(-1, -2)


def _per_token(weights):
    """layer(i, h) = W_i[t] h[t] for a weight set per token ([B, H, N, out, in])."""
    return lambda i, h: (weights[i] @ h.unsqueeze(-1)).squeeze(-1)


def _layernorm(z):
    return F.layer_norm(z, (z.shape[-1],), eps=1e-5)


def _layernorm_backward(z, dy):
    """dℓ/dz for y = LayerNorm(z) without affine parameters: (dy - mean(dy) - ẑ·mean(dy·ẑ)) / σ."""
    rstd = torch.rsqrt(z.var(-1, unbiased=False, keepdim=True) + 1e-5)
    zhat = (z - z.mean(-1, keepdim=True)) * rstd
    return rstd * (dy - dy.mean(-1, keepdim=True) - zhat * (dy * zhat).mean(-1, keepdim=True))


def _newton_schulz(g):
    """NS_k(G): NS_STEPS quintic Newton–Schulz iterations X ← aX + (bA + cA²)X, A = XXᵀ, from X_0 = G/(‖G‖_F + 1e-7),
    on each matrix of the last two axes (the wide orientation, so A is the smaller Gram matrix). They push every
    singular value of G towards 1 (to about [0.7, 1.2] with these coefficients) and keep the singular vectors: an
    approximation of the nearest semi-orthogonal matrix UVᵀ (Atlas Eq. 32; Muon)."""
    a, b, c = NS_COEFFICIENTS
    tall = g.shape[-2] > g.shape[-1]
    x = g.transpose(-1, -2) if tall else g
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    x = x / (norm + 1e-7)
    for _ in range(NS_STEPS):
        gram = x @ x.transpose(-1, -2)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.transpose(-1, -2) if tall else x


def _poly_features(x):
    """φ_p(x) = [1, x, x⊗x/√2!, …, x^⊗p/√p!] over the last axis, p = POLY_DEGREE (Atlas Eq. 22, truncated): full
    tensor powers, so φ_p(q)·φ_p(k) = Σ_{i<=p} (q·k)^i / i!, the Taylor polynomial of exp(q·k) (Atlas Eq. 5,
    a_i = 1/i!)."""
    parts, power = [torch.ones_like(x[..., :1]), x], x
    for i in range(2, POLY_DEGREE + 1):
        power = (power.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)  # x^⊗i, index (j_1, …, j_i) row-major
        parts.append(power / math.sqrt(math.factorial(i)))
    return torch.cat(parts, dim=-1)


def _feature_width(d_k):
    """Width of φ_p(x) for x of width d_k: 1 + d_k + … + d_k^p."""
    return sum(d_k ** i for i in range(POLY_DEGREE + 1))


def _token_coefs(c, t0, t1):
    """Coefficients of tokens t0:t1 in token layout: [B, H, n, 1] per head, [B, H, n, D] per channel.
    (A channel-wise η is carried as c["eta_ch"], read by the gradient; c["eta"] is then 1.)"""
    return {name: val[:, :, t0:t1] if val.dim() == 4 else val[:, :, t0:t1, None] for name, val in c.items()}


def _on_weight(name, x):
    """A coefficient of one token ([.., 1, 1] or [.., 1, D]) as a factor on a weight [.., Dv, Dk]:
    key channels scale its columns, value channels its rows (docs/semantics.md: channel-wise gates)."""
    return x.transpose(-1, -2) if GATE_CHANNELS.get(name) == "v" else x
