"""The preconditioned learner (docs/semantics.md, "Preconditioned learner"; a runtime piece: copied into the module of a
spec with `learner = precond(...)` by mirasc.codegen.torch_backend). The statistic of the gradient's key-side factor,
a_t = ν_t a_{t-1} + ρ_t k_t² per key channel (the state's "A" [B, H, Dk]), does not read the memory, so it is scanned
first, over the whole sequence, and its multiplier m(a_t) makes the key-channel learning rate η_t ⊙ m(a_t) of
gd(lr=gate(k)), which every algorithm and backend of the memory runs. The multiplier's transform and constants are
the module's PRECOND (mirasc.runtime.memory_spec has an example)."""

import math

import torch

from .inputs import _extra_inputs
from .memory_hooks import _coefficients, _start
from .memory_spec import EXTRAS, PRECOND
from .segments import _segment_products
from .token_step import _read_tokens


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
