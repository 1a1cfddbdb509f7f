"""Channel-wise gates (docs/semantics.md: channel-wise gates) against the independent float64 reference
(tests/reference.py).

Each case is a spec a user could write (none of them is bundled), compiled in-process, and run by every
algorithm the module offers: outputs, final state and the gradients of q, k, v, every gate and the
initial state are compared with autograd through the written-out token loop. The illegal combinations
of §6 are rejected with a located message.
"""

from __future__ import annotations

import functools

import pytest
import torch
from reference import decode, make_inputs, make_state, reference_apply

mirasc = pytest.importorskip("mirasc")

f64 = torch.float64
B, H, DK, DV = 2, 2, 6, 5
T_EXACT, CHUNK = 23, 8  # the chunk does not divide T

LIN = dict(kind="linear")
MLP = dict(kind="mlp", depth=2, expansion=2, act="gelu", residual=True, norm="layernorm")
MLP_SMALL = "mlp(depth=2, expansion=2, act=gelu, residual=true, norm=layernorm)"

# name -> (spec body, reference config). Dk != Dv wherever the memory allows it, so a gate on the wrong
# side cannot broadcast by accident.
CASES = {
    "gla": ("memory = linear; bias = dot; retention = decay(alpha=gate(k)); learner = gd(lr=1)",
            dict(memory=LIN, bias=dict(kind="dot"), retention=dict(kind="decay", alpha="gate(k)"),
                 learner=dict(kind="gd", lr=1.0), parallel=None)),
    "gla_value_side": ("memory = linear; bias = dot; retention = decay(alpha=gate(v)); learner = gd(lr=gate)",
                       dict(memory=LIN, bias=dict(kind="dot"), retention=dict(kind="decay", alpha="gate(v)"),
                            learner=dict(kind="gd", lr="gate"), parallel=None)),
    "hgrn_like": ("memory = linear; bias = dot; retention = decay(alpha=gate(k)); learner = gd(lr=gate(k))",
                  dict(memory=LIN, bias=dict(kind="dot"), retention=dict(kind="decay", alpha="gate(k)"),
                       learner=dict(kind="gd", lr="gate(k)"), parallel=None)),
    "kda": ("memory = linear; bias = l2; retention = decay(alpha=gate(k), order=pre); learner = gd(lr=gate)",
            dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate(k)", order="pre"),
                 learner=dict(kind="gd", lr="gate"), parallel=None)),
    "delta_value_side": ("memory = linear; bias = l2; retention = decay(alpha=gate(v)); learner = gd(lr=gate(v))",
                         dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate(v)"),
                              learner=dict(kind="gd", lr="gate(v)"), parallel=None)),
    "delta_key_lr": ("memory = linear; bias = l2; retention = decay(alpha=gate, order=pre); learner = gd(lr=gate(k))",
                     dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate", order="pre"),
                          learner=dict(kind="gd", lr="gate(k)"), parallel=None)),
    "longhorn_channel_decay": (
        "memory = linear; bias = l2; retention = decay(alpha=gate(k), order=pre); learner = implicit(lr=gate)",
        dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate(k)", order="pre"),
             learner=dict(kind="implicit", lr="gate"), parallel=None)),
    "momentum_key_side": (
        "memory = linear; bias = l2; retention = decay(alpha=gate(k)); learner = momentum(lr=gate, theta=gate(k)); "
        f"parallel = minibatch({CHUNK})",
        dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate(k)"),
             learner=dict(kind="momentum", lr="gate", theta="gate(k)"), parallel=CHUNK)),
    "momentum_value_side": (
        "memory = linear; bias = l2; retention = decay(alpha=gate); learner = momentum(lr=gate(v), theta=gate(v)); "
        f"parallel = minibatch({CHUNK})",
        dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate"),
             learner=dict(kind="momentum", lr="gate(v)", theta="gate(v)"), parallel=CHUNK)),
    "lq_key_side": (f"memory = linear; bias = l2; retention = lq(q=3, alpha=gate(k)); learner = gd; "
                    f"parallel = minibatch({CHUNK})",
                    dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="lq", q=3.0, alpha="gate(k)"),
                         learner=dict(kind="gd", lr="gate"), parallel=CHUNK)),
    "kl_value_side": (f"memory = linear; bias = l2; retention = kl(alpha=gate(v)); learner = gd(lr=gate(v)); "
                      f"parallel = minibatch({CHUNK})",
                      dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="kl", c=1.0, alpha="gate(v)"),
                           learner=dict(kind="gd", lr="gate(v)"), parallel=CHUNK)),
    # kl with a decay over key channels: defined by its log-space form (docs/semantics.md: channel-wise gates), not α
    # ∘ log W
    "kl_key_side": ("memory = linear; bias = l2; retention = kl(c=2, alpha=gate(k)); learner = gd(lr=gate)",
                    dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="kl", c=2.0, alpha="gate(k)"),
                         learner=dict(kind="gd", lr="gate"), parallel=None)),
    "mixed_sides": ("memory = linear; bias = l2; retention = decay(alpha=gate(k)); "
                    f"learner = momentum(lr=gate, theta=gate(v)); parallel = minibatch({CHUNK})",
                    dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate(k)"),
                         learner=dict(kind="momentum", lr="gate", theta="gate(v)"), parallel=CHUNK)),
    "lp_value_lr": ("memory = linear; bias = lp(p=3); retention = decay(alpha=gate(k)); learner = gd(lr=gate(v))",
                    dict(memory=LIN, bias=dict(kind="lp", p=3.0, eps=1e-6),
                         retention=dict(kind="decay", alpha="gate(k)"), learner=dict(kind="gd", lr="gate(v)"),
                         parallel=None)),
    "mlp_value_lr": (f"memory = {MLP_SMALL}; bias = l2; retention = decay(alpha=gate); "
                     f"learner = momentum(lr=gate(v), theta=gate); parallel = minibatch({CHUNK})",
                     dict(memory=MLP, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate"),
                          learner=dict(kind="momentum", lr="gate(v)", theta="gate"), parallel=CHUNK)),
    "mlp_huber_value_delta": (f"memory = {MLP_SMALL}; bias = huber(delta=gate(v)); learner = gd(lr=gate(v)); "
                              f"parallel = minibatch({CHUNK})",
                              dict(memory=MLP, bias=dict(kind="huber", delta="gate(v)", mode="coordinate"),
                                   retention=dict(kind="none"), learner=dict(kind="gd", lr="gate(v)"),
                                   parallel=CHUNK)),
}
NAMES = sorted(CASES)
SQUARE = {name for name, (_, cfg) in CASES.items() if cfg["memory"]["kind"] == "mlp"}  # residual: Dk = Dv


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@functools.cache
def spec_text(name: str) -> str:
    body = "\n    ".join(part.strip() for part in CASES[name][0].split(";"))
    return f"model {name} {{\n    {body}\n}}\n"


