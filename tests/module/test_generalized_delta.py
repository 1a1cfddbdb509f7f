"""Erase and write keys apart: the generalized delta transition (docs/semantics.md), `l2(read=kappa)` and
`l2(erase=kappa)`.

1. Variants a user could write (decay order, decay and learning rate per head or per key channel, no retention),
   compiled in-process, against the independent float64 reference (tests/reference.py: a token loop with the
   erase gradient by autograd), on every algorithm: outputs, final state, gradients of q, k, v, κ, every gate and
   the initial state.
2. flash-linear-attention's pure-torch references with their conventions mapped (state S = Wᵀ [K, V]; FLA scales
   q by Dk^-1/2 inside, so ours gets q·Dk^-1/2): the DPLR recurrence and chunk form (what fla.ops.rwkv7 computes:
   a = −κ, b = η ⊙ κ, gk = log α), the IPLR recurrence and chunk form (no decay), and Comba's recurrent reference
   (decay first: order=pre) and chunk reference (decay after the read: order=post).
3. The fused recurrent Triton kernel and its generated backward (interpreter, float32) against the same
   reference.
4. The combinations without a defined meaning are rejected with a located reason; the op checks κ.
"""

from __future__ import annotations

import functools
import importlib
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reference import make_inputs, make_state, reference_apply, rel

mirasc = pytest.importorskip("mirasc")

SPECS = Path(__file__).resolve().parents[2] / "specs"

f64 = torch.float64
B, H, DK, DV = 2, 2, 6, 5
T_EXACT, CHUNK = 23, 8  # the chunk does not divide T
LIN = dict(kind="linear")


def _case(bias: str, retention: str, lr: str):
    """(spec body, reference config) of one variant."""
    ret = dict(kind="none")
    if retention != "none":
        alpha, order = retention.split("/")
        ret = dict(kind="decay", alpha=alpha, order=order)
    spec_ret = "none" if retention == "none" else f"decay(alpha={ret['alpha']}, order={ret['order']})"
    body = f"memory = linear; bias = l2({bias}=kappa); retention = {spec_ret}; learner = gd(lr={lr})"
    cfg = dict(memory=LIN, bias=dict(kind="l2", **{bias: "kappa"}), retention=ret,
               learner=dict(kind="gd", lr=lr), parallel=None, gate_ranges=dict(eta=(0.1, 0.9)))
    return body, cfg


CASES = {
    f"{bias}-{retention.replace('/', '-')}-{lr}": _case(bias, retention, lr)
    for bias in ("erase", "read")
    for retention, lr in (("gate(k)/post", "gate(k)"), ("gate(k)/pre", "gate"), ("gate/pre", "gate(k)"),
                          ("gate/post", "gate"), ("none", "gate(k)"))
}


@functools.cache
def module(name: str):
    return mirasc.compile_spec(f"model gd_{name.replace('-', '_').replace('(', '').replace(')', '')} "
                               f"{{ {CASES[name][0]} }}")


def _split(gates):
    return {n: x for n, x in gates.items() if n != "kappa"}, {"kappa": gates["kappa"]}


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_variant_matches_reference(name, algorithm):
    mod = module(name)
    cfg = CASES[name][1]
    assert mod.EXTRAS == ("kappa",) and mod.CHUNKED
    q, k, v, gates = make_inputs(cfg, B, T_EXACT, H, DK, DV, f64, seed=3)
    state = make_state(cfg, B, H, DK, DV, f64, seed=3)
    leaves = {"q": q, "k": k, "v": v, **gates, **{f"state:{n}": x for n, x in state.items()}}
    for x in leaves.values():
        x.requires_grad_(True)
    want_o, want_s = reference_apply(cfg, q, k, v, gates, state)
    g, extras = _split(gates)
    got_o, got_s = mod.apply(q, k, v, g, state=state, extras=extras, backend="torch", algorithm=algorithm,
                             chunk_size=CHUNK)
    tol = 1e-10 if algorithm == "recurrent" else 1e-9
    assert rel(got_o, want_o) < tol and rel(got_s["W"], want_s["W"]) < tol, (rel(got_o, want_o),
                                                                            rel(got_s["W"], want_s["W"]))
    gen = torch.Generator().manual_seed(5)
    w_o, w_s = torch.randn(want_o.shape, generator=gen, dtype=f64), torch.randn(want_s["W"].shape, generator=gen,
                                                                                dtype=f64)

    def grads(o, s):
        return torch.autograd.grad((o * w_o).sum() + (s["W"] * w_s).sum(), list(leaves.values()))

    errs = {n: rel(a, b) for n, a, b in zip(leaves, grads(got_o, got_s), grads(want_o, want_s))}
    assert max(errs.values()) < 1e-9, errs


