"""Chunk readouts (docs/semantics.md: chunk readouts, `parallel = minibatch(C, readout=chunk)`): the torch recurrent
and chunked
(dual-form) algorithms against the independent float64 reference (tests/reference.py, written from §7), with
outputs, final state and the gradients of q, k, v, the gates and the initial state; C that does not divide T;
a momentum learner; Layer decoding equal to the full forward across chunk boundaries; gradcheck; and the
rejection of readout=chunk for retentions without a map to defer.

The bundled specs (minibatch(64)) are covered by test_semantics.py; here C is small so that short
sequences cross several chunk boundaries."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from reference import REF_CONFIGS, decode, make_inputs, make_state, reference_apply

import mirasc
from mirasc.cli import main

SPECS = Path(__file__).resolve().parents[2] / "specs"
f64 = torch.float64
C, T = 4, 11  # 3 chunks, the last one partial
B, H, D = 1, 2, 4

_LIN_MOM = dict(memory=dict(kind="linear"), learner=dict(kind="momentum", lr="gate", theta="gate"), parallel=C,
                readout="chunk")
CASES = {
    # name: (spec text, reference config)
    "moneta": (None, dict(REF_CONFIGS["moneta"], parallel=C)),
    "memora": (None, dict(REF_CONFIGS["memora"], parallel=C)),
    "lq_momentum": ("memory = linear\nbias = l2\nretention = lq(q=3, alpha=gate)\n"
                    "learner = momentum(lr=gate, theta=gate)",
                    dict(_LIN_MOM, bias=dict(kind="l2"), retention=dict(kind="lq", q=3.0, alpha="gate"))),
    "kl_momentum": ("memory = mlp(depth=2, expansion=2, act=silu, residual=false, norm=none)\n"
                    "bias = huber(delta=gate)\nretention = kl(c=2, alpha=gate)\n"
                    "learner = momentum(lr=gate, theta=gate)",
                    dict(_LIN_MOM, memory=dict(kind="mlp", depth=2, expansion=2, act="silu", residual=False,
                                               norm="none"),
                         bias=dict(kind="huber", delta="gate", mode="coordinate"),
                         retention=dict(kind="kl", c=2.0, alpha="gate"))),
    # channel-wise learning rates (docs/semantics.md: channel-wise gates) weight the loss per output channel, inside
    # the gradient
    "kl_lr_channels": ("memory = mlp(depth=2, expansion=2, act=silu, residual=false, norm=none)\nbias = l2\n"
                       "retention = kl(c=1, alpha=gate)\nlearner = gd(lr=gate(v))",
                       dict(memory=dict(kind="mlp", depth=2, expansion=2, act="silu", residual=False, norm="none"),
                            bias=dict(kind="l2"), retention=dict(kind="kl", c=1.0, alpha="gate"),
                            learner=dict(kind="gd", lr="gate(v)"), parallel=C, readout="chunk")),
    "lq_lr_channels": ("memory = linear\nbias = l2\nretention = lq(q=3, alpha=gate)\nlearner = gd(lr=gate(v))",
                       dict(memory=dict(kind="linear"), bias=dict(kind="l2"),
                            retention=dict(kind="lq", q=3.0, alpha="gate"), learner=dict(kind="gd", lr="gate(v)"),
                            parallel=C, readout="chunk")),
    # channel-wise decays (docs/semantics.md: channel-wise gates) under chunk readouts: linear memories (an MLP takes
    # no channel α/θ)
    "lq_alpha_k": ("memory = linear\nbias = l2\nretention = lq(q=4, alpha=gate(k))\nlearner = gd(lr=gate)",
                   dict(memory=dict(kind="linear"), bias=dict(kind="l2"),
                        retention=dict(kind="lq", q=4.0, alpha="gate(k)"), learner=dict(kind="gd", lr="gate"),
                        parallel=C, readout="chunk")),
    "lq_alpha_v_theta_v": ("memory = linear\nbias = dot\nretention = lq(q=3, alpha=gate(v))\n"
                           "learner = momentum(lr=gate, theta=gate(v))",
                           dict(_LIN_MOM, bias=dict(kind="dot"), retention=dict(kind="lq", q=3.0, alpha="gate(v)"),
                                learner=dict(kind="momentum", lr="gate", theta="gate(v)"))),
    "kl_alpha_k": ("memory = linear\nbias = l2\nretention = kl(c=1, alpha=gate(k))\nlearner = gd(lr=gate)",
                   dict(memory=dict(kind="linear"), bias=dict(kind="l2"),
                        retention=dict(kind="kl", c=1.0, alpha="gate(k)"), learner=dict(kind="gd", lr="gate"),
                        parallel=C, readout="chunk")),
    "kl_alpha_v_theta_v": ("memory = linear\nbias = l2\nretention = kl(c=2, alpha=gate(v))\n"
                           "learner = momentum(lr=gate(v), theta=gate(v))",
                           dict(_LIN_MOM, bias=dict(kind="l2"), retention=dict(kind="kl", c=2.0, alpha="gate(v)"),
                                learner=dict(kind="momentum", lr="gate(v)", theta="gate(v)"))),
    "lq_theta_k": ("memory = linear\nbias = l2\nretention = lq(q=3, alpha=gate)\n"
                   "learner = momentum(lr=gate(k), theta=gate(k))",
                   dict(_LIN_MOM, bias=dict(kind="l2"), retention=dict(kind="lq", q=3.0, alpha="gate"),
                        learner=dict(kind="momentum", lr="gate(k)", theta="gate(k)"))),
}


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def spec_text(name: str, c: int = C) -> str:
    text, _ = CASES[name]
    if text is None:
        text = (SPECS / f"{name}.miras").read_text()
        assert "minibatch(64, readout=chunk)" in text
        return text.replace("minibatch(64, readout=chunk)", f"minibatch({c}, readout=chunk)").replace(
            f"model {name} ", f"model {name}_c{c} ")
    return f"model {name} {{\n{text}\nparallel = minibatch({c}, readout=chunk)\n}}\n"


@functools.cache
def module(name: str, c: int = C):
    return mirasc.compile_spec(spec_text(name, c))


def case(name: str, t: int = T, dk: int = D, b: int = B, h: int = H):
    cfg = CASES[name][1]
    q, k, v, gates = make_inputs(cfg, b, t, h, dk, dk, f64, seed=3)
    state = make_state(cfg, b, h, dk, dk, f64, seed=3)
    g = torch.Generator().manual_seed(5)
    for key in state:
        if key.startswith("S_"):
            state[key] = 0.01 * torch.randn(state[key].shape, generator=g, dtype=f64)
    return q, k, v, gates, state


def run(fn, q, k, v, gates, state):
    leaves = {"q": q, "k": k, "v": v, **{f"gate:{n}": x for n, x in gates.items()},
              **{f"state:{n}": x for n, x in state.items()}}
    leaves = {n: x.clone().requires_grad_(True) for n, x in leaves.items()}
    gates = {n[5:]: x for n, x in leaves.items() if n.startswith("gate:")}
    state = {n[6:]: x for n, x in leaves.items() if n.startswith("state:")}
    o, final = fn(leaves["q"], leaves["k"], leaves["v"], gates, state)
    g = torch.Generator().manual_seed(11)
    loss = (o * torch.randn(o.shape, generator=g, dtype=f64)).sum()
    for key in sorted(final):
        loss = loss + (final[key] * torch.randn(final[key].shape, generator=g, dtype=f64)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    grads = {n: torch.zeros_like(x) if gr is None else gr for (n, x), gr in zip(leaves.items(), grads)}
    return o.detach(), {n: x.detach() for n, x in final.items()}, grads


def check(got, want, tol, what):
    errs = {"o": rel(got[0], want[0])}
    assert set(got[1]) == set(want[1]), what
    errs.update({f"state:{n}": rel(got[1][n], want[1][n]) for n in want[1]})
    errs.update({f"grad:{n}": rel(got[2][n], want[2][n]) for n in want[2] if want[2][n].norm() > 0})
    for n in want[2]:  # an input the function does not read (lq-chunk: the state's W) gets no gradient either
        if want[2][n].norm() == 0:
            assert got[2][n].norm() == 0, f"{what}: grad:{n} should be 0"
    bad = {n: f"{e:.2e}" for n, e in errs.items() if not e < tol}
    assert not bad, f"{what}: relative errors above {tol:g}: {bad}"


@functools.cache
def reference_result(name: str, t: int = T):
    cfg = CASES[name][1]
    return run(lambda q, k, v, g, s: reference_apply(cfg, q, k, v, g, s), *case(name, t))


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_matches_reference(name, algorithm):
    mod = module(name)
    assert mod.CHUNKED
    got = run(lambda q, k, v, g, s: mod.apply(q, k, v, g, state=s, backend="torch", algorithm=algorithm),
              *case(name))
    check(got, reference_result(name), 1e-10 if algorithm == "recurrent" else 1e-9, f"{name} {algorithm}")


@pytest.mark.parametrize("name", ["moneta", "memora"])
@pytest.mark.parametrize("t", [1, C, C + 1])
def test_edge_lengths(name, t):
    mod = module(name)
    want = reference_result(name, t)
    for algorithm in ("recurrent", "chunked"):
        got = run(lambda q, k, v, g, s, a=algorithm: mod.apply(q, k, v, g, state=s, backend="torch", algorithm=a),
                  *case(name, t))
        check(got, want, 1e-9, f"{name} {algorithm} T={t}")


def test_lq_chunk_from_an_empty_accumulator():
    """A linear memory starts from A = 0, where n_c = ‖A‖_q^(q-2) is undefined: the chunk takes n_c = 1 and reads
    its raw accumulator (docs/semantics.md); torch paths and reference agree, gradients included, and stay finite."""
    mod = module("lq_momentum")
    q, k, v, gates, state = case("lq_momentum")
    state = {n: torch.zeros_like(x) for n, x in state.items()}
    want = run(lambda q, k, v, g, s: reference_apply(CASES["lq_momentum"][1], q, k, v, g, s), q, k, v, gates, state)
    assert all(torch.isfinite(x).all() for x in [want[0], *want[1].values(), *want[2].values()])
    for algorithm in ("recurrent", "chunked"):
        got = run(lambda q, k, v, g, s, a=algorithm: mod.apply(q, k, v, g, state=s, algorithm=a), q, k, v, gates,
                  state)
        check(got, want, 1e-9, f"lq from A = 0, {algorithm}")


def test_the_readouts_differ_from_per_token_readouts():
    """readout=chunk is its own function: Moneta's and Memora's per-token forms give other outputs."""
    for name in ("moneta", "memora"):
        token = mirasc.compile_spec(spec_text(name).replace(", readout=chunk", ""))
        q, k, v, gates, state = case(name)
        a = module(name).apply(q, k, v, gates, state=state)[0]
        b = token.apply(q, k, v, gates, state=state)[0]
        assert rel(a, b) > 1e-6, name


def test_kl_chunk_of_one_is_the_per_token_step():
    """With C = 1 every token is a chunk's first token: Memora's chunk readout is then exactly §3's kl step."""
    chunk1 = module("memora", 1)
    token1 = mirasc.compile_spec(spec_text("memora", 1).replace(", readout=chunk", ""))
    q, k, v, gates, state = case("memora")
    for algorithm in ("recurrent", "chunked"):
        a, fa = chunk1.apply(q, k, v, gates, state=state, algorithm=algorithm)
        b, fb = token1.apply(q, k, v, gates, state=state, algorithm=algorithm)
        assert rel(a, b) < 1e-12 and all(rel(fa[n], fb[n]) < 1e-12 for n in fb)


