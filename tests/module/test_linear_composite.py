"""Composite linear memories: per-head constant coefficients, feature maps and the normaliser.

Per-head constants (docs/language.md, "Per-head constants"): a coefficient written as an expression in the head
index h and the head count H, e.g. RetNet's γ_h = 1 − 2^(−5−h). Checked here: parsing, the canonical round trip,
located errors for out-of-range or unknown names, the op's own range check for head counts past the compiler's,
RetNet against the float64 token-by-token reference (tests/reference.py evaluates the γ_h itself; outputs, final
states and every gradient, recurrent and chunked) and ALiBi (a nonparametric memory with a per-head decay) against
softmax attention with the linear bias −m_h (t − s) written out. RetNet against flash-linear-attention's
naive_retention (every head) is in tests/peers/test_peers_fla.py; the Triton kernels against torch in
tests/triton_backend/test_triton_chunked.py and tests/triton_backend/test_triton_recurrent.py (both include retnet).

Feature maps and the normaliser (docs/semantics.md, "Feature maps and the normaliser"): linear(feature=elu1 | taylor
| hedgehog, normalize=true). The bundled specs (linear_attention_elu, based) are in tests/module/test_semantics.py
against the float64 reference; here: every map with and without the normaliser, with a decay gate, against a token
loop written out below (outputs, final W and z, gradients of q, k, v, the gates, the initial state and Hedgehog's
parameters), against flash-linear-attention (naive_recurrent_linear_attn with normalize=True on elu+1, Taylor and
Hedgehog features from fla.modules.feature_map; naive_parallel_based; Based against the quadratic nonparametric poly
kernel), Layer.step against Layer.forward, the Triton kernels under the interpreter, and the rejections.

The chunked momentum delta rule (linear + l2 + momentum, docs/semantics.md "Equivalent forms"): the bundled
specs/momentum_deltanet.miras is in tests/module/test_semantics.py (chunked vs recurrent vs the float64 reference, with
gradients) and in tests/peers/test_fla_mappings.py (FLA's momentum_delta_rule with p = k); here the other retentions
(order=pre, none, a per-head constant) against the float64 reference with gradients, across chunk sizes.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from reference import make_inputs, make_state, reference_apply, rel

import mirasc
from mirasc.language.frontend import parse_text
from mirasc.language.messages import SpecError

F = torch.nn.functional

ROOT = Path(__file__).resolve().parents[2]
D64 = torch.float64


def linear_spec(alpha="1 - 2^(-5 - h)", lr="1", bias="dot"):
    return (f"model m {{ memory = linear\n bias = {bias}\n retention = decay(alpha={alpha})\n"
            f" learner = gd(lr={lr}) }}")


# ------------------------------------------------------------------------------------------------- the language
def test_per_head_constant_parses_and_round_trips():
    spec = parse_text(linear_spec())
    (name, coef), = spec.per_head().items()
    assert name == "alpha" and {s.name for s in coef.expr.free_symbols} == {"h"}
    assert spec.gates == ()  # not an input of the op
    assert parse_text(spec.canonical()).canonical() == spec.canonical()
    # an expression without h or H is folded to a number
    assert parse_text(linear_spec(alpha="1 - 2^(-5)")).retention.alpha == 0.96875


@pytest.mark.parametrize("alpha,message", [
    ("2 - h", "at head h = 0 it is 2"),                          # α outside [0, 1]
    ("1 - 2^(-h)/x", "unknown name `x` in expression"),          # only h, H, numbers and pi
    ("log(h - 1)", "at head h = 0 it is not a finite real number"),
    ("h/(H - 2)", "at head h = 0 of H = 2"),                     # the H-dependent form is checked for every H
])
def test_bad_per_head_constants_are_located(alpha, message):
    with pytest.raises(SpecError) as err:
        parse_text(linear_spec(alpha=alpha))
    assert message in str(err.value) and str(err.value).startswith("<spec>:3:")


def test_op_checks_the_range_past_the_compilers_head_counts():
    # lr_h = 1 − h/64 is >= 0 for every head the compiler checks (H <= 64) and negative at h = 65
    mod = mirasc.compile_spec(linear_spec(lr="1 - h/64", alpha="1"))
    q = torch.randn(1, 3, 66, 4, dtype=D64)
    with pytest.raises(ValueError, match="per-head eta"):
        mod.apply(q, q, q)
    mod.apply(q[:, :, :64], q[:, :, :64], q[:, :, :64])


# ------------------------------------------------------------------------------------------------ RetNet, exact
@pytest.mark.parametrize("algorithm,chunk", [("recurrent", None), ("chunked", 4)])
def test_retnet_matches_the_float64_reference(algorithm, chunk):
    mod = mirasc.compile_spec(ROOT / "specs" / "retnet.miras")
    B, T, H, Dk, Dv = 2, 11, 3, 4, 5
    q, k, v, gates = make_inputs("retnet", B, T, H, Dk, Dv)
    state = make_state("retnet", B, H, Dk, Dv)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, state["W"])]
    o, fin = mod.apply(*leaves[:3], state={"W": leaves[3]}, algorithm=algorithm, chunk_size=chunk)
    o_ref, fin_ref = reference_apply("retnet", *leaves[:3], gates, {"W": leaves[3]})
    assert rel(o, o_ref) < 1e-12 and rel(fin["W"], fin_ref["W"]) < 1e-12
    g = torch.Generator().manual_seed(3)
    do, dW = torch.randn(o.shape, generator=g, dtype=D64), torch.randn(fin["W"].shape, generator=g, dtype=D64)
    ours = torch.autograd.grad((o * do).sum() + (fin["W"] * dW).sum(), leaves)
    ref = torch.autograd.grad((o_ref * do).sum() + (fin_ref["W"] * dW).sum(), leaves)
    for a, b in zip(ours, ref):
        assert rel(a, b) < 1e-10
    # the heads decay at their own rates: head 2 (γ = 1 − 2⁻⁷) keeps more of W0 than head 0 (γ = 1 − 2⁻⁵)
    zero = {"W": torch.zeros_like(state["W"])}
    o0, _ = mod.apply(q, k, v, state=zero)
    kept = (o - o0).detach()[:, -1].norm(dim=(0, 2))
    assert kept[2] > kept[0]


# ----------------------------------------------------------------------------------- ALiBi: decaying attention
def test_alibi_is_softmax_attention_with_a_linear_bias_per_head():
    """α_h = exp(−m_h), m_h = 2^(−8(h+1)/H): the pair stored at s has weight α_h^(t−s) = exp(−m_h (t − s)),
    ALiBi's bias (Press et al. 2022) on the softmax logits."""
    mod = mirasc.compile_spec("model alibi { memory = nonparametric(kernel=softmax)\n"
                              " retention = decay(alpha=exp(-2^(-8*(h + 1)/H))) }")
    assert mod.GATES == ()
    B, T, H, D = 2, 13, 4, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=D64, requires_grad=True) for _ in range(3))
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], dtype=D64)
    pos = torch.arange(T, dtype=D64)
    bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :])  # [H, T, T]
    logits = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D) + bias
    logits = logits.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
    ref = torch.einsum("bhts,bshd->bthd", torch.softmax(logits, -1), v)
    for algorithm in ("recurrent", "chunked"):
        o, _ = mod.apply(q, k, v, algorithm=algorithm)
        assert rel(o, ref) < 1e-12
        ours = torch.autograd.grad(o.square().sum(), (q, k, v))
        theirs = torch.autograd.grad(ref.square().sum(), (q, k, v), retain_graph=True)
        for a, b in zip(ours, theirs):
            assert rel(a, b) < 1e-10