@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_recurrent_matches_reference(name):
    """The fused recurrent Triton kernel (forward) and its generated reverse sweep (backward), float32 under the
    interpreter, against the float64 reference: outputs, final state, gradients of every input incl. κ.
    Dk, Dv not powers of two (padded lanes) and Dv > BV = 4 (two V tiles, partial sums of dk, dκ, dη)."""
    pytest.importorskip("triton")
    mod = module(name)
    cfg = CASES[name][1]
    q, k, v, gates = make_inputs(cfg, 1, 9, 2, DK, DV, f64, seed=7)
    state = make_state(cfg, 1, 2, DK, DV, f64, seed=7)
    leaves64 = {"q": q, "k": k, "v": v, **gates, "W": state["W"]}
    leaves32 = {n: x.float().requires_grad_(True) for n, x in leaves64.items()}
    for x in leaves64.values():
        x.requires_grad_(True)
    want_o, want_s = reference_apply(cfg, q, k, v, gates, state)
    g, extras = _split({n: leaves32[n] for n in gates})
    got_o, got_s = mod.apply(leaves32["q"], leaves32["k"], leaves32["v"], g, state={"W": leaves32["W"]},
                             extras=extras, backend="triton", algorithm="recurrent")
    assert rel(got_o, want_o) < 1e-5 and rel(got_s["W"], want_s["W"]) < 1e-5
    gen = torch.Generator().manual_seed(8)
    w_o, w_s = torch.randn(want_o.shape, generator=gen, dtype=f64), torch.randn(want_s["W"].shape, generator=gen,
                                                                                dtype=f64)
    want = torch.autograd.grad((want_o * w_o).sum() + (want_s["W"] * w_s).sum(), list(leaves64.values()))
    got = torch.autograd.grad((got_o * w_o.float()).sum() + (got_s["W"] * w_s.float()).sum(),
                              list(leaves32.values()))
    errs = {n: rel(a, b) for n, a, b in zip(leaves64, got, want)}
    assert max(errs.values()) < 1e-5, errs  # (measured ≤ 3e-7)


@pytest.mark.parametrize("name", ["erase-gate(k)-post-gate(k)", "read-gate-post-gate"])
def test_chunk_sizes_and_float32(name):
    """Every chunk size from 1 to past T computes the same function; float32 within 1e-5 of float64."""
    mod = module(name)
    cfg = CASES[name][1]
    q, k, v, gates = make_inputs(cfg, 1, 13, 2, DK, DV, f64, seed=4)
    state = make_state(cfg, 1, 2, DK, DV, f64, seed=4)
    g, extras = _split(gates)
    want = mod.apply(q, k, v, g, state=state, extras=extras, algorithm="recurrent")
    for chunk in (1, 2, 5, 13, 64):
        got = mod.apply(q, k, v, g, state=state, extras=extras, algorithm="chunked", chunk_size=chunk)
        assert rel(got[0], want[0]) < 1e-10 and rel(got[1]["W"], want[1]["W"]) < 1e-10, chunk
    cast = lambda d: {n: x.float() for n, x in d.items()}  # noqa: E731
    for algorithm in ("recurrent", "chunked"):
        got = mod.apply(q.float(), k.float(), v.float(), cast(g), state=cast(state), extras=cast(extras),
                        algorithm=algorithm)
        assert rel(got[0], want[0]) < 1e-5 and rel(got[1]["W"], want[1]["W"]) < 1e-5, algorithm


def test_reduces_to_delta_rule_when_kappa_is_k():
    """read=kappa with κ = k is the l2 bias itself (Gated DeltaNet); erase=kappa with κ = k and a write key η ⊙ k
    as well: the two halves of the ℓ2 gradient put back together."""
    gdn = mirasc.compile_spec("model g { memory = linear; bias = l2; retention = decay(alpha=gate, order=pre); "
                              "learner = gd(lr=gate) }")
    read = mirasc.compile_spec("model r { memory = linear; bias = l2(read=kappa); "
                               "retention = decay(alpha=gate, order=pre); learner = gd(lr=gate) }")
    erase = mirasc.compile_spec("model e { memory = linear; bias = l2(erase=kappa); "
                                "retention = decay(alpha=gate, order=pre); learner = gd(lr=gate) }")
    cfg = dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate", order="pre"),
               learner=dict(kind="gd", lr="gate"), parallel=None)
    q, k, v, gates = make_inputs(cfg, B, 11, H, DK, DV, f64, seed=6)
    state = make_state(cfg, B, H, DK, DV, f64, seed=6)
    want = gdn.apply(q, k, v, gates, state=state, algorithm="recurrent")
    got_read = read.apply(q, k, v, gates, state=state, extras={"kappa": k}, algorithm="recurrent")
    got_erase = erase.apply(q, gates["eta"][..., None] * k, v, gates, state=state, extras={"kappa": k},
                            algorithm="recurrent")
    for got in (got_read, got_erase):
        assert rel(got[0], want[0]) < 1e-12 and rel(got[1]["W"], want[1]["W"]) < 1e-12


