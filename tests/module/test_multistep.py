"""Multi-step learners (docs/semantics.md, "Multi-step learners"): `gd(steps=n)` / `implicit(steps=n)` take n
gradient steps per token over n (key, value) pairs, the retention's α at the first only, the read after the last.

1. Variants across the four axes (Gated DeltaProduct, DeltaProduct, a Hebbian and an implicit product, κ per
   sub-step, α and η over channels, a per-token Huber δ, a constant α with kl, an MLP memory with lp and lq),
   compiled in-process, against the independent float64 reference (tests/reference.py, `steps=n`: a loop over
   tokens and their sub-steps with autograd gradients) on every torch algorithm: outputs, final state and the
   gradients of q, k, v, every gate, κ and the initial state.
2. The Triton kernels (interpreter, float32, tiny shapes): fused recurrent and chunked, forward and backward.
3. flash-linear-attention's naive Gated DeltaProduct (fla.ops.gated_delta_product) with its conventions mapped:
   state S = Wᵀ [K, V]; q scaled by `scale` inside (ours gets q·scale); g = log α per token; β = η per sub-step; keys
   and values interleaved [B, T·n, H, D] token-major (ours [B, T, H, n, D]); no key normalisation inside the naive
   form (ours none either). With and without the gate (DeltaProduct), and with cu_seqlens.
4. cu_seqlens, Layer decoding (init_cache/step equals forward), located rejections, shape errors.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reference import decode, make_inputs, make_state, reference_apply, rel

mirasc = pytest.importorskip("mirasc")

SPECS = Path(__file__).resolve().parents[2] / "specs"
f64 = torch.float64
LIN = dict(kind="linear")

# name -> (spec body, reference config). Each is one multi-step design a user could write.
CASES = {
    "gated_deltaproduct": ("memory = linear; bias = l2; retention = decay(alpha=gate, order=pre); "
                           "learner = gd(lr=gate, steps=2)",
                           dict(memory=LIN, bias=dict(kind="l2"),
                                retention=dict(kind="decay", alpha="gate", order="pre"),
                                learner=dict(kind="gd", lr="gate"), parallel=None, steps=2)),
    "deltaproduct3": ("memory = linear; bias = l2; learner = gd(lr=gate, steps=3)",
                      dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="none"),
                           learner=dict(kind="gd", lr="gate"), parallel=None, steps=3)),
    "decay_post": ("memory = linear; bias = l2; retention = decay(alpha=gate, order=post); "
                   "learner = gd(lr=gate, steps=2)",
                   dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate", order="post"),
                        learner=dict(kind="gd", lr="gate"), parallel=None, steps=2)),
    "kda_product": ("memory = linear; bias = l2; retention = decay(alpha=gate(k), order=pre); "
                    "learner = gd(lr=gate(k), steps=2)",
                    dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate(k)", order="pre"),
                         learner=dict(kind="gd", lr="gate(k)"), parallel=None, steps=2)),
    "hebbian_product": ("memory = linear; bias = dot; retention = decay(alpha=gate); learner = gd(lr=gate, steps=2)",
                        dict(memory=LIN, bias=dict(kind="dot"), retention=dict(kind="decay", alpha="gate"),
                             learner=dict(kind="gd", lr="gate"), parallel=None, steps=2)),
    "longhorn_product": ("memory = linear; bias = l2; retention = decay(alpha=gate, order=pre); "
                         "learner = implicit(lr=gate, steps=2)",
                         dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate", order="pre"),
                              learner=dict(kind="implicit", lr="gate"), parallel=None, steps=2)),
    "comba_product": ("memory = linear; bias = l2(read=kappa); retention = decay(alpha=gate, order=pre); "
                      "learner = gd(lr=gate, steps=2)",
                      dict(memory=LIN, bias=dict(kind="l2", read="kappa"),
                           retention=dict(kind="decay", alpha="gate", order="pre"),
                           learner=dict(kind="gd", lr="gate"), parallel=None, steps=2)),
    "huber_product": ("memory = linear; bias = huber(delta=gate); retention = decay(alpha=gate); "
                      "learner = gd(lr=gate, steps=2)",  # δ once per token, at both steps
                      dict(memory=LIN, bias=dict(kind="huber", delta="gate", mode="coordinate"),
                           retention=dict(kind="decay", alpha="gate", order="post"),
                           learner=dict(kind="gd", lr="gate"), parallel=None, steps=2,
                           gate_ranges=dict(delta=(0.3, 1.2)))),
    "kl_constant_alpha": ("memory = linear; bias = l2; retention = kl(c=1, alpha=0.7); "
                          "learner = gd(lr=gate(v), steps=2)",
                          dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="kl", c=1.0, alpha=0.7),
                               learner=dict(kind="gd", lr="gate(v)"), parallel=None, steps=2)),
    "mlp_lp_lq": ("memory = mlp(depth=2, expansion=2, act=silu, residual=false, norm=none); bias = lp(p=3); "
                  "retention = lq(q=4, alpha=gate); learner = gd(lr=gate, steps=2)",
                  dict(memory=dict(kind="mlp", depth=2, expansion=2, act="silu", residual=False, norm="none"),
                       bias=dict(kind="lp", p=3.0, eps=1e-6), retention=dict(kind="lq", q=4.0, alpha="gate"),
                       learner=dict(kind="gd", lr="gate"), parallel=None, steps=2)),
    # across branches: a per-head constant (RetNet's γ_h, decaying once per token) and Atlas' polynomial features
    "retnet_product": ("memory = linear; bias = l2; retention = decay(alpha=1 - 2^(-3 - h), order=pre); "
                       "learner = gd(lr=gate, steps=2)",
                       dict(memory=LIN, bias=dict(kind="l2"),
                            retention=dict(kind="decay", alpha=lambda h, H: 1 - 2.0 ** (-3 - h), order="pre"),
                            learner=dict(kind="gd", lr="gate"), parallel=None, steps=2)),
    "poly_product": ("memory = linear(feature=poly, degree=2); bias = l2; retention = decay(alpha=gate, order=pre); "
                     "learner = gd(lr=gate, steps=2)",
                     dict(memory=dict(kind="linear", feature="poly", degree=2), bias=dict(kind="l2"),
                          retention=dict(kind="decay", alpha="gate", order="pre"),
                          learner=dict(kind="gd", lr="gate"), parallel=None, steps=2)),
}
B, H, DK, DV = 2, 2, 5, 4
T = 7
CHUNK = 3  # in sub-steps: chunks end inside tokens


@functools.cache
def module(name: str):
    return mirasc.compile_spec(f"model {name} {{ {CASES[name][0]} }}")


def case(name, T=T, dk=DK, dv=DV, dtype=f64, seed=0):
    cfg = CASES[name][1]
    if cfg["memory"]["kind"] == "mlp" or cfg["retention"]["kind"] == "kl":
        dv = dk  # (kl: any widths; kept square to keep the case small)
    q, k, v, gates = make_inputs(cfg, B, T, H, dk, dv, f64, seed)
    state = make_state(cfg, B, H, dk, dv, f64, seed)
    cast = lambda x: x.to(dtype).clone()  # noqa: E731
    return cast(q), cast(k), cast(v), {n: cast(x) for n, x in gates.items()}, {n: cast(x) for n, x in state.items()}


def split(gates):
    """The reference keeps κ with the gates; the op takes it in `extras`."""
    extras = {n: x for n, x in gates.items() if n == "kappa"}
    return {n: x for n, x in gates.items() if n != "kappa"}, ({"extras": extras} if extras else {})


def run_with_grads(fn, q, k, v, gates, state, seed=5):
    """(o, final, grads of every input) for a fixed random scalar of the outputs and the final state."""
    leaves = {"q": q, "k": k, "v": v, **{f"gate:{n}": x for n, x in gates.items()},
              **{f"state:{n}": x for n, x in state.items()}}
    for x in leaves.values():
        x.requires_grad_(True)
    o, final = fn(q, k, v, gates, state)
    g = torch.Generator().manual_seed(seed)
    loss = (o * torch.randn(o.shape, generator=g, dtype=f64).to(o.dtype)).sum()
    for n in sorted(final):
        loss = loss + (final[n] * torch.randn(final[n].shape, generator=g, dtype=f64).to(final[n].dtype)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    grads = {n: torch.zeros_like(x) if gr is None else gr for (n, x), gr in zip(leaves.items(), grads)}
    return o.detach(), {n: x.detach() for n, x in final.items()}, grads


def compare(got, want, tol, what):
    errs = {"o": rel(got[0], want[0])} | {f"state:{n}": rel(got[1][n], want[1][n]) for n in want[1]}
    errs |= {f"d{n}": rel(got[2][n], want[2][n]) for n in want[2]}
    bad = {n: f"{e:.2e}" for n, e in errs.items() if not e < tol}
    assert not bad, f"{what}: relative errors above {tol:g}: {bad}"
    return max(errs.values())


def reference(name):
    return lambda q, k, v, gates, state: reference_apply(CASES[name][1], q, k, v, gates, state)


def compiled(name, **kw):
    mod = module(name)

    def fn(q, k, v, gates, state):
        gates, extras = split(gates)
        return mod.apply(q, k, v, gates, state=state, **kw, **extras)

    return fn


@functools.cache
def reference_result(name):
    return run_with_grads(reference(name), *case(name))


# ------------------------------------------------------------------------------- torch, float64


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_algorithms_match_reference(name):
    """Every torch algorithm the spec has, outputs, final state and all gradients, against the float64 reference;
    the chunked form with chunks of 3 sub-steps (boundaries inside tokens)."""
    mod = module(name)
    assert mod.STEPS == CASES[name][1]["steps"]
    want = reference_result(name)
    got = run_with_grads(compiled(name, backend="torch", algorithm="recurrent"), *case(name))
    compare(got, want, 1e-10, f"{name} recurrent")
    if mod.CHUNKED:
        for chunk in (CHUNK, 64):
            got = run_with_grads(compiled(name, backend="torch", algorithm="chunked", chunk_size=chunk), *case(name))
            compare(got, want, 1e-9, f"{name} chunked({chunk})")


def test_one_step_is_the_single_step_model():
    """steps=1 is the model without it: `gd(lr=gate, steps=1)` prints as `gd(lr=gate)` and compiles to the same
    module as specs/gated_deltanet.miras."""
    text = (SPECS / "gated_deltanet.miras").read_text()
    one = mirasc.compile_spec(text.replace("gd(lr=gate)", "gd(lr=gate, steps=1)"))
    assert one.SPEC == mirasc.compile_spec(text).SPEC and not hasattr(one, "STEPS")


def test_multistep_equals_interleaved_single_step():
    """Gated DeltaProduct is Gated DeltaNet over the interleaved sub-steps with α at each token's first, read at the
    last (the identity the compiler uses; here checked from the outside with the bundled single-step spec)."""
    gdp = mirasc.compile_spec(SPECS / "gated_deltaproduct.miras")
    gdn = mirasc.compile_spec(SPECS / "gated_deltanet.miras")
    q, k, v, gates, state = case("gated_deltaproduct")
    o, final = gdp.apply(q, k, v, gates, state=state)
    n = gdp.STEPS
    inter = lambda x: x.movedim(3, 2).flatten(1, 2)  # noqa: E731  [B, T, H, n, D] -> [B, T·n, H, D]
    alpha = torch.ones(B, T, H, n, dtype=f64)
    alpha[..., 0] = gates["alpha"]
    q_sub = torch.zeros(B, T, H, n, DK, dtype=f64)
    q_sub[..., -1, :] = q
    o_sub, final_sub = gdn.apply(inter(q_sub), inter(k), inter(v), {"eta": gates["eta"].transpose(2, 3).flatten(1, 2),
                                 "alpha": alpha.transpose(2, 3).flatten(1, 2)}, state=state)
    assert rel(o, o_sub[:, n - 1::n]) < 1e-12 and rel(final["W"], final_sub["W"]) < 1e-12


# ------------------------------------------------------------------------------------- Triton

TRITON_CASES = ["gated_deltaproduct", "deltaproduct3", "kda_product", "comba_product", "retnet_product"]


@pytest.mark.parametrize("name", TRITON_CASES)
def test_triton_matches_reference(name):
    """backend="triton" (interpreter, float32): the fused recurrent kernel and, where the family has one, the
    chunked kernels, outputs, final state and all gradients against the float64 reference."""
    pytest.importorskip("triton")
    mod = module(name)
    want = run_with_grads(reference(name), *case(name, T=4, dk=4, dv=4))
    algorithms = ["recurrent"] + (["chunked"] if "_chunked_triton" in vars(mod) else [])
    for algorithm in algorithms:
        kw = dict(chunk_size=4) if algorithm == "chunked" else {}
        got = run_with_grads(compiled(name, backend="triton", algorithm=algorithm, **kw),
                             *case(name, T=4, dk=4, dv=4, dtype=torch.float32))
        compare(got, want, 1e-4, f"{name} triton {algorithm}")


# -------------------------------------------------------------------------- flash-linear-attention


def _fla_naive():
    try:
        return importlib.import_module("fla.ops.gated_delta_product.naive").naive_recurrent_gated_delta_product
    except Exception as err:  # noqa: BLE001 - fla (or a dependency) missing
        pytest.skip(f"flash-linear-attention not importable: {err}")


def _fla_inputs(n, gated, Tn=6, dk=6, dv=5, seed=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, Tn, H, dk, generator=g, dtype=f64)
    k = F.normalize(torch.randn(1, Tn, H, n, dk, generator=g, dtype=f64), dim=-1)
    v = torch.randn(1, Tn, H, n, dv, generator=g, dtype=f64)
    beta = torch.rand(1, Tn, H, n, generator=g, dtype=f64)
    alpha = 0.7 + 0.3 * torch.rand(1, Tn, H, generator=g, dtype=f64) if gated else None
    W0 = 0.3 * torch.randn(1, H, dv, dk, generator=g, dtype=f64)
    return q, k, v, beta, alpha, W0


def _fla_run(naive, q, k, v, beta, alpha, W0, n, scale, cu_seqlens=None):
    """FLA's naive form with its conventions: keys/values/β token-major interleaved, g = log α, S = Wᵀ."""
    inter = lambda x: x.movedim(3, 2).flatten(1, 2)  # noqa: E731
    o, S = naive(q, inter(k), inter(v), None if alpha is None else alpha.log(), inter(beta), scale,
                 cu_seqlens=cu_seqlens, initial_state=W0.transpose(-1, -2).float().expand(
                     1 if cu_seqlens is None else len(cu_seqlens) - 1, -1, -1, -1).contiguous(),
                 output_final_state=True, num_householder=n)
    return o, S.transpose(-1, -2)


