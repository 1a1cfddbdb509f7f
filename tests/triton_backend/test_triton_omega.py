"""The Atlas pieces on Triton (docs/semantics.md, "Atlas"): the Omega rule in the fused recurrent kernels (c gradient
factor evaluations per step at the current state, the window read from sequences with the carried tokens in front;
the generated backward sums each window token's cotangents over the c steps that read it), the Omega rule on the
chunk kernels as c kernel rows per token (SWLA's dot bias: the Hebbian family; l2 under minibatch(C): the
mini-batch family; MLP memories and momentum under minibatch(C): the mini-batch dual-form kernels, a kernel chunk of
C·c rows per mini-batch, specs/omega_yaad.miras as written), and feature=poly on a
linear memory (every kernel runs the plain linear memory on φ_p(q), φ_p(k), mapped in torch: Dk = 4 -> Dφ = 21).

Under TRITON_INTERPRET=1 with small shapes (c = 3, T = 20): Triton against the independent float64 reference
(tests/reference.py: autograd on the written-out window sum) and against the torch recurrence: outputs, the whole
final state (the carried window included), and the gradients of q, k, v, every gate (γ included) and every entry of
a random initial state (a full window); a run continued from a final state equals one run. The mini-batch dual-form
kernels with a window (c = 3, 4; T = 22-74, two calls cut at a mini-batch end): against the reference and the
module's torch chunked path, through both calls; a channel-wise coefficient inside the window still says why not.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from reference import make_inputs, reference_apply, rel  # noqa: E402
from test_omega_atlas import linear_loss_grads, random_state  # noqa: E402 (a random state with a full Omega window)

mirasc = pytest.importorskip("mirasc")
pytest.importorskip("triton")

f64 = torch.float64
B, H, T = 1, 2, 20
_DECAY = dict(kind="decay", alpha="gate", order="post")
_MLP = dict(kind="mlp", depth=2, expansion=2, act="gelu", residual=True, norm="layernorm")

# name -> (spec body, reference config, Dk, Dv, fp32 tolerance[, the Triton algorithms]); muon has no kernel
CASES = {
    "l2_decay": (  # OmegaNet's rule on a linear memory; Dv = 8 crosses two V tiles (partial sums of dk, dγ)
        "memory = linear; bias = l2(window=3, gamma=gate); retention = decay(alpha=gate); learner = gd(lr=gate)",
        dict(memory=dict(kind="linear"), bias=dict(kind="l2", window=3, gamma="gate"), retention=_DECAY,
             learner=dict(kind="gd", lr="gate"), parallel=None), 4, 8, 2e-5),
    "swla": (  # SWLA: a dot bias over a sliding window; chunked: the Hebbian family, c kernel rows per token
        "memory = linear; bias = dot(window=3, gamma=gate); retention = decay(alpha=gate); learner = gd(lr=gate)",
        dict(memory=dict(kind="linear"), bias=dict(kind="dot", window=3, gamma="gate"), retention=_DECAY,
             learner=dict(kind="gd", lr="gate"), parallel=None), 4, 8, 2e-5, ("recurrent", "chunked")),
    "l2_minibatch": (  # gradients at the anchor: the mini-batch chunk family, c kernel rows per token (C = 6 does
        # not divide T: the last mini-batch is partial; window tokens of the previous mini-batch at this anchor)
        "memory = linear; bias = l2(window=3, gamma=gate); retention = decay(alpha=gate); "
        "learner = gd(lr=gate); parallel = minibatch(6)",
        dict(memory=dict(kind="linear"), bias=dict(kind="l2", window=3, gamma="gate"), retention=_DECAY,
             learner=dict(kind="gd", lr="gate"), parallel=6), 4, 8, 2e-5, ("chunked",)),
    "custom_pre_momentum": (  # a derived loss, the decay before the gradient, momentum
        "memory = linear; bias = custom(loss=log(1 + e^2/2), window=3, gamma=gate); "
        "retention = decay(alpha=gate, order=pre); learner = momentum(lr=gate, theta=gate)",
        dict(memory=dict(kind="linear"), bias=dict(kind="custom", f=lambda e: torch.log(1 + e * e / 2), window=3,
                                                    gamma="gate"),
             retention=dict(kind="decay", alpha="gate", order="pre"),
             learner=dict(kind="momentum", lr="gate", theta="gate"), parallel=None), 4, 8, 2e-5),
    "elastic_minibatch": (  # an accumulator readout, gradients at the mini-batch anchor (window tokens included)
        "memory = linear; bias = l2(window=3, gamma=0.7); retention = elastic(lam=0.01, alpha=gate); "
        "learner = gd(lr=gate); parallel = minibatch(4)",
        dict(memory=dict(kind="linear"), bias=dict(kind="l2", window=3, gamma=0.7),
             retention=dict(kind="elastic", lam=0.01, alpha="gate"), learner=dict(kind="gd", lr="gate"), parallel=4),
        4, 4, 2e-5),
    "huber_mlp": (  # Omega-Yaad's rule: an MLP memory (one program per head), each window token with its own δ
        "memory = mlp(depth=2, expansion=2, act=gelu, residual=true, norm=layernorm); "
        "bias = huber(delta=gate, mode=mixture, window=3, gamma=gate); retention = decay(alpha=gate); "
        "learner = gd(lr=gate); parallel = minibatch(4)",
        dict(memory=_MLP, bias=dict(kind="huber", delta="gate", mode="mixture", window=3, gamma="gate"),
             retention=_DECAY, learner=dict(kind="gd", lr="gate"), parallel=4, gate_ranges=dict(delta=(1.5, 4.0))),
        4, 4, 1e-4, ("recurrent", "chunked")),  # (chunked: the mini-batch dual-form kernels, c rows per token)
    "omeganet": (  # OmegaNet: polynomial features, the Omega rule, decay, gd
        "memory = linear(feature=poly, degree=2); bias = l2(window=3, gamma=gate); retention = decay(alpha=gate); "
        "learner = gd(lr=gate)",
        dict(memory=dict(kind="linear", feature="poly", degree=2), bias=dict(kind="l2", window=3, gamma="gate"),
             retention=_DECAY, learner=dict(kind="gd", lr="gate"), parallel=None), 4, 4, 2e-5),
    "poly_delta_pre": (  # features on the fused recurrent kernel and the delta chunk family
        "memory = linear(feature=poly, degree=2); bias = l2; retention = decay(alpha=gate, order=pre); "
        "learner = gd(lr=gate)",
        dict(memory=dict(kind="linear", feature="poly", degree=2), bias=dict(kind="l2"),
             retention=dict(kind="decay", alpha="gate", order="pre"), learner=dict(kind="gd", lr="gate"),
             parallel=None), 4, 4, 2e-5, ("recurrent", "chunked")),
    "poly_minibatch_momentum": (  # features on the mini-batch dual-form kernels
        "memory = linear(feature=poly, degree=2); bias = l2; retention = decay(alpha=gate); "
        "learner = momentum(lr=gate, theta=gate); parallel = minibatch(4)",
        dict(memory=dict(kind="linear", feature="poly", degree=2), bias=dict(kind="l2"), retention=_DECAY,
             learner=dict(kind="momentum", lr="gate", theta="gate"), parallel=4), 4, 4, 2e-5, ("chunked",)),
}
RUNS = [(n, a) for n in sorted(CASES) for a in (CASES[n][5] if len(CASES[n]) > 5 else ("recurrent",))]


@functools.cache
def module(name: str):
    return mirasc.compile_spec(f"model {name} {{ {CASES[name][0]} }}")


def plan_of(name: str):
    """The Plan of a case above: which Triton kernels cover it, or why none."""
    return mirasc.compile_text(f"model {name} {{ {CASES[name][0]} }}").plan


def test_atlas_specs_have_the_recurrent_kernel():
    """The Omega rule and feature=poly (linear memory) no longer refuse Triton; the chunk kernels take the Omega rule
    where the gradients are at an anchor (the mini-batch dual-form kernels for the MLP memory); muon still says
    why."""
    for name in CASES:
        mod = module(name)
        plan = mod.launch_plan(16, 16, device="sm_90", backend="triton", algorithm="recurrent")
        assert set(plan["kernels"]) == {"_fused_recurrent_fwd", "_fused_recurrent_bwd"}, name
        assert mod.WINDOW == (3 if "window" in mod.SPEC else 1) and mod._BWD_STATE, name  # (a generated backward)
        assert plan_of(name).features == ("poly" in mod.SPEC), name
    assert plan_of("l2_decay").chunk_family is None  # (exact, state-dependent: the recurrent kernel only)
    assert all(plan_of(n).chunk_family is not None for n in ("swla", "l2_minibatch", "poly_delta_pre"))
    assert plan_of("huber_mlp").minibatch
    muon = mirasc.compile_spec("model m { memory = linear(feature=poly, degree=2); bias = l2(window=2, gamma=gate); "
                               "learner = muon(lr=gate, theta=gate) }")
    assert "muon orthogonalises" in muon.__doc__ and muon.launch_plan(8, 8, device="sm_90")["backend"] == "torch"


@pytest.mark.parametrize("name,algorithm", RUNS)
def test_matches_reference_and_torch(name, algorithm):
    body, cfg, dk, dv, tol = CASES[name][:5]
    mod = module(name)
    n_tok = 8 if name == "huber_mlp" else T  # (the MLP's interpreted kernels are slow: two mini-batches)
    q, k, v, gates = make_inputs(cfg, B, n_tok, H, dk, dv, f64, seed=5)
    state = random_state(mod, 5, batch=B, heads=H, dk=dk, dv=dv)
    leaves = {"q": q, "k": k, "v": v, **gates, **{f"state:{n}": x for n, x in state.items()}}
    for x in leaves.values():
        x.requires_grad_(True)
    want_o, want_s = reference_apply(cfg, q, k, v, gates, state)
    got_o, got_s = mod.apply(q, k, v, gates, state=state, backend="triton", algorithm=algorithm)
    tor_o, tor_s = mod.apply(q, k, v, gates, state=state, backend="torch", algorithm="recurrent")
    assert sorted(got_s) == sorted(want_s) == sorted(state)
    assert any(n.startswith("win_") for n in got_s) == ("window" in mod.SPEC)
    grads = linear_loss_grads(want_o, want_s, leaves)
    errs, errs_torch = {"o": rel(got_o, want_o)}, {"o": rel(got_o, tor_o)}
    for n in want_s:
        errs[f"final:{n}"], errs_torch[f"final:{n}"] = rel(got_s[n], want_s[n]), rel(got_s[n], tor_s[n])
    g_tri, g_ref, g_tor = grads(got_o, got_s), grads(want_o, want_s), grads(tor_o, tor_s)
    for n, a, b, c in zip(leaves, g_tri, g_ref, g_tor):
        if b is None or b.abs().max() == 0:  # (e.g. the oldest window token: out of every window after c steps)
            assert a is None or a.abs().max() < 1e-6, n
            continue
        errs[f"d{n}"], errs_torch[f"d{n}"] = rel(a, b), rel(a, c)
    assert {"dq", "dk", "dv", "deta"} <= set(errs) and any(n.startswith("dstate:W") for n in errs)
    if "window" in mod.SPEC:
        assert {"dstate:win_k", "dstate:win_v", "dstate:win_gamma"} <= set(errs) and ("dgamma" in errs) == (
            "gamma" in gates)
    bad = {n: e for n, e in errs.items() if not e < tol}
    assert not bad, f"{name} vs reference: {bad}"
    bad = {n: e for n, e in errs_torch.items() if not e < tol}
    assert not bad, f"{name} vs torch: {bad}"


@pytest.mark.parametrize("name,algorithm,cut", [("omeganet", "recurrent", 9), ("swla", "chunked", 9),
                                                ("l2_minibatch", "chunked", 12)])  # (a cut at a mini-batch end)
def test_continued_run_equals_one_run(name, algorithm, cut):
    """The final state (weights, the carried window) continues the sequence exactly."""
    body, cfg, dk, dv, tol = CASES[name][:5]
    mod = module(name)
    q, k, v, gates = make_inputs(cfg, B, T, H, dk, dv, torch.float32, seed=7)
    o, s = mod.apply(q, k, v, gates, backend="triton", algorithm=algorithm)
    o1, s1 = mod.apply(q[:, :cut], k[:, :cut], v[:, :cut], {n: g[:, :cut] for n, g in gates.items()},
                       backend="triton", algorithm=algorithm)
    o2, s2 = mod.apply(q[:, cut:], k[:, cut:], v[:, cut:], {n: g[:, cut:] for n, g in gates.items()}, state=s1,
                       backend="triton", algorithm=algorithm)
    assert rel(torch.cat([o1, o2], dim=1), o) < 1e-6
    for n in s:
        assert rel(s2[n], s[n]) < 1e-6, n


# ------------------------------------------------------------------ the Omega rule on the mini-batch dual-form kernels

_YAAD = (Path(__file__).resolve().parents[2] / "specs" / "omega_yaad.miras").read_text()
_MLP_SPEC = "mlp(depth=2, expansion=2, act=gelu, residual=true, norm=layernorm)"
# name -> (spec text, reference config, D, T, the cut between the two calls (a mini-batch end), fp32 tolerance)
MB_CASES = {
    "omega_yaad": (  # the bundled spec as written: minibatch(64), window 4, Huber mixture with δ_i per token; the
        # first call is one whole mini-batch (64 tokens, 256 kernel rows), the second a partial one
        _YAAD,
        dict(memory=dict(_MLP, expansion=4), bias=dict(kind="huber", delta="gate", mode="mixture", window=4,
                                                       gamma="gate"),
             retention=_DECAY, learner=dict(kind="gd", lr="gate"), parallel=64, gate_ranges=dict(delta=(1.5, 4.0))),
        8, 74, 64, 1e-4),
    "mlp_l2_momentum": (  # momentum: θ_t on a step's row 0, S added to W on its last row; C = 4 does not divide T
        f"model mlp_l2_momentum {{ memory = {_MLP_SPEC}; bias = l2(window=3, gamma=gate); "
        "retention = decay(alpha=gate); learner = momentum(lr=gate, theta=gate); parallel = minibatch(4) }",
        dict(memory=_MLP, bias=dict(kind="l2", window=3, gamma="gate"), retention=_DECAY,
             learner=dict(kind="momentum", lr="gate", theta="gate"), parallel=4), 8, 22, 8, 1e-4),
    "linear_momentum": (  # a linear memory with momentum: not a chunk family (gd only), the dual-form kernels
        "model linear_momentum { memory = linear; bias = l2(window=4, gamma=0.7); retention = decay(alpha=gate); "
        "learner = momentum(lr=gate, theta=gate); parallel = minibatch(5) }",
        dict(memory=dict(kind="linear"), bias=dict(kind="l2", window=4, gamma=0.7), retention=_DECAY,
             learner=dict(kind="momentum", lr="gate", theta="gate"), parallel=5), 16, 23, 10, 2e-5),
}


@functools.cache
def mb_module(name: str):
    return mirasc.compile_spec(MB_CASES[name][0])


@pytest.mark.parametrize("name,schedule", [("omega_yaad", "tile"), ("mlp_l2_momentum", "tile"),
                                           ("linear_momentum", "stream")])
def test_minibatch_kernels_take_the_window(name, schedule, monkeypatch):
    """backend="triton", algorithm="chunked" on the mini-batch dual-form kernels (c kernel rows per token, a kernel
    chunk of C·c rows = one mini-batch) against the float64 reference (one run) and the module's torch chunked path,
    both as two calls cut at a mini-batch end: the first from a random state with a full window, the second from the
    first's final state. Outputs, final state (window included) and the gradients of q, k, v, every gate and every
    initial-state entry, through both calls."""
    spec_text, cfg, d, n_tok, cut, tol = MB_CASES[name]
    mod = mb_module(name)
    c, C = mod.WINDOW, mod.MINIBATCH
    plan = mirasc.compile_text(MB_CASES[name][0]).plan
    assert plan.minibatch and plan.chunk_family is None and c > 1
    assert "mini-batch dual-form kernels" in mod.__doc__
    if schedule == "stream":  # (the weights in global memory, walked in 16-wide tiles)
        monkeypatch.setattr(mod, "MINIBATCH_SCHEDULE", "stream")
        monkeypatch.setattr(mod, "MB_STREAM_TILE", 16)
    launches = []
    kernels = mod._minibatch_triton

    def spy(q, k, v, cc, state, chunk, **kw):
        launches.append((q.shape[2], chunk))
        return kernels(q, k, v, cc, state, chunk, **kw)

    monkeypatch.setattr(mod, "_minibatch_triton", spy)
    q, k, v, gates = make_inputs(cfg, 1, n_tok, H, d, d, f64, seed=6)
    state = random_state(mod, 6, batch=1, heads=H, dk=d, dv=d)
    leaves = {"q": q, "k": k, "v": v, **gates, **{f"state:{n}": x for n, x in state.items()}}
    for x in leaves.values():
        x.requires_grad_(True)
    want_o, want_s = reference_apply(cfg, q, k, v, gates, state)

    def two_calls(backend):
        parts = [slice(0, cut), slice(cut, n_tok)]
        o1, s1 = mod.apply(q[:, parts[0]], k[:, parts[0]], v[:, parts[0]], {n: g[:, parts[0]] for n, g in
                           gates.items()}, state=state, backend=backend, algorithm="chunked")
        o2, s2 = mod.apply(q[:, parts[1]], k[:, parts[1]], v[:, parts[1]], {n: g[:, parts[1]] for n, g in
                           gates.items()}, state=s1, backend=backend, algorithm="chunked")
        return torch.cat([o1, o2], dim=1), s2

    got_o, got_s = two_calls("triton")
    # the kernels saw each token as c rows and each mini-batch as one chunk of C·c rows
    assert launches == [(cut * c, C * c), ((n_tok - cut) * c, C * c)]
    tor_o, tor_s = two_calls("torch")
    assert sorted(got_s) == sorted(want_s) == sorted(state) and got_s["win_k"].shape[2] == c - 1
    grads = linear_loss_grads(want_o, want_s, leaves)
    errs, errs_torch = {"o": rel(got_o, want_o)}, {"o": rel(got_o, tor_o)}
    for n in want_s:
        errs[f"final:{n}"], errs_torch[f"final:{n}"] = rel(got_s[n], want_s[n]), rel(got_s[n], tor_s[n])
    g_tri, g_ref, g_tor = grads(got_o, got_s), grads(want_o, want_s), grads(tor_o, tor_s)
    flat = lambda gs: torch.cat([g.flatten() for g in gs if g is not None])  # noqa: E731
    assert rel(flat(g_tor), flat(g_ref)) < 1e-9  # (the torch chunked path itself, float64)
    for n, a, b, t in zip(leaves, g_tri, g_ref, g_tor):
        if b is None or b.abs().max() == 0:
            assert a is None or a.abs().max() < 1e-6, n
            continue
        errs[f"d{n}"], errs_torch[f"d{n}"] = rel(a, b), rel(a, t)
    want = {"dq", "dk", "dv", "deta", "dalpha", "dstate:win_k", "dstate:win_v", "dstate:win_gamma"} | {
        f"d{g}" for g in gates} | {f"dstate:{n}" for n in state if not n.startswith("win_")}
    assert want <= set(errs), want - set(errs)
    bad = {n: e for n, e in errs.items() if not e < tol}
    assert not bad, f"{name} vs reference: {bad}"
    bad = {n: e for n, e in errs_torch.items() if not e < tol}
    assert not bad, f"{name} vs torch chunked: {bad}"


def test_channel_wise_window_coefficient_still_refused():
    """A channel-wise coefficient inside the window (Huber's δ per value channel) is not on Triton: the window
    sequences carry one scalar per token and coefficient; backend="triton" says so, torch runs it."""
    mod = mirasc.compile_spec(f"model hv {{ memory = {_MLP_SPEC}; bias = huber(delta=gate(v), mode=coordinate, "
                              "window=3, gamma=gate); retention = decay(alpha=gate); learner = gd(lr=gate); "
                              "parallel = minibatch(4) }")
    assert not mirasc.compile_text(mod.SPEC).plan.minibatch
    cfg = dict(memory=_MLP, bias=dict(kind="huber", delta="gate(v)", mode="coordinate", window=3, gamma="gate"),
               retention=_DECAY, learner=dict(kind="gd", lr="gate"), parallel=4)
    q, k, v, gates = make_inputs(cfg, 1, 5, 1, 4, 4, f64)
    with pytest.raises(RuntimeError, match="no Triton kernel for this spec: the Omega rule's window carries the "
                                           "channel-wise delta"):
        mod.apply(q, k, v, gates, backend="triton", algorithm="chunked")
    assert mod.apply(q, k, v, gates, backend="torch", algorithm="chunked")[0].shape == v.shape


def test_window_tile_beyond_a_gpu_is_refused_or_recurrent(monkeypatch):
    """On a GPU the mini-batch kernels fit chunk tiles of up to 64 rows; omega_yaad as written (minibatch(64), c = 4)
    is 256 rows. There algorithm='chunked' refuses with the reason and the ways out, algorithm='auto' runs the fused
    recurrent kernel, and backend='auto' keeps torch; the CPU interpreter runs any tile (the test above). The
    dispatch is checked here with the GPU predicate forced (no GPU in the tests)."""
    mod = mb_module("omega_yaad")
    # (the rule, C·c <= 64 rows on a GPU: tests/runtime/test_minibatch_host.py)
    plan = mod.launch_plan(64, 64, device="sm_90")  # backend='auto' keeps torch: a tile of 256 rows
    assert plan["backend"] == "torch" and "256 rows" in plan["reason"]
    plan = mod.launch_plan(16, 16, device="sm_90", backend="triton")  # the fused recurrent kernel, saying why
    assert plan["algorithm"] == "recurrent" and "one chunk tile of 64·4 rows" in plan["reason"]
    assert set(plan["kernels"]) == {"_fused_recurrent_fwd", "_fused_recurrent_bwd"}
    with pytest.raises(RuntimeError, match="whole memory of a \\(batch, head\\)"):  # which holds no head of 64
        mod.launch_plan(64, 64, device="sm_90", backend="triton")
    with pytest.raises(RuntimeError, match="one chunk tile of 64·4 rows"):
        mod.launch_plan(16, 16, device="sm_90", backend="triton", algorithm="chunked")
    assert mod.launch_plan(64, 64, device="cpu", backend="triton")["algorithm"] == "chunked"  # (the interpreter)
    monkeypatch.setattr(mod, "_mb_window_fits", lambda chunk, device: False)
    calls = []
    recurrent, kernels = mod._recurrent_triton, mod._minibatch_triton
    monkeypatch.setattr(mod, "_recurrent_triton", lambda *a: calls.append("recurrent") or recurrent(*a))
    monkeypatch.setattr(mod, "_minibatch_triton", lambda *a, **kw: calls.append("minibatch") or kernels(*a, **kw))
    cfg = MB_CASES["omega_yaad"][1]
    q, k, v, gates = make_inputs(cfg, 1, 3, 1, 4, 4, f64, seed=1)
    with pytest.raises(RuntimeError, match=r"one chunk tile of 64·4 rows \(padded to 256\).*minibatch\(C\) for "
                                           r"C <= 16"):
        mod.apply(q, k, v, gates, backend="triton", algorithm="chunked")
    o, _ = mod.apply(q, k, v, gates, backend="triton")
    assert calls == ["recurrent"]
    assert rel(o, mod.apply(q, k, v, gates, backend="torch", algorithm="recurrent")[0]) < 1e-5
