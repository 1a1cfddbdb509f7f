"""Atlas (Behrouz et al. 2025) in the spec language: the Omega rule (`bias = l2(window=c, gamma=gate)`), polynomial
features of the memory's input (`memory = mlp(..., feature=poly, degree=p)`) and the Muon learner
(`learner = muon(lr=gate, theta=gate, ns_steps=5)`); docs/semantics.md, "The Omega rule", "Features", "Muon".

1. Variants (linear and MLP memories, l2 / dot / Huber-mixture biases, decay / elastic / no retention, gd / momentum /
   muon, exact and minibatch(C)) against the independent float64 reference (tests/reference.py: a token loop whose
   gradient is autograd on the written-out window sum Σ γ_i ℓ(W; k_i, v_i)) on every torch algorithm they have:
   outputs, the whole final state (weights, momentum, the carried window), and the gradients of q, k, v, every gate
   and every initial-state entry (a non-empty initial window included).
2. c = 1 is today's spec; Newton–Schulz keeps the singular vectors and brings the singular values near 1.
3. The bundled specs (atlas, omega_yaad): reference, Layer decoding = forward, cu_seqlens = separate runs.
4. Illegal combinations are rejected at their location; backend="triton" (muon, poly MLP memories) and a missing
   chunk form say why.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from reference import decode, make_inputs, newton_schulz, reference_apply, rel

mirasc = pytest.importorskip("mirasc")

SPECS = Path(__file__).resolve().parents[2] / "specs"
f64 = torch.float64
B, H, D = 2, 2, 4  # Dk = Dv (residual MLP memories)
T, C = 11, 4       # C does not divide T

_MLP = dict(kind="mlp", depth=2, expansion=2, act="gelu", residual=True, norm="layernorm")
_MLP_SPEC = "mlp(depth=2, expansion=2, act=gelu, residual=true, norm=layernorm"
_DECAY = dict(kind="decay", alpha="gate", order="post")

# name -> (spec body, reference config, torch algorithms it has)
CASES = {
    "omega_l2_linear": (
        "memory = linear; bias = l2(window=3, gamma=gate); retention = decay(alpha=gate); learner = gd(lr=gate)",
        dict(memory=dict(kind="linear"), bias=dict(kind="l2", window=3, gamma="gate"), retention=_DECAY,
             learner=dict(kind="gd", lr="gate"), parallel=None),
        ("recurrent",)),
    "omega_dot_linear": (  # a state-independent gradient: every chunking is exact
        "memory = linear; bias = dot(window=3, gamma=gate); retention = decay(alpha=gate); learner = gd(lr=gate)",
        dict(memory=dict(kind="linear"), bias=dict(kind="dot", window=3, gamma="gate"), retention=_DECAY,
             learner=dict(kind="gd", lr="gate"), parallel=None),
        ("recurrent", "chunked")),
    "omega_custom_pre": (  # a derived custom loss, the decay before the gradient
        "memory = linear; bias = custom(loss=log(1 + e^2/2), window=3, gamma=gate); "
        "retention = decay(alpha=gate, order=pre); learner = momentum(lr=gate, theta=gate)",
        dict(memory=dict(kind="linear"), bias=dict(kind="custom", f=lambda e: torch.log(1 + e * e / 2), window=3,
                                                    gamma="gate"),
             retention=dict(kind="decay", alpha="gate", order="pre"),
             learner=dict(kind="momentum", lr="gate", theta="gate"), parallel=None),
        ("recurrent",)),
    "omega_huber_mlp": (
        f"memory = {_MLP_SPEC}); bias = huber(delta=gate, mode=mixture, window=3, gamma=gate); "
        f"retention = decay(alpha=gate); learner = gd(lr=gate); parallel = minibatch({C})",
        dict(memory=_MLP, bias=dict(kind="huber", delta="gate", mode="mixture", window=3, gamma="gate"),
             retention=_DECAY, learner=dict(kind="gd", lr="gate"), parallel=C, gate_ranges=dict(delta=(1.5, 4.0))),
        ("recurrent", "chunked")),
    "omega_momentum_mlp": (
        f"memory = {_MLP_SPEC}); bias = l2(window=2, gamma=0.5); retention = decay(alpha=gate); "
        f"learner = momentum(lr=gate, theta=gate); parallel = minibatch({C})",
        dict(memory=_MLP, bias=dict(kind="l2", window=2, gamma=0.5), retention=_DECAY,
             learner=dict(kind="momentum", lr="gate", theta="gate"), parallel=C),
        ("recurrent", "chunked")),
    "omega_elastic_linear": (  # a nonlinear per-token readout: the chunk form materialises each token's accumulator
        f"memory = linear; bias = l2(window=2, gamma=gate); retention = elastic(lam=0.01, alpha=gate); "
        f"learner = gd(lr=gate); parallel = minibatch({C})",
        dict(memory=dict(kind="linear"), bias=dict(kind="l2", window=2, gamma="gate"),
             retention=dict(kind="elastic", lam=0.01, alpha="gate"), learner=dict(kind="gd", lr="gate"), parallel=C),
        ("recurrent", "chunked")),
    "atlas_small": (
        f"memory = {_MLP_SPEC}, feature=poly, degree=2); bias = l2(window=3, gamma=gate); "
        f"retention = decay(alpha=gate); learner = muon(lr=gate, theta=gate, ns_steps=5); parallel = minibatch({C})",
        dict(memory=dict(_MLP, feature="poly", degree=2), bias=dict(kind="l2", window=3, gamma="gate"),
             retention=_DECAY,
             learner=dict(kind="muon", lr="gate", theta="gate", ns_steps=5), parallel=C),
        ("recurrent", "chunked")),
    "muon_linear": (
        "memory = linear; bias = l2; retention = none; learner = muon(lr=gate, theta=gate, ns_steps=3)",
        dict(memory=dict(kind="linear"), bias=dict(kind="l2"), retention=dict(kind="none"),
             learner=dict(kind="muon", lr="gate", theta="gate", ns_steps=3), parallel=None),
        ("recurrent",)),
    "muon_dot_poly3": (
        "memory = linear(feature=poly, degree=3); bias = dot; retention = decay(alpha=gate); "
        "learner = muon(lr=gate, theta=0.9, ns_steps=5)",
        dict(memory=dict(kind="linear", feature="poly", degree=3), bias=dict(kind="dot"), retention=_DECAY,
             learner=dict(kind="muon", lr="gate", theta=0.9, ns_steps=5), parallel=None),
        ("recurrent", "chunked")),
    "poly_linear_pre": (
        "memory = linear(feature=poly, degree=2); bias = l2; retention = decay(alpha=gate, order=pre); "
        "learner = gd(lr=gate)",
        dict(memory=dict(kind="linear", feature="poly", degree=2), bias=dict(kind="l2"),
             retention=dict(kind="decay", alpha="gate", order="pre"), learner=dict(kind="gd", lr="gate"),
             parallel=None),
        ("recurrent", "chunked")),
    "poly_linear_implicit": (  # the proximal step's ‖φ(k)‖²; the delta chunk form on the features
        "memory = linear(feature=poly, degree=2); bias = l2; learner = implicit(lr=gate)",
        dict(memory=dict(kind="linear", feature="poly", degree=2), bias=dict(kind="l2"), retention=dict(kind="none"),
             learner=dict(kind="implicit", lr="gate"), parallel=None),
        ("recurrent", "chunked")),
    "poly_linear_rows": (  # value-channel gates: the channel-wise delta chunk form on the features
        "memory = linear(feature=poly, degree=2); bias = l2; retention = decay(alpha=gate(v)); "
        "learner = gd(lr=gate(v))",
        dict(memory=dict(kind="linear", feature="poly", degree=2), bias=dict(kind="l2"),
             retention=dict(kind="decay", alpha="gate(v)", order="post"), learner=dict(kind="gd", lr="gate(v)"),
             parallel=None),
        ("recurrent", "chunked")),
    "poly_mlp_momentum": (
        f"memory = {_MLP_SPEC}, feature=poly, degree=2); bias = l2; retention = decay(alpha=gate); "
        f"learner = momentum(lr=gate, theta=gate); parallel = minibatch({C})",
        dict(memory=dict(_MLP, feature="poly", degree=2), bias=dict(kind="l2"), retention=_DECAY,
             learner=dict(kind="momentum", lr="gate", theta="gate"), parallel=C),
        ("recurrent", "chunked")),
    # across branches: the op's feature maps (elu1, taylor: the window and the momentum live in feature space) and
    # per-head constants (γ_h, α_h) with the Atlas pieces
    "omega_elu1_features": (
        "memory = linear(feature=elu1); bias = l2(window=3, gamma=gate); retention = decay(alpha=gate); "
        f"learner = gd(lr=gate); parallel = minibatch({C})",
        dict(memory=dict(kind="linear", feature="elu1"), bias=dict(kind="l2", window=3, gamma="gate"),
             retention=_DECAY, learner=dict(kind="gd", lr="gate"), parallel=C),
        ("recurrent", "chunked")),
    "muon_taylor_features": (
        "memory = linear(feature=taylor); bias = l2; retention = decay(alpha=gate); "
        f"learner = muon(lr=gate, theta=gate); parallel = minibatch({C})",
        dict(memory=dict(kind="linear", feature="taylor"), bias=dict(kind="l2"), retention=_DECAY,
             learner=dict(kind="muon", lr="gate", theta="gate", ns_steps=5), parallel=C),
        ("recurrent", "chunked")),
    "omega_muon_hedgehog": (  # (the reference's Hedgehog map is the op's default, U = I, c = 0)
        "memory = linear(feature=hedgehog); bias = l2(window=2, gamma=gate); retention = decay(alpha=gate); "
        f"learner = muon(lr=gate, theta=gate); parallel = minibatch({C})",
        dict(memory=dict(kind="linear", feature="hedgehog"), bias=dict(kind="l2", window=2, gamma="gate"),
             retention=_DECAY, learner=dict(kind="muon", lr="gate", theta="gate", ns_steps=5), parallel=C),
        ("recurrent", "chunked")),
    "omega_muon_per_head": (
        "memory = linear; bias = l2(window=3, gamma=1 - 2^(-1 - h)); retention = decay(alpha=1 - 2^(-3 - h)); "
        f"learner = muon(lr=gate, theta=gate); parallel = minibatch({C})",
        dict(memory=dict(kind="linear"), bias=dict(kind="l2", window=3, gamma=lambda h, H: 1 - 2.0 ** (-1 - h)),
             retention=dict(kind="decay", alpha=lambda h, H: 1 - 2.0 ** (-3 - h), order="post"),
             learner=dict(kind="muon", lr="gate", theta="gate", ns_steps=5), parallel=C),
        ("recurrent", "chunked")),
}


@functools.cache
def module(name: str):
    return mirasc.compile_spec(f"model {name} {{ {CASES[name][0]} }}")


def random_state(mod, seed: int, batch: int = B, heads: int = H, dk: int = D, dv: int = D) -> dict[str, torch.Tensor]:
    """A random initial state with the module's keys: weights and momentum ~ N(0, 0.3²)·…, a full Omega window
    (unit keys, γ in [0, 1], Huber δ in [1.5, 4])."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, x in mod.init_state(batch, heads, dk, dv, dtype=f64).items():
        if name.startswith("win_gamma"):
            val = torch.rand(x.shape, generator=g, dtype=f64)
        elif name.startswith("win_delta"):
            val = 1.5 + 2.5 * torch.rand(x.shape, generator=g, dtype=f64)
        elif name in ("win_k",):
            val = torch.nn.functional.normalize(torch.randn(x.shape, generator=g, dtype=f64), dim=-1)
        else:
            val = torch.randn(x.shape, generator=g, dtype=f64) * (0.3 if name.startswith(("W", "S_", "A_")) else 1.0)
        state[name] = val
    if "A_W" in state:  # elastic: W is the accumulator's readout
        state["W"] = torch.sign(state["A_W"]) * (state["A_W"].abs() - 0.01).clamp_min(0)
    return state