@pytest.mark.parametrize("n,gated", [(2, True), (3, False)], ids=["gated_deltaproduct-2", "deltaproduct-3"])
def test_matches_fla_gated_delta_product(n, gated):
    """fla.ops.gated_delta_product's naive recurrence (float32 inside) vs the compiled op with q·scale, α = e^g,
    η = β: outputs, final state and the gradients of q, k, v, β, g and the initial state."""
    naive = _fla_naive()
    mod = mirasc.compile_spec(SPECS / ("gated_deltaproduct.miras" if gated else "deltaproduct.miras"))
    assert mod.STEPS == n
    scale = 6 ** -0.5
    inputs = _fla_inputs(n, gated)
    ours_in = [x.clone().requires_grad_(True) for x in inputs if x is not None]
    fla_in = [x.clone().requires_grad_(True) for x in inputs if x is not None]

    def unpack(xs):
        q, k, v, beta, *rest = xs
        return q, k, v, beta, (rest[0] if gated else None), rest[-1]

    def ours(xs, algorithm):
        q, k, v, beta, alpha, W0 = unpack(xs)
        gates = {"eta": beta} | ({"alpha": alpha} if gated else {})
        o, final = mod.apply(q * scale, k, v, gates, state={"W": W0}, backend="torch", algorithm=algorithm,
                             chunk_size=4)
        return o, final["W"]

    gen = torch.Generator().manual_seed(9)
    for algorithm in ("recurrent", "chunked"):
        o, W = ours(ours_in, algorithm)
        o_f, W_f = _fla_run(naive, *unpack(fla_in), n, scale)
        w_o, w_s = torch.randn(o.shape, generator=gen, dtype=f64), torch.randn(W.shape, generator=gen, dtype=f64)
        assert rel(o, o_f) < 2e-6 and rel(W, W_f) < 2e-6, (algorithm, rel(o, o_f), rel(W, W_f))
        grads = torch.autograd.grad((o * w_o).sum() + (W * w_s).sum(), ours_in)
        grads_f = torch.autograd.grad((o_f.double() * w_o).sum() + (W_f.double() * w_s).sum(), fla_in)
        for name, a, b in zip(("q", "k", "v", "beta", "alpha", "W0") if gated else ("q", "k", "v", "beta", "W0"),
                              grads, grads_f):
            assert rel(a, b) < 1e-5, (algorithm, name, rel(a, b))