# ------------------------------------------------------------------------------------------ FLA references


@pytest.fixture(scope="module")
def fla_refs():
    pytest.importorskip("fla")
    paths = {"dplr": "fla.ops.generalized_delta_rule.dplr.naive", "iplr": "fla.ops.generalized_delta_rule.iplr.naive",
             "comba": "fla.ops.comba.naive"}
    return {n: importlib.import_module(p) for n, p in paths.items()}


def _fla_inputs(seed, T=32, Dk=8, Dv=6, decay=True):
    """q, k, v, κ (unit rows), η ∈ (0.1, 0.9) per key channel, α ∈ (0.8, 1) per key channel, W0 — float64 leaves."""
    g = torch.Generator().manual_seed(seed)
    x = dict(q=torch.randn(B, T, H, Dk, generator=g, dtype=f64), k=0.5 * torch.randn(B, T, H, Dk, generator=g,
                                                                                       dtype=f64),
             v=torch.randn(B, T, H, Dv, generator=g, dtype=f64),
             kappa=F.normalize(torch.randn(B, T, H, Dk, generator=g, dtype=f64), dim=-1),
             eta=0.1 + 0.8 * torch.rand(B, T, H, Dk, generator=g, dtype=f64),
             W0=0.3 * torch.randn(B, H, Dv, Dk, generator=g, dtype=f64))
    if decay:
        x["alpha"] = 0.8 + 0.2 * torch.rand(B, T, H, Dk, generator=g, dtype=f64)
    return {n: t.requires_grad_(True) for n, t in x.items()}


def _hm(x):  # [B, T, H, D] -> FLA's naive layout [B, H, T, D], float32 (its references compute in float32)
    return x.transpose(1, 2).float()


def _check(ours, theirs, leaves, tol):
    """Outputs, final state and the gradients of every leaf (a fixed random projection of o and the state)."""
    (o1, s1), (o2, s2) = ours, theirs
    assert rel(o1, o2) < tol and rel(s1, s2) < tol, (rel(o1, o2), rel(s1, s2))
    gen = torch.Generator().manual_seed(9)
    w_o, w_s = torch.randn(o2.shape, generator=gen, dtype=f64), torch.randn(s2.shape, generator=gen, dtype=f64)
    g1 = torch.autograd.grad((o1 * w_o).sum() + (s1 * w_s).sum(), list(leaves.values()))
    g2 = torch.autograd.grad((o2.double() * w_o).sum() + (s2.double() * w_s).sum(), list(leaves.values()))
    errs = {n: rel(a, b) for n, a, b in zip(leaves, g1, g2)}
    assert max(errs.values()) < tol, errs