def linear_loss_grads(want_o, want_s, leaves, seed=11):
    """grads(o, s): the gradients of every leaf under one fixed random linear loss on the output and each final-state
    tensor (cotangents drawn once, from the reference's shapes, so every path is differentiated through the same
    loss)."""
    gen = torch.Generator().manual_seed(seed)
    w_o = torch.randn(want_o.shape, generator=gen, dtype=f64)
    w_s = {n: torch.randn(x.shape, generator=gen, dtype=f64) for n, x in want_s.items()}

    def grads(o, s):
        loss = (o * w_o).sum() + sum((s[n] * w_s[n]).sum() for n in w_s)
        return torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)

    return grads


def _check(name, algorithm, seed=3):
    mod, cfg = module(name), CASES[name][1]
    q, k, v, gates = make_inputs(cfg, B, T, H, D, D, f64, seed=seed)
    state = random_state(mod, seed)
    leaves = {"q": q, "k": k, "v": v, **gates, **{f"state:{n}": x for n, x in state.items()}}
    for x in leaves.values():
        x.requires_grad_(True)
    want_o, want_s = reference_apply(cfg, q, k, v, gates, state)
    got_o, got_s = mod.apply(q, k, v, gates, state=state, backend="torch", algorithm=algorithm)
    assert sorted(got_s) == sorted(want_s) == sorted(state)
    errs = {"o": rel(got_o, want_o), **{f"final:{n}": rel(got_s[n], want_s[n]) for n in want_s}}
    grads = linear_loss_grads(want_o, want_s, leaves)
    for n, a, b in zip(leaves, grads(got_o, got_s), grads(want_o, want_s)):
        if b is None or b.abs().max() == 0:  # (e.g. the oldest window token after T > c steps: no influence)
            assert a is None or a.abs().max() < 1e-12, n
            continue
        errs[f"d{n}"] = rel(a, b)
    return errs


