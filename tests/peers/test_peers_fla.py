"""Cross-check of the linear-memory specs against flash-linear-attention's CPU naive references.

FLA (``fla-core``, import ``fla``) ships pure-torch "naive" reference implementations next to its
Triton kernels.  Those references are an independent oracle for the Miras semantics of docs/semantics.md: parametric
memories
on the specs that FLA covers.  Every convention difference is mapped explicitly below:

* **Layout.**  Our ``q, k`` are ``[B, T, H, Dk]`` and ``v`` is ``[B, T, H, Dv]``.  Most FLA references
  take the same seq-first layout, but ``delta_rule_recurrence`` and ``naive_retention`` are still
  head-first ``[B, H, T, K]``; we transpose in and out around them.
* **State.**  FLA's state is ``S`` of shape ``[B, H, K, V]`` with ``o_t = S_tᵀ q_t``; ours is
  ``W`` of shape ``[B, H, Dv, Dk]`` with ``o_t = W_t q_t``.  Hence ``W = Sᵀ`` (last two axes swapped),
  both for the initial state we pass in and for the final state we compare.
* **Scale.**  FLA multiplies q by ``scale`` inside (``scale=None`` means ``K**-0.5``); our op applies
  no implicit scaling.  We pass ``scale=1.0`` where the reference has the argument; where it is fixed
  at ``K**-0.5`` (``delta_rule_recurrence``, ``naive_retention``) we feed it ``q * K**0.5`` so the two
  factors cancel (exactly, since K = 16 makes both powers of two).
* **Gates.**  FLA's scalar gates are in log space: ``g = log α`` (decay ``exp(g)``).  FLA's ``β`` of the
  delta rules is our learning rate ``η``.  Simple GLA (Mamba2 / SSD) has no learning-rate argument; the
  Mamba2 mapping used by FLA's own ``test_simple_gla_to_mamba2`` puts the step size into the value:
  ``v_fla = η · v``.
* **Decay order.**  ``naive_recurrent_gated_delta_rule`` decays the state first and then takes the
  delta step at the decayed state (``h ← exp(g) h; h ← h + k (β (v − hᵀk))ᵀ``), which is our
  ``decay(order=pre)``.  Simple GLA decays and then adds the Hebbian write, which for the ``dot`` bias
  is the same function as our default ``order=post`` (the gradient of ``−⟨Wk, v⟩`` does not depend on W).

The references upcast everything to float32, so the comparison is done in float32 with the relative
error ``‖ours − fla‖ / ‖fla‖ < 1e-5`` on the output, the final state and the gradients of a random
scalar loss with respect to q, k, v, every gate and the initial state (autograd on both sides, same
leaves, same random upstream gradients).  Each of our algorithms (``recurrent`` and ``chunked``, the
latter also with a small ``chunk_size`` so T = 50 spans several chunks and ends with a partial one)
is checked.

Not compared: ``specs/ttt_linear.miras`` vs ``fla.ops.ttt.naive.chunk_ttt_linear_ref``.  The FLA TTT
reference is TTT-Linear *as an architecture*, not the plain linear memory of our spec:
  1. its memory is ``f(x) = x + LN_{w,b}(x h + hb)`` — a learned bias ``hb`` and a LayerNorm with
     per-head affine ``(w, b)`` inside the memory and a residual, with reconstruction target ``v − k``;
     the LayerNorm makes ``f`` nonlinear in the state, so no choice of ``w, b`` reduces it to ``M(x) = Wx``;
  2. its learning rate is indexed by the *reading* token (``o_j`` uses ``η_j · Σ_{s≤j} g_s`` inside a
     mini-batch, and the state update uses ``η`` of the mini-batch's last token), whereas our
     ``gd(lr=gate)`` writes ``η_s g_s`` per token;
  3. it requires K == V.
There is no exact mapping, so forcing a comparison would only test the mapping, not mirasc.
"""

from __future__ import annotations

import functools
import importlib
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import mirasc

SPECS = Path(__file__).resolve().parents[2] / "specs"

