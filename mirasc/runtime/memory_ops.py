"""A parametric memory's torch pieces that do not depend on the update rule (a runtime piece: the functions a spec
needs are copied into its emitted module by mirasc.codegen.torch_backend): how a weight set is applied, the LayerNorm
of an MLP memory and its backward, muon's Newton–Schulz orthogonalisation, Atlas' polynomial features, the
coefficients of a token range and their place on a weight, and the preconditioned learner (its statistic's scan and
the learning rate it makes). They read the spec's choices as module constants (mirasc.runtime.memory_spec)."""

import math

import torch
import torch.nn.functional as F

from .inputs import _extra_inputs
from .memory_hooks import _coefficients, _start, _token_step
from .memory_spec import EXTRAS, GATE_CHANNELS, NS_COEFFICIENTS, NS_STEPS, POLY_DEGREE, PRECOND
from .segments import _segment_products


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


def _read_tokens(carry, q, k, v, c, params):
    """Layer.step's memory over the n tokens of one Layer token (n = 1; a multi-step learner's STEPS sub-steps): q, k,
    v [B, n, H, D] in the state's dtype, c their coefficients, params the read's; returns the carry after the last
    token and its read o_t [B, H, 1, Dv]."""
    for j in range(q.shape[1]):
        c_j = {name: val.to(q.dtype) for name, val in _token_coefs(c, j, j + 1).items()}
        carry, o_t = _token_step(carry, *(t[:, j:j + 1].transpose(1, 2) for t in (q, k, v)), c_j, params)
    return carry, o_t


def _on_weight(name, x):
    """A coefficient of one token ([.., 1, 1] or [.., 1, D]) as a factor on a weight [.., Dv, Dk]:
    key channels scale its columns, value channels its rows (docs/semantics.md: channel-wise gates)."""
    return x.transpose(-1, -2) if GATE_CHANNELS.get(name) == "v" else x


def _statistic_scan(nu, x, a0, chunk=64):
    """a_t = ν_t a_{t-1} + x_t for t = 1..T from a_0: nu [B, H, T] (or [B, H, T, D]), x [B, H, T, D], a0 [B, H, D];
    returns a [B, H, T, D]. In a chunk of n tokens a_t = (ν_1⋯ν_t) a_0 + Σ_{s<=t} (ν_{s+1}⋯ν_t) x_s, the products
    by cumulative products (no log, no division: exact for ν = 0, stable for every ν in [0, 1]); the loop runs over
    chunks, not tokens."""
    if nu.dim() == 3:
        nu = nu.unsqueeze(-1)
    a, out = a0, []
    for c0 in range(0, x.shape[2], chunk):
        c1 = min(c0 + chunk, x.shape[2])
        nu_c = nu[:, :, c0:c1].transpose(-1, -2)  # [B, H, D or 1, n]
        x_c = x[:, :, c0:c1].transpose(-1, -2)  # [B, H, D, n]
        a_c = torch.cumprod(nu_c, dim=-1) * a.unsqueeze(-1) + (_segment_products(nu_c) @ x_c.unsqueeze(-1))[..., 0]
        out.append(a_c)
        a = a_c[..., -1]
    return torch.cat(out, dim=-1).transpose(-1, -2)


def _multiplier(a):
    """m(a): the preconditioner's scale of each key channel's learning rate, from the statistic a >= 0."""
    if PRECOND["transform"] == "atk":
        # FLA's ATK squash: m = base^(−r/(1+|r|)), r = log(a + eps) − center, so m lies in (1/base, base)
        r = torch.log(a + PRECOND["eps"]) - PRECOND["center"]
        return torch.exp(-math.log(PRECOND["base"]) * r / (1 + r.abs()))
    return torch.rsqrt(a + PRECOND["eps"])  # rms: (a + eps)^(−1/2), RMSprop's / Adagrad's scale


def _precondition(c, k, a0, pad_mask=None):
    """gd(lr=gate(k))'s coefficients from the precond learner's: c["eta_ch"] = η_t ⊙ m(a_t) (an η per head broadcast
    over the key channels) and c["eta"] = 1; ν and ρ are used up. k [B, H, T, Dk]; a0 [B, H, Dk]. Returns (c, a_T).
    pad_mask [B, T] (internal): padding tokens leave the statistic as it was (ν = 1, ρ = 0)."""
    c = dict(c)
    nu, rho = c.pop("nu"), c.pop("rho")
    if pad_mask is not None:
        keep = pad_mask.to(k.device)[:, None, :]
        nu = torch.where(keep, nu, torch.ones_like(nu))
        rho = rho * keep.to(rho.dtype)
    a = _statistic_scan(nu, rho.unsqueeze(-1) * k * k, a0.to(k.dtype))
    eta = c.pop("eta_ch") if "eta_ch" in c else c["eta"].unsqueeze(-1)
    c["eta_ch"] = eta * _multiplier(a)
    c["eta"] = torch.ones_like(c["eta"])
    return c, a[:, :, -1]


def _preconditioned(c, k, state, compute, pad_mask=None):
    """apply's coefficients and state under the preconditioned learner (mirasc.runtime.memory_api): the statistic,
    scanned from state["A"] over the sequence (k in the compute dtype), makes gd(lr=gate(k))'s key-channel rate; the
    memory runs on the state without "A", and a_T comes back for the final state."""
    c, stat = _precondition(c, k.to(compute), state["A"], pad_mask)
    return c, {name: val for name, val in state.items() if name != "A"}, stat


def _layer_cache(state):
    """A decoding cache (mirasc.runtime.layer) under the preconditioned learner: the preconditioner's statistic a is
    carried beside the memory."""
    return {"carry": _start(state), "conv": None, "stat": state["A"]}


def _layer_read(cache, q, k, v, gates, extras, read_params, keep=None):
    """Layer.step's memory read (mirasc.runtime.layer) under the preconditioned learner: η ⊙ m(a_t) from the carried
    statistic, which the cache carries on."""
    c = _coefficients(gates, q, v.shape[-1])
    if extras:
        c.update(_extra_inputs(extras, q, EXTRAS))
    c, stat = _precondition(c, k.transpose(1, 2), cache["stat"])
    carry, o_t = _read_tokens(cache["carry"], q, k, v, c, {n: p.to(q.dtype) for n, p in read_params.items()})
    return {"carry": carry, "stat": stat}, o_t