@pytest.mark.parametrize("name,algorithm", [(n, a) for n in sorted(CASES) for a in CASES[n][2]])
def test_matches_reference(name, algorithm):
    errs = _check(name, algorithm)
    assert max(errs.values()) < 1e-9, errs  # (float64: measured ≤ 1e-13)


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if "chunked" not in CASES[n][2]])
def test_no_chunk_form_says_why(name):
    mod = module(name)
    q, k, v, gates = make_inputs(CASES[name][1], 1, 3, 1, D, D, f64)
    assert not mod.CHUNKED
    with pytest.raises(ValueError, match="no chunked algorithm for this spec: .*(Omega|muon|features|raw keys)"):
        mod.apply(q, k, v, gates, algorithm="chunked")


@pytest.mark.parametrize("name", ["atlas_small", "poly_mlp_momentum", "muon_linear"])  # (what runs: test_triton_omega)
def test_triton_rejects_with_reason(name):
    mod = module(name)
    q, k, v, gates = make_inputs(CASES[name][1], 1, 3, 1, D, D, f64)
    with pytest.raises(RuntimeError, match="no Triton kernel for this spec: .*(Omega rule|feature=poly|muon)"):
        mod.apply(q, k, v, gates, backend="triton")


def test_window_one_is_todays_spec():
    """c = 1 (and γ = 1) is the online bias: the same canonical spec, the same module, the same numbers."""
    plain = mirasc.compile_spec("model p { memory = linear; bias = huber(delta=gate); learner = gd(lr=gate) }")
    one = mirasc.compile_spec("model p { memory = linear; bias = huber(delta=gate, window=1, gamma=1); "
                              "learner = gd(lr=gate) }")
    assert one.SPEC == plain.SPEC and "window" not in one.SPEC and "win_k" not in one.init_state(1, 1, 2, 2)
    cfg = dict(memory=dict(kind="linear"), bias=dict(kind="huber", delta="gate"), retention=dict(kind="none"),
               learner=dict(kind="gd", lr="gate"), parallel=None)
    q, k, v, gates = make_inputs(cfg, 1, 7, 2, 3, 3, f64, seed=1)
    assert rel(one.apply(q, k, v, gates)[0], plain.apply(q, k, v, gates)[0]) == 0


