"""The chunked Triton kernels with a decay over key channels (alpha=gate(k), docs/semantics.md: channel-wise gates)
and a written key
scaled per channel (lr=gate(k)), run by the interpreter on the CPU against the independent float64
reference (tests/reference.py): outputs, final state and the gradients of q, k, v, every gate and the
initial state. Hebbian (GLA, HGRN2), delta (KDA, order=post, implicit) and mini-batch families; a chunk that does not
divide T and the default chunk (64: four 16-row sub-blocks); small α (∈ (0.05, 0.3)), where a chunk's
cumulative decay underflows float32 and only the sub-block factorisation keeps every exponent <= 0."""

from __future__ import annotations

import pytest
import torch
from reference import REF_CONFIGS, make_inputs, make_state, reference_apply
from test_triton_recurrent import one_launch

import mirasc

pytest.importorskip("triton")
f64 = torch.float64
LIN = dict(kind="linear")

CASES = {
    # the bundled specs take their reference configuration from tests/reference.py
    "gla": ("specs/gla.miras", REF_CONFIGS["gla"]),
    "hgrn2": ("specs/hgrn2.miras", REF_CONFIGS["hgrn2"]),
    "kda": ("specs/kda.miras", REF_CONFIGS["kda"]),
    "delta_post_key": ("memory = linear; bias = l2; retention = decay(alpha=gate(k), order=post); "
                       "learner = gd(lr=gate(k))",
                       dict(memory=LIN, bias=dict(kind="l2"),
                            retention=dict(kind="decay", alpha="gate(k)", order="post"),
                            learner=dict(kind="gd", lr="gate(k)"), parallel=None)),
    "implicit_key_decay": ("memory = linear; bias = l2; retention = decay(alpha=gate(k), order=pre); "
                           "learner = implicit(lr=gate)",
                           dict(memory=LIN, bias=dict(kind="l2"),
                                retention=dict(kind="decay", alpha="gate(k)", order="pre"),
                                learner=dict(kind="implicit", lr="gate"), parallel=None)),
    # the mini-batch family (gradients at the chunk's anchor) with a decay over key channels and lr=gate(k)
    "minibatch_key": ("memory = linear; bias = l2; retention = decay(alpha=gate(k)); learner = gd(lr=gate(k)); "
                      "parallel = minibatch(8)",
                      dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate(k)"),
                           learner=dict(kind="gd", lr="gate(k)"), parallel=8)),
    "minibatch_key_decay": ("memory = linear; bias = l2; retention = decay(alpha=gate(k)); learner = gd(lr=gate); "
                            "parallel = minibatch(16)",
                            dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate(k)"),
                                 learner=dict(kind="gd", lr="gate"), parallel=16)),
    # a per-head decay with lr=gate(k): the per-head kernels with the scaled written key
    "delta_key_lr": ("memory = linear; bias = l2; retention = decay(alpha=gate, order=pre); learner = gd(lr=gate(k))",
                     dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate", order="pre"),
                          learner=dict(kind="gd", lr="gate(k)"), parallel=None)),
}
SMALL_ALPHA = {"alpha": (0.05, 0.3)}


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


_MODULES = {}


def module(name):
    if name not in _MODULES:
        src = CASES[name][0]
        if src.endswith(".miras"):
            _MODULES[name] = mirasc.compile_spec(open(src).read())
        else:
            body = "\n    ".join(part.strip() for part in src.split(";"))
            _MODULES[name] = mirasc.compile_spec(f"model {name} {{\n    {body}\n}}\n")
    return _MODULES[name]