# ------------------------------------------------------------------------------ feature maps and the normaliser
def feature_spec(feature, normalize, eps=None, retention="decay(alpha=gate)", lr="gate"):
    extra = f", eps={eps}" if eps is not None else ""
    return (f"model m {{ memory = linear(feature={feature}, normalize={str(normalize).lower()}{extra})\n bias = dot\n"
            f" retention = {retention}\n learner = gd(lr={lr}) }}")


def phi(feature, x, U=None, c=None):
    """The feature maps as docs/semantics.md states them (Taylor as explicit pairs i <= j, row-major)."""
    if feature == "elu1":
        return F.elu(x) + 1
    if feature == "taylor":
        D = x.shape[-1]
        cross = [x[..., i] * x[..., j] for i in range(D) for j in range(i + 1, D)]
        return torch.cat([torch.ones_like(x[..., :1]), x, x * x / math.sqrt(2), torch.stack(cross, -1)], -1)
    u = torch.einsum("bthd,hed->bthe", x, U) + c  # hedgehog: U [H, D, D], c [H, D]
    return torch.softmax(torch.cat([u, -u], -1), -1)


def token_loop(feature, normalize, eps, q, k, v, eta, alpha, W0, z0, U=None, c=None):
    """W_t = α_t W_{t-1} + η_t v_t φ(k_t)ᵀ, z_t = α_t z_{t-1} + η_t φ(k_t), o_t = W_t φ(q_t) [/ (z_tᵀφ(q_t) + eps)]."""
    fq, fk = phi(feature, q, U, c), phi(feature, k, U, c)
    W, z, outs = W0, z0[:, :, 0], []
    for t in range(q.shape[1]):
        a, e = alpha[:, t, :, None, None], eta[:, t, :, None, None]
        W = a * W + e * v[:, t, :, :, None] * fk[:, t, :, None, :]
        z = a[..., 0] * z + e[..., 0] * fk[:, t]
        o = torch.einsum("bhvf,bhf->bhv", W, fq[:, t])
        outs.append(o / ((z * fq[:, t]).sum(-1, keepdim=True) + eps) if normalize else o)
    return torch.stack(outs, 1), W, z[:, :, None]


