"""The diagonal preconditioned learner `precond` (docs/semantics.md, "Preconditioned learner").

Preconditioned Gated DeltaNet and preconditioned KDA against flash-linear-attention 0.6's CPU references with FLA's
raw inputs (outputs, final W and final statistic A, gradients of every input including the statistic's gates and
initial state), recurrent and chunked, also packed with cu_seqlens; a held-out RMSprop-form spec against the float64
token-by-token reference (tests/reference.py); the Triton paths under the interpreter; Layer.step == Layer.forward;
the located rejections. Conventions as in tests/peers/test_fla_mappings.py: FLA's state S [B, H, K, V] is our Wᵀ, FLA's
scale is passed as 1.0, its log gates g are log α (here also ν = e^{g_atk}); FLA computes in float32, so the
tolerances are float32's.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reference import REF_CONFIGS, make_inputs, make_state, reference_apply, rel
from test_fla_mappings import _T, compare, fla, leaves  # FLA's references, the same leaves and comparison

import mirasc

SPECS = Path(__file__).resolve().parents[2] / "specs"
B, T, H, DK, DV = 2, 19, 2, 8, 6  # T = 19: chunk_size 8 gives two full chunks and a partial one
ALGORITHMS = [("recurrent", None), ("chunked", 8)]


@functools.cache
def spec(name: str):
    return mirasc.compile_spec(str(SPECS / f"{name}.miras"))


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


def _packed_inputs(seed, channel, lens=(5, 9, 5)):
    """N = 3 sequences packed in one row (B = 1), each with its own initial W and A."""
    n, total = len(lens), sum(lens)
    gshape = (1, total, H, DK) if channel else (1, total, H)
    x = leaves(seed, q=("", (1, total, H, DK)), k=("", (1, total, H, DK)), v=("", (1, total, H, DV)),
               g=("u", gshape), g_atk=("u", (1, total, H)), beta_atk=("u", (1, total, H)), beta=("u", (1, total, H)),
               S0=("", (n, H, DK, DV)), A0=("u", (n, H, DK)))
    return x, torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])


def _theirs_packed(x, channel, cu):
    """FLA's Gated DeltaNet reference takes cu_seqlens; its KDA reference does not, so each sequence is run alone."""
    if not channel:
        naive = fla("precond_gated_delta_rule.naive", "naive_recurrent_precond_gated_delta_rule")
        o, S, A = naive(x["q"], x["k"], x["v"], -0.2 * x["g_atk"], -0.3 * x["g"], x["beta_atk"], x["beta"],
                        scale=1.0, initial_state=x["S0"], initial_A_state=x["A0"], output_final_state=True,
                        cu_seqlens=cu)
        return o, [_T(S), A]
    outs, Ss, As = [], [], []
    for i, (a, b) in enumerate(zip(cu.tolist(), cu.tolist()[1:])):
        part = {n: t[:, a:b] for n, t in x.items() if n not in ("S0", "A0")}
        o, (S, A) = _theirs({**part, "S0": x["S0"][i:i + 1], "A0": x["A0"][i:i + 1]}, channel)
        outs.append(o)
        Ss.append(S)
        As.append(A)
    return torch.cat(outs, 1), [torch.cat(Ss), torch.cat(As)]


@pytest.mark.parametrize("algorithm,chunk", ALGORITHMS)
@pytest.mark.parametrize("name", ["precond_gated_deltanet", "precond_kda"])
def test_packed_sequences_match_fla(name, algorithm, chunk):
    """cu_seqlens: every sequence starts from its own W_0 and A_0 (the statistic is reset per sequence) and the
    final state has one row per sequence; against FLA with the same packing, o, W, A and all gradients."""
    channel = name == "precond_kda"
    x, cu = _packed_inputs(4, channel)
    mod = spec(name)
    compare(lambda: _ours(mod, x, channel, algorithm=algorithm, chunk_size=chunk, cu_seqlens=cu),
            lambda: _theirs_packed(x, channel, cu), x)


