"""Sanity checks of tests/reference.py against closed forms written differently (no mirasc needed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from reference import (
    GATE_OF_ROLE,
    REF_CONFIGS,
    declared_gates,
    make_inputs,
    make_state,
    memory_forward,
    needs_positive_weights,
    reference_apply,
    state_keys,
)

SPECS = Path(__file__).resolve().parents[2] / "specs"
f64 = torch.float64
LIN = dict(kind="linear")


def cfg_of(memory=LIN, bias=None, retention=None, learner=None, parallel=None):
    return dict(
        memory=memory,
        bias=bias or dict(kind="l2"),
        retention=retention or dict(kind="none"),
        learner=learner or dict(kind="gd", lr="gate"),
        parallel=parallel,
    )


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def setup(cfg, B=2, T=9, H=2, Dk=4, Dv=3, seed=0):
    q, k, v, g = make_inputs(cfg, B, T, H, Dk, Dv, f64, seed)
    st = make_state(cfg, B, H, Dk, Dv, f64, seed)
    return q, k, v, g, st


def outer(a, b):
    return a[:, None] * b[None, :]


# ------------------------------------------------------------------------------------------ configs


def test_ref_configs_cover_specs():
    """Every parametric spec (docs/semantics.md: parametric memories) has a reference config; nonparametric memories
    are checked against their own references in test_attention.py and test_nonparametric_variants.py."""
    stems = {p.stem for p in SPECS.glob("*.miras") if "nonparametric" not in p.read_text()}
    assert stems, "no specs found"
    assert set(REF_CONFIGS) == stems


@pytest.mark.parametrize("name", sorted(REF_CONFIGS))
def test_make_inputs_and_state(name):
    cfg = REF_CONFIGS[name]
    q, k, v, g, st = setup(name, T=5, Dk=4, Dv=4)
    sub = (cfg["steps"],) if cfg.get("steps", 1) > 1 else ()  # multi-step learners: n keys, values, η, κ per token
    kappa = g.get("kappa")  # the regression key of l2(read|erase=kappa), drawn with the gates
    assert (kappa is not None) == ("kappa" in (cfg["bias"].get("read"), cfg["bias"].get("erase")))
    if kappa is not None:
        torch.testing.assert_close(kappa.norm(dim=-1), torch.ones(2, 5, 2, *sub, dtype=f64))
    assert set(g) - {"kappa"} == declared_gates(cfg)
    torch.testing.assert_close(q.norm(dim=-1), torch.ones(2, 5, 2, dtype=f64))
    torch.testing.assert_close(k.norm(dim=-1), torch.ones(2, 5, 2, *sub, dtype=f64))
    assert v.shape == (2, 5, 2, *sub, 4)
    channels = {GATE_OF_ROLE[role]: cfg[section][role] for section in ("bias", "retention", "learner")
                for role in GATE_OF_ROLE if role in cfg[section]}
    for name_, x in g.items():
        if name_ == "kappa":
            continue
        per_step = sub if name_ == "eta" else ()  # one learning rate per inner step
        assert x.shape == ((2, 5, 2, *per_step) if channels[name_] == "gate" else (2, 5, 2, *per_step, 4))  # Dk = Dv
        assert (x > 0).all() or name_ == "theta"
        if name_ == "alpha":
            assert (x <= 1).all()
    assert list(st) == state_keys(cfg)
    if needs_positive_weights(cfg):
        for key, x in st.items():
            if not key.startswith("S_"):
                assert (x > 0).all()
    q32, k32, v32, g32 = make_inputs(name, 2, 5, 2, 4, 4, torch.float32, 0)
    assert q32.dtype == torch.float32 and torch.allclose(q32.double(), q, atol=1e-7)
    o, fin = reference_apply(name, q, k, v, g, st)
    assert o.shape == (2, 5, 2, 4) and list(fin) == list(st)
    for key in st:
        assert fin[key].shape == st[key].shape


# ------------------------------------------------------------------------------------- linear forms


def test_deltanet_closed_recurrence():
    cfg = REF_CONFIGS["deltanet"]
    q, k, v, g, st = setup(cfg)
    o, fin = reference_apply(cfg, q, k, v, g, st)
    B, T, H, Dk = k.shape
    for b in range(B):
        for h in range(H):
            W = st["W"][b, h]
            for t in range(T):
                kt, eta = k[b, t, h], g["eta"][b, t, h]
                W = W @ (torch.eye(Dk, dtype=f64) - eta * outer(kt, kt)) + eta * outer(v[b, t, h], kt)
                torch.testing.assert_close(o[b, t, h], W @ q[b, t, h], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(fin["W"][b, h], W, rtol=1e-12, atol=1e-12)


def test_gated_deltanet_closed_recurrence():
    cfg = REF_CONFIGS["gated_deltanet"]
    q, k, v, g, st = setup(cfg)
    o, fin = reference_apply(cfg, q, k, v, g, st)
    B, T, H, Dk = k.shape
    for b in range(B):
        for h in range(H):
            W = st["W"][b, h]
            for t in range(T):
                kt, eta, a = k[b, t, h], g["eta"][b, t, h], g["alpha"][b, t, h]
                W = a * W @ (torch.eye(Dk, dtype=f64) - eta * outer(kt, kt)) + eta * outer(v[b, t, h], kt)
                torch.testing.assert_close(o[b, t, h], W @ q[b, t, h], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(fin["W"][b, h], W, rtol=1e-12, atol=1e-12)


def _per_bh(x):  # [B,T,H,D] -> [B,H,T,D]
    return x.transpose(1, 2)


def test_generalized_delta_as_transition_matrices():
    """rwkv7 (erase=kappa): W_t = W_{t-1}(diag(α_t) − κ_t (η_t ⊙ κ_t)ᵀ) + v_t k_tᵀ; comba (read=kappa, decay first):
    W_t = α_t W_{t-1}(I − η_t κ_t k_tᵀ) + η_t v_t k_tᵀ — written as matrix products, not as the reference's steps."""
    for name in ("rwkv7", "comba"):
        q, k, v, g, st = setup(name)
        o, final = reference_apply(name, q, k, v, g, st)
        W = st["W"]
        Dk = k.shape[-1]
        for t in range(q.shape[1]):
            kap, eta, alpha = g["kappa"][:, t], g["eta"][:, t], g["alpha"][:, t]
            if name == "rwkv7":
                A = torch.diag_embed(alpha) - kap[..., :, None] * (eta * kap)[..., None, :]
                W = W @ A + v[:, t][..., :, None] * k[:, t][..., None, :]
            else:
                eta, alpha = eta[..., None, None], alpha[..., None, None]
                A = torch.eye(Dk, dtype=f64) - eta * kap[..., :, None] * k[:, t][..., None, :]
                W = alpha * W @ A + eta * v[:, t][..., :, None] * k[:, t][..., None, :]
            assert rel(o[:, t], torch.einsum("bhvk,bhk->bhv", W, q[:, t])) < 1e-12
        assert rel(final["W"], W) < 1e-12


