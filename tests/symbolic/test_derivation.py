"""Unit tests of the symbolic derivation (mirasc.derive), the TorchPrinter and the IR passes (mirasc.ir)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch

from mirasc import compile_spec, ir
from mirasc import derive as D
from mirasc.language.frontend import parse_text
from mirasc.language.primitives import apow, relu, sigmoid, spow, step
from mirasc.printers import TorchPrinter, print_block

POINTS = [-2.3, -1.0, -0.37, -1e-3, 0.0, 1e-3, 0.25, 0.8, 1.0, 3.1]


def spec(bias="l2", retention="none", learner="gd", memory="linear", parallel="exact"):
    return parse_text(f"model m {{ memory = {memory}; bias = {bias}; retention = {retention}; learner = {learner}; "
                      f"parallel = {parallel} }}")


def derive(**kw) -> D.Derivation:
    return D.derive(spec(**kw))


# Reference semantics of mirasc's own primitives, for sympy.lambdify (scalar floats).
def _spow(x, a):
    return math.copysign(abs(x) ** a, x) if x != 0 else 0.0


SCALAR_PRIMITIVES = {
    "apow": lambda x, a: abs(x) ** a,
    "spow": _spow,
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)),
    "step": lambda x: 1.0 if x > 0 else 0.0,
    "relu": lambda x: max(x, 0.0),
}


def lambdified(expr, *syms):
    return sp.lambdify(syms, expr, modules=[SCALAR_PRIMITIVES, "math"])


def torch_eval(expr: sp.Expr, values: dict[sp.Symbol, torch.Tensor]) -> torch.Tensor:
    """Print `expr` with the backend's printer (print_block, with cse) and run the code on tensors."""
    names = {s: f"in_{s.name}" for s in expr.free_symbols}
    lines = print_block({"out": expr}, names)
    scope = {"torch": torch, **{names[s]: values[s] for s in names}}
    exec("\n".join(lines), scope)
    out = scope["out"]
    return out if isinstance(out, torch.Tensor) else torch.full_like(next(iter(values.values())), float(out))


def numeric_diff(f, x, h=1e-6):
    return (f(x + h) - f(x - h)) / (2 * h)


# ---------------------------------------------------------------------------------------------- biases
def test_l2_and_dot():
    assert derive(bias="l2").dloss == D.e
    assert derive(bias="dot").dloss == -D.v


def test_lp_derivative_finite_at_zero_with_eps():
    d = derive(bias="lp(p=3)")
    expected = D.e * sp.sqrt(D.e**2 + sp.Float(1e-6))  # d/de (1/3)(e²+eps)^{3/2}
    for x in POINTS:
        assert float(d.dloss.subs(D.e, x)) == pytest.approx(float(expected.subs(D.e, x)), rel=1e-12, abs=1e-15)
    out = torch_eval(d.dloss, {D.e: torch.tensor(POINTS, dtype=torch.float64)})
    assert torch.isfinite(out).all()
    assert out[POINTS.index(0.0)] == 0


@pytest.mark.parametrize("text", ["lp(p=1.5, eps=0)", "custom(loss=abs(e)^1.5/1.5)"])
def test_lp_15_eps0_derivative_finite_at_zero(text):
    d = derive(bias=text)
    assert d.dloss.has(spow)
    e = torch.tensor(POINTS, dtype=torch.float64)
    out = torch_eval(d.dloss, {D.e: e})
    assert torch.isfinite(out).all()
    assert torch.allclose(out, torch.sign(e) * e.abs() ** 0.5, rtol=1e-12, atol=0)
    # the symbolic value at 0 is finite too (no 0/0)
    assert d.dloss.subs(D.e, 0) == 0