@pytest.mark.parametrize("feature", ["elu1", "taylor", "hedgehog"])
@pytest.mark.parametrize("normalize", [True, False])
def test_feature_maps_match_the_token_loop(feature, normalize):
    mod = mirasc.compile_spec(feature_spec(feature, normalize))
    B, T, H, Dk, Dv = 2, 9, 2, 4, 3
    Df = mod.feature_dim(Dk)
    assert Df == {"elu1": Dk, "taylor": 1 + Dk + Dk * (Dk + 1) // 2, "hedgehog": 2 * Dk}[feature]
    g = torch.Generator().manual_seed(5)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=D64)  # noqa: E731
    leaves = dict(q=rnd(B, T, H, Dk), k=rnd(B, T, H, Dk), v=rnd(B, T, H, Dv),
                  eta=0.1 + 0.8 * torch.rand(B, T, H, generator=g, dtype=D64),
                  alpha=0.8 + 0.2 * torch.rand(B, T, H, generator=g, dtype=D64),
                  W0=0.3 * rnd(B, H, Dv, Df), z0=torch.rand(B, H, 1, Df, generator=g, dtype=D64))
    if feature == "hedgehog":
        leaves.update(U=torch.eye(Dk, dtype=D64) + 0.3 * rnd(H, Dk, Dk), c=0.3 * rnd(H, Dk))
    for x in leaves.values():
        x.requires_grad_(True)
    x = leaves
    params = {"feature_U": x["U"], "feature_c": x["c"]} if feature == "hedgehog" else None
    ref_o, ref_W, ref_z = token_loop(feature, normalize, 1e-6, x["q"], x["k"], x["v"], x["eta"], x["alpha"], x["W0"],
                                     x["z0"], x.get("U"), x.get("c"))
    used = [n for n in leaves if normalize or n != "z0"]
    for algorithm in ("recurrent", "chunked"):
        state = {"W": x["W0"], "z": x["z0"]} if normalize else {"W": x["W0"]}
        o, fin = mod.apply(x["q"], x["k"], x["v"], {"eta": x["eta"], "alpha": x["alpha"]}, state=state,
                           params=params, algorithm=algorithm, chunk_size=4)
        assert rel(o, ref_o) < 1e-12 and rel(fin["W"], ref_W) < 1e-12
        loss = o.square().sum() + fin["W"].sum()
        ref_loss = ref_o.square().sum() + ref_W.sum()
        if normalize:
            assert rel(fin["z"], ref_z) < 1e-12
            loss, ref_loss = loss + fin["z"].square().sum(), ref_loss + ref_z.square().sum()
        ours = torch.autograd.grad(loss, [leaves[n] for n in used])
        ref = torch.autograd.grad(ref_loss, [leaves[n] for n in used], retain_graph=True)
        for n, a, b in zip(used, ours, ref):
            assert rel(a, b) < 1e-10, n