def test_linear_attention_is_causal_masked_matmul():
    cfg = REF_CONFIGS["linear_attention"]
    q, k, v, g, st = setup(cfg, T=11)
    st = {"W": torch.zeros_like(st["W"])}
    o, fin = reference_apply(cfg, q, k, v, g, st)
    Q, K, V = _per_bh(q), _per_bh(k), _per_bh(v)
    mask = torch.tril(torch.ones(11, 11, dtype=f64))
    expect = ((Q @ K.transpose(-1, -2)) * mask) @ V
    torch.testing.assert_close(_per_bh(o), expect, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fin["W"], V.transpose(-1, -2) @ K, rtol=1e-12, atol=1e-12)


def test_retnet_is_decay_masked_matmul():
    cfg = REF_CONFIGS["retnet"]
    q, k, v, g, st = setup(cfg, T=11)
    st = {"W": torch.zeros_like(st["W"])}
    o, _ = reference_apply(cfg, q, k, v, g, st)
    Q, K, V = _per_bh(q), _per_bh(k), _per_bh(v)
    i = torch.arange(11)
    gap = (i[:, None] - i[None, :]).to(f64)
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(q.shape[2])], dtype=f64)  # γ_h, per head
    D = torch.where(gap >= 0, gamma[:, None, None] ** gap, torch.zeros_like(gap))  # [H, T, T]
    torch.testing.assert_close(_per_bh(o), ((Q @ K.transpose(-1, -2)) * D) @ V, rtol=1e-12, atol=1e-12)