def test_matches_fla_with_cu_seqlens():
    """Packed sequences: token offsets [0, 2, 6] (sub-step offsets ×2 inside), each from its own initial state,
    against FLA's naive form with the same cu_seqlens (its keys, values and β are indexed at offsets·n)."""
    naive = _fla_naive()
    mod = mirasc.compile_spec(SPECS / "gated_deltaproduct.miras")
    q, k, v, beta, alpha, W0 = _fla_inputs(2, True)
    cu = torch.tensor([0, 2, 6])
    states = torch.cat([W0, 0.5 * W0], 0)
    o, final = mod.apply(q, k, v, {"eta": beta, "alpha": alpha}, state={"W": states}, cu_seqlens=cu)
    inter = lambda x: x.movedim(3, 2).flatten(1, 2)  # noqa: E731
    o_f, S = naive(q, inter(k), inter(v), alpha.log(), inter(beta), 1.0, cu_seqlens=cu,
                   initial_state=states.transpose(-1, -2).float(), output_final_state=True, num_householder=2)
    assert rel(o, o_f) < 2e-6 and rel(final["W"], S.transpose(-1, -2)) < 2e-6
    # the same as running each sequence alone
    for i, (a, b) in enumerate(((0, 2), (2, 6))):
        o_i, f_i = mod.apply(q[:, a:b], k[:, a:b], v[:, a:b], {"eta": beta[:, a:b], "alpha": alpha[:, a:b]},
                             state={"W": states[i:i + 1]})
        assert rel(o[:, a:b], o_i) < 1e-12 and rel(final["W"][i:i + 1], f_i["W"]) < 1e-12