def test_normaliser_with_key_channel_gates():
    """decay(alpha=gate(k)), lr=gate(k) on elu1 features: W_t = W_{t-1} diag(α_t) + v_t (η_t ⊙ φ(k_t))ᵀ and
    z_t = z_{t-1} ⊙ α_t + η_t ⊙ φ(k_t) (docs/semantics.md), recurrent and chunked."""
    mod = mirasc.compile_spec("model m { memory = linear(feature=elu1, normalize=true)\n bias = dot\n"
                              " retention = decay(alpha=gate(k))\n learner = gd(lr=gate(k)) }")
    B, T, H, D, Dv = 2, 11, 2, 4, 3
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, d, generator=g, dtype=D64) for d in (D, D, Dv))
    alpha = 0.8 + 0.2 * torch.rand(B, T, H, D, generator=g, dtype=D64)
    eta = torch.rand(B, T, H, D, generator=g, dtype=D64)
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    W, z, outs = torch.zeros(B, H, Dv, D, dtype=D64), torch.zeros(B, H, D, dtype=D64), []
    for t in range(T):
        W = W * alpha[:, t, :, None, :] + v[:, t, :, :, None] * (eta[:, t] * fk[:, t])[:, :, None, :]
        z = z * alpha[:, t] + eta[:, t] * fk[:, t]
        outs.append(torch.einsum("bhvd,bhd->bhv", W, fq[:, t]) / ((z * fq[:, t]).sum(-1, keepdim=True) + 1e-6))
    ref = torch.stack(outs, 1)
    for algorithm in ("recurrent", "chunked"):
        o, fin = mod.apply(q, k, v, {"eta": eta, "alpha": alpha}, algorithm=algorithm, chunk_size=4)
        assert rel(o, ref) < 1e-12 and rel(fin["W"], W) < 1e-12 and rel(fin["z"][:, :, 0], z) < 1e-12


@pytest.fixture(scope="module")
def fla():
    pytest.importorskip("fla")
    import importlib

    names = {"linear_attn": "ops.linear_attn.naive", "based": "ops.based.naive", "feature_map": "modules.feature_map"}
    return {key: importlib.import_module("fla." + path) for key, path in names.items()}


def _fla_inputs(B=2, T=20, H=2, Dk=8, Dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, T, H, d, generator=g).requires_grad_(True) for d in (Dk, Dk, Dv))


def _compare(ours, theirs, leaves, tol=1e-5):
    o, o_ref = ours[0], theirs[0]
    assert rel(o, o_ref) < tol
    for a, b in zip(ours[1:], theirs[1:]):
        assert rel(a, b) < tol
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(o.shape, generator=gen)
    grads = []
    for out in (o, o_ref):  # .backward: FLA's Taylor map is a reentrant checkpoint, which autograd.grad refuses
        for x in leaves:
            x.grad = None
        (out * do).sum().backward(retain_graph=True)
        grads.append([x.grad.clone() for x in leaves])
    for a, b in zip(*grads):
        assert rel(a, b) < 1e-4


@pytest.mark.parametrize("feature", ["elu1", "taylor", "hedgehog"])
def test_normalised_linear_attention_vs_fla(fla, feature):
    """FLA's linear attention with normalize=True on the features of fla.modules.feature_map: its op takes the
    mapped q, k (scale 1) and divides by q·Σk + 1e-10. Taylor: FLA's map scales x by Dk^(-1/4) first (our q, k
    are passed as x·Dk^(-1/4)), its coordinates are ours. Hedgehog: FLA's map is softmax([2(Ax + b), −2(Ax + b)])
    with one Linear shared by the heads: U = 2A, c = 2b on every head."""
    q, k, v = _fla_inputs()
    B, T, H, Dk = q.shape
    mod = mirasc.compile_spec(feature_spec(feature, True, eps=1e-10, retention="none", lr="1"))
    params, scale = None, 1.0
    if feature == "elu1":
        fmap = lambda x: F.elu(x) + 1  # noqa: E731  (FLA's linear attention layer's elu feature map)
    elif feature == "taylor":
        fmap, scale = fla["feature_map"].TaylorFeatureMap(Dk), Dk ** -0.25
    else:
        fmap = fla["feature_map"].HedgehogFeatureMap(Dk)
        with torch.no_grad():
            fmap.layer.weight.add_(0.3 * torch.randn(Dk, Dk, generator=torch.Generator().manual_seed(2)))
            fmap.layer.bias.normal_(0, 0.3, generator=torch.Generator().manual_seed(3))
        params = {"feature_U": 2 * fmap.layer.weight.detach().expand(H, Dk, Dk),
                  "feature_c": 2 * fmap.layer.bias.detach().expand(H, Dk)}
    o_ref, (S, z) = fla["linear_attn"].naive_recurrent_linear_attn(fmap(q), fmap(k), v, scale=1.0, normalize=True,
                                                             output_final_state=True)
    o, fin = mod.apply(q * scale, k * scale, v, params=params)
    _compare((o, fin["W"], fin["z"][:, :, 0]), (o_ref, S.transpose(-1, -2), z[:, 0]), (q, k, v))