# ------------------------------------------------------------------------------ held-out specs, float64
LIN = dict(kind="linear")
HELD_OUT = {
    # RMSprop's scale on a key-channel learning rate, a per-head constant ν_h (several timescales), a constant ρ,
    # a decay over key channels after the step, mini-batches of 4
    "rmsprop_minibatch": (
        "memory = linear; bias = l2; retention = decay(alpha=gate(k)); "
        "learner = precond(lr=gate(k), nu=1 - 2^(-2 - h), rho=0.25, transform=rms); parallel = minibatch(4)",
        dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate(k)", order="post"),
             learner=dict(kind="precond", lr="gate(k)", nu=lambda h, H: 1 - 2 ** (-2 - h), rho=0.25,
                          transform="rms", eps=1e-6), parallel=4)),
    # Adagrad (ν = 1, ρ = 1: the plain running sum of k²) on a Hebbian memory with a per-head decay, exact
    "adagrad_hebbian": (
        "memory = linear; bias = dot; retention = decay(alpha=gate); "
        "learner = precond(lr=gate, nu=1, rho=1, transform=rms, eps=0.01)",
        dict(memory=LIN, bias=dict(kind="dot"), retention=dict(kind="decay", alpha="gate", order="post"),
             learner=dict(kind="precond", lr="gate", nu=1.0, rho=1.0, transform="rms", eps=0.01), parallel=None)),
    # ATK with its own constants and learned-statistic gates on a delta rule without retention
    "atk_delta": (
        "memory = linear; bias = l2; learner = precond(lr=gate, nu=gate, rho=gate, transform=atk, base=2, "
        "center=-1)",
        dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="none"),
             learner=dict(kind="precond", lr="gate", nu="gate", rho="gate", transform="atk", base=2.0, center=-1.0,
                          eps=1e-6), parallel=None)),
}


@functools.cache
def held_out(name):
    body = "\n    ".join(part.strip() for part in HELD_OUT[name][0].split(";"))
    return mirasc.compile_spec(f"model {name} {{\n    {body}\n}}\n")


def _run(fn, cfg, shape, seed=1):
    """fn(q, k, v, gates, state) -> (o, final state); o, final W and A, and the gradients of q, k, v, every gate,
    W_0 and A_0 under one random upstream gradient."""
    Bn, Tn, Hn, Dk, Dv = shape
    q, k, v, gates = make_inputs(cfg, Bn, Tn, Hn, Dk, Dv, torch.float64, seed)
    state = make_state(cfg, Bn, Hn, Dk, Dv, torch.float64, seed)
    leaves_ = {"q": q, "k": k, "v": v, **{f"gate_{n}": g for n, g in gates.items()}, "W0": state["W"],
               "A0": state["A"]}
    for t in leaves_.values():
        t.requires_grad_(True)
    o, final = fn(q, k, v, gates, state)
    gen = torch.Generator().manual_seed(seed + 11)
    loss = (o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64)).sum()
    for key in ("W", "A"):
        loss = loss + (final[key].double() * torch.randn(final[key].shape, generator=gen, dtype=torch.float64)).sum()
    grads = torch.autograd.grad(loss, list(leaves_.values()))
    return {"o": o, "W": final["W"], "A": final["A"], **{f"d{n}": g for n, g in zip(leaves_, grads)}}


def _check(ours, ref, tol):
    errors = {n: rel(ours[n], ref[n]) for n in ref}
    bad = {n: e for n, e in errors.items() if not e < tol}
    assert not bad, bad
    return errors


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
@pytest.mark.parametrize("name", sorted(HELD_OUT))
def test_held_out_specs_match_reference(name, algorithm):
    """Specs no test above was written for, against the float64 token-by-token reference: o, W, A and the
    gradients of every input (q, k, v, the gates, W_0, A_0), to 1e-10."""
    cfg = HELD_OUT[name][1]
    mod = held_out(name)
    shape = (2, 11, 3, 5, 4)
    ref = _run(lambda q, k, v, g, s: reference_apply(cfg, q, k, v, g, s), cfg, shape)
    chunk = None if cfg["parallel"] else 4
    ours = _run(lambda q, k, v, g, s: mod.apply(q, k, v, g, state=s, algorithm=algorithm, chunk_size=chunk), cfg,
                shape)
    _check(ours, ref, 1e-10)