B, T, H, DK, DV = 2, 50, 2, 16, 12  # T = 50 is not a multiple of 16 or 64; Dk != Dv on purpose
RTOL = 1e-5
RETNET_GAMMA = [1 - 2.0 ** (-5 - h) for h in range(H)]  # specs/retnet.miras: decay(alpha=1 - 2^(-5 - h)) per head

# (algorithm, chunk_size) of our module; chunk_size=16 makes T = 50 span 4 chunks, the last partial.
ALGORITHMS = [
    pytest.param("recurrent", None, id="recurrent"),
    pytest.param("chunked", None, id="chunked"),
    pytest.param("chunked", 16, id="chunked-c16"),
]


# --------------------------------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fla_naive():
    """FLA's naive references, imported once per module (``import fla`` takes several seconds)."""
    pytest.importorskip("fla")
    mods = {
        "delta_rule": "fla.ops.delta_rule.naive",
        "gated_delta_rule": "fla.ops.gated_delta_rule.naive",
        "simple_gla": "fla.ops.simple_gla.naive",
        "retention": "fla.ops.retention.naive",
        "linear_attn": "fla.ops.linear_attn.naive",
        "gla": "fla.ops.gla.naive",
        "kda": "fla.ops.kda.naive",
    }
    return SimpleNamespace(**{name: importlib.import_module(path) for name, path in mods.items()})


@functools.cache
def _compile(name: str):
    return mirasc.compile_spec(str(SPECS / f"{name}.miras"))


def _module(name: str, expected_gates: set[str]):
    mod = _compile(name)
    assert set(mod.GATES) == expected_gates, f"{name}: GATES={mod.GATES!r}, expected {sorted(expected_gates)}"
    return mod


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(torch.float32).requires_grad_(True)