def test_final_state_meaning():
    """lq: the final W is A_T / n_c of the last chunk (what its last read used), and the state's own W is not
    read; kl: the final W is in weight space and may leave the simplex (the next chunk reads log max(W, 1e-12))."""
    mod = module("moneta")
    q, k, v, gates, state = case("moneta")
    o, final = mod.apply(q, k, v, gates, state=state)
    other = dict(state, **{n: torch.randn_like(state[n]) for n in ("W1", "W2")})
    o2, final2 = mod.apply(q, k, v, gates, state=other)
    assert torch.equal(o, o2) and all(torch.equal(final[n], final2[n]) for n in final)
    # continuing from the final state equals running the concatenation when the split is at a chunk boundary
    q2, k2, v2, g2, _ = case("moneta", 2 * C)
    for name in ("moneta", "memora"):
        mod = module(name)
        _, _, _, gates2, state = case(name, 2 * C)
        whole, fw = mod.apply(q2, k2, v2, gates2, state=state)
        first, mid = mod.apply(q2[:, :C], k2[:, :C], v2[:, :C], {n: x[:, :C] for n, x in gates2.items()}, state=state)
        second, fs = mod.apply(q2[:, C:], k2[:, C:], v2[:, C:], {n: x[:, C:] for n, x in gates2.items()}, state=mid)
        assert rel(torch.cat([first, second], 1), whole) < 1e-12, name
        assert all(rel(fs[n], fw[n]) < 1e-12 for n in fw), name