RWKV7_LIKE = {
    "rwkv7": "memory = linear; bias = l2(erase=kappa); retention = decay(alpha=gate(k), order=post); "
             "learner = gd(lr=gate(k))",
    "iplr": "memory = linear; bias = l2(erase=kappa); retention = none; learner = gd(lr=gate(k))",
}


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
@pytest.mark.parametrize("fla_form", ["recurrence", "chunkwise"])
@pytest.mark.parametrize("which", ["rwkv7", "iplr"])
def test_erase_kappa_vs_fla_dplr_iplr(fla_refs, which, fla_form, algorithm):
    """RWKV-7 (the bundled spec) against FLA's DPLR references, the no-decay form against its IPLR references:
    S_t = S_{t-1}·diag(e^{gk_t}) (DPLR only) + k_t v_tᵀ + b_t (a_tᵀ S_{t-1}), with a = −κ, b = η ⊙ κ."""
    decay = which == "rwkv7"
    mod = mirasc.compile_spec(SPECS / "rwkv7.miras") if decay else \
        mirasc.compile_spec(f"model iplr_like {{ {RWKV7_LIKE['iplr']} }}")
    x = _fla_inputs(11, decay=decay)
    Dk = x["q"].shape[-1]
    gates = {"eta": x["eta"], **({"alpha": x["alpha"]} if decay else {})}
    o, s = mod.apply(x["q"] * Dk ** -0.5, x["k"], x["v"], gates, state={"W": x["W0"]}, extras={"kappa": x["kappa"]},
                     backend="torch", algorithm=algorithm, chunk_size=CHUNK)
    a, b = -x["kappa"], x["eta"] * x["kappa"]
    args = [_hm(x["q"]), _hm(x["k"]), _hm(x["v"]), _hm(a), _hm(b)]
    if decay:
        args.append(_hm(torch.log(x["alpha"])))
    fn = getattr(fla_refs["dplr" if decay else "iplr"], f"{'dplr' if decay else 'iplr'}_{fla_form}")
    kwargs = dict(initial_state=x["W0"].transpose(-1, -2).float(), output_final_state=True)
    if fla_form == "chunkwise":
        kwargs["chunk_size"] = 16
    o_ref, s_ref = fn(*args, **kwargs)
    _check((o, s["W"].transpose(-1, -2)), (_hm(o_ref), s_ref), x, 2e-6)  # float32 references (measured ≤ 3e-7)


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
@pytest.mark.parametrize("fla_form", ["recurrent", "chunk"])
def test_read_kappa_vs_fla_comba(fla_refs, fla_form, algorithm):
    """Comba: FLA's recurrent reference decays first (order=pre, the bundled spec); its chunk reference reads the
    error at the undecayed state (order=post). p = κ, β = η, g = log α, per head."""
    order = "pre" if fla_form == "recurrent" else "post"
    text = (SPECS / "comba.miras").read_text()
    assert "order=pre" in text
    text = text.replace("order=pre", f"order={order}").replace("model comba", f"model comba_{order}")
    mod = mirasc.compile_spec(text)
    g = torch.Generator().manual_seed(13)
    x = _fla_inputs(13, decay=False)
    x.pop("eta")
    x["eta"] = (0.1 + 0.8 * torch.rand(B, 32, H, generator=g, dtype=f64)).requires_grad_(True)
    x["alpha"] = (0.8 + 0.2 * torch.rand(B, 32, H, generator=g, dtype=f64)).requires_grad_(True)
    Dk = x["q"].shape[-1]
    o, s = mod.apply(x["q"] * Dk ** -0.5, x["k"], x["v"], {"eta": x["eta"], "alpha": x["alpha"]},
                     state={"W": x["W0"]}, extras={"kappa": x["kappa"]}, backend="torch", algorithm=algorithm,
                     chunk_size=CHUNK)
    ref = fla_refs["comba"]
    common = dict(initial_state=x["W0"].transpose(-1, -2).float(), output_final_state=True)
    f = {n: t.float() for n, t in x.items()}  # FLA's references compute in float32
    if fla_form == "recurrent":
        o_ref, s_ref = ref.naive_recurrent_comba(f["q"], f["k"], f["v"], f["kappa"], f["eta"],
                                                 torch.log(f["alpha"]), **common)
    else:
        o_ref, s_ref = ref.naive_chunk_comba(f["q"], f["k"], f["v"], f["kappa"], torch.log(f["alpha"]), f["eta"],
                                             chunk_size=16, **common)
    _check((o, s["W"].transpose(-1, -2)), (o_ref, s_ref), x, 2e-6)  # float32 references (measured ≤ 3e-7)


def test_comba_references_disagree_on_order(fla_refs):
    """The two FLA Comba references compute different functions (so each test above checks its own order)."""
    x = _fla_inputs(14, decay=False)
    g = torch.Generator().manual_seed(14)
    beta, logd = 0.5 * torch.ones(B, 32, H, dtype=f64), torch.log(0.5 + 0.4 * torch.rand(B, 32, H, generator=g,
                                                                                          dtype=f64))
    ref = fla_refs["comba"]
    o1, _ = ref.naive_recurrent_comba(x["q"], x["k"], x["v"], x["kappa"], beta, logd, output_final_state=True)
    o2, _ = ref.naive_chunk_comba(x["q"], x["k"], x["v"], x["kappa"], logd, beta, chunk_size=16,
                                  output_final_state=True)
    assert rel(o1, o2) > 1e-2


# ------------------------------------------------------------------------------------------ errors