def test_omega_dot_closed_form():
    """The Omega sum written out by hand for the dot bias, linear memory, γ = 1 and c = T (no token leaves the
    window): W_t = W_{t-1} + η_t Σ_{i<=t} v_i k_iᵀ (Atlas Eq. 20 with α = 1)."""
    mod = mirasc.compile_spec("model sw { memory = linear; bias = dot(window=5, gamma=1); learner = gd(lr=gate) }")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 5, 1, 3, generator=g, dtype=f64) for _ in range(3))
    eta = torch.rand(1, 5, 1, generator=g, dtype=f64)
    o, final = mod.apply(q, k, v, {"eta": eta}, algorithm="recurrent")
    W = torch.zeros(3, 3, dtype=f64)
    for t in range(5):
        W = W + eta[0, t, 0] * sum(torch.outer(v[0, i, 0], k[0, i, 0]) for i in range(t + 1))
        assert rel(o[0, t, 0], W @ q[0, t, 0]) < 1e-12
    assert rel(final["W"][0, 0], W) < 1e-12


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
def test_poly_features_are_based_linear_time_form(algorithm):
    """feature=poly, degree=2 on a linear memory with the dot bias is Based's linear-time form: φ_2(q')·φ_2(k) =
    1 + s + s²/2 with q' = q·Dk^{-1/2}, s = q'·k; with v′ = [v, 1] the last output channel is the normaliser.
    Against flash-linear-attention's `naive_parallel_based` (its CPU reference), normalised and not."""
    naive = pytest.importorskip("fla.ops.based.naive")
    mod = mirasc.compile_spec("model based_lin { memory = linear(feature=poly, degree=2); bias = dot; "
                              "learner = gd(lr=1) }")
    g = torch.Generator().manual_seed(4)
    b, t, h, d, dv = 2, 13, 2, 4, 3
    q, k, v = (torch.randn(b, h, t, n, generator=g, dtype=f64) for n in (d, d, dv))
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    o, _ = mod.apply(*(x.transpose(1, 2) for x in (q * d ** -0.5, k, v1)), algorithm=algorithm, chunk_size=5)
    o = o.transpose(1, 2)
    assert rel(o[..., :dv], naive.naive_parallel_based(q, k, v, use_norm=False)) < 1e-12
    assert rel(o[..., :dv] / (o[..., dv:] + 1e-6), naive.naive_parallel_based(q, k, v, use_norm=True)) < 1e-12