def test_custom_abs_15_matches_closed_form_and_finite_difference():
    d = derive(bias="custom(loss=abs(e)^1.5)")
    f = lambdified(d.loss, D.e)
    df = lambdified(d.dloss, D.e)
    for x in POINTS:
        closed = 1.5 * math.copysign(1.0, x) * abs(x) ** 0.5 if x != 0 else 0.0
        assert df(x) == pytest.approx(closed, rel=1e-12, abs=1e-15)
        if abs(x) > 1e-2:
            assert df(x) == pytest.approx(numeric_diff(f, x), rel=1e-6)
    e = torch.tensor(POINTS, dtype=torch.float64)
    out = torch_eval(d.dloss, {D.e: e})
    assert torch.isfinite(out).all() and out[POINTS.index(0.0)] == 0
    assert torch.allclose(out, 1.5 * torch.sign(e) * e.abs().sqrt(), rtol=1e-12, atol=0)


def test_lp_1_eps0_is_sign_subgradient():
    d = derive(bias="lp(p=1, eps=0)")
    out = torch_eval(d.dloss, {D.e: torch.tensor([-2.0, 0.0, 0.5], dtype=torch.float64)})
    assert out.tolist() == [-1.0, 0.0, 1.0]


@pytest.mark.parametrize("delta", ["gate", "0.5"])
def test_huber_derivative(delta):
    d = derive(bias=f"huber(delta={delta})")
    dl = d.dloss
    assert isinstance(dl, sp.Piecewise)
    dval = 0.5
    vals = {D.delta: dval} if delta == "gate" else {}
    for x in POINTS:
        expected = x if abs(x) <= dval else dval * math.copysign(1.0, x)
        assert float(dl.subs({**vals, D.e: x})) == pytest.approx(expected, abs=1e-15)
    # and the derivative of the stated loss, numerically, away from the kinks
    f = lambdified(d.loss.subs(vals), D.e)
    for x in (-2.3, -0.37, 0.25, 3.1):
        assert numeric_diff(f, x) == pytest.approx(float(dl.subs({**vals, D.e: x})), rel=1e-6)


def test_huber_mixture_reads_row_norm():
    dl = derive(bias="huber(mode=mixture)").dloss
    assert dl.has(D.enorm) and dl.has(D.delta)
    assert float(dl.subs({D.e: -0.3, D.enorm: 0.9, D.delta: 1.0})) == pytest.approx(-0.3)
    assert float(dl.subs({D.e: -0.3, D.enorm: 1.1, D.delta: 1.0})) == pytest.approx(-1.0)


def test_custom_cauchy_derivative():
    d = derive(bias="custom(loss=log(1 + e^2/2))")
    df = lambdified(d.dloss, D.e)
    for x in POINTS:
        assert df(x) == pytest.approx(x / (1 + x * x / 2), rel=1e-12, abs=1e-15)


def test_implicit_longhorn_step():
    d = derive(bias="l2", learner="implicit")
    assert sp.simplify(d.dloss - D.e / (1 + D.cprox)) == 0
    assert d.dloss.free_symbols == {D.e, D.cprox}


def test_implicit_huber_prox():
    """prox of c·H_δ: e* = e/(1+c) while |e| ≤ δ(1+c), else e − cδ·sign(e); the update uses H'(e*)."""
    dl = derive(bias="huber(delta=1)", learner="implicit").dloss
    c = 1.0
    for x in (-5.0, -1.5, 0.0, 0.7, 1.99, 2.01, 4.0):
        e_star = x / (1 + c) if abs(x) <= 1 + c else x - c * math.copysign(1.0, x)
        expected = e_star if abs(e_star) <= 1 else math.copysign(1.0, e_star)
        assert float(dl.subs({D.e: x, D.cprox: c})) == pytest.approx(expected, abs=1e-12)
        # e* + c·H'(e*) = e
        assert e_star + c * expected == pytest.approx(x)


def test_implicit_dot_equals_gradient_step():
    assert derive(bias="dot", learner="implicit").dloss == -D.v


