"""The box retention (docs/semantics.md, step 4): A_t = α_t A_{t−1} + U_t, W_t = max(−r, min(A_t, r)), every weight
kept within ±r. One class in mirasc/language/retention.py; every path that computes it reads that class's facts and
its entrywise map. Checked against the independent float64 reference (tests/reference.py, written from the docs):
the torch token loop and mini-batch dual form in float64 (outputs, final state, gradients of every input and of the
initial state), the Triton recurrent kernel (interpreted) in float32 against the float64 torch recurrence; the map
does clip (a good share of the accumulator lies outside the box, none of the weights does), and the combinations
the retention has no meaning in are rejected with their reason."""

from __future__ import annotations

import functools

import pytest
import torch
from reference import make_inputs, make_state, reference_apply

import mirasc
from mirasc import compiler

f64 = torch.float64
R = 0.15  # the radius: the initial weights (~0.18 at D = 8) and the updates reach past it
_GD = dict(memory=dict(kind="linear"), bias=dict(kind="l2"), retention=dict(kind="box", radius=R, alpha="gate"),
           learner=dict(kind="gd", lr="gate"), parallel=None)
CASES = {
    # (spec body, reference config, torch algorithms)
    "linear_gd": (f"memory = linear; bias = l2; retention = box(radius={R}, alpha=gate); learner = gd(lr=gate)",
                  _GD, ("recurrent",)),
    "linear_minibatch": (f"memory = linear; bias = lp(p=3); retention = box(radius={R}, alpha=0.9); "
                         "learner = gd(lr=gate); parallel = minibatch(4)",
                         dict(_GD, bias=dict(kind="lp", p=3.0, eps=1e-6), parallel=4,
                              retention=dict(kind="box", radius=R, alpha=0.9)), ("recurrent", "chunked")),
    "channel_alpha": (f"memory = linear; bias = l2; retention = box(radius={R}, alpha=gate(k)); "
                      "learner = gd(lr=gate, steps=2)",
                      dict(_GD, retention=dict(kind="box", radius=R, alpha="gate(k)"), steps=2), ("recurrent",)),
    "mlp_momentum": (f"memory = mlp(depth=2, expansion=2); bias = huber(delta=gate); "
                     f"retention = box(radius={R}, alpha=gate); learner = momentum(lr=gate, theta=gate)",
                     dict(memory=dict(kind="mlp", depth=2, expansion=2, act="gelu", residual=True, norm="layernorm"),
                          bias=dict(kind="huber", delta="gate", mode="coordinate"),
                          retention=dict(kind="box", radius=R, alpha="gate"),
                          learner=dict(kind="momentum", lr="gate", theta="gate"), parallel=None), ("recurrent",)),
}
B, T, H, D = 2, 12, 2, 8


@functools.cache
def module(name: str):
    return mirasc.compile_spec(f"model box_{name} {{ {CASES[name][0]} }}")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _leaves(name, seed=3):
    cfg = CASES[name][1]
    q, k, v, gates = make_inputs(cfg, B, T, H, D, D, f64, seed=seed)
    state = make_state(cfg, B, H, D, D, f64, seed=seed)
    g = torch.Generator().manual_seed(seed)  # an accumulator apart from the weights (the reference draws A = W)
    state = {n: x + 0.1 * torch.randn(x.shape, generator=g, dtype=f64) if n.startswith("A_") else x
             for n, x in state.items()}
    return q, k, v, gates, state


def _grads(o, s, leaves, seed=11):
    """The gradient of every leaf under one fixed random linear loss on the output and the final state."""
    gen = torch.Generator().manual_seed(seed)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=f64).to(o.dtype)).sum()
    for n in sorted(s):
        loss = loss + (s[n] * torch.randn(s[n].shape, generator=gen, dtype=f64).to(s[n].dtype)).sum()
    return torch.autograd.grad(loss, leaves, allow_unused=True)