@pytest.mark.parametrize("learner", ["gd(lr=gate)", "momentum(lr=gate, theta=gate)", "implicit(lr=gate)"])
def test_taylor_and_poly_degree_two_agree(learner):
    """`feature=taylor` (the op's compact map: each x_i x_j once) and `feature=poly, degree=2` (the memory's full
    x⊗x) are the same kernel 1 + q·k + (q·k)²/2, stored differently: from the empty memory, with per-head gates,
    every update lies in the span of the φ(k)ᵀ and the outputs agree; the states differ in width (Dφ = 15 vs 21)."""
    body = "bias = l2; retention = decay(alpha=gate, order=pre); learner = " + learner
    taylor = mirasc.compile_spec(f"model t {{ memory = linear(feature=taylor); {body} }}")
    poly = mirasc.compile_spec(f"model p {{ memory = linear(feature=poly, degree=2); {body} }}")
    cfg = dict(memory=dict(kind="linear"), bias=dict(kind="l2"),
               retention=dict(kind="decay", alpha="gate", order="pre"),
               learner=dict(kind=learner.split("(")[0], lr="gate", theta="gate"), parallel=None)
    q, k, v, gates = make_inputs(cfg, B, T, H, D, D, f64, seed=8)
    gates = {n: x for n, x in gates.items() if n in taylor.GATES}
    o_t, s_t = taylor.apply(q, k, v, gates, backend="torch", algorithm="recurrent")
    o_p, s_p = poly.apply(q, k, v, gates, backend="torch", algorithm="recurrent")
    assert s_t["W"].shape[-1] == 1 + D + D * (D + 1) // 2 and s_p["W"].shape[-1] == 1 + D + D * D
    assert rel(o_t, o_p) < 1e-12, rel(o_t, o_p)