def module(name: str):
    return mirasc.compile_spec(spec_text(name))


def case(name: str):
    cfg = CASES[name][1]
    dk, dv = (DK, DK) if name in SQUARE else (DK, DV)
    T = T_EXACT if cfg["parallel"] is None else 2 * CHUNK + 5
    q, k, v, gates = make_inputs(cfg, B, T, H, dk, dv, f64, seed=3)
    state = make_state(cfg, B, H, dk, dv, f64, seed=3)
    gen = torch.Generator().manual_seed(11)
    for key in state:
        if key.startswith("S_"):
            state[key] = 0.01 * torch.randn(state[key].shape, generator=gen, dtype=f64)
    return q, k, v, gates, state


def run(name: str, fn):
    """Outputs, final state and gradients of a fixed random functional of both, through fn."""
    q, k, v, gates, state = case(name)
    leaves = {"q": q, "k": k, "v": v, **{f"gate_{n}": g for n, g in gates.items()},
              **{f"state_{n}": s for n, s in state.items()}}
    for x in leaves.values():
        x.requires_grad_(True)
    o, final = fn(q, k, v, gates, state)
    gen = torch.Generator().manual_seed(5)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=f64)).sum()
    for key in sorted(final):
        loss = loss + (final[key] * torch.randn(final[key].shape, generator=gen, dtype=f64)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return o.detach(), {n: x.detach() for n, x in final.items()}, dict(zip(leaves, grads))


@functools.cache
def reference(name: str):
    return run(name, lambda q, k, v, g, s: reference_apply(CASES[name][1], q, k, v, g, s))


def apply_with(mod, q, k, v, gates, state, **options):
    return mod.apply(q, k, v, gates, state=state, backend="torch", **options)


def algorithms(name: str) -> list[str]:
    return ["recurrent"] + (["chunked"] if module(name).CHUNKED else [])


@pytest.mark.parametrize("name", NAMES)
def test_matches_reference(name):
    mod, (o_ref, s_ref, g_ref) = module(name), reference(name)
    for algorithm in algorithms(name):
        chunk = CHUNK if CASES[name][1]["parallel"] is None else None
        o, final, grads = run(name, functools.partial(apply_with, mod, algorithm=algorithm, chunk_size=chunk))
        assert rel(o, o_ref) < 1e-10, (algorithm, "output", rel(o, o_ref))
        assert sorted(final) == sorted(s_ref)
        for key in s_ref:
            assert rel(final[key], s_ref[key]) < 1e-10, (algorithm, key, rel(final[key], s_ref[key]))
        for key, want in g_ref.items():
            assert want is not None and grads[key] is not None, (algorithm, key)
            assert rel(grads[key], want) < 1e-9, (algorithm, f"d/d{key}", rel(grads[key], want))


def test_chunked_forms_exist_where_derived():
    """Every case with a chunked form derived has one; the mixed-side momentum says why it has none."""
    # lp, kl (exact): the gradient reads the running state (no chunk form)
    expected_none = {"mixed_sides", "lp_value_lr", "kl_key_side"}
    assert {n for n in NAMES if not module(n).CHUNKED} == expected_none
    q, k, v, gates, state = case("mixed_sides")
    with pytest.raises(ValueError, match="key channels and θ over value channels"):
        module("mixed_sides").apply(q, k, v, gates, state=state, algorithm="chunked")


def test_gate_shapes_are_checked():
    mod = module("kda")
    q, k, v, gates, state = case("kda")
    assert mod.GATES == ("eta", "alpha") and mod.GATE_CHANNELS == {"alpha": "k"}
    with pytest.raises(ValueError, match=r"gate 'alpha' has shape .*expected \[B, T, H, Dk\]"):
        mod.apply(q, k, v, {**gates, "alpha": gates["alpha"][..., 0]}, state=state)
    with pytest.raises(ValueError, match=r"gate 'eta' has shape .*expected \[B, T, H\]"):
        mod.apply(q, k, v, {**gates, "eta": gates["alpha"]}, state=state)
    mod = module("delta_value_side")  # Dv = 5, Dk = 6: a key-sized vector is refused
    q, k, v, gates, state = case("delta_value_side")
    with pytest.raises(ValueError, match=r"expected \[B, T, H, Dv\]"):
        mod.apply(q, k, v, {**gates, "alpha": torch.ones(*q.shape, dtype=f64)}, state=state)


def triton_float32(mod, q, k, v, gates, state):
    cast = lambda x: x.float()  # noqa: E731
    o, final = mod.apply(cast(q), cast(k), cast(v), {n: cast(g) for n, g in gates.items()},
                         state={n: cast(x) for n, x in state.items()}, backend="triton", algorithm="recurrent")
    return o.double(), {n: x.double() for n, x in final.items()}


@pytest.mark.parametrize("name", NAMES)
def test_triton_recurrent_matches_reference(name):
    """The fused recurrent Triton kernel (interpreted here) loads channel-wise gates per token; its
    backward recomputes the recurrence in torch. float32 against the float64 reference."""
    pytest.importorskip("triton")
    mod, (o_ref, s_ref, g_ref) = module(name), reference(name)
    o, final, grads = run(name, functools.partial(triton_float32, mod))
    assert rel(o, o_ref) < 1e-4, rel(o, o_ref)
    for key in s_ref:
        assert rel(final[key], s_ref[key]) < 1e-4, (key, rel(final[key], s_ref[key]))
    for key, want in g_ref.items():
        assert rel(grads[key], want) < 1e-4, (f"d/d{key}", rel(grads[key], want))
    if mod.CHUNKED and name not in TRITON_CHUNKED | TRITON_MINIBATCH:  # channel decays: the request says so
        q, k, v, gates, state = case(name)
        with pytest.raises(RuntimeError, match="no chunked Triton kernel"):
            triton_chunked = {n: x.float() for n, x in gates.items()}
            mod.apply(q.float(), k.float(), v.float(), triton_chunked, backend="triton", algorithm="chunked")


# The cases the chunked Triton kernels take (a decay over key channels and/or lr=gate(k); hebbian and delta
# families), and those the mini-batch kernels take (MLP memories with lr=gate(v), huber(delta=gate(v)):
# tests/triton_backend/test_triton_minibatch_channel.py covers more); every other case with a chunked form has a
# value-side or momentum decay per channel, or a per-token readout, and refuses.
TRITON_CHUNKED = {"gla", "hgrn_like", "kda", "delta_key_lr", "longhorn_channel_decay"}
TRITON_MINIBATCH = {"mlp_value_lr", "mlp_huber_value_delta"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_plan_names_the_chunk_parallel_kernels(name):
    """Which cases the chunked Triton families or the mini-batch kernels take, as the Plan says (docs/kernels.md,
    "Which kernels run a spec"): every case, with a chunked form or without; the others refuse the chunked Triton
    call (the test above)."""
    plan = mirasc.compile_text(spec_text(name)).plan
    assert plan.chunk_form or name not in TRITON_CHUNKED | TRITON_MINIBATCH, plan.no_chunk_form
    assert (plan.chunk_family is not None) == (name in TRITON_CHUNKED), plan.summary()
    assert plan.minibatch == (name in TRITON_MINIBATCH), plan.summary()


@pytest.mark.parametrize("name", sorted(TRITON_CHUNKED | TRITON_MINIBATCH))
def test_triton_chunked_matches_reference(name):
    """The chunked Triton kernels (interpreted here; tests/triton_backend/test_triton_channel_chunks.py and
    test_triton_minibatch_channel.py cover more shapes): float32 against the float64 reference, chunk 8 not
    dividing T; the MLP cases on the mini-batch kernels."""
    pytest.importorskip("triton")
    mod, (o_ref, s_ref, g_ref) = module(name), reference(name)
    assert mod.CHUNKED
    chunk = CHUNK if name in TRITON_CHUNKED else None  # the mini-batch kernels: the spec's minibatch(8)

    def fn(q, k, v, gates, state):
        o, final = mod.apply(q.float(), k.float(), v.float(), {n: g.float() for n, g in gates.items()},
                             state={n: x.float() for n, x in state.items()}, backend="triton",
                             algorithm="chunked", chunk_size=chunk)
        return o.double(), {n: x.double() for n, x in final.items()}

    o, final, grads = run(name, fn)
    assert rel(o, o_ref) < 1e-4, rel(o, o_ref)
    for key in s_ref:
        assert rel(final[key], s_ref[key]) < 1e-4, (key, rel(final[key], s_ref[key]))
    for key, want in g_ref.items():
        assert rel(grads[key], want) < 1e-4, (f"d/d{key}", rel(grads[key], want))


@pytest.mark.parametrize("name", ["kda", "mlp_value_lr"])
def test_layer_channel_gates_and_decoding(name):
    """The Layer projects channel gates at low rank to [B, T, H, D]; step() equals forward()."""
    mod = module(name)
    torch.manual_seed(0)
    layer = mod.Layer(24, 2, head_dim=6).double()
    x = torch.randn(2, 2 * CHUNK + 3, 24, dtype=f64)
    q, k, v, gates, _ = layer._project(x)
    for gname in mod.GATE_CHANNELS:
        assert gates[gname].shape == (2, x.shape[1], 2, 6), gname
    full = layer(x)
    assert rel(decode(layer, x), full) < 1e-10


BAD = {
    "memory = mlp; bias = l2; retention = decay(alpha=gate(k)); learner = gd": ("4:", "MLP memory's weights have no"),
    "memory = mlp; bias = l2; learner = momentum(lr=gate, theta=gate(v))": ("4:", "MLP memory's weights have no"),
    "memory = mlp; bias = l2; learner = gd(lr=gate(k))": ("4:", "use `lr=gate(v)`"),
    "memory = linear; bias = huber(delta=gate(v), mode=mixture)": ("3:", "a vector threshold has no meaning"),
    "memory = linear; bias = huber(delta=gate(k))": ("3:", "write `delta=gate(v)`"),
    "memory = linear; bias = l2; learner = implicit(lr=gate(v))": ("4:", "no closed-form proximal step"),
    "memory = linear; bias = l2; learner = gd(lr=gate(q))": ("4:", "is `gate(k)`"),
}


@pytest.mark.parametrize("body", sorted(BAD))
def test_illegal_channel_gates_are_rejected(body, tmp_path, capsys):
    from mirasc.cli import main

    line, message = BAD[body]
    lines = "\n".join("    " + part.strip() for part in body.split(";"))
    path = tmp_path / "bad.miras"
    path.write_text(f"model bad {{\n{lines}\n}}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"bad.miras:{line}" in err and message in err and "Traceback" not in err, err