@pytest.mark.parametrize("name,algorithm", [(n, a) for n in sorted(CASES) for a in CASES[n][2]])
def test_torch_matches_the_float64_reference(name, algorithm):
    mod, cfg = module(name), CASES[name][1]
    q, k, v, gates, state = _leaves(name)
    names = ["q", "k", "v", *gates, *(f"state:{n}" for n in state)]
    leaves = [x.requires_grad_(True) for x in (q, k, v, *gates.values(), *state.values())]
    want_o, want_s = reference_apply(cfg, q, k, v, gates, state)
    got_o, got_s = mod.apply(q, k, v, gates, state=state, backend="torch", algorithm=algorithm)
    assert sorted(got_s) == sorted(want_s) == sorted(state)
    assert rel(got_o, want_o) < 1e-10
    for n in want_s:
        assert rel(got_s[n], want_s[n]) < 1e-10, n
    for n, a, b in zip(names, _grads(got_o, got_s, leaves), _grads(want_o, want_s, leaves)):
        assert rel(a, b) < 1e-9, n
    # the map clips: a good share of the final accumulator lies outside the box, and no weight does
    acc = torch.cat([got_s[n].detach().flatten() for n in got_s if n.startswith("A_")])
    outside = (acc.abs() > R).double().mean().item()
    assert 0.1 < outside < 0.95, outside
    for n in got_s:
        if n.startswith("W"):
            assert got_s[n].abs().max().item() <= R + 1e-12, n


@pytest.mark.parametrize("name", ["linear_gd", "linear_minibatch", "mlp_momentum"])
def test_triton_recurrent_matches_the_float64_recurrence(name):
    """backend="triton" in float32 against the float64 torch recurrence (itself checked above): outputs, final
    state and every gradient, within twice the torch float32 recurrence's own error."""
    mod = module(name)
    q, k, v, gates, state = _leaves(name, seed=5)
    names = ["q", "k", "v", *gates, *state]

    def run(backend, dtype):
        leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v, *gates.values(), *state.values())]
        gs = dict(zip(gates, leaves[3:3 + len(gates)]))
        st = dict(zip(state, leaves[3 + len(gates):]))
        o, final = mod.apply(*leaves[:3], gs, state=st, backend=backend, algorithm="recurrent")
        return _grads(o, final, leaves) + (o, *(final[n] for n in sorted(final)))

    ref = run("torch", f64)
    fp32_worst = max(rel(c, b) for c, b in zip(run("torch", torch.float32), ref))
    for n, a, b in zip(names + ["o", *sorted(state)], run("triton", torch.float32), ref):
        assert rel(a, b) < max(2e-5, 2 * fp32_worst), n


def test_explain_and_state():
    """The derived rule in the module's docstring, the accumulator in its state, the map as its own function."""
    mod = module("linear_gd")
    assert "A_t = α_t·A_{t−1} + U_t,  W_t = Max(-0.15, Min(0.15, a)) at a = A_t" in mod.__doc__
    assert sorted(mod.init_state(1, 1, 4, 4)) == ["A_W", "W"]
    source = compiler.compile_text(f"model m {{ {CASES['linear_gd'][0]} }}").source
    assert "def _box_clip(a):" in source and "return _box_clip(acc)" in source


@pytest.mark.parametrize("body,at,words", [
    ("memory = linear; bias = l2; retention = box(radius=0); learner = gd", "0)", "greater than 0"),
    ("memory = linear; bias = l2; retention = box(radius=0.5); learner = gd; parallel = minibatch(8, readout=chunk)",
     "readout=chunk", "no chunk form is defined for it"),
    ("memory = nonparametric; retention = box(radius=0.5)", "box(", "acts on weights"),
    ("memory = linear; bias = l2; retention = box(radius=0.5); learner = implicit", "implicit",
     "retention none or decay, not `box`"),
])
def test_meaningless_combinations_are_rejected(body, at, words):
    """Each with its reason, located at the offending argument or form of the spec's text."""
    text = f"model m {{ {body} }}"
    with pytest.raises(mirasc.SpecError) as err:
        mirasc.compile_spec(text)
    assert words in err.value.message, err.value.message
    assert err.value.line == 1 and text[err.value.col - 1:].startswith(at), (err.value.col, err.value.message)


def test_no_chunked_form_says_why():
    mod = module("linear_gd")
    q, k, v, gates, state = _leaves("linear_gd")
    with pytest.raises(ValueError, match="box retention"):
        mod.apply(q, k, v, gates, state=state, backend="torch", algorithm="chunked")