# --------------------------------------------------------------------------------------- Newton–Schulz


def test_newton_schulz_orthogonalises(monkeypatch):
    """NS_k keeps the singular vectors and, after enough iterations (12 here, for singular values spread over three
    decades; each step multiplies a small one by ≈ 3.4), maps every singular value into about [0.7, 1.2] (the
    quintic's band, not exactly 1: Muon's coefficients trade convergence for speed); the module's orthogonalisation
    (mirasc/runtime/memory_ops.py, with the spec's NS_STEPS) and the reference agree."""
    from mirasc.runtime import memory_ops

    def module_ns(mod, G):
        monkeypatch.setattr(memory_ops, "NS_STEPS", mod.NS_STEPS)
        monkeypatch.setattr(memory_ops, "NS_COEFFICIENTS", mod.NS_COEFFICIENTS)
        return memory_ops._newton_schulz(G)

    mod5 = module("atlas_small")
    mod = mirasc.compile_spec("model ns12 { memory = linear; bias = l2; learner = muon(lr=gate, theta=gate, "
                              "ns_steps=12) }")
    assert (mod5.NS_STEPS, mod.NS_STEPS) == (5, 12)
    g = torch.Generator().manual_seed(0)
    for shape in ((6, 10), (10, 6), (8, 8)):
        G = torch.randn(3, *shape, generator=g, dtype=f64) @ torch.diag_embed(torch.logspace(0, -2, shape[1],
                                                                                            dtype=f64))
        U, sv, Vh = torch.linalg.svd(G, full_matrices=False)
        assert rel(module_ns(mod5, G), newton_schulz(G, 5)) < 1e-12
        X = module_ns(mod, G)
        assert rel(X, newton_schulz(G, 12)) < 1e-12
        inner = U.mT @ X @ Vh.mT  # diagonal when the singular vectors are kept
        off = inner - torch.diag_embed(torch.diagonal(inner, dim1=-2, dim2=-1))
        assert off.abs().max() < 1e-10
        out = torch.linalg.svdvals(X)
        assert out.min() > 0.6 and out.max() < 1.25, (shape, out)
        assert torch.linalg.svdvals(G / G.norm(dim=(-2, -1), keepdim=True)).min() < 0.05  # (far from 1 before)
        assert rel(X, U @ Vh) < 0.3  # close to the nearest semi-orthogonal matrix UVᵀ
    assert module_ns(mod, torch.zeros(2, 3, 4, dtype=f64)).abs().max() == 0


# --------------------------------------------------------------------------------------- bundled specs


@functools.cache
def bundled(name: str):
    return mirasc.compile_spec((SPECS / f"{name}.miras").read_text())