REJECTED = {
    "memory = mlp(depth=2); bias = l2(erase=kappa)": ("bias", "no key channels past the first layer"),
    "memory = linear; bias = l2(read=kappa); learner = momentum": ("learner", "is defined with `gd`"),
    "memory = linear; bias = l2(erase=kappa); learner = implicit": ("learner", "is defined with `gd`"),
    "memory = linear; bias = l2(read=kappa); retention = lq(q=3)": ("retention", "nonlinear readout"),
    "memory = linear; bias = l2(read=kappa); parallel = minibatch(8)": ("parallel", "write `parallel = exact`"),
    "memory = linear; bias = l2(erase=kappa); learner = gd(lr=gate(v))": ("learner", "acts on value channels"),
    "memory = linear; bias = l2(erase=kappa); retention = decay(alpha=gate(v))": ("retention",
                                                                                 "acts on value channels"),
    "memory = linear; bias = l2(read=kappa, erase=kappa)": ("bias", "already reads the memory at κ"),
    "memory = linear; bias = l2(read=kapa)": ("bias", "read"),
}


@pytest.mark.parametrize("body", sorted(REJECTED))
def test_rejections(body):
    field, why = REJECTED[body]
    text = f"model bad {{\n    {body}\n}}\n"
    with pytest.raises(mirasc.SpecError) as err:
        mirasc.compile_spec(text)
    message = str(err.value)
    assert message.startswith("<spec>:2:") and why in message, message


def test_op_checks_kappa():
    mod = module("erase-gate(k)-post-gate(k)")
    cfg = CASES["erase-gate(k)-post-gate(k)"][1]
    q, k, v, gates = make_inputs(cfg, 1, 4, 1, DK, DV, f64, seed=1)
    g, extras = _split(gates)
    with pytest.raises(ValueError, match="missing extra input 'kappa'"):
        mod.apply(q, k, v, g)
    with pytest.raises(ValueError, match=r"extra input 'kappa' has shape"):
        mod.apply(q, k, v, g, extras={"kappa": extras["kappa"][..., :3]})
    with pytest.raises(ValueError, match="unknown extra input"):
        mod.apply(q, k, v, g, extras={**extras, "p": extras["kappa"]})
    # (backend="triton", algorithm="chunked" runs the chunk kernels: tests/triton_backend/test_triton_gdelta.py)
    assert mirasc.compile_text(mod.SPEC).plan.chunk_family == "gdelta"


def test_packed_sequences_carry_kappa():
    """cu_seqlens: κ is cut along time like q, k, v."""
    mod = module("read-gate-post-gate")
    cfg = CASES["read-gate-post-gate"][1]
    q, k, v, gates = make_inputs(cfg, 1, 10, 2, DK, DV, f64, seed=2)
    g, extras = _split(gates)
    o, final = mod.apply(q, k, v, g, extras=extras, cu_seqlens=torch.tensor([0, 4, 10]))
    for i, (a, b) in enumerate(((0, 4), (4, 10))):
        o_i, f_i = mod.apply(q[:, a:b], k[:, a:b], v[:, a:b], {n: x[:, a:b] for n, x in g.items()},
                             extras={"kappa": extras["kappa"][:, a:b]})
        assert rel(o[:, a:b], o_i) < 1e-12 and rel(final["W"][i:i + 1], f_i["W"]) < 1e-12


def test_layer_alpha_act_exp():
    """layer { alpha_act = exp }: α = exp(−e^{−r}), RWKV-7's decay form; decoding still equals the forward."""
    text = (SPECS / "rwkv7.miras").read_text().replace(
        "parallel  = exact", "parallel  = exact\n    layer { alpha_act = exp }").replace("model rwkv7", "model rwkv7e")
    mod = mirasc.compile_spec(text)
    assert "alpha_act = exp" in mod.SPEC
    torch.manual_seed(0)
    layer = mod.Layer(16, 2).double()
    x = torch.randn(2, 9, 16, dtype=f64)
    _, _, _, gates, _ = layer._project(x)
    extras = layer._key_inputs(x)
    r = layer.gate_proj(x).split(layer._gates.widths, dim=-1)[list(mod.GATES).index("alpha")].view(2, 9, 2, 8)
    assert torch.allclose(gates["alpha"], torch.exp(-torch.exp(-r)))
    assert torch.allclose(extras["kappa"].norm(dim=-1), torch.ones(2, 9, 2, dtype=f64))
    y = layer(x)
    cache, steps = layer.init_cache(2), []
    for t in range(9):
        y_t, cache = layer.step(x[:, t], cache)
        steps.append(y_t)
    assert rel(torch.stack(steps, 1), y) < 1e-12
    assert math.isclose(math.exp(-math.exp(-3.0)), 0.9514, abs_tol=1e-4)