# ------------------------------------------------------------------------------------------- retention
def test_bregman_entropy_inverse_is_exp():
    d = derive(retention="bregman(phi=w*log(w))")
    assert d.positive_domain
    assert sp.simplify(d.phi_prime - (sp.log(D.w) + 1)) == 0
    assert sp.simplify(d.phi_prime_inv - sp.exp(D.u - 1)) == 0
    inv = lambdified(d.phi_prime_inv, D.u)
    fwd = lambdified(d.phi_prime, D.w)
    for w in (0.01, 0.5, 1.0, 7.0):
        assert inv(fwd(w)) == pytest.approx(w, rel=1e-12)


def test_bregman_cosh_inverse_is_stable_asinh():
    d = derive(retention="bregman(phi=cosh(w))")
    assert not d.positive_domain
    assert d.phi_prime_inv == sp.asinh(D.u)
    u = torch.tensor([-1e6, -30.0, -1.0, 0.0, 2.0, 1e6], dtype=torch.float64)
    out = torch_eval(d.phi_prime_inv, {D.u: u})
    assert torch.isfinite(out).all()
    assert torch.allclose(out, torch.asinh(u), rtol=1e-12)
    assert torch.allclose(torch.sinh(out), u, rtol=1e-10)


def test_bregman_quartic_inverse_is_real_cube_root():
    d = derive(retention="bregman(phi=w^4/4)")
    assert d.phi_prime == D.w**3
    u = torch.tensor([-8.0, -1.0, -1e-9, 0.0, 0.125, 27.0], dtype=torch.float64)
    out = torch_eval(d.phi_prime_inv, {D.u: u})
    assert torch.isfinite(out).all()
    assert torch.allclose(out, torch.sign(u) * u.abs() ** (1 / 3), rtol=1e-12)
    assert out[0].item() == pytest.approx(-2.0)


def test_bregman_rejections_are_derivation_errors():
    for phi, words in (("-w^2", "strictly convex"), ("w^3", "strictly convex"), ("w^2 + sin(w)", "cannot invert")):
        with pytest.raises(D.DerivationError) as info:
            derive(retention=f"bregman(phi={phi})")
        assert info.value.field == "retention" and info.value.param == "phi"
        assert words in info.value.message


def test_elastic_soft_threshold():
    d = derive(retention="elastic(lam=0.1, alpha=gate)")
    a = torch.tensor([-1.0, -0.1, -0.05, 0.0, 0.05, 0.3], dtype=torch.float64)
    out = torch_eval(d.entrywise, {D.a: a})
    assert torch.allclose(out, torch.sign(a) * torch.clamp_min(a.abs() - 0.1, 0), atol=1e-15)


def test_kl_marks_positive_domain():
    assert derive(retention="kl").positive_domain
    assert not derive(retention="decay").positive_domain


# ----------------------------------------------------------------------------------------- activations
@pytest.mark.parametrize("act,reference", [
    ("gelu", lambda x: torch.nn.functional.gelu(x)),
    ("silu", lambda x: torch.nn.functional.silu(x)),
    ("relu", torch.relu),
    ("tanh", torch.tanh),
    ("identity", lambda x: x),
])
def test_activation_and_derivative(act, reference):
    d = derive(memory=f"mlp(act={act})", parallel="minibatch(4)")
    x = torch.tensor(POINTS, dtype=torch.float64, requires_grad=True)
    ref = reference(x)
    (grad,) = torch.autograd.grad(ref.sum(), x)
    values = {D.x: x.detach()}
    act_out = torch_eval(d.act, values) if d.act.free_symbols else torch.full_like(x, float(d.act))
    grad_out = torch_eval(d.act_grad, values) if d.act_grad.free_symbols else torch.full_like(x, float(d.act_grad))
    assert torch.allclose(act_out, ref.detach(), rtol=1e-12, atol=1e-15)
    assert torch.allclose(grad_out, grad, rtol=1e-10, atol=1e-12)


def test_relu_derivative_at_zero_is_zero():
    d = derive(memory="mlp(act=relu)", parallel="minibatch(4)")
    assert d.act_grad == step(D.x)
    assert torch_eval(d.act_grad, {D.x: torch.tensor([0.0], dtype=torch.float64)}).item() == 0.0