def test_key_channel_rate_without_retention_chunks_causally():
    """Regression (found by atk_delta above): the channel-wise delta chunk form with no retention masked its
    (t, s) factor with a .tril() over the wrong axes, so a chunk's outputs read later tokens' updates (final W was
    right, o was not): gd(lr=gate(k)) with retention none, chunked == recurrent."""
    mod = mirasc.compile_spec("model key_rate {\n    memory = linear\n    bias = l2\n    learner = gd(lr=gate(k))\n}\n")
    gen = torch.Generator().manual_seed(0)
    q, k = (F.normalize(torch.randn(2, 11, 3, 5, generator=gen, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(2, 11, 3, 4, generator=gen, dtype=torch.float64)
    eta = torch.rand(2, 11, 3, 5, generator=gen, dtype=torch.float64)
    W0 = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64)
    o_r, f_r = mod.apply(q, k, v, {"eta": eta}, state={"W": W0}, algorithm="recurrent")
    o_c, f_c = mod.apply(q, k, v, {"eta": eta}, state={"W": W0}, algorithm="chunked", chunk_size=4)
    assert rel(o_c, o_r) < 1e-12 and rel(f_c["W"], f_r["W"]) < 1e-12


# ------------------------------------------------------------------------------ Triton (the interpreter on CPU)
def _triton(mod, algorithm, chunk, **kw):
    def fn(q, k, v, gates, state):
        f32 = lambda x: x.float()  # noqa: E731
        return mod.apply(f32(q), f32(k), f32(v), {n: f32(g) for n, g in gates.items()},
                         state={n: f32(s) for n, s in state.items()}, backend="triton", algorithm=algorithm,
                         chunk_size=chunk, **kw)
    return fn


TRITON_CASES = [("precond_kda", "chunked"), ("precond_kda", "recurrent"), ("precond_gated_deltanet", "chunked"),
                ("precond_gated_deltanet", "recurrent"), ("adagrad_hebbian", "chunked"), ("atk_delta", "chunked"),
                ("rmsprop_minibatch", "chunked")]


@pytest.mark.parametrize("name,algorithm", TRITON_CASES)
def test_triton_matches_reference(name, algorithm):
    """backend='triton': the statistic scanned in torch, then the existing Triton kernels for lr=gate(k) (the delta
    family's chunk kernels with the write key η ⊙ m ⊙ k, the Hebbian and mini-batch families', the fused recurrent
    kernel);
    float32 against the float64 reference: o, W, A and every gradient."""
    pytest.importorskip("triton")
    cfg = REF_CONFIGS[name] if name in REF_CONFIGS else HELD_OUT[name][1]
    mod = spec(name) if name in REF_CONFIGS else held_out(name)
    shape = (1, 21, 2, 16, 8)
    ref = _run(lambda q, k, v, g, s: reference_apply(cfg, q, k, v, g, s), cfg, shape)
    chunk = None if cfg["parallel"] else 16  # a mini-batch spec's chunk is its C (semantics, not schedule)
    _check(_run(_triton(mod, algorithm, chunk), cfg, shape), ref, 1e-4)


def test_triton_packed_sequences_in_one_launch():
    """cu_seqlens on the chunk kernels (one launch, padded rows): the padding keeps the statistic (ν = 1, ρ = 0),
    so each sequence's outputs and final W, A equal the torch recurrence run on it alone (and their gradients)."""
    pytest.importorskip("triton")
    x, cu = _packed_inputs(6, True, lens=(7, 12, 3))
    mod = spec("precond_kda")
    compare(lambda: _ours(mod, x, True, backend="triton", algorithm="chunked", chunk_size=16, cu_seqlens=cu),
            lambda: _ours(mod, x, True, algorithm="recurrent", cu_seqlens=cu), x)


# ------------------------------------------------------------------------------ rejections, Layer, the scan
REJECTED = {
    # body (one field per line) -> (the located token, a phrase of the reason)
    "memory = mlp\nbias = l2\nlearner = precond(lr=gate)": ("learner", "statistic would read the memory"),
    "memory = linear\nbias = l2\nlearner = precond(lr=gate(v))": ("lr=", "scale both sides of W"),
    "memory = linear\nbias = l2\nlearner = precond(lr=gate, nu=gate(k))": ("nu=", "one number per head and token"),
    "memory = linear\nbias = l2\nlearner = precond(lr=gate, base=2)": ("base=", "with transform=rms"),
    "memory = linear(feature=elu1)\nbias = dot\nlearner = precond(lr=gate)": ("learner", "key-side factor φ(k)"),
    "memory = linear\nbias = l2(read=kappa)\nlearner = precond(lr=gate)": ("learner", "separate erase and write keys"),
    "memory = linear\nbias = l2(window=2)\nlearner = precond(lr=gate)": ("window=", "over a window"),
    "memory = linear\nbias = l2\nlearner = precond(lr=gate, nu=1.5)": ("nu=", "decay is in [0, 1]"),
    "memory = linear\nbias = l2\nlearner = precond(lr=gate, eps=0, transform=atk)": ("eps=", "greater than 0"),
}


@pytest.mark.parametrize("body", sorted(REJECTED))
def test_rejections_are_located(body):
    """Combinations where the statistic would read the memory, or that have no meaning, are refused with the
    reason at the offending field or parameter: `<spec>:line:col: ...`."""
    token, why = REJECTED[body]
    lines = body.splitlines()
    text = "model bad {\n" + "".join(f"    {line}\n" for line in lines) + "}\n"
    row = next(i for i, line in enumerate(text.splitlines()) if token in line and (token != "learner" or "precond"
                                                                                  in line or "feature" in line))
    with pytest.raises(mirasc.SpecError) as err:
        mirasc.compile_spec(text)
    message = str(err.value)
    line, col = (int(x) for x in message.split(":")[1:3])
    assert line == row + 1 and why in message, message
    if token.endswith("="):  # a parameter: the column is at the parameter or at its value
        start = text.splitlines()[row].index(token)
        assert start <= col - 1 <= start + len(token), message


def test_layer_steps_equal_forward_with_constant_statistic_gates():
    """The Layer of a held-out spec (a per-head ν, a constant ρ, mini-batches): step() carries the statistic A in
    its cache and gives forward()'s outputs token by token; A is part of the initial state but not learned."""
    from reference import decode

    torch.manual_seed(0)
    layer = held_out("rmsprop_minibatch").Layer(16, 2).double()
    assert not layer.initial["A"].requires_grad and layer.initial["W"].requires_grad
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    assert rel(decode(layer, x), layer(x)) < 1e-10


def test_triton_chunked_refuses_where_its_family_has_no_kernel():
    """A decay over value channels has no chunked Triton kernel for lr=gate(k), so neither for precond:
    backend='triton', algorithm='chunked' refuses with that family's reason (the recurrent kernel runs)."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec("model value_decay {\n    memory = linear\n    bias = l2\n"
                              "    retention = decay(alpha=gate(v))\n    learner = precond(lr=gate)\n}\n")
    q, v = torch.randn(1, 4, 2, 5), torch.randn(1, 4, 2, 4)
    gates = {"eta": torch.rand(1, 4, 2), "alpha": torch.rand(1, 4, 2, 4), "nu": torch.rand(1, 4, 2),
             "rho": torch.rand(1, 4, 2)}
    gates = {n: gates[n] for n in mod.GATES}
    with pytest.raises(RuntimeError, match="no chunked Triton kernel for this memory"):
        mod.apply(q, q, v, gates, backend="triton", algorithm="chunked")
    o, final = mod.apply(q, q, v, gates, backend="triton", algorithm="recurrent")
    assert o.shape == (1, 4, 2, 4) and final["A"].shape == (1, 2, 5)