def test_mamba2_is_gated_decay_masked_matmul_plus_initial_state():
    cfg = REF_CONFIGS["mamba2"]
    q, k, v, g, st = setup(cfg, T=11)
    o, _ = reference_apply(cfg, q, k, v, g, st)
    Q, K, V = _per_bh(q), _per_bh(k), _per_bh(v)
    logcum = torch.cumsum(torch.log(g["alpha"]), dim=1).transpose(1, 2)  # [B,H,T]
    causal = torch.tril(torch.ones(11, 11, dtype=torch.bool))
    D = torch.where(causal, torch.exp(logcum[..., :, None] - logcum[..., None, :]), torch.zeros(()))
    D = D * g["eta"].transpose(1, 2)[..., None, :]  # eta_s on column s
    expect = ((Q @ K.transpose(-1, -2)) * D) @ V
    expect = expect + torch.exp(logcum)[..., None] * (Q @ st["W"].transpose(-1, -2))  # W_t = (prod alpha) W_0 + ...
    torch.testing.assert_close(_per_bh(o), expect, rtol=1e-12, atol=1e-12)


def test_longhorn_step_is_the_proximal_minimiser():
    cfg = REF_CONFIGS["longhorn"]
    q, k, v, g, st = setup(cfg, T=1)
    k = k * 1.7  # not unit norm, so that ||k||^2 matters
    _, fin = reference_apply(cfg, q, k, v, g, st)
    eta = g["eta"][:, 0][..., None, None]
    kt, vt = k[:, 0], v[:, 0]

    def objective(W):
        e = torch.einsum("bhvk,bhk->bhv", W, kt) - vt
        return 0.5 * (e * e).sum((-1,)) + ((W - st["W"]) ** 2).sum((-2, -1)) / (2 * eta[..., 0, 0])

    W1 = fin["W"].clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(objective(W1).sum(), W1)
    assert grad.abs().max() < 1e-12
    base = objective(fin["W"])
    for s in range(3):
        d = torch.randn(fin["W"].shape, generator=torch.Generator().manual_seed(s), dtype=f64) * 1e-3
        assert (objective(fin["W"] + d) > base).all()
    # and the one-step GD (DeltaNet) update is not the minimiser: the test can tell them apart
    gd, _ = reference_apply(REF_CONFIGS["deltanet"], q, k, v, g, st)
    lh, _ = reference_apply(cfg, q, k, v, g, st)
    assert rel(gd, lh) > 1e-3


def test_longhorn_closed_form_over_a_sequence():
    cfg = REF_CONFIGS["longhorn"]
    q, k, v, g, st = setup(cfg, B=1, H=1, T=6)
    k = k * torch.linspace(0.5, 2.0, 6, dtype=f64)[None, :, None, None]
    o, _ = reference_apply(cfg, q, k, v, g, st)
    W = st["W"][0, 0]
    for t in range(6):
        kt, vt, eta = k[0, t, 0], v[0, t, 0], g["eta"][0, t, 0]
        # solve the normal equations of the proximal objective directly: W (k k^T + I/eta) = v k^T + W'/eta
        lhs = outer(kt, kt) + torch.eye(kt.numel(), dtype=f64) / eta
        W = torch.linalg.solve(lhs, (outer(vt, kt) + W / eta).T).T
        torch.testing.assert_close(o[0, t, 0], W @ q[0, t, 0], rtol=1e-11, atol=1e-12)


# ----------------------------------------------------------------------------------- learners


