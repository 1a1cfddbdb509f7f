"""The diagonal preconditioned learner `precond` (docs/semantics.md, "Preconditioned learner").

Preconditioned Gated DeltaNet and preconditioned KDA against flash-linear-attention 0.6's CPU references with FLA's
raw inputs (outputs, final W and final statistic A, gradients of every input including the statistic's gates and
initial state), recurrent and chunked, also packed with cu_seqlens; a held-out RMSprop-form spec against the float64
token-by-token reference (tests/reference.py); the Triton paths under the interpreter; Layer.step == Layer.forward;
the located rejections. Conventions as in tests/test_fla_mappings.py: FLA's state S [B, H, K, V] is our Wᵀ, FLA's
scale is passed as 1.0, its log gates g are log α (here also ν = e^{g_atk}); FLA computes in float32, so the
tolerances are float32's.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reference import rel

import mirasc

SPECS = Path(__file__).resolve().parents[1] / "specs"
B, T, H, DK, DV = 2, 19, 2, 8, 6  # T = 19: chunk_size 8 gives two full chunks and a partial one
ALGORITHMS = [("recurrent", None), ("chunked", 8)]


@functools.cache
def spec(name: str):
    return mirasc.compile_spec(str(SPECS / f"{name}.miras"))


def fla(module: str, name: str):
    pytest.importorskip("fla")
    return getattr(importlib.import_module(f"fla.ops.{module}"), name)


def leaves(seed: int, **shapes):
    """float32 leaves: 'n' unit rows, 'u' uniform in (0, 1), otherwise normal."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, (kind, shape) in shapes.items():
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        if kind == "n":
            x = F.normalize(x, dim=-1)
        elif kind == "u":
            x = torch.rand(shape, generator=gen, dtype=torch.float64)
        out[name] = x.float().requires_grad_(True)
    return out


def compare(ours, theirs, x: dict, seed: int = 0, tol=(1e-5, 1e-4)):
    """ours(), theirs(): (o, [final tensors]); outputs, every final tensor and every leaf's gradient."""
    gen = torch.Generator().manual_seed(seed)
    results = []
    for fn in (ours, theirs):
        o, finals = fn()
        loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum()
        for f in finals:
            loss = loss + (f * torch.randn(f.shape, generator=gen, dtype=f.dtype)).sum()
        gen.manual_seed(seed)  # the same upstream gradients for both sides
        results.append((o, finals, torch.autograd.grad(loss, list(x.values()))))
    (o_a, f_a, g_a), (o_b, f_b, g_b) = results
    assert rel(o_a, o_b) < tol[0], rel(o_a, o_b)
    for i, (a, b) in enumerate(zip(f_a, f_b)):
        assert rel(a, b) < tol[0], (i, rel(a, b))
    for name, a, b in zip(x, g_a, g_b):
        assert rel(a, b) < tol[1], (name, rel(a, b))


def _T(S):
    return S.transpose(-1, -2)


def _fla_inputs(seed, channel, n_seq=B):
    gshape = (n_seq, T, H, DK) if channel else (n_seq, T, H)
    return leaves(seed, q=("", (n_seq, T, H, DK)), k=("", (n_seq, T, H, DK)), v=("", (n_seq, T, H, DV)),
                  g=("u", gshape), g_atk=("u", (n_seq, T, H)), beta_atk=("u", (n_seq, T, H)),
                  beta=("u", (n_seq, T, H)), S0=("", (n_seq, H, DK, DV)), A0=("u", (n_seq, H, DK)))


def _ours(mod, x, channel, **kw):
    """Our op on FLA's raw inputs: α = e^g, η = β, ν = e^{g_atk}, ρ = β_atk; FLA's Gated DeltaNet variant
    ℓ2-normalises q and k inside, so that is done here before the op (KDA's reference takes them as given)."""
    q, k = (x["q"], x["k"]) if channel else (F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1))
    gates = {"eta": x["beta"], "alpha": torch.exp(-0.3 * x["g"]), "nu": torch.exp(-0.2 * x["g_atk"]),
             "rho": x["beta_atk"]}
    o, st = mod.apply(q, k, x["v"], gates, state={"W": _T(x["S0"]), "A": x["A0"]}, **kw)
    return o, [st["W"], st["A"]]


def _theirs(x, channel):
    g, g_atk = -0.3 * x["g"], -0.2 * x["g_atk"]
    if channel:
        naive = fla("precond_kda.naive", "naive_recurrent_precond_kda")
        o, S, A = naive(x["q"], x["k"], x["v"], g, g_atk, x["beta_atk"], x["beta"], scale=1.0,
                        initial_state=x["S0"], initial_A_state=x["A0"], output_final_state=True)
    else:
        naive = fla("precond_gated_delta_rule.naive", "naive_recurrent_precond_gated_delta_rule")
        o, S, A = naive(x["q"], x["k"], x["v"], g_atk, g, x["beta_atk"], x["beta"], scale=1.0,
                        initial_state=x["S0"], initial_A_state=x["A0"], output_final_state=True)
    return o, [_T(S), A]


@pytest.mark.parametrize("algorithm,chunk", ALGORITHMS)
@pytest.mark.parametrize("name", ["precond_gated_deltanet", "precond_kda"])
def test_matches_fla_naive(name, algorithm, chunk):
    """The bundled specs against FLA's naive references with FLA's raw inputs: o, final W, final A and the
    gradients of q, k, v, g, g_atk, β_atk, β, S_0, A_0."""
    channel = name == "precond_kda"
    x = _fla_inputs(3, channel)
    mod = spec(name)
    compare(lambda: _ours(mod, x, channel, algorithm=algorithm, chunk_size=chunk), lambda: _theirs(x, channel), x)