def test_based_vs_fla_parallel_and_the_poly_kernel(fla):
    """specs/based.miras (linear time) = FLA's naive_parallel_based (quadratic; q scaled by Dk^(-1/2) inside, 1 + s +
    s²/2, divided by the row sum + 1e-6) = the nonparametric poly kernel of degree 2 (no eps)."""
    q, k, v = _fla_inputs(T=24)
    Dk = q.shape[-1]
    mod = mirasc.compile_spec(ROOT / "specs" / "based.miras")
    for algorithm in ("recurrent", "chunked"):
        o, _ = mod.apply(q * Dk ** -0.5, k, v, algorithm=algorithm, chunk_size=8)
        ref = fla["based"].naive_parallel_based(*(x.transpose(1, 2) for x in (q, k, v)), use_norm=True)
        _compare((o,), (ref.transpose(1, 2),), (q, k, v))
    poly = mirasc.compile_spec("model p { memory = nonparametric(kernel=poly, degree=2) }")
    o_poly, _ = poly.apply(q, k, v)
    o, _ = mod.apply(q * Dk ** -0.5, k, v)
    assert rel(o, o_poly) < 1e-5


def test_layer_step_matches_forward_with_features_and_normaliser():
    mod = mirasc.compile_spec(feature_spec("hedgehog", True))
    layer = mod.Layer(16, 2).double()
    assert set(layer.read_params) == {"feature_U", "feature_c"} and set(layer.initial) == {"W", "z"}
    assert all(p.is_contiguous() for p in layer.initial.values())  # (safetensors, the Hugging Face export, need it)
    x = torch.randn(2, 6, 16, dtype=D64)
    y = layer(x)
    cache = layer.init_cache(2)
    steps = []
    for t in range(6):
        y_t, cache = layer.step(x[:, t], cache)
        steps.append(y_t)
    assert rel(torch.stack(steps, 1), y) < 1e-12