# -------------------------------------------------------------------------------------------- printers
PRINTED = {
    "lp3": derive(bias="lp(p=3)").dloss,
    "lp1.5": derive(bias="lp(p=1.5, eps=0)").dloss,
    "huber": derive(bias="huber(delta=gate)").dloss,
    "mixture": derive(bias="huber(mode=mixture)").dloss,
    "huber-implicit": derive(bias="huber(delta=gate)", learner="implicit").dloss,
    "cauchy": derive(bias="custom(loss=log(1 + e^2/2))").dloss,
    "softplus": derive(bias="custom(loss=softplus(e) + softplus(-e))").dloss,
    "tanh-sigmoid": derive(bias="custom(loss=e*tanh(e) + sigmoid(e)*e^2)").dloss,
    "atan-erf": derive(bias="custom(loss=e*atan(e) + erf(e)*e)").dloss,
    "gelu'": derive(memory="mlp(act=gelu)", parallel="minibatch(2)").act_grad,
    "silu'": derive(memory="mlp(act=silu)", parallel="minibatch(2)").act_grad,
    "entropy-inv": derive(retention="bregman(phi=w*log(w))").phi_prime_inv,
    "cosh-inv": derive(retention="bregman(phi=cosh(w))").phi_prime_inv,
    "quartic-inv": derive(retention="bregman(phi=w^4/4)").phi_prime_inv,
    "elastic": derive(retention="elastic(lam=0.2)").entrywise,
    "handwritten": sp.Max(D.x, 0.5) * sp.Min(D.x, 2) + sp.sqrt(D.x**2 + 1) ** -1 + relu(D.x) * sigmoid(D.x)
    + apow(D.x, sp.Rational(5, 2)) + spow(D.x, sp.Rational(1, 3)) + sp.pi * D.x**3 / sp.E,
}


@pytest.mark.parametrize("name", sorted(PRINTED))
def test_torch_printer_matches_lambdify(name):
    expr = PRINTED[name]
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    rng = np.random.default_rng(0)
    n = 64
    samples = {}
    for s in syms:
        if s.name in ("delta", "c", "enorm"):
            samples[s] = rng.uniform(0.05, 2.0, n)
        elif s.name == "u" and name == "entropy-inv":
            samples[s] = rng.uniform(-5, 3, n)
        else:
            vals = rng.normal(0, 1.5, n)
            vals[:3] = [0.0, 1e-4, -1e-4]
            samples[s] = vals
    if name == "mixture":  # the row norm is at least |e|
        samples[D.enorm] = np.abs(samples[D.e]) + samples[D.enorm]
    f = lambdified(expr, *syms)
    expected = np.array([f(*(float(samples[s][i]) for s in syms)) for i in range(n)])
    got = torch_eval(expr, {s: torch.tensor(samples[s], dtype=torch.float64) for s in syms}).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_torch_printer_uses_library_calls():
    p = TorchPrinter()
    assert p.doprint(sp.sqrt(D.x)) == "torch.sqrt(x)"
    assert p.doprint(sigmoid(D.x)) == "torch.sigmoid(x)"
    assert "torch.where" in p.doprint(sp.Piecewise((D.x, D.x > 0), (0, True)))
    assert p.doprint(sp.sqrt(2) * D.x).startswith("1.4142135623730951")
    with pytest.raises(NotImplementedError):
        p.doprint(sp.LambertW(D.x))


# -------------------------------------------------------------------------------------------- IR passes
s_, t_, r_ = sp.symbols("s t r", real=True)