@pytest.mark.parametrize("name", ["moneta", "memora", "lq_alpha_k", "kl_alpha_v_theta_v"])
def test_layer_step_equals_forward(name):
    """Decoding token by token crosses chunk boundaries (C = 4, 11 tokens) and equals the full forward, with the
    chunked (dual-form) algorithm and with the recurrent one."""
    torch.manual_seed(0)
    mod = module(name)
    layer = mod.Layer(16, 2).double()
    x = torch.randn(2, T, 16, dtype=f64)
    y = layer(x)
    slow = mod.Layer(16, 2, algorithm="recurrent").double()
    slow.load_state_dict(layer.state_dict())
    assert rel(slow(x), y) < 1e-12
    assert rel(decode(layer, x), y) < 1e-12
    y.square().sum().backward()
    for pname, p in layer.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname
    if name == "moneta":  # the initial W is derived from A at each chunk: only A is learned
        assert not layer.initial["W1"].requires_grad and layer.initial["A_W1"].requires_grad


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
@pytest.mark.parametrize("name", ["moneta", "memora"])
def test_gradcheck(name, algorithm):
    mod = module(name, 2)
    q, k, v, gates, state = case(name, 5, dk=3, h=1)
    gnames, snames = list(gates), [n for n in state if not (name == "moneta" and not n.startswith("A_"))]
    rest = {n: x for n, x in state.items() if n not in snames}
    leaves = [x.requires_grad_(True) for x in (q, k, v, *gates.values(), *(state[n] for n in snames))]

    def fn(*xs):
        g = dict(zip(gnames, xs[3:3 + len(gnames)]))
        s = dict(zip(snames, xs[3 + len(gnames):]), **rest)
        o, final = mod.apply(xs[0], xs[1], xs[2], g, state=s, backend="torch", algorithm=algorithm)
        return (o, *(final[n] for n in sorted(final)))

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-6, rtol=1e-4)


