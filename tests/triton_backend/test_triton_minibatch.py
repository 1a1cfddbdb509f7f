"""The mini-batch (dual-form) Triton kernels, run by the interpreter on the CPU:
backend="triton" with the chunked algorithm vs the torch recurrence in float64 (an independent path: one
token at a time, gradients at the anchor by autograd) — outputs, final state and the gradients of q, k,
v, every gate and every initial-state tensor. The forward prints `memory_grad` and `memory_forward` on
[C, n] tiles; the backward prints their reverse-mode graphs, so the specs and variants below cover the
pieces: LayerNorm + residual + GELU (TTT-MLP, Titans, Yaad), momentum and decay (Titans), a gated
Huber bias (Yaad), decay after the step with Dk != Dv and no norm (mlp_post_decay), a depth-3 tanh MLP,
and a linear memory with a non-l2 bias and momentum (no linear chunk family covers it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_triton_recurrent import assert_compiled_matches_eager, one_launch, rel

import mirasc

triton = pytest.importorskip("triton")
SPEC_DIR = Path(__file__).resolve().parents[2] / "specs"
RANGES = {"eta": (0.05, 0.5), "alpha": (0.8, 1.0), "theta": (0.3, 0.9), "delta": (1.0, 4.0)}
MINIBATCH_SPECS = ["titans", "ttt_mlp", "yaad"]
VARIANTS = {
    "mlp_post_decay": "memory = mlp(depth=2, expansion=2, act=silu, residual=false, norm=none)\nbias = l2\n"
                      "retention = decay(alpha=gate, order=post)\nlearner = momentum(lr=gate, theta=0.8)\n"
                      "parallel = minibatch(16)",
    "mlp_depth3_tanh": "memory = mlp(depth=3, expansion=2, act=tanh, residual=true, norm=layernorm)\nbias = l2\n"
                       "retention = none\nlearner = gd(lr=gate)\nparallel = minibatch(16)",
    "linear_huber_momentum": "memory = linear\nbias = huber(delta=gate)\nretention = decay(alpha=gate)\n"
                             "learner = momentum(lr=gate, theta=gate)\nparallel = minibatch(16)",
}


def _channels(mod, name, Dk, Dv):
    """The trailing shape of a gate: none per head, (Dk,) or (Dv,) channel-wise (docs/semantics.md, channel-wise
    gates)."""
    side = getattr(mod, "GATE_CHANNELS", {}).get(name)
    return () if side is None else (Dk,) if side == "k" else (Dv,)


def compile_named(name):
    if name == "any_c3":
        return mirasc.compile_spec(f"model any_c3 {{\n{ANY_C.format(C=3)}\n}}\n")
    if name in VARIANTS:
        return mirasc.compile_spec(f"model {name} {{\n{VARIANTS[name]}\n}}\n")
    return mirasc.compile_spec(SPEC_DIR / f"{name}.miras")


def inputs(mod, B, T, H, Dk, Dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=g), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=g)
    gates = {n: RANGES[n][0] + (RANGES[n][1] - RANGES[n][0])
             * torch.rand(B, T, H, *_channels(mod, n, Dk, Dv), generator=g)
             for n in mod.GATES}
    state = mod.init_state(B, H, Dk, Dv)
    # perturbed, with a non-zero momentum buffer, so every initial-state tensor matters
    state = {n: s + 0.05 * torch.randn(s.shape, generator=g) for n, s in state.items()}
    return q, k, v, gates, state


def grads_of(mod, q, k, v, gates, state, dtype, **kw):
    """Outputs, final state and the gradients of a fixed random functional of both."""
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v, *gates.values(), *state.values())]
    gs = dict(zip(gates, leaves[3:3 + len(gates)]))
    st = dict(zip(state, leaves[3 + len(gates):]))
    o, final = mod.apply(*leaves[:3], gs, state=st, **kw)
    gen = torch.Generator().manual_seed(2)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)).sum()
    for n in sorted(final):
        loss = loss + (final[n] * torch.randn(final[n].shape, generator=gen, dtype=torch.float64).to(dtype)).sum()
    return [o, *(final[n] for n in sorted(final))], torch.autograd.grad(loss, leaves)


# Tolerance: float32 kernels vs float64; the float32 torch paths are off by the same order (rounding
# amplified by the inner loop's LayerNorm: up to ~3e-5 for Titans at T = 150).
@pytest.mark.parametrize("name", MINIBATCH_SPECS + sorted(VARIANTS))
@pytest.mark.parametrize("shape", [(1, 37, 2, 8, 8), (2, 1, 1, 8, 8)], ids=["T37", "T1"])
def test_minibatch_kernels_match_the_recurrence(name, shape):
    mod = compile_named(name)
    kernels = mod.launch_plan(8, 8, device="sm_90", backend="triton", algorithm="chunked")["kernels"]
    assert "_minibatch_stream_fwd" in kernels  # the mini-batch kernels take it (streamed on a GPU)
    if "residual=true" not in mod.SPEC:  # no x + M(x): Dk != Dv, and Dv below tl.dot's 16 (padded lanes)
        shape = shape[:3] + (8, 5)
    if mod.MINIBATCH == 64 and shape[1] > 1:
        shape = (1, 70, 1) + shape[3:]  # two chunks, the last one partial
    data = inputs(mod, *shape)
    outs, grads = grads_of(mod, *data, torch.float32, backend="triton", algorithm="chunked")
    ref_outs, ref_grads = grads_of(mod, *data, torch.float64, backend="torch", algorithm="recurrent")
    names = ["q", "k", "v", *data[3], *data[4]]
    for a, b in zip(outs, ref_outs):
        assert rel(a, b) < 2e-5
    for n, a, b in zip(names, grads, ref_grads):
        assert b.norm() > 0 or n == "v", n  # the functional reaches every input (Huber's v: sign regime)
        assert rel(a, b) < 5e-5, n


def test_which_specs_have_minibatch_kernels():
    """Every mini-batch spec whose retention keeps the weights linear in the accumulated updates;
    Moneta and Memora with per-token readouts (lq, kl) read through a nonlinear map and keep the recurrent
    kernel. Their chunk-readout forms (docs/semantics.md: chunk readouts) run each chunk on the kernels of their decay
    form, one launch
    per chunk (tests/triton_backend/test_triton_chunk_readout.py). omega_yaad's Omega window runs on them as c kernel
    rows per token (tests/triton_backend/test_triton_omega.py)."""
    have = sorted(p.stem for p in SPEC_DIR.glob("*.miras") if hasattr(mirasc.compile_spec(p), "_minibatch_triton"))
    assert have == sorted(MINIBATCH_SPECS + ["memora", "moneta", "omega_yaad"])
    mod = compile_named("memora_token")
    q, k, v, gates, state = inputs(mod, 1, 4, 1, 4, 4)
    with pytest.raises(RuntimeError, match="no chunked Triton kernel"):
        mod.apply(q, k, v, gates, backend="triton", algorithm="chunked")


def test_triton_default_is_the_minibatch_kernel(monkeypatch):
    """backend="triton" runs the mini-batch kernels for every mini-batch size (minibatch(4) too: its chunks
    are padded to a 16-row tile); the result is the same function as the recurrent kernel's and torch's."""
    mod = compile_named("ttt_mlp")
    data = inputs(mod, 1, 20, 1, 8, 8)
    calls = []
    real = mod._minibatch_triton
    monkeypatch.setattr(mod, "_minibatch_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    a, _ = mod.apply(*data[:4], state=data[4], backend="triton")
    assert calls == [1]
    b, _ = mod.apply(*data[:4], state=data[4], backend="triton", algorithm="recurrent")
    assert rel(a, b) < 1e-5
    small = mirasc.compile_spec(mod.SPEC.replace("minibatch(C=16)", "minibatch(C=4)"))
    assert small.MINIBATCH == 4
    calls = []
    real_small = small._minibatch_triton
    monkeypatch.setattr(small, "_minibatch_triton", lambda *a, **kw: calls.append(1) or real_small(*a, **kw))
    c, _ = small.apply(*data[:4], state=data[4], backend="triton")
    assert calls == [1]
    d, _ = small.apply(*data[:4], state=data[4], backend="torch")
    assert rel(c, d) < 1e-5


ANY_C = ("memory = mlp(depth=2, expansion=2, act=gelu, residual=true, norm=layernorm)\nbias = l2\n"
         "retention = decay(alpha=gate)\nlearner = momentum(lr=gate, theta=gate)\nparallel = minibatch({C})")


@pytest.mark.parametrize("C", [1, 3, 4, 8, 16, 64])
def test_any_minibatch_size(C):
    """minibatch(C) for any C on the mini-batch kernels (a Titans-like memory: momentum, decay, LayerNorm,
    residual): chunks of C tokens padded to a tile of max(16, next power of two) rows. Two full chunks and a
    partial one; outputs, final state and every gradient vs the float64 torch recurrence."""
    mod = mirasc.compile_spec(f"model any_c {{\n{ANY_C.format(C=C)}\n}}\n")
    assert mod.MINIBATCH == C
    data = inputs(mod, 1, 2 * C + max(1, C // 2), 1, 8, 8)
    outs, grads = grads_of(mod, *data, torch.float32, backend="triton", algorithm="chunked")
    ref_outs, ref_grads = grads_of(mod, *data, torch.float64, backend="torch", algorithm="recurrent")
    for a, b in zip(outs, ref_outs):
        assert rel(a, b) < 2e-5
    for n, a, b in zip(["q", "k", "v", *data[3], *data[4]], grads, ref_grads):
        assert b.norm() > 0, n
        assert rel(a, b) < 5e-5, n


def test_minibatch_fp16_inputs():
    mod = compile_named("titans")
    q, k, v, gates, state = inputs(mod, 1, 70, 1, 8, 8)
    o, final = mod.apply(q.half(), k.half(), v.half(), gates, state=state, backend="triton")
    assert o.dtype == torch.float16 and all(t.dtype == torch.float32 for t in final.values())
    ref, _ = mod.apply(q, k, v, gates, state=state, backend="torch", algorithm="recurrent")
    assert rel(o, ref) < 2e-3


def test_minibatch_op_compiles_without_graph_breaks():
    mod = compile_named("titans")
    q, k, v, gates, state = inputs(mod, 1, 70, 1, 8, 8)
    for t in (q, k, v, *gates.values()):
        t.requires_grad_(True)

    def run(q, k, v, gates, state):
        o, final = mod.apply(q, k, v, gates, state=state, backend="triton")
        return o, final["W2"]

    assert_compiled_matches_eager(run, q, k, v, gates, state)


@pytest.mark.parametrize("name", ["ttt_mlp", "mlp_post_decay", "any_c3"])
def test_packed_sequences_in_one_launch(name):
    """cu_seqlens on the mini-batch kernels: sequences become padded rows of one launch; each row's chunk
    ends are taken at its last real token (with momentum, padding tokens are not no-ops: W keeps moving
    by S). Equal to the torch path run per sequence: outputs, final states, gradients; incl. an empty
    sequence, one shorter than a mini-batch and one spanning two; state=None as well."""
    mod = compile_named(name)
    Dv = 8 if "residual=true" in mod.SPEC else 5
    cu = [0, 5, 5, 23, 40]
    q, k, v, gates, _ = inputs(mod, 1, cu[-1], 2, 8, Dv)
    assert one_launch(mod, q, v)  # the one-launch path, not a loop
    for state in (None, inputs(mod, len(cu) - 1, 1, 2, 8, Dv, seed=3)[4]):
        leaves = [v] + ([] if state is None else list(state.values()))
        runs = []
        for backend, dt in (("triton", torch.float32), ("torch", torch.float64)):  # the reference in float64
            vv = v.detach().to(dt).requires_grad_(True)
            st = None if state is None else {n: t.detach().to(dt).requires_grad_(True) for n, t in state.items()}
            o, final = mod.apply(q.to(dt), k.to(dt), vv, {n: g.to(dt) for n, g in gates.items()}, state=st,
                                 backend=backend, cu_seqlens=cu)
            gen = torch.Generator().manual_seed(4)
            loss = (o * torch.randn(o.shape, generator=gen).to(dt)).sum()
            loss = loss + sum((final[n] * torch.randn(final[n].shape, generator=gen).to(dt)).sum()
                              for n in sorted(final))
            ins = [vv] + ([] if st is None else list(st.values()))
            runs.append((o, [final[n] for n in sorted(final)], torch.autograd.grad(loss, ins)))
        (o, fin, grads), (ref, ref_fin, ref_grads) = runs
        assert len(grads) == len(leaves)
        # float32 kernels vs the float64 torch path: Titans-like momentum + LayerNorm over 14 chunks (any_c3)
        # puts S at 3.5e-5 on one x86 machine and 5.8e-5 on another (float32 rounding differs with the CPU's
        # kernels); an error in the algorithm is 1e-2 and up
        tol = 1e-4
        assert rel(o, ref) < tol
        for a, b in zip(fin + list(grads), ref_fin + list(ref_grads)):
            assert rel(a, b) < tol


# The streamed kernels (weights in global memory, every dimension walked in tiles): forced, with 16-wide
# tiles, at head sizes that take several tiles with a partial last one (Dk = 20: 16 + 4; E = 40 or 80),
# and for a Dv != Dk memory. Same checks and tolerances as the single-tile kernels.
STREAM_CASES = {"titans_like_c8": (20, 20), "ttt_mlp": (8, 8), "yaad": (8, 8), "mlp_post_decay": (20, 13),
                "mlp_depth3_tanh": (8, 8), "linear_huber_momentum": (20, 13)}


@pytest.mark.parametrize("name", sorted(STREAM_CASES))
def test_streamed_kernels_match_the_recurrence(name, monkeypatch):
    mod = (mirasc.compile_spec(f"model titans_like_c8 {{\n{ANY_C.format(C=8)}\n}}\n") if name == "titans_like_c8"
           else compile_named(name))
    monkeypatch.setattr(mod, "MINIBATCH_SCHEDULE", "stream")
    monkeypatch.setattr(mod, "MB_STREAM_TILE", 16)
    Dk, Dv = STREAM_CASES[name]
    T = 2 * mod.MINIBATCH + 5 if mod.MINIBATCH < 64 else 70
    data = inputs(mod, 1, T, 1, Dk, Dv)
    outs, grads = grads_of(mod, *data, torch.float32, backend="triton", algorithm="chunked")
    ref_outs, ref_grads = grads_of(mod, *data, torch.float64, backend="torch", algorithm="recurrent")
    for a, b in zip(outs, ref_outs):
        assert rel(a, b) < 2e-5
    for n, a, b in zip(["q", "k", "v", *data[3], *data[4]], grads, ref_grads):
        assert b.norm() > 0 or n == "v", n
        assert rel(a, b) < 5e-5, n


def test_schedule_choice():
    """A GPU streams Titans' state (the schedule itself: tests/runtime/test_minibatch_host.py); backend="auto" sends
    heads up to D = 128 with E = 4 D to the streamed kernels, in tiles of MB_STREAM_WIDTH (launch_plan)."""
    mod = compile_named("titans")
    plan = mod.launch_plan(128, 128, dtype=torch.bfloat16, device="sm_90")
    assert plan["backend"] == "triton" and plan["algorithm"] == "chunked" and plan["chunk"] == mod.MINIBATCH
    assert set(plan["kernels"]) == {"_minibatch_stream_fwd", "_minibatch_stream_fwd_end", "_minibatch_stream_bwd_a",
                                    "_minibatch_stream_bwd_b"}
    assert all(c["TK"] == c["TV"] == c["TE"] == mod.MB_STREAM_WIDTH for cs in plan["kernels"].values() for c in cs)
    plan = mod.launch_plan(256, 256, dtype=torch.bfloat16, device="sm_90")
    assert plan["backend"] == "torch" and "Dk=256, Dv=256" in plan["reason"] and plan["kernels"] == {}


# 16-bit inputs (docs/semantics.md "Numerics"): the mini-batch kernels' operands are fp32 intermediates, so each
# product takes them as two bf16 parts on the tensor cores (bf16x3: hi·hi + hi·lo + lo·hi, about 16 bits; the
# interpreter computes the same three products exactly). Judged as the chunk kernels are: against the float64
# recurrence on the same 16-bit inputs, every output and gradient within 3 unit roundoffs (relative RMS error) and
# within 3x the error of the module's own torch path.
@pytest.mark.parametrize("name", ["titans", "yaad", "moneta", "memora"])
def test_bf16_inputs_split_products(name, monkeypatch):
    mod = compile_named(name)
    monkeypatch.setattr(mod, "MINIBATCH_SCHEDULE", "stream")
    monkeypatch.setattr(mod, "MB_STREAM_TILE", 16)
    assert mod.HALF_DOTS == "split"
    assert mod.launch_plan(16, 16, dtype=torch.bfloat16, backend="triton")["precision"] == "bf16x3"
    q, k, v, gates, state = inputs(mod, 1, 70, 1, 16, 16)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))

    def run(to, **kw):
        leaves = [t.detach().to(to if to == torch.float64 else t.dtype).requires_grad_() for t in (q, k, v)]
        leaves += [t.detach().to(to if to == torch.float64 else torch.float32).requires_grad_()
                   for t in (*gates.values(), *state.values())]
        gs = dict(zip(gates, leaves[3:3 + len(gates)]))
        st = dict(zip(state, leaves[3 + len(gates):]))
        o, final = mod.apply(*leaves[:3], gs, state=st, **kw)
        w = torch.randn(o.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        (o.double() * w).sum().backward()
        return [o, *(t.grad for t in leaves[:3 + len(gates)])]

    ref = run(torch.float64, backend="torch", algorithm="recurrent")
    fast = run(torch.bfloat16, backend="triton", algorithm="chunked")
    edges = run(torch.bfloat16, backend="torch", algorithm="chunked")
    assert fast[0].dtype == torch.bfloat16
    for label, a, b, r in zip(["o", "dq", "dk", "dv", *gates], fast, edges, ref):
        if r.norm() == 0:  # (Yaad's v: the Huber bias in its sign regime passes no gradient)
            assert a.norm() == 0, label
            continue
        err = rel(a.double(), r)
        assert err < 3 * 2.0 ** -8, (label, err)
        assert err < 3 * rel(b.double(), r), (label, err, rel(b.double(), r))