def small_graph():
    """x -> a1 = 2x, a2 = 2x (duplicate), b = a1 + a2, c = b^2 (chain), unused = x + 7, output c."""
    g = ir.Graph("test")
    x = g.add("input", arg="x", name="x")
    a1 = g.ew(2 * s_, {s_: x}, name="a1")
    a2 = g.ew(2 * s_, {s_: x}, name="a2")
    b = g.ew(s_ + t_, {s_: a1, t_: a2}, name="b")
    c = g.ew(r_**2, {r_: b}, name="c")
    g.ew(s_ + 7, {s_: x}, name="unused")
    g.add("output", c, arg="y", name="out_y")
    return g


def ew_count(g):
    return sum(1 for n in g.g.nodes if g.node(n).op == "ew")


def evaluate(gr: ir.Graph, inputs: dict, weights: dict | None = None) -> dict:
    """A tiny independent interpreter of the IR on numpy arrays (rows are tokens)."""
    erf = np.vectorize(math.erf, otypes=[float])  # numpy has no erf; scipy is not a test dependency

    prims = {"apow": lambda x, a: np.abs(x) ** a, "spow": lambda x, a: np.sign(x) * np.abs(x) ** a,
             "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "step": lambda x: (x > 0).astype(float),
             "relu": lambda x: np.maximum(x, 0), "erf": erf}
    val: dict[int, np.ndarray] = {}
    outs = {}
    for nid in gr.order():
        op, srcs = gr.node(nid), gr.srcs(nid)
        a = [val[s] for s in srcs]
        if op.op == "input":
            val[nid] = inputs[op.arg]
        elif op.op == "weight":
            val[nid] = weights[op.arg]
        elif op.op == "ew":
            expr, syms = op.arg
            f = sp.lambdify(syms, expr, modules=[prims, "numpy"])
            val[nid] = np.broadcast_to(np.asarray(f(*a), dtype=float), np.broadcast_shapes(*(x.shape for x in a))
                                       if a else ()) if a else np.asarray(float(expr))
        elif op.op == "linear":
            val[nid] = a[1] @ a[0].T
        elif op.op == "linear_t":
            val[nid] = a[1] @ a[0]
        elif op.op == "rownorm":
            val[nid] = np.linalg.norm(a[0], axis=-1, keepdims=True)
        elif op.op == "rowsumsq":
            val[nid] = (a[0] ** 2).sum(-1, keepdims=True)
        elif op.op == "layernorm":
            z = a[0]
            val[nid] = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-5)
        elif op.op == "layernorm_bwd":
            z, dy = a
            rstd = 1 / np.sqrt(z.var(-1, keepdims=True) + 1e-5)
            zh = (z - z.mean(-1, keepdims=True)) * rstd
            val[nid] = rstd * (dy - dy.mean(-1, keepdims=True) - zh * (dy * zh).mean(-1, keepdims=True))
        elif op.op == "output":
            outs[op.arg] = a[0]
        else:
            raise AssertionError(f"no interpreter rule for {op.op}")
    return outs


def test_small_graph_interpreter_sanity():
    x = np.array([[0.5, -1.0]])
    assert np.allclose(evaluate(small_graph(), {"x": x})["y"], (4 * x) ** 2)


def test_cse_merges_duplicates():
    g = ir.verify(small_graph())
    n = g.g.number_of_nodes()
    ir.cse(g)
    ir.verify(g)
    assert g.g.number_of_nodes() == n - 1
    assert [g.node(m).name for m in g.g.nodes].count("a2") == 0
    b = next(m for m in g.g.nodes if g.node(m).name == "b")
    assert len(set(g.srcs(b))) == 1  # both operands now read the same node
    x = np.array([[0.3, -2.0, 1.0]])
    assert np.allclose(evaluate(g, {"x": x})["y"], (4 * x) ** 2)


def test_cse_keeps_distinct_nodes():
    g = ir.Graph("t")
    x = g.add("input", arg="x", name="x")
    a = g.ew(2 * s_, {s_: x})
    b = g.ew(3 * s_, {s_: x})
    g.add("output", g.ew(s_ - t_, {s_: a, t_: b}), arg="y")
    n = g.g.number_of_nodes()
    assert ir.cse(g).g.number_of_nodes() == n