@pytest.mark.parametrize("feature", ["elu1", "taylor"])
def test_triton_kernels_on_features_and_normaliser(feature):
    """The Triton kernels see φ(q), φ(k) and [v, 1] (TRITON_INTERPRET=1 on the CPU): recurrent and chunked, fp32."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(feature_spec(feature, True))
    B, T, H, Dk, Dv = 1, 12, 1, 4, 4
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(B, T, H, d, generator=g).requires_grad_(True) for d in (Dk, Dk, Dv))
    gates = {"eta": 0.1 + 0.8 * torch.rand(B, T, H, generator=g), "alpha": 0.8 + 0.2 * torch.rand(B, T, H, generator=g)}
    o_ref, fin_ref = mod.apply(q, k, v, gates, backend="torch", algorithm="recurrent")
    g_ref = torch.autograd.grad(o_ref.square().sum(), (q, k, v))
    for algorithm in ("recurrent", "chunked"):
        o, fin = mod.apply(q, k, v, gates, backend="triton", algorithm=algorithm, chunk_size=8)
        assert rel(o, o_ref) < 1e-4 and rel(fin["W"], fin_ref["W"]) < 1e-4 and rel(fin["z"], fin_ref["z"]) < 1e-4
        for a, b in zip(torch.autograd.grad(o.square().sum(), (q, k, v)), g_ref):
            assert rel(a, b) < 1e-4


@pytest.mark.parametrize("text,message", [
    ("memory = linear(feature=taylor, normalize=true)\n bias = l2", "defined for the Hebbian write"),
    ("memory = linear(normalize=true)\n bias = dot\n learner = momentum", "by gd"),
    ("memory = linear(normalize=true)\n bias = dot\n retention = lq(q=4)", "linear retention"),
    ("memory = linear(feature=hedgehog)\n bias = dot\n learner = gd(lr=gate(k))", "not per feature"),
    ("memory = linear(feature=elu1, eps=0.1)\n bias = dot", "`eps` is the normaliser's"),
    ("memory = linear(feature=elu1)\n bias = l2(read=kappa)", "the map on κ"),
])
def test_composite_rejections(text, message):
    with pytest.raises(SpecError) as err:
        parse_text(f"model m {{ {text} }}")
    assert message in str(err.value) and "illegal combination" in str(err.value)


# ------------------------------------------------------------------------------ chunked momentum delta rule
@pytest.mark.parametrize("retention,theta", [
    ("decay(alpha=gate, order=pre)", "gate"),
    ("none", "gate"),
    ("decay(alpha=1 - 2^(-3 - h))", "0.9"),   # a per-head decay and a constant θ
])
def test_momentum_delta_chunked_matches_the_float64_reference(retention, theta):
    text = (f"model m {{ memory = linear\n bias = l2\n retention = {retention}\n"
            f" learner = momentum(lr=gate, theta={theta}) }}")
    mod = mirasc.compile_spec(text)
    assert mod.CHUNKED
    spec = parse_text(text)
    r, th = spec.retention, spec.learner.theta
    per_head = r.kind == "decay" and not isinstance(r.alpha, str)
    per_head_alpha = (lambda h, H: 1 - 2.0 ** (-3 - h)) if per_head else "gate"
    cfg = dict(memory=dict(kind="linear"), bias=dict(kind="l2"), parallel=None,
               retention=dict(kind="none") if r.kind == "none" else dict(kind="decay", alpha=per_head_alpha,
                                                                          order=r.order),
               learner=dict(kind="momentum", lr="gate", theta="gate" if th == "gate" else float(th)))
    B, T, H, Dk, Dv = 2, 19, 3, 4, 5
    q, k, v, gates = make_inputs(cfg, B, T, H, Dk, Dv)
    state = make_state(cfg, B, H, Dk, Dv)
    state["S_W"] = 0.05 * torch.randn(state["S_W"].shape, generator=torch.Generator().manual_seed(4), dtype=D64)
    names = sorted(gates)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, state["W"], state["S_W"], *(gates[n] for n in names))]
    lg = dict(zip(names, leaves[5:]))
    st = {"W": leaves[3], "S_W": leaves[4]}
    o_ref, f_ref = reference_apply(cfg, *leaves[:3], lg, st)
    w = torch.randn(o_ref.shape, generator=torch.Generator().manual_seed(5), dtype=D64)
    ref_grads = torch.autograd.grad((o_ref * w).sum() + f_ref["W"].sum() + f_ref["S_W"].square().sum(), leaves)
    for chunk in (1, 5, 64):
        o, fin = mod.apply(*leaves[:3], lg, state=st, algorithm="chunked", chunk_size=chunk)
        assert rel(o, o_ref) < 1e-12 and rel(fin["W"], f_ref["W"]) < 1e-12 and rel(fin["S_W"], f_ref["S_W"]) < 1e-12
        grads = torch.autograd.grad((o * w).sum() + fin["W"].sum() + fin["S_W"].square().sum(), leaves)
        for a, b in zip(grads, ref_grads):
            assert rel(a, b) < 1e-10


def test_momentum_delta_with_channel_gates_has_no_chunked_form():
    mod = mirasc.compile_spec("model m { memory = linear\n bias = l2\n retention = decay(alpha=gate(k))\n"
                              " learner = momentum(lr=gate, theta=gate) }")
    assert not mod.CHUNKED
    q = torch.randn(1, 4, 1, 3)
    with pytest.raises(ValueError, match="scalar 2x2 factors"):
        mod.apply(q, q, q, {"eta": torch.rand(1, 4, 1), "alpha": torch.rand(1, 4, 1, 3), "theta": torch.rand(1, 4, 1)},
                  algorithm="chunked")


def test_alibi_on_the_flash_triton_kernel():
    """The per-head decay reaches the flash kernel as its log-decay input (TRITON_INTERPRET=1 on the CPU, fp32)."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec("model alibi { memory = nonparametric(kernel=softmax)\n"
                              " retention = decay(alpha=exp(-2^(-8*(h + 1)/H))) }")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 16, 2, 16, generator=g, requires_grad=True) for _ in range(3))
    o_ref, _ = mod.apply(q, k, v, backend="torch")
    o, _ = mod.apply(q, k, v, backend="triton")
    assert rel(o, o_ref) < 1e-5
    ours = torch.autograd.grad(o.square().sum(), (q, k, v))
    for a, b in zip(ours, torch.autograd.grad(o_ref.square().sum(), (q, k, v))):
        assert rel(a, b) < 1e-4