def test_momentum_with_decay_unrolled_by_hand():
    cfg = cfg_of(
        retention=dict(kind="decay", alpha="gate", order="post"),
        learner=dict(kind="momentum", lr="gate", theta="gate"),
    )
    q, k, v, g, st = setup(cfg, B=1, H=1, T=3)
    S0 = 0.1 * torch.randn(st["W"].shape, generator=torch.Generator().manual_seed(3), dtype=f64)
    st["S_W"] = S0
    o, fin = reference_apply(cfg, q, k, v, g, st)
    kk, vv = k[0, :, 0], v[0, :, 0]
    e, a, th = g["eta"][0, :, 0], g["alpha"][0, :, 0], g["theta"][0, :, 0]
    W0 = st["W"][0, 0]
    S1 = th[0] * S0[0, 0] - e[0] * outer(W0 @ kk[0] - vv[0], kk[0])
    W1 = a[0] * W0 + S1
    S2 = th[1] * S1 - e[1] * outer(W1 @ kk[1] - vv[1], kk[1])
    W2 = a[1] * W1 + S2
    S3 = th[2] * S2 - e[2] * outer(W2 @ kk[2] - vv[2], kk[2])
    W3 = a[2] * W2 + S3
    for t, W in enumerate((W1, W2, W3)):
        torch.testing.assert_close(o[0, t, 0], W @ q[0, t, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fin["W"][0, 0], W3, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fin["S_W"][0, 0], S3, rtol=1e-12, atol=1e-12)


def test_minibatch_gradients_at_the_chunk_anchor():
    cfg = dict(REF_CONFIGS["ttt_linear"], parallel=2)
    q, k, v, g, st = setup(cfg, B=1, H=1, T=5)
    o, fin = reference_apply(cfg, q, k, v, g, st)
    kk, vv, e = k[0, :, 0], v[0, :, 0], g["eta"][0, :, 0]

    def grad(W, t):
        return outer(W @ kk[t] - vv[t], kk[t])

    W0 = st["W"][0, 0]
    W1 = W0 - e[0] * grad(W0, 0)
    W2 = W1 - e[1] * grad(W0, 1)  # anchor W0
    W3 = W2 - e[2] * grad(W2, 2)  # new chunk: anchor W2
    W4 = W3 - e[3] * grad(W2, 3)
    W5 = W4 - e[4] * grad(W4, 4)
    for t, W in enumerate((W1, W2, W3, W4, W5)):
        torch.testing.assert_close(o[0, t, 0], W @ q[0, t, 0], rtol=1e-12, atol=1e-12)
    # exact (C = None) differs, so the anchor is really used
    o_exact, _ = reference_apply(REF_CONFIGS["deltanet"], q, k, v, g, st)
    assert rel(o_exact, o) > 1e-4


ENTROPIC = cfg_of(  # phi(w) = w log w: phi' = log w + 1, (phi')^{-1}(y) = exp(y - 1)
    retention=dict(
        kind="bregman", phi_prime=lambda w: torch.log(w) + 1, phi_prime_inv=lambda y: torch.exp(y - 1), positive=True
    ),
    learner=dict(kind="momentum", lr="gate", theta=0.9),
    parallel=2,
)


def test_entropic_mirror_by_hand():
    cfg = ENTROPIC
    q, k, v, g, st = setup(cfg, B=1, H=1, T=3)
    assert (st["W"] > 0).all()
    o, fin = reference_apply(cfg, q, k, v, g, st)
    kk, vv, e = k[0, :, 0], v[0, :, 0], g["eta"][0, :, 0]
    W0 = st["W"][0, 0]
    S1 = -e[0] * outer(W0 @ kk[0] - vv[0], kk[0])
    W1 = W0 * torch.exp(S1)
    S2 = 0.9 * S1 - e[1] * outer(W0 @ kk[1] - vv[1], kk[1])
    W2 = W1 * torch.exp(S2)
    S3 = 0.9 * S2 - e[2] * outer(W2 @ kk[2] - vv[2], kk[2])
    W3 = W2 * torch.exp(S3)
    for t, W in enumerate((W1, W2, W3)):
        torch.testing.assert_close(o[0, t, 0], W @ q[0, t, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fin["S_W"][0, 0], S3, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------- retentions


def test_kl_rows_sum_to_c_and_stay_positive():
    c = 2.5
    cfg = dict(REF_CONFIGS["memora_token"], retention=dict(kind="kl", c=c, alpha="gate"), parallel=4)
    q, k, v, g, st = setup(cfg, T=9, Dk=4, Dv=4)
    for key in st:
        torch.testing.assert_close(st[key].sum(-1), torch.full(st[key].shape[:-1], c, dtype=f64))
    _, fin = reference_apply(cfg, q, k, v, g, st)
    for key, W in fin.items():
        assert (W > 0).all()
        torch.testing.assert_close(W.sum(-1), torch.full(W.shape[:-1], c, dtype=f64), rtol=1e-12, atol=1e-12)
        assert rel(W, st[key]) > 1e-4  # it moved


def test_kl_linear_one_step_by_hand():
    cfg = cfg_of(retention=dict(kind="kl", c=1.0, alpha="gate"))
    q, k, v, g, st = setup(cfg, B=1, H=1, T=1)
    _, fin = reference_apply(cfg, q, k, v, g, st)
    W0, kt, vt = st["W"][0, 0], k[0, 0, 0], v[0, 0, 0]
    Z = g["alpha"][0, 0, 0] * torch.log(W0) - g["eta"][0, 0, 0] * outer(W0 @ kt - vt, kt)
    expect = torch.exp(Z) / torch.exp(Z).sum(-1, keepdim=True)
    torch.testing.assert_close(fin["W"][0, 0], expect, rtol=1e-12, atol=1e-12)


def test_lq_with_q2_equals_decay():
    mlp = dict(kind="mlp", depth=2, expansion=2, act="tanh", residual=False, norm="none")
    lq = cfg_of(memory=mlp, bias=dict(kind="lp", p=3.0, eps=1e-6), retention=dict(kind="lq", q=2.0, alpha="gate"))
    dec = dict(lq, retention=dict(kind="decay", alpha="gate", order="post"))
    q, k, v, g, st = setup(lq, T=7, Dk=3, Dv=3)
    o1, f1 = reference_apply(lq, q, k, v, g, st)
    o2, f2 = reference_apply(dec, q, k, v, g, {n: st[n] for n in ("W1", "W2")})
    torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f1["A_W1"], f2["W1"], rtol=1e-12, atol=1e-12)
    # and q = 4 does something else
    o4, _ = reference_apply(dict(lq, retention=dict(kind="lq", q=4.0, alpha="gate")), q, k, v, g, st)
    assert rel(o4, o2) > 1e-3


def test_lq_readout_normalises():
    cfg = cfg_of(retention=dict(kind="lq", q=4.0, alpha="gate"))
    q, k, v, g, st = setup(cfg, T=3)
    _, fin = reference_apply(cfg, q, k, v, g, st)
    A, W = fin["A_W"], fin["W"]
    nA = (A**4).sum((-2, -1)) ** 0.25
    nW = (W**4).sum((-2, -1)) ** 0.25
    torch.testing.assert_close(nW * nA, torch.ones_like(nA), rtol=1e-12, atol=1e-12)  # ||W||_4 = 1/||A||_4


def test_elastic_lam0_equals_decay_and_lam_sparsifies():
    el = cfg_of(bias=dict(kind="lp", p=1.5, eps=1e-6), retention=dict(kind="elastic", lam=0.0, alpha="gate"))
    dec = dict(el, retention=dict(kind="decay", alpha="gate", order="post"))
    q, k, v, g, st = setup(el, T=7)
    o1, _ = reference_apply(el, q, k, v, g, st)
    o2, _ = reference_apply(dec, q, k, v, g, {"W": st["W"]})
    torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-12)
    big = dict(el, retention=dict(kind="elastic", lam=0.2, alpha="gate"))
    _, fin = reference_apply(big, q, k, v, g, st)
    A, W = fin["A_W"], fin["W"]
    assert ((A.abs() <= 0.2) == (W == 0)).all() and (W == 0).any() and (W != 0).any()
    torch.testing.assert_close(W.abs(), (A.abs() - 0.2).clamp_min(0), rtol=0, atol=1e-15)


def test_hyperbolic_mirror_by_hand():
    cfg = dict(REF_CONFIGS["hyperbolic_mirror"], parallel=2)
    q, k, v, g, st = setup(cfg, B=1, H=1, T=3)
    st["S_W"] = torch.full_like(st["W"], 0.3)
    o, fin = reference_apply(cfg, q, k, v, g, st)
    kk, vv, e = k[0, :, 0], v[0, :, 0], g["eta"][0, :, 0]
    W0 = st["W"][0, 0]
    S1 = 0.9 * 0.3 - e[0] * outer(W0 @ kk[0] - vv[0], kk[0])
    W1 = torch.asinh(torch.sinh(W0) + S1)
    S2 = 0.9 * S1 - e[1] * outer(W0 @ kk[1] - vv[1], kk[1])
    W2 = torch.asinh(torch.sinh(W1) + S2)
    S3 = 0.9 * S2 - e[2] * outer(W2 @ kk[2] - vv[2], kk[2])
    W3 = torch.asinh(torch.sinh(W2) + S3)
    for t, W in enumerate((W1, W2, W3)):
        torch.testing.assert_close(o[0, t, 0], W @ q[0, t, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fin["W"][0, 0], W3, rtol=1e-12, atol=1e-12)


def test_bregman_quadratic_potential_equals_no_retention():
    br = cfg_of(retention=dict(kind="bregman", phi_prime=lambda w: w, phi_prime_inv=lambda y: y))
    q, k, v, g, st = setup(br, T=7)
    o1, f1 = reference_apply(br, q, k, v, g, st)
    o2, f2 = reference_apply(REF_CONFIGS["deltanet"], q, k, v, g, st)
    torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------- biases


def _one_step_W(cfg, seed=0, B=2, H=2, Dk=4, Dv=3):
    cfg = dict(cfg, learner=dict(kind="gd", lr=1.0))
    q, k, v, g, st = setup(cfg, B=B, H=H, T=1, Dk=Dk, Dv=Dv, seed=seed)
    _, fin = reference_apply(cfg, q, k, v, g, st)
    return fin["W"] - st["W"], k[:, 0], v[:, 0], st["W"], g  # U = -g


def _e(W, k, v):
    return torch.einsum("bhvk,bhk->bhv", W, k) - v


def test_l2_and_dot_gradients_by_hand():
    U, k, v, W, _ = _one_step_W(cfg_of())
    torch.testing.assert_close(-U, _e(W, k, v)[..., None] * k[..., None, :], rtol=1e-12, atol=1e-12)
    U, k, v, W, _ = _one_step_W(cfg_of(bias=dict(kind="dot")))
    torch.testing.assert_close(U, v[..., None] * k[..., None, :], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "bias",
    [
        dict(kind="lp", p=2.0, eps=0.0),
        dict(kind="custom", f=lambda e: 0.5 * e * e),
        dict(kind="huber", delta=1e6, mode="coordinate"),
        dict(kind="huber", delta=1e6, mode="mixture"),
    ],
    ids=["lp2", "custom_half_square", "huber_big", "mixture_big"],
)
def test_biases_reducing_to_l2(bias):
    U1, *_ = _one_step_W(cfg_of(bias=bias))
    U2, *_ = _one_step_W(cfg_of())
    torch.testing.assert_close(U1, U2, rtol=1e-12, atol=1e-12)


def test_lp_gradient_by_hand():
    U, k, v, W, _ = _one_step_W(cfg_of(bias=dict(kind="lp", p=3.0, eps=1e-6)))
    e = _e(W, k, v)
    dl_de = e * (e * e + 1e-6) ** 0.5  # d/de (1/p)(e^2+eps)^{p/2} = e (e^2+eps)^{p/2-1}
    torch.testing.assert_close(-U, dl_de[..., None] * k[..., None, :], rtol=1e-12, atol=1e-12)


def test_huber_gradients_by_hand():
    # coordinate-wise, delta = 0.3: clip each coordinate of e
    U, k, v, W, _ = _one_step_W(cfg_of(bias=dict(kind="huber", delta=0.3, mode="coordinate")))
    e = _e(W, k, v)
    assert (e.abs() > 0.3).any() and (e.abs() < 0.3).any(), "both branches should be exercised"
    torch.testing.assert_close(-U, e.clamp(-0.3, 0.3)[..., None] * k[..., None, :], rtol=1e-12, atol=1e-12)
    # mixture with a gate: per row, e if ||e|| <= delta else delta * sign(e)
    cfg = cfg_of(bias=dict(kind="huber", delta="gate", mode="mixture"))
    cfg["gate_ranges"] = dict(delta=(0.5, 2.5))
    found = set()
    for seed in range(4):
        U, k, v, W, g = _one_step_W(cfg, seed=seed, B=4, H=4)
        e = _e(W, k, v)
        d = g["delta"][:, 0][..., None]
        small = e.norm(dim=-1, keepdim=True) <= d
        found |= set(small.flatten().tolist())
        de = torch.where(small, e, d * torch.sign(e))
        torch.testing.assert_close(-U, de[..., None] * k[..., None, :], rtol=1e-12, atol=1e-12)
    assert found == {True, False}


def test_cauchy_gradient_by_hand():
    cfg = dict(REF_CONFIGS["custom_cauchy"], retention=dict(kind="none"))
    U, k, v, W, _ = _one_step_W(cfg)
    e = _e(W, k, v)
    torch.testing.assert_close(-U, (e / (1 + e * e / 2))[..., None] * k[..., None, :], rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------- memories


def test_mlp_forward_by_hand():
    mem = dict(kind="mlp", depth=3, expansion=2, act="tanh", residual=True, norm="layernorm")
    g = torch.Generator().manual_seed(0)
    W = {n: torch.randn(1, 1, *s, generator=g, dtype=f64) for n, s in (("W1", (6, 3)), ("W2", (6, 6)), ("W3", (3, 6)))}
    x = torch.randn(1, 1, 3, generator=g, dtype=f64)
    y = W["W3"][0, 0] @ torch.tanh(W["W2"][0, 0] @ torch.tanh(W["W1"][0, 0] @ x[0, 0]))
    y = (y - y.mean()) / torch.sqrt(y.var(unbiased=False) + 1e-5)
    torch.testing.assert_close(memory_forward(mem, W, x)[0, 0], x[0, 0] + y, rtol=1e-12, atol=1e-12)
    gelu = dict(mem, act="gelu", depth=2, residual=False, norm="none")
    h = W["W1"][0, 0] @ x[0, 0]
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    W2 = {"W1": W["W1"], "W2": W["W3"]}
    torch.testing.assert_close(memory_forward(gelu, W2, x)[0, 0], W["W3"][0, 0] @ h, rtol=1e-12, atol=1e-12)


def test_mlp_depth1_identity_equals_linear():
    mlp1 = dict(kind="mlp", depth=1, expansion=4, act="identity", residual=False, norm="none")
    lin = REF_CONFIGS["deltanet"]
    q, k, v, g, st = setup(lin, T=6)
    o1, f1 = reference_apply(lin, q, k, v, g, st)
    o2, f2 = reference_apply(cfg_of(memory=mlp1), q, k, v, g, {"W1": st["W"]})
    assert make_state(cfg_of(memory=mlp1), 2, 2, 4, 3)["W1"].shape == (2, 2, 3, 4)
    torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f1["W"], f2["W1"], rtol=1e-12, atol=1e-12)


def test_mlp_relu_gradient_by_hand():
    mlp = dict(kind="mlp", depth=2, expansion=2, act="relu", residual=False, norm="none")
    cfg = cfg_of(memory=mlp, learner=dict(kind="gd", lr=1.0))
    q, k, v, g, st = setup(cfg, B=1, H=1, T=1)
    _, fin = reference_apply(cfg, q, k, v, g, st)
    W1, W2, x, vt = st["W1"][0, 0], st["W2"][0, 0], k[0, 0, 0], v[0, 0, 0]
    pre = W1 @ x
    h = pre.clamp_min(0)
    e = W2 @ h - vt
    torch.testing.assert_close(st["W2"][0, 0] - fin["W2"][0, 0], outer(e, h), rtol=1e-12, atol=1e-12)
    dh = (W2.T @ e) * (pre > 0)
    torch.testing.assert_close(st["W1"][0, 0] - fin["W1"][0, 0], outer(dh, x), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------- structure


@pytest.mark.parametrize("name", sorted(REF_CONFIGS))
def test_state_passing_at_chunk_boundary(name):
    """Running [0, s) then [s, T) from the returned state equals one run (s a multiple of C)."""
    cfg = dict(REF_CONFIGS[name])
    C = cfg["parallel"]
    if C is not None:
        cfg["parallel"] = C = 3
    s = 6 if C else 4
    q, k, v, g, st = setup(cfg, T=9, Dk=3, Dv=3)
    if "S_W1" in st or "S_W" in st:
        st = {key: x + 0.05 if key.startswith("S_") else x for key, x in st.items()}
    o, fin = reference_apply(cfg, q, k, v, g, st)
    o1, mid = reference_apply(cfg, q[:, :s], k[:, :s], v[:, :s], {n: x[:, :s] for n, x in g.items()}, st)
    o2, fin2 = reference_apply(cfg, q[:, s:], k[:, s:], v[:, s:], {n: x[:, s:] for n, x in g.items()}, mid)
    torch.testing.assert_close(torch.cat([o1, o2], 1), o, rtol=1e-12, atol=1e-12)
    for key in fin:
        torch.testing.assert_close(fin2[key], fin[key], rtol=1e-12, atol=1e-12)


def test_undeclared_gates_take_defaults():
    # no gates at all: eta = 1, alpha = 1 (decay == none), theta = 0 (momentum == gd)
    base = cfg_of(learner=dict(kind="gd"))
    q, k, v, _, st = setup(base, T=5)
    o1, _ = reference_apply(base, q, k, v, {}, st)
    o2, _ = reference_apply(cfg_of(learner=dict(kind="gd", lr=1.0)), q, k, v, {}, st)
    o3, _ = reference_apply(
        cfg_of(learner=dict(kind="momentum", lr=1.0), retention=dict(kind="decay")), q, k, v, {}, st
    )
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    torch.testing.assert_close(o3, o2, rtol=1e-12, atol=1e-12)


def _flat_inputs(cfg, T, D, seed=0):
    q, k, v, g, st = setup(cfg, B=1, H=1, T=T, Dk=D, Dv=D, seed=seed)
    gn, sn = list(g), list(st)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, *g.values(), *st.values())]

    def fn(*xs):
        gates = dict(zip(gn, xs[3 : 3 + len(gn)]))
        state = dict(zip(sn, xs[3 + len(gn) :]))
        o, fin = reference_apply(cfg, xs[0], xs[1], xs[2], gates, state)
        return (o, *fin.values())

    return fn, leaves


@pytest.mark.parametrize("name", ["deltanet", "sparse_lp", "yaad"])
def test_reference_is_differentiable(name):
    cfg = dict(REF_CONFIGS[name])
    if cfg["parallel"]:
        cfg["parallel"] = 2
    if name == "yaad":
        cfg["memory"] = dict(cfg["memory"], expansion=1)
        cfg["gate_ranges"] = dict(delta=(0.5, 3.0))
    fn, leaves = _flat_inputs(cfg, T=4, D=2)
    assert torch.autograd.gradcheck(fn, leaves, atol=1e-6, rtol=1e-5)


def test_reference_gradient_wrt_every_input_is_nonzero():
    cfg = dict(REF_CONFIGS["titans"], parallel=2)
    fn, leaves = _flat_inputs(cfg, T=5, D=3)
    out = fn(*leaves)
    w = [torch.randn(x.shape, generator=torch.Generator().manual_seed(i), dtype=f64) for i, x in enumerate(out)]
    loss = sum((x * wi).sum() for x, wi in zip(out, w))
    grads = torch.autograd.grad(loss, leaves)
    assert len(grads) == 3 + 3 + 4  # q, k, v; eta, alpha, theta; W1, W2, S_W1, S_W2
    for gr in grads:
        assert torch.isfinite(gr).all() and gr.abs().max() > 0


def test_no_grad_context_is_fine():
    with torch.no_grad():
        q, k, v, g, st = setup("ttt_mlp", T=4, Dk=3, Dv=3)
        o, _ = reference_apply("ttt_mlp", q, k, v, g, st)
    assert torch.isfinite(o).all() and not o.requires_grad