def test_fuse_elementwise_reduces_ew_count_and_preserves_values():
    g = ir.cse(ir.verify(small_graph()))
    before = ew_count(g)
    x = np.array([[0.3, -2.0, 1.0]])
    ref = evaluate(g, {"x": x})["y"]
    ir.fuse_elementwise(g)
    ir.verify(g)
    assert ew_count(g) < before
    assert np.allclose(evaluate(g, {"x": x})["y"], ref)


def test_dead_code_removes_unused_nodes():
    g = ir.verify(small_graph())
    assert any(g.node(m).name == "unused" for m in g.g.nodes)
    n = g.g.number_of_nodes()
    ir.dead_code(g)
    ir.verify(g)
    assert not any(g.node(m).name == "unused" for m in g.g.nodes)
    assert g.g.number_of_nodes() == n - 1
    assert any(g.node(m).name == "c" for m in g.g.nodes)


def _broken(kind: str) -> ir.Graph:
    g = small_graph()
    nodes = {g.node(m).name: m for m in g.g.nodes}
    if kind == "cycle":
        g.g.add_edge(nodes["c"], nodes["a1"])
    elif kind == "arity":
        g.add("linear", nodes["x"], arg=0, name="bad_linear")
    elif kind == "unbound-symbol":
        g.g.nodes[nodes["c"]]["node"] = ir.Op("ew", (r_**2 + t_, (r_,)), "c")
    elif kind == "missing-source":
        g.g.nodes[nodes["b"]]["srcs"] = (nodes["a1"], 999)
    elif kind == "unlinked-source":
        g.g.nodes[nodes["c"]]["srcs"] = (nodes["a2"],)
    elif kind == "no-outputs":
        g.g.remove_node(nodes["out_y"])
    elif kind == "duplicate-output":
        g.add("output", nodes["b"], arg="y", name="again")
    elif kind == "unknown-op":
        g.add("frobnicate", nodes["x"], name="weird")
    return g


@pytest.mark.parametrize("kind", ["cycle", "arity", "unbound-symbol", "missing-source", "unlinked-source",
                                  "no-outputs", "duplicate-output", "unknown-op"])
def test_verify_catches_broken_graphs(kind):
    ir.verify(small_graph())  # the intact graph passes
    words = {"cycle": "cycle", "arity": "takes 2 sources", "unbound-symbol": "do not bind",
             "missing-source": "missing or not linked", "unlinked-source": "missing or not linked",
             "no-outputs": "no outputs", "duplicate-output": "defined twice", "unknown-op": "unknown op"}[kind]
    with pytest.raises(ir.IRError, match=words):
        ir.verify(_broken(kind))


def test_group_kernels_annotates_fusable_nodes():
    s = spec(bias="lp(p=3)", memory="mlp", parallel="minibatch(4)")
    _, grad = ir.compile_graphs(s, D.derive(s))
    groups = {n: grad.g.nodes[n].get("group") for n in grad.g.nodes}
    for n, grp in groups.items():
        fusable = grad.node(n).op in ("ew", "rownorm", "rowsumsq", "layernorm", "layernorm_bwd")
        assert (grp is not None) == fusable


PIPELINE_SPECS = {
    "deltanet": dict(bias="l2"),
    "lp3": dict(bias="lp(p=3)"),
    "huber-mixture": dict(bias="huber(mode=mixture)"),
    "longhorn": dict(bias="l2", learner="implicit"),
    "huber-implicit": dict(bias="huber(delta=gate)", learner="implicit"),
    "mlp-gelu-ln": dict(bias="lp(p=3)", memory="mlp", parallel="minibatch(4)"),
    "mlp-silu-3": dict(bias="huber", memory="mlp(depth=3, expansion=2, act=silu, residual=false, norm=none)",
                       parallel="minibatch(4)"),
    "mlp-relu": dict(bias="custom(loss=log(1 + e^2/2))", memory="mlp(act=relu, expansion=1)",
                     parallel="minibatch(4)"),
}