def run(name, fn, shape, ranges=None, seed=3):
    cfg = dict(CASES[name][1], **({"gate_ranges": ranges} if ranges else {}))
    B, T, H, Dk, Dv = shape
    q, k, v, gates = make_inputs(cfg, B, T, H, Dk, Dv, f64, seed=seed)
    state = make_state(cfg, B, H, Dk, Dv, f64, seed=seed)
    state["W"] = state["W"] + 0.3 * torch.randn(state["W"].shape, generator=torch.Generator().manual_seed(2),
                                                dtype=f64)  # a non-zero initial memory
    leaves = {"q": q, "k": k, "v": v, **{f"gate_{n}": g for n, g in gates.items()}, "W0": state["W"]}
    for x in leaves.values():
        x.requires_grad_(True)
    o, final = fn(cfg, q, k, v, gates, {"W": state["W"]})
    gen = torch.Generator().manual_seed(5)
    loss = (o.double() * torch.randn(o.shape, generator=gen, dtype=f64)).sum()
    loss = loss + (final["W"].double() * torch.randn(final["W"].shape, generator=gen, dtype=f64)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return o.detach(), final["W"].detach(), dict(zip(leaves, grads))


def reference(cfg, q, k, v, gates, state):
    return reference_apply(cfg, q, k, v, gates, state)


def triton_chunked(name, chunk, dtype):
    def fn(cfg, q, k, v, gates, state):
        cast = lambda x: x.to(dtype)  # noqa: E731
        return module(name).apply(cast(q), cast(k), cast(v), {n: cast(g) for n, g in gates.items()},
                                  state={"W": state["W"].float()}, backend="triton", algorithm="chunked",
                                  chunk_size=chunk)
    return fn


def compare(name, shape, chunk, ranges=None, dtype=torch.float32, tol=1e-4):
    o_ref, w_ref, g_ref = run(name, reference, shape, ranges)
    o, w, grads = run(name, triton_chunked(name, chunk, dtype), shape, ranges)
    errors = {"o": rel(o, o_ref), "W": rel(w, w_ref), **{f"d{n}": rel(grads[n], g) for n, g in g_ref.items()}}
    bad = {n: e for n, e in errors.items() if not e < tol}
    assert not bad, (name, bad)
    return errors


@pytest.mark.parametrize("name", sorted(CASES))
def test_chunk_kernels_match_reference(name):
    """T = 37 with chunk 24 (two chunks, the second partial; 32-row tiles = two sub-blocks; the mini-batch specs:
    their C, 8 or 16, the last chunk partial), Dk = 16 (two
    16-wide Dk tiles on the interpreter's smallest tiles... one here), Dk != Dv."""
    assert module(name)._CHUNK_OP is not None
    minibatch = CASES[name][1]["parallel"] is not None  # the chunk is the spec's mini-batch (it is semantics)
    compare(name, (1, 37, 2, 16, 12), chunk=None if minibatch else 24)


@pytest.mark.parametrize("name", ["gla", "kda"])
def test_default_chunk_several_tiles(name):
    """The default chunk (64 = four sub-blocks), two Dk and two Dv tiles of the interpreter's 16-wide tiles."""
    compare(name, (1, 40, 1, 24, 20), chunk=None)


@pytest.mark.parametrize("name", ["hgrn2", "delta_post_key"])
@pytest.mark.parametrize("shape,chunk", [((1, 1, 1, 8, 8), 16), ((2, 20, 1, 8, 5), 5)], ids=["T1", "Dk8_Dv5_chunk5"])
def test_small_shapes(name, shape, chunk):
    """T = 1; Dk = 8 below tl.dot's 16 (padded lanes) with a chunk of 5 (one zero-padded 16-row tile)."""
    compare(name, shape, chunk=chunk)


@pytest.mark.parametrize("name", ["gla", "kda", "delta_post_key"])
def test_small_alpha_is_stable(name):
    """α ∈ (0.05, 0.3): within a 32-row tile the cumulative decay reaches e^{-90}; nothing overflows."""
    errors = compare(name, (1, 40, 1, 16, 8), chunk=32, ranges=SMALL_ALPHA)
    assert all(e == e for e in errors.values())  # no NaN


@pytest.mark.parametrize("name,shape", [("kda", (1, 37, 1, 16, 12)), ("gla", (1, 48, 2, 16, 12))],
                         ids=["kda_padded", "gla_in_place"])
def test_bf16_inputs(name, shape):
    """bf16 inputs (bf16 operands and fp32 accumulation in every product; outputs and input gradients come back in
    bf16) against the float64 reference on the unrounded inputs: the error, about 5e-3 on the interpreter, is the
    rounding of the inputs, operands, outputs and gradients to bf16 (8 bits of mantissa). GLA at T = 48, three
    whole chunks: the Hebbian op reads q, k, v as the [B, T, H, D] tensors they are."""
    compare(name, shape, chunk=16, dtype=torch.bfloat16, tol=2e-2)


def test_log_decays_match_torch():
    """The cumulative log-decays of a key-channel decay (the kernels _log_decay_fwd/_bwd) against torch's
    log-clamp-cumsum and its autograd: α read through the [B, H, T, Dk] view of a [B, T, H, Dk] tensor (the layout
    layers hand over), α = 0 on some channels (clamped at the smallest normal float, which passes no gradient),
    chunks of 24 tokens in 32-row tiles, Dk = 20 over two 16-wide tiles' worth of columns, a last partial chunk."""
    mod = module("gla")
    B, T, H, Dk, n = 2, 53, 3, 20, 24
    NT = -(-T // n)
    a = 0.5 + 0.5 * torch.rand(B, T, H, Dk, generator=torch.Generator().manual_seed(0))
    a[0, 3, 1, :5] = 0.0
    a.requires_grad_(True)
    alpha = a.transpose(1, 2)

    def chunks(x):
        return torch.nn.functional.pad(x, (0, 0, 0, NT * n - T)).unflatten(2, (NT, n))

    g = mod._log_decays(alpha, n, NT)
    ref = chunks(torch.log(alpha.clamp_min(torch.finfo(torch.float32).tiny))).cumsum(3)
    assert g.shape == ref.shape and rel(g, ref) < 1e-6
    w = torch.randn(g.shape, generator=torch.Generator().manual_seed(1))
    (da,) = torch.autograd.grad((g * w).sum(), a)
    (ref_da,) = torch.autograd.grad((ref * w).sum(), a)
    assert rel(da, ref_da) < 1e-6
    assert torch.equal(da[0, 3, 1, :5], torch.zeros(5))


@pytest.mark.parametrize("name", ["hgrn2", "kda"])
def test_packed_sequences_in_one_launch(name):
    """cu_seqlens on the channel-decay chunk kernels: padding tokens are no-ops (η = 0, α = 1 on every
    channel); equal to each sequence run alone on the torch recurrence, outputs, states and gradients."""
    mod = module(name)
    cfg = CASES[name][1]
    cu = [0, 5, 5, 23, 40]  # includes an empty sequence
    q, k, v, gates = make_inputs(cfg, 1, cu[-1], 2, 16, 8, torch.float32, seed=1)
    state = {"W": 0.3 * torch.randn(len(cu) - 1, 2, 8, 16, generator=torch.Generator().manual_seed(0))}
    leaves = [v, *gates.values()]
    for x in leaves:
        x.requires_grad_(True)
    assert one_launch(mod, q, v, chunk_size=16)  # the one-launch path, not a loop
    o, final = mod.apply(q, k, v, gates, state=state, backend="triton", cu_seqlens=cu, chunk_size=16)
    outs = []
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        o_i, f_i = mod.apply(q[:, a:b], k[:, a:b], v[:, a:b], {n: x[:, a:b] for n, x in gates.items()},
                             state={"W": state["W"][i:i + 1]}, backend="torch", algorithm="recurrent")
        if a < b:
            assert rel(o[:, a:b], o_i) < 1e-5
            outs.append(o_i)
        assert rel(final["W"][i:i + 1], f_i["W"]) < 1e-5
    assert torch.equal(final["W"][1], state["W"][1])
    grads = torch.autograd.grad(o.square().sum(), leaves)
    ref = torch.autograd.grad(torch.cat(outs, dim=1).square().sum(), leaves)
    for a, b in zip(grads, ref):
        assert rel(a, b) < 1e-5


@pytest.mark.parametrize("T,dtype,limit", [(20, torch.float32, None), (32, torch.bfloat16, None),
                                           (20, torch.float32, 232448)],
                         ids=["fp32_padded", "bf16_in_place", "fit_checked"])
def test_chunk_op_compiles_without_graph_breaks(T, dtype, limit, monkeypatch):
    """The channel-decay variant runs registered custom ops (the Hebbian op and the log-decays: fake
    implementations, autograd), also where 16-bit [B, T, H, D] inputs are read in place, and with the kernels'
    fit checked before the launch as on a GPU (`limit`: sm_90's shared memory per block, which the interpreter
    has not: the check runs inside the compiled graph)."""
    from test_triton_recurrent import assert_compiled_matches_eager

    mod = module("gla")
    monkeypatch.setattr(mod, "FIT_SMEM_LIMIT", limit)
    q, k, v, gates = make_inputs(CASES["gla"][1], 1, T, 2, 16, 16, torch.float32, seed=1)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    state = {"W": 0.3 * torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(0))}
    for t in (q, k, v, *gates.values()):
        t.requires_grad_(True)

    def run(q, k, v, gates, state):
        o, final = mod.apply(q, k, v, gates, state=state, backend="triton", chunk_size=16)
        return o, final["W"]

    assert_compiled_matches_eager(run, q, k, v, gates, state)