def test_cu_seqlens_on_triton_chunks():
    """Packed sequences in one launch of the chunked Triton kernels (interpreter): each row padded at its end in
    sub-steps, equal to each sequence run alone."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(SPECS / "gated_deltaproduct.miras")
    q, k, v, gates, state = case("gated_deltaproduct", T=5, dk=4, dv=4, dtype=torch.float32)
    q, k, v, gates = q[:1], k[:1], v[:1], {n: x[:1] for n, x in gates.items()}
    cu = torch.tensor([0, 2, 5])
    o, final = mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="chunked", chunk_size=4,
                         cu_seqlens=cu)
    for i, (a, b) in enumerate(((0, 2), (2, 5))):
        o_i, f_i = mod.apply(q[:, a:b], k[:, a:b], v[:, a:b], {n: x[:, a:b] for n, x in gates.items()},
                             state={"W": state["W"][i:i + 1]}, backend="torch", algorithm="recurrent")
        assert rel(o[:, a:b], o_i) < 1e-5 and rel(final["W"][i:i + 1], f_i["W"]) < 1e-5


# ---------------------------------------------------------------------------- layer, errors


@pytest.mark.parametrize("name", ["comba_product", "kda_product"])
def test_layer_step_equals_forward(name):
    """The Layer projects n keys, values and η per token (and κ per sub-step); decoding token by token with
    init_cache/step (O(1) state) equals the full forward, and every parameter gets a gradient."""
    torch.manual_seed(0)
    mod = module(name)
    layer = mod.Layer(16, 2).double()
    x = torch.randn(2, 9, 16, dtype=f64)
    y = layer(x)
    assert rel(decode(layer, x), y) < 1e-12
    y.square().sum().backward()
    for pname, p in layer.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("learner,parallel,match", [
    ("momentum(lr=gate, theta=gate, steps=2)", "exact", "momentum\\(steps=n\\)` is not defined"),
    ("gd(lr=gate, steps=2)", "minibatch(8)", "collapse into one step"),
    ("gd(lr=gate, steps=0)", "exact", ">= 1"),
    ("gd(lr=gate, steps=1.5)", "exact", "integer"),
])
def test_rejections_are_located(learner, parallel, match):
    text = f"model m {{\n    memory = linear\n    bias = l2\n    learner = {learner}\n    parallel = {parallel}\n}}\n"
    with pytest.raises(mirasc.SpecError, match=match) as info:
        mirasc.compile_spec(text)
    assert ":4:" in str(info.value)


@pytest.mark.parametrize("memory,bias,learner,line,match", [
    ("linear(feature=elu1)", "l2", "gd(lr=gate, steps=2)", 4, "feature=elu1"),
    ("linear(feature=taylor, normalize=true)", "dot", "gd(lr=gate, steps=2)", 4,
     "`feature=taylor` and `normalize=true` is not"),
    ("linear(normalize=true)", "dot", "gd(lr=gate, steps=2)", 4, "`steps=n` with `normalize=true` is not"),
    ("linear", "l2", "muon(lr=gate, theta=gate, steps=2)", 4, "muon\\(steps=n\\)` is not defined"),
    ("linear", "l2(window=3, gamma=gate)", "gd(lr=gate, steps=2)", 3, "Omega window"),
])
def test_rejections_across_features(memory, bias, learner, line, match):
    """What the multi-step learner does not combine with (feature maps the op applies, muon, an Omega window)."""
    text = f"model m {{\n    memory = {memory}\n    bias = {bias}\n    learner = {learner}\n}}\n"
    with pytest.raises(mirasc.SpecError, match=match) as info:
        mirasc.compile_spec(text)
    assert f":{line}:" in str(info.value)


def test_shape_errors_name_the_inner_steps():
    mod = module("gated_deltaproduct")
    q, k, v, gates, state = case("gated_deltaproduct")
    with pytest.raises(ValueError, match="STEPS=2"):
        mod.apply(q, k[:, :, :, 0], v, gates)
    with pytest.raises(ValueError, match="one per inner step"):
        mod.apply(q, k, v, {"eta": gates["eta"][..., 0], "alpha": gates["alpha"]})
    with pytest.raises(ValueError, match="gate 'alpha'"):
        mod.apply(q, k, v, {"eta": gates["eta"], "alpha": gates["eta"]})