@pytest.mark.parametrize("name", ["atlas", "omega_yaad"])
def test_bundled_spec_layer_decoding_and_packing(name):
    """The Layer decodes token by token (the cache carries the window) as its forward computes; sequences packed
    with cu_seqlens equal separate runs; the chunked and recurrent algorithms agree."""
    mod = bundled(name)
    torch.manual_seed(0)
    layer = mod.Layer(16, 2).double()
    x = torch.randn(2, 7, 16, dtype=f64)
    y = layer(x)
    assert rel(decode(layer, x), y) < 1e-12
    assert not any(p.requires_grad for n, p in layer.initial.items() if n.startswith(("win_", "S_")))
    q, k, v, gates, _ = layer._project(x[:1])
    o, final = mod.apply(q, k, v, gates, cu_seqlens=torch.tensor([0, 3, 7]), algorithm="chunked")
    for i, (a, b) in enumerate(((0, 3), (3, 7))):
        o_i, f_i = mod.apply(q[:, a:b], k[:, a:b], v[:, a:b], {n: g[:, a:b] for n, g in gates.items()},
                             algorithm="recurrent")
        assert rel(o[:, a:b], o_i) < 1e-10
        assert all(rel(final[n][i:i + 1], f_i[n]) < 1e-10 for n in f_i)


def test_bundled_atlas_matches_reference():
    """specs/atlas.miras itself (feature=poly degree 2, l2 over a window of 4 with γ gates, decay, muon with 5
    Newton–Schulz steps, minibatch) against the reference, short sequence, both algorithms."""
    mod = bundled("atlas")
    cfg = dict(memory=dict(kind="mlp", depth=2, expansion=4, act="gelu", residual=True, norm="layernorm",
                           feature="poly", degree=2),
               bias=dict(kind="l2", window=4, gamma="gate"), retention=_DECAY,
               learner=dict(kind="muon", lr="gate", theta="gate", ns_steps=5), parallel=mod.MINIBATCH)
    q, k, v, gates = make_inputs(cfg, 1, 7, 1, 3, 3, f64, seed=5)
    want_o, want_s = reference_apply(cfg, q, k, v, gates, mod.init_state(1, 1, 3, 3, dtype=f64))
    for algorithm in ("recurrent", "chunked"):
        o, s = mod.apply(q, k, v, gates, algorithm=algorithm)
        assert rel(o, want_o) < 1e-10 and all(rel(s[n], want_s[n]) < 1e-10 for n in want_s), algorithm


# ------------------------------------------------------------------------------------------- errors


REJECTED = {
    "memory = linear; bias = l2(gamma=gate)": "with window=1",
    "memory = linear; bias = l2(window=3, gamma=gate(v))": "one number",
    "memory = linear; bias = l2(window=3); learner = implicit": "has none",
    "memory = linear; bias = l2(window=3); learner = gd(lr=gate(v))": "rather than step t's",
    "memory = linear; bias = l2(window=3, erase=kappa)": "generalized delta",
    "memory = linear; bias = l2(window=0)": "window",
    "memory = linear(feature=poly); bias = l2(read=kappa)": "the same map",
    "memory = linear(feature=poly); bias = l2; retention = decay(alpha=gate(k))": "not the key channels",
    "memory = linear(feature=poly, degree=9); bias = l2": "degree",
    "memory = linear; bias = l2; learner = muon(lr=gate(v))": "orthogonalised step",
    "memory = linear; bias = l2; learner = muon(ns_steps=0)": "ns_steps",
    "memory = linear(feature=poly, normalize=true); bias = dot; learner = gd": "feature=taylor",
    "memory = linear(feature=elu1, degree=3); bias = l2": "the other feature maps have none",
    "memory = mlp(feature=elu1); bias = l2": "feature",
    "memory = linear(feature=elu1, normalize=true); bias = dot(window=3, gamma=gate); learner = gd": "Omega window",
}


@pytest.mark.parametrize("body", sorted(REJECTED))
def test_rejections(body):
    text = f"model bad {{\n    {body}\n}}\n"
    with pytest.raises(mirasc.SpecError) as err:
        mirasc.compile_spec(text)
    message = str(err.value)
    assert message.startswith("<spec>:2:") and REJECTED[body] in message, message