def _inputs(seed: int, *, heads: int = H, l2norm: bool = False) -> SimpleNamespace:
    """Random float32 leaves shared by both sides, plus random upstream gradients."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    q, k = randn(B, T, heads, DK), randn(B, T, heads, DK)
    if l2norm:  # the delta rules assume unit-norm keys (and FLA's tests normalise q as well)
        q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    else:
        q, k = q * DK**-0.5, k * DK**-0.5
    return SimpleNamespace(
        q=_leaf(q),
        k=_leaf(k),
        v=_leaf(randn(B, T, heads, DV)),
        eta=_leaf(0.05 + 0.9 * rand(B, T, heads)),  # learning rate η ∈ (0.05, 0.95)  ↔  FLA β
        alpha=_leaf(0.85 + 0.149 * rand(B, T, heads)),  # retention α ∈ (0.85, 0.999)  ↔  FLA g = log α
        W0=_leaf(0.5 * randn(B, heads, DV, DK)),  # our layout [B, H, Dv, Dk]; FLA's S0 = W0ᵀ
        do=randn(B, T, heads, DV).float(),
        dW=randn(B, heads, DV, DK).float(),
    )


def _ours(mod, x: SimpleNamespace, algorithm: str, chunk_size: int | None, *, W0: torch.Tensor | None = None):
    gates = {name: getattr(x, name) for name in mod.GATES}
    state = {"W": x.W0 if W0 is None else W0}
    o, final = mod.apply(x.q, x.k, x.v, gates, state=state, backend="torch", algorithm=algorithm, chunk_size=chunk_size)
    return o, final["W"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm()).item()


def _compare(ours, ref, x: SimpleNamespace, leaves: dict[str, torch.Tensor], *, with_state: bool = True) -> None:
    """Run both sides, compare o, final W and the gradients of <o, do> + <W_T, dW> w.r.t. ``leaves``.

    ``ours()`` and ``ref()`` each return ``(o [B,T,H,Dv], W_T [B,H,Dv,Dk] or None)`` in *our* layout.
    """
    errs: dict[str, float] = {}
    results = {}
    for side, fn in (("ours", ours), ("fla", ref)):
        o, W = fn()
        assert o.shape == x.do.shape, f"{side}: o.shape={tuple(o.shape)}"
        assert torch.isfinite(o).all(), f"{side}: non-finite output"
        loss = (o.float() * x.do).sum()
        if with_state:
            assert W.shape == x.dW.shape, f"{side}: W.shape={tuple(W.shape)}"
            loss = loss + (W.float() * x.dW).sum()
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        results[side] = (o, W, dict(zip(leaves, grads)))
    (o_a, W_a, g_a), (o_b, W_b, g_b) = results["ours"], results["fla"]
    errs["o"] = _rel(o_a, o_b)
    if with_state:
        errs["W_final"] = _rel(W_a, W_b)
    for name in leaves:
        assert g_b[name] is not None, f"fla side has no gradient for {name} (test mapping bug)"
        assert g_a[name] is not None, f"mirasc gives no gradient for {name}"
        errs[f"d{name}"] = _rel(g_a[name], g_b[name])
    bad = {key: err for key, err in errs.items() if not err < RTOL}
    assert not bad, f"rel err >= {RTOL}: " + ", ".join(f"{key}={err:.3e}" for key, err in errs.items())


def _T(S: torch.Tensor | None) -> torch.Tensor | None:
    """FLA state [B, H, K, V] <-> our W [B, H, V, K]."""
    return None if S is None else S.transpose(-1, -2)


def _hf(x: torch.Tensor) -> torch.Tensor:
    """[B, T, H, ...] <-> head-first [B, H, T, ...]."""
    return x.transpose(1, 2)


# --------------------------------------------------------------------------------------------------
# DeltaNet: linear memory, l2 bias, no retention, gd(lr=gate)
#   ours: W_t = W_{t-1} - η_t (W_{t-1} k_t - v_t) k_tᵀ,  o_t = W_t q_t
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_deltanet_vs_delta_rule_recurrence(fla_naive, algorithm, chunk_size):
    # delta_rule_recurrence(q, k, v, beta, initial_state, output_final_state) is head-first [B,H,T,K],
    # has no scale argument and always multiplies q by K**-0.5: feed it q * K**0.5.
    mod = _module("deltanet", {"eta"})
    x = _inputs(1, l2norm=True)

    def ref():
        o, S = fla_naive.delta_rule.delta_rule_recurrence(
            _hf(x.q) * DK**0.5,
            _hf(x.k),
            _hf(x.v),
            _hf(x.eta),  # β [B,H,T] = η
            initial_state=_T(x.W0).contiguous(),
            output_final_state=True,
        )
        return _hf(o), _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "eta": x.eta, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_deltanet_vs_gated_delta_rule_without_gate(fla_naive, algorithm, chunk_size):
    # The gated delta rule with g = 0 (α = 1) is the plain delta rule.
    mod = _module("deltanet", {"eta"})
    x = _inputs(2, l2norm=True)
    g0 = torch.zeros(B, T, H)

    def ref():
        o, S = fla_naive.gated_delta_rule.naive_recurrent_gated_delta_rule(
            q=x.q, k=x.k, v=x.v, beta=x.eta, g=g0, scale=1.0,
            initial_state=_T(x.W0).contiguous(), output_final_state=True,
        )  # fmt: skip
        return o, _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "eta": x.eta, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


# --------------------------------------------------------------------------------------------------
# Gated DeltaNet: linear, l2, decay(alpha=gate, order=pre), gd(lr=gate)
#   ours: W'_{t-1} = α_t W_{t-1};  W_t = W'_{t-1} - η_t (W'_{t-1} k_t - v_t) k_tᵀ
#   FLA:  h ← exp(g_t) h;  h ← h + k_t (β_t (v_t - hᵀ k_t))ᵀ   with g = log α, β = η
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_gated_deltanet_vs_recurrent_gated_delta_rule(fla_naive, algorithm, chunk_size):
    mod = _module("gated_deltanet", {"eta", "alpha"})
    x = _inputs(3, l2norm=True)

    def ref():
        o, S = fla_naive.gated_delta_rule.naive_recurrent_gated_delta_rule(
            q=x.q, k=x.k, v=x.v, beta=x.eta, g=torch.log(x.alpha), scale=1.0,
            initial_state=_T(x.W0).contiguous(), output_final_state=True,
        )  # fmt: skip
        return o, _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "eta": x.eta, "alpha": x.alpha, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_gated_deltanet_vs_chunk_gated_delta_rule(fla_naive, algorithm, chunk_size):
    # FLA's chunked (WY / UT-transform) reference; argument order is (q, k, v, g, beta), so keywords.
    # chunk_size=16: T = 50 is zero-padded to 64 inside the reference, i.e. 4 chunks.
    mod = _module("gated_deltanet", {"eta", "alpha"})
    x = _inputs(4, l2norm=True)

    def ref():
        o, S = fla_naive.gated_delta_rule.naive_chunk_gated_delta_rule(
            q=x.q, k=x.k, v=x.v, g=torch.log(x.alpha), beta=x.eta, chunk_size=16, scale=1.0,
            initial_state=_T(x.W0).contiguous(), output_final_state=True,
        )  # fmt: skip
        return o, _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "eta": x.eta, "alpha": x.alpha, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


# --------------------------------------------------------------------------------------------------
# Channel-wise decays (docs/semantics.md: channel-wise gates): FLA's log-space gate g has one value per key channel,
# [B, T, H, K].
# GLA: linear, dot, decay(alpha=gate(k)), gd(lr=1)
#   ours: W_t = W_{t-1} diag(α_t) + v_t k_tᵀ
#   FLA:  h ← h * exp(gk_t)[:, None] + k_t v_tᵀ, o_t = (scale q_t)ᵀ h; its scale is fixed at K**-0.5
#         (so we feed it q·K**0.5, exact for K = 16) and it upcasts to float32
# KDA: linear, l2, decay(alpha=gate(k), order=pre), gd(lr=gate)
#   ours: W'_t = W_{t-1} diag(α_t);  W_t = W'_t - η_t (W'_t k_t - v_t) k_tᵀ
#   FLA:  S ← S * exp(g_t)[..., None];  S ← S + β_t k_t (v_t - S ᵀk_t)ᵀ, with scale=1.0
# --------------------------------------------------------------------------------------------------


def _channel_alpha(x: SimpleNamespace, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return _leaf(0.85 + 0.149 * torch.rand(B, T, H, DK, generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_gla_vs_naive_recurrent_gla(fla_naive, algorithm, chunk_size):
    mod = _module("gla", {"alpha"})
    assert mod.GATE_CHANNELS == {"alpha": "k"}
    x = _inputs(21)
    x.alpha = _channel_alpha(x, 22)

    def ref():
        o, S = fla_naive.gla.naive_recurrent_gla(
            x.q * DK**0.5, x.k, x.v, torch.log(x.alpha), initial_state=_T(x.W0), output_final_state=True,
        )  # fmt: skip
        return o, _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "alpha": x.alpha, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_kda_vs_naive_recurrent_kda(fla_naive, algorithm, chunk_size):
    mod = _module("kda", {"eta", "alpha"})
    assert mod.GATE_CHANNELS == {"alpha": "k"}
    x = _inputs(23, l2norm=True)
    x.alpha = _channel_alpha(x, 24)

    def ref():
        o, S = fla_naive.kda.naive_recurrent_kda(
            q=x.q, k=x.k, v=x.v, g=torch.log(x.alpha), beta=x.eta, scale=1.0,
            initial_state=_T(x.W0), output_final_state=True,
        )  # fmt: skip
        return o, _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "eta": x.eta, "alpha": x.alpha, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_kda_vs_naive_chunk_kda(fla_naive, algorithm, chunk_size):
    mod = _module("kda", {"eta", "alpha"})
    x = _inputs(25, l2norm=True)
    x.alpha = _channel_alpha(x, 26)

    def ref():
        # the chunked reference needs T % 16 == 0: pad T = 50 to 64 with no-op tokens (k = v = 0, β = 0, g = 0)
        def pad(t):
            return torch.cat([t, t.new_zeros(t.shape[0], 64 - T, *t.shape[2:])], dim=1)

        o, S = fla_naive.kda.naive_chunk_kda(
            q=pad(x.q), k=pad(x.k), v=pad(x.v), g=pad(torch.log(x.alpha)), beta=pad(x.eta), scale=1.0,
            chunk_size=16, initial_state=_T(x.W0), output_final_state=True,
        )  # fmt: skip
        return o[:, :T], _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "eta": x.eta, "alpha": x.alpha, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


# --------------------------------------------------------------------------------------------------
# Mamba2 / SSD: linear, dot, decay(alpha=gate), gd(lr=gate)
#   ours: W_t = α_t W_{t-1} + η_t v_t k_tᵀ   (gradient of -<W k, v> is -v kᵀ)
#   FLA simple GLA: S_t = exp(g_t) S_{t-1} + k_t v_tᵀ   with g = log α and v_fla = η v
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_mamba2_vs_recurrent_simple_gla(fla_naive, algorithm, chunk_size):
    mod = _module("mamba2", {"eta", "alpha"})
    x = _inputs(5)

    def ref():
        o, S = fla_naive.simple_gla.naive_recurrent_simple_gla(
            q=x.q, k=x.k, v=x.v * x.eta[..., None], g=torch.log(x.alpha), scale=1.0,
            initial_state=_T(x.W0).contiguous(), output_final_state=True,
        )  # fmt: skip
        return o, _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "eta": x.eta, "alpha": x.alpha, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_mamba2_vs_chunk_simple_gla(fla_naive, algorithm, chunk_size):
    mod = _module("mamba2", {"eta", "alpha"})
    x = _inputs(6)

    def ref():
        o, S = fla_naive.simple_gla.naive_chunk_simple_gla(
            q=x.q, k=x.k, v=x.v * x.eta[..., None], g=torch.log(x.alpha), chunk_size=16, scale=1.0,
            initial_state=_T(x.W0).contiguous(), output_final_state=True,
        )  # fmt: skip
        return o, _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "eta": x.eta, "alpha": x.alpha, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


# --------------------------------------------------------------------------------------------------
# RetNet: linear, dot, decay(alpha=0.96875), gd(lr=1)  — no gates
#   ours: W_t = γ W_{t-1} + v_t k_tᵀ
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_retnet_vs_simple_gla_constant_gate(fla_naive, algorithm, chunk_size):
    mod = _module("retnet", set())
    x = _inputs(7)
    g = torch.tensor([math.log(gamma) for gamma in RETNET_GAMMA]).expand(B, T, H)  # γ_h per head, every token

    def ref():
        o, S = fla_naive.simple_gla.naive_recurrent_simple_gla(
            q=x.q, k=x.k, v=x.v, g=g, scale=1.0, initial_state=_T(x.W0).contiguous(), output_final_state=True
        )
        return o, _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_retnet_vs_naive_retention(fla_naive, algorithm, chunk_size):
    # naive_retention(q, k, v) is head-first, has no state, fixes scale = K**-0.5 and uses the fixed
    # per-head decay γ_h = 1 - 2**(-5 - h), the spec's per-head constant; four heads (γ = 0.969 .. 0.996),
    # a zero initial state and no final state (the reference returns none).
    mod = _module("retnet", set())
    x = _inputs(8, heads=4)
    zero_state = torch.zeros(B, 4, DV, DK)

    def ref():
        o = fla_naive.retention.naive_retention(_hf(x.q) * DK**0.5, _hf(x.k), _hf(x.v))
        return _hf(o), None

    leaves = {"q": x.q, "k": x.k, "v": x.v}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size, W0=zero_state), ref, x, leaves, with_state=False)


# --------------------------------------------------------------------------------------------------
# Linear attention: linear, dot, none, gd(lr=1)  — no gates
#   ours: W_t = W_{t-1} + v_t k_tᵀ;  FLA: S_t = S_{t-1} + k_t v_tᵀ, o_t = S_tᵀ (scale q_t), normalize=False
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm,chunk_size", ALGORITHMS)
def test_linear_attention_vs_recurrent_linear_attn(fla_naive, algorithm, chunk_size):
    mod = _module("linear_attention", set())
    x = _inputs(9)

    def ref():
        o, S = fla_naive.linear_attn.naive_recurrent_linear_attn(
            q=x.q, k=x.k, v=x.v, scale=1.0, initial_state=_T(x.W0).contiguous(),
            output_final_state=True, normalize=False,
        )  # fmt: skip
        return o, _T(S)

    leaves = {"q": x.q, "k": x.k, "v": x.v, "W0": x.W0}
    _compare(lambda: _ours(mod, x, algorithm, chunk_size), ref, x, leaves)