REJECTED = {
    "decay(alpha=gate)": "retention = decay",
    "none": "retention = none",
    "elastic(lam=0.01, alpha=gate)": "retention = elastic",
    "bregman(phi=w*log(w))": "retention = bregman",
}


@pytest.mark.parametrize("retention", sorted(REJECTED))
def test_readout_chunk_is_rejected_for_other_retentions(retention, tmp_path, capsys):
    path = tmp_path / "bad.miras"
    path.write_text("model bad {\n    memory    = mlp\n    bias      = l2\n"
                    f"    retention = {retention}\n    learner   = gd(lr=gate)\n"
                    "    parallel  = minibatch(16, readout=chunk)\n}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:6:" in err, err
    assert "readout=chunk" in err and REJECTED[retention] in err and "lq or kl" in err, err


def test_readout_chunk_with_channel_wise_decay_on_an_mlp_is_rejected(tmp_path, capsys):
    """Linear memories take channel-wise α/θ under readout=chunk (cases above); an MLP memory does not (§6)."""
    path = tmp_path / "bad.miras"
    path.write_text("model bad {\n    memory = mlp\n    bias = l2\n    retention = lq(q=4, alpha=gate(v))\n"
                    "    parallel = minibatch(16, readout=chunk)\n}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:4:" in err and "MLP" in err, err


def test_readout_values(tmp_path, capsys):
    """readout takes token or chunk; readout=token is the default and is not printed in the canonical text."""
    path = tmp_path / "bad.miras"
    path.write_text("model bad {\n    memory = linear\n    bias = l2\n    retention = lq(q=4)\n"
                    "    parallel = minibatch(16, readout=tokens)\n}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:5:" in err and "readout" in err, err
    token = mirasc.parse_file(SPECS / "moneta_token.miras")
    assert token.parallel.readout == "token" and "readout" not in token.canonical()
    chunk = mirasc.parse_file(SPECS / "moneta.miras")
    assert "minibatch(C=64, readout=chunk)" in chunk.canonical()
    assert mirasc.compile_spec(chunk.canonical()).SPEC == chunk.canonical()


@pytest.mark.parametrize("q", [1.5, 4.0])
def test_lq_default_state_reads_the_mlp_draw(q):
    """The default accumulator is the A whose readout A / ‖A‖_q^(q-2) is the usual MLP draw N(0, 1/fan_in): the
    same weights Titans starts from (same shapes, same seed), not a draw shrunk or grown by the q-norm."""
    moneta = mirasc.compile_spec((SPECS / "moneta.miras").read_text().replace("q=4", f"q={q}"))
    titans = mirasc.compile_spec((SPECS / "titans.miras").read_text())
    mine, theirs = moneta.init_state(1, 2, 8, 8, dtype=f64), titans.init_state(1, 2, 8, 8, dtype=f64)
    for name in ("W1", "W2"):
        assert rel(mine[name], theirs[name]) < 1e-12, name
        a = mine["A_" + name]
        norm = a.abs().pow(q).sum((-2, -1), keepdim=True).pow(1 / q)
        assert rel(a / norm ** (q - 2), theirs[name]) < 1e-12, name