@pytest.mark.parametrize("name", sorted(PIPELINE_SPECS))
def test_pipeline_preserves_gradient_values(name):
    """The optimised grad graph computes what the unoptimised one does (on random numbers), and for a
    linear memory it equals the closed form δ = ℓ'(Wk − v), x = k."""
    s = spec(**PIPELINE_SPECS[name])
    d = D.derive(s)
    raw = ir.verify(ir.build_grad(s, d))
    opt = ir.run_pipeline(ir.build_grad(s, d))
    assert opt.g.number_of_nodes() <= raw.g.number_of_nodes()
    rng = np.random.default_rng(1)
    n, dk = 5, 4
    m = s.memory
    hid = m.expansion * dk if m.kind == "mlp" else dk
    depth = m.depth if m.kind == "mlp" else 1
    shapes = [(dk, dk)] if depth == 1 else [(hid, dk)] + [(hid, hid)] * (depth - 2) + [(dk, hid)]
    weights = {i: rng.normal(0, 0.7, sh) for i, sh in enumerate(shapes)}
    inputs = {"k": rng.normal(size=(n, dk)), "v": rng.normal(size=(n, dk)), "delta": rng.uniform(0.2, 1, (n, 1)),
              "eta": rng.uniform(0.1, 1, (n, 1))}
    a, b = evaluate(raw, inputs, weights), evaluate(opt, inputs, weights)
    assert a.keys() == b.keys() and {f"delta{i + 1}" for i in range(depth)} <= a.keys()
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-10, atol=1e-12)
    if m.kind == "linear":
        e = inputs["k"] @ weights[0].T - inputs["v"]
        f = lambdified(d.dloss, *sorted(d.dloss.free_symbols, key=lambda t: t.name))
        env = {"e": e, "v": inputs["v"], "delta": inputs["delta"], "enorm": np.linalg.norm(e, axis=-1, keepdims=True),
               "c": inputs["eta"] * (inputs["k"] ** 2).sum(-1, keepdims=True)}
        syms = sorted(d.dloss.free_symbols, key=lambda t: t.name)
        expected = np.vectorize(f)(*(np.broadcast_to(env[t.name], e.shape) for t in syms))
        np.testing.assert_allclose(a["delta1"], expected, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a["input1"], inputs["k"])


def test_fuse_reduces_ew_nodes_on_a_real_graph():
    s = spec(bias="lp(p=3)", memory="mlp", parallel="minibatch(4)")
    g = ir.cse(ir.verify(ir.build_grad(s, D.derive(s))))
    before = ew_count(g)
    assert ew_count(ir.fuse_elementwise(g)) < before


@pytest.mark.parametrize("kw,expected", [
    (dict(bias="dot"), True),
    (dict(bias="dot", learner="momentum", retention="decay"), True),
    (dict(bias="l2"), False),
    (dict(bias="lp(p=3)"), False),
    (dict(bias="huber(delta=gate)"), False),
    (dict(bias="dot", memory="mlp(residual=false, norm=none)", parallel="minibatch(4)"), False),
])
def test_state_independent_gradient(kw, expected):
    s = spec(**kw)
    d = D.derive(s)
    assert ir.state_independent_gradient(ir.build_grad(s, d)) is expected
    assert ir.state_independent_gradient(ir.compile_graphs(s, d)[1]) is expected


# ------------------------------------------------------------------------------- degenerate custom losses
@pytest.mark.parametrize("loss", ["e", "2*e + 1", "3"])
def test_custom_loss_with_constant_derivative_runs(loss):
    mod = compile_spec(f"model m {{ memory = linear; bias = custom(loss={loss}) }}")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 1, 3, generator=g) for _ in range(3))
    o, _ = mod.apply(q, k, v, {n: torch.full((1, 4, 1), 0.5) for n in mod.GATES})
    assert torch.isfinite(o).all()
