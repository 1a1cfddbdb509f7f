"""Stick-breaking attention (Tan et al. 2024) as a nonparametric read: `memory = nonparametric(kernel=stickbreaking,
remainder=..., attend_current=...)` (docs/semantics.md, "Stick-breaking attention").

Every path against an independent float64 reference written token by token that breaks the stick literally: walk
the visible pairs from the newest back, give each β = σ(scale·q·k) of what is left, multiply the rest by 1 − β
(no logs, no cumulative sums; autograd for the gradients of q, k, v and the remainder vector). The torch
recurrent and chunked algorithms (1e-10), the Triton kernels under TRITON_INTERPRET=1 (fp32 1e-5, fp16 1e-3, bf16 1e-2;
gradients 4x), every remainder, attend_current, a window; flash-linear-attention's `naive_stickbreaking_attn`
(outputs, the stick left over, gradients); decoding (Layer.step) against forward; a cache continued across calls;
packed sequences; saturated logits; rejections."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from reference import rel

import mirasc

ROOT = Path(__file__).resolve().parents[2]
SB = ROOT / "specs" / "stickbreaking.miras"
D64 = torch.float64


def spec(memory="kernel=stickbreaking"):
    return f"model s {{ memory = nonparametric({memory})\n bias = l2\n learner = nonparametric }}"


def inputs(B=2, T=23, H=2, Dk=8, Dv=6, seed=0, spread=1.5):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, Dk, generator=g, dtype=D64) * spread for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=g, dtype=D64)
    return q, k, v


def reference(q, k, v, *, attend_current=False, window=0, remainder="none", bias=None, scale=None):
    """Token by token in float64, the stick broken literally from the newest visible pair back."""
    B, T, H, Dk = q.shape
    scale = 1 / math.sqrt(Dk) if scale is None else scale
    outs = []
    for t in range(T):
        o = torch.zeros(B, H, v.shape[-1], dtype=q.dtype)
        stick = torch.ones(B, H, dtype=q.dtype)
        for s in range(t if attend_current else t - 1, -1, -1):
            if window and t - s >= window:
                break
            beta = torch.sigmoid((q[:, t] * k[:, s]).sum(-1) * scale)
            o = o + (stick * beta)[..., None] * v[:, s]
            stick = stick * (1 - beta)
        if remainder == "current":
            o = o + stick[..., None] * v[:, t]
        elif remainder == "bias":
            o = o + stick[..., None] * bias[None]
        outs.append(o)
    return torch.stack(outs, 1)


def grads(out, tensors, seed=1):
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=D64).to(out.dtype)
    return torch.autograd.grad(out, tensors, cot)


VARIANTS = ["kernel=stickbreaking", "kernel=stickbreaking, remainder=current",
            "kernel=stickbreaking, remainder=bias, attend_current=true",
            "kernel=stickbreaking, attend_current=true, window=5", "kernel=stickbreaking, remainder=current, window=4"]


def options(mod):
    return {"attend_current": mod.ATTEND_CURRENT, "window": mod.WINDOW, "remainder": mod.REMAINDER}


def test_bundled_spec():
    mod = mirasc.compile_spec(SB)
    assert mod.KERNEL == "stickbreaking" and mod.REMAINDER == "current" and mod.ATTEND_CURRENT is False
    assert mod.GATES == () and mod.PARAM_NAMES == ()
    text = mirasc.parse_file(SB).canonical()
    assert "remainder=current" in text and "attend_current=false" in text
    # the options are left out of every other kernel's canonical text, so earlier specs compile as before
    assert "remainder" not in mirasc.parse_text(spec("kernel=softmax")).canonical()


@pytest.mark.parametrize("memory", VARIANTS)
def test_torch_matches_reference(memory):
    mod = mirasc.compile_spec(spec(memory))
    q, k, v = (t.requires_grad_() for t in inputs())
    params = {n: torch.randn(2, 6, dtype=D64).requires_grad_() for n in mod.PARAM_NAMES}
    ref = reference(q, k, v, bias=params.get("remainder_bias"), **options(mod))
    leaves = (q, k, v, *params.values())
    want = grads(ref, leaves)
    for algorithm in ("recurrent", "chunked"):
        o, _ = mod.apply(q, k, v, params=params, algorithm=algorithm, chunk_size=4)
        assert rel(o, ref) < 1e-12, algorithm
        for i, (a, b) in enumerate(zip(grads(o, leaves), want)):
            assert rel(a, b) < 1e-10, (algorithm, i)


def test_matches_flash_linear_attention_naive():
    """fla.ops.stickbreaking_attn.naive_stickbreaking_attn returns (o, rem): our remainder=none is its o, and
    remainder=current is o + rem·v_t (the authors' reference); it computes in float64 for float64 inputs."""
    naive = pytest.importorskip("fla.ops.stickbreaking_attn.naive").naive_stickbreaking_attn
    q, k, v = inputs(T=29, Dv=8, spread=2.0)
    leaves = tuple(t.clone().requires_grad_() for t in (q, k, v))
    for current in (False, True):
        flag = "true" if current else "false"
        theirs, rem = naive(*leaves, attend_current=current)
        plain = mirasc.compile_spec(spec(f"kernel=stickbreaking, attend_current={flag}"))
        ours, _ = plain.apply(*leaves)
        assert rel(ours, theirs) < 1e-12, current
        for a, b in zip(grads(ours, leaves), grads(theirs, leaves)):
            assert rel(a, b) < 1e-10
        full = mirasc.compile_spec(spec(f"kernel=stickbreaking, remainder=current, attend_current={flag}"))
        ours, _ = full.apply(*leaves)
        theirs, rem = naive(*leaves, attend_current=current)
        theirs = theirs + rem[..., None] * leaves[2]
        assert rel(ours, theirs) < 1e-12, current
        for a, b in zip(grads(ours, leaves), grads(theirs, leaves)):
            assert rel(a, b) < 1e-10


def test_cache_continues_across_calls():
    for memory in ("kernel=stickbreaking, remainder=current", "kernel=stickbreaking, window=5"):
        mod = mirasc.compile_spec(spec(memory))
        q, k, v = inputs()
        full, end = mod.apply(q, k, v)
        for algorithm in ("recurrent", "chunked"):
            a, cache = mod.apply(q[:, :9], k[:, :9], v[:, :9], algorithm=algorithm)
            b, last = mod.apply(q[:, 9:], k[:, 9:], v[:, 9:], state=cache, algorithm=algorithm, chunk_size=4)
            assert rel(torch.cat([a, b], 1), full) < 1e-12, (memory, algorithm)
            assert rel(last["K"], end["K"]) == 0
        if "window" in memory:
            assert end["K"].shape[2] == 5


def test_layer_step_equals_forward():
    for memory in ("kernel=stickbreaking, remainder=current", "kernel=stickbreaking, remainder=bias"):
        mod = mirasc.compile_spec(spec(memory))
        torch.manual_seed(0)
        layer = mod.Layer(16, 2).double()
        x = torch.randn(2, 13, 16, dtype=D64)
        y = layer(x)
        y.square().sum().backward()
        if mod.REMAINDER == "bias":  # the remainder vector is learned with the layer
            grad = [p.grad for n, p in layer.named_parameters() if "remainder_bias" in n]
            assert grad and grad[0].abs().sum() > 0
        cache = layer.init_cache(2)
        steps = []
        for t in range(13):
            y_t, cache = layer.step(x[:, t], cache)
            steps.append(y_t)
        assert rel(torch.stack(steps, 1), y) < 1e-12, memory


def test_packed_sequences():
    mod = mirasc.compile_spec(SB)
    q, k, v = inputs(B=1, T=20)
    bounds = [0, 7, 7, 20]
    o, states = mod.apply(q, k, v, cu_seqlens=torch.tensor(bounds))
    for a, b in zip(bounds, bounds[1:]):
        if a < b:
            assert rel(o[:, a:b], reference(q[:, a:b], k[:, a:b], v[:, a:b], remainder="current")) < 1e-12


def test_saturated_logits_stay_finite():
    """Logits of ±80 (β within 1e-35 of 0 or 1): the log-space weights stay finite where the literal product
    underflows to exact zeros; the first pair that takes (almost) the whole stick leaves nothing for the older."""
    mod = mirasc.compile_spec(SB)
    q, k, v = inputs(T=12, spread=10.0)
    o, _ = mod.apply(q.requires_grad_(), k, v)
    assert torch.isfinite(o).all() and rel(o, reference(q, k, v, remainder="current")) < 1e-10
    assert all(torch.isfinite(g).all() for g in grads(o, (q,)))


@pytest.mark.parametrize("memory,dtype,tol", [("kernel=stickbreaking, remainder=current", torch.float32, 1e-5),
                                              ("kernel=stickbreaking, attend_current=true, window=7",
                                               torch.float32, 1e-5),
                                              ("kernel=stickbreaking, remainder=bias", torch.float32, 1e-5),
                                              ("kernel=stickbreaking, remainder=current", torch.bfloat16, 1e-2),
                                              ("kernel=stickbreaking", torch.float16, 1e-3)])
def test_triton_matches_reference(memory, dtype, tol):
    """The flash kernels (T = 37: three 16-row tiles, the last partial), outputs and the gradients of q, k, v (and
    the remainder vector); the cache they return is the torch path's."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(spec(memory))
    q, k, v = inputs(B=1, T=37, H=2, Dk=16, Dv=12, seed=3)
    params = {n: torch.randn(2, 12, dtype=D64) for n in mod.PARAM_NAMES}
    leaves = tuple(t.to(dtype).requires_grad_() for t in (q, k, v))
    fparams = {n: p.float().requires_grad_() for n, p in params.items()}
    o, state = mod.apply(*leaves, params=fparams, backend="triton")
    assert o.dtype == dtype
    exact = tuple(t.detach().double().requires_grad_() for t in leaves)
    xparams = {n: p.detach().double().requires_grad_() for n, p in fparams.items()}
    ref = reference(*exact, bias=xparams.get("remainder_bias"), **options(mod))
    assert rel(o, ref) < tol
    for i, (a, b) in enumerate(zip(grads(o, leaves + tuple(fparams.values())),
                                   grads(ref, exact + tuple(xparams.values())))):
        assert rel(a, b) < 4 * tol, i
    _, torch_state = mod.apply(*exact, params=xparams, backend="torch")
    assert rel(state["K"], torch_state["K"]) < 1e-2 and state["K"].shape == torch_state["K"].shape


def test_triton_crosses_larger_tiles():
    """T = 70 runs the interpreter's 32-row tiles: three key tiles per late query block, so the stick and the
    gradient sums are carried across two tile boundaries (and stored per tile for dk/dv)."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(SB)
    q, k, v = inputs(B=1, T=70, H=1, Dk=16, Dv=16, seed=4)
    leaves = tuple(t.float().requires_grad_() for t in (q, k, v))
    o, _ = mod.apply(*leaves, backend="triton")
    exact = tuple(t.detach().double().requires_grad_() for t in leaves)
    ref, _ = mod.apply(*exact, backend="torch")
    assert rel(o, ref) < 1e-5
    for a, b in zip(grads(o, leaves), grads(ref, exact)):
        assert rel(a, b) < 4e-5


@pytest.mark.parametrize("memory", ["kernel=stickbreaking, remainder=current",
                                    "kernel=stickbreaking, attend_current=true, window=5, remainder=bias"])
def test_triton_packed_sequences_in_one_launch(memory, monkeypatch):
    """cu_seqlens on the Triton path: one call of the kernels over all sequences (their varlen grid), an empty
    sequence among them; outputs, gradients and each sequence's cache equal the per-sequence torch calls."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(spec(memory))
    bounds = [0, 17, 17, 20, 45]
    q, k, v = inputs(B=1, T=45, H=2, Dk=16, Dv=16, seed=7)
    params = {n: torch.randn(2, 16, dtype=D64) for n in mod.PARAM_NAMES}
    calls = []
    real = mod._stickbreaking_attention
    monkeypatch.setattr(mod, "_stickbreaking_attention", lambda *a: calls.append(a[-1]) or real(*a))
    leaves = tuple(t.float().requires_grad_() for t in (q, k, v))
    o, caches = mod.apply(*leaves, params={n: p.float() for n, p in params.items()}, backend="triton",
                          cu_seqlens=torch.tensor(bounds))
    assert calls == [bounds]
    exact = tuple(t.clone().requires_grad_() for t in (q, k, v))
    ref, ref_caches = mod.apply(*exact, params=params, backend="torch", cu_seqlens=torch.tensor(bounds))
    assert rel(o, ref) < 1e-5
    for a, b in zip(grads(o, leaves), grads(ref, exact)):
        assert rel(a, b) < 4e-5
    for mine, theirs in zip(caches, ref_caches):
        assert mine["K"].shape == theirs["K"].shape and mine["start"] == theirs.get("start", 0)
        if theirs["K"].numel():
            assert rel(mine["V"], theirs["V"]) < 1e-6


def test_auto_backend_continues_a_cache_on_torch(monkeypatch):
    """backend='auto' takes the Triton kernels where they apply (here: on the CPU, its reason to leave them out taken
    away, so that the interpreter runs them) and continues a non-empty cache on the torch path instead of refusing;
    backend='triton' refuses it."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(SB)
    q, k, v = (t.float() for t in inputs(B=1, T=20, Dk=8, Dv=8, seed=6))
    assert mod.launch_plan(8, 8, device="sm_90")["backend"] == "triton"
    assert mod.launch_plan(8, 8, device="cpu")["backend"] == "torch"
    monkeypatch.setattr(mod, "_auto_reason", lambda *a: None)
    launched = []
    real = mod._stickbreaking_attention
    monkeypatch.setattr(mod, "_stickbreaking_attention", lambda *a: launched.append(1) or real(*a))
    full, _ = mod.apply(q, k, v)
    assert launched == [1]
    a, cache = mod.apply(q[:, :9], k[:, :9], v[:, :9])
    b, _ = mod.apply(q[:, 9:], k[:, 9:], v[:, 9:], state=cache)
    assert launched == [1, 1]  # the continuation ran on torch
    assert rel(torch.cat([a, b], 1), full) < 1e-5
    with pytest.raises(ValueError, match="empty cache"):
        mod.apply(q[:, 9:], k[:, 9:], v[:, 9:], state=cache, backend="triton")


def test_flash_op_compiles_without_graph_breaks():
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(SB)
    q, k, v = (t.float().requires_grad_() for t in inputs(B=1, T=20, Dk=8, Dv=8, seed=5))

    def run(q, k, v):
        return mod.apply(q, k, v, backend="triton")[0]

    compiled = torch.compile(run, backend="aot_eager", fullgraph=True)
    o, ref = compiled(q, k, v), run(q, k, v)
    assert rel(o, ref) < 1e-6
    for a, b in zip(torch.autograd.grad(o.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))):
        assert rel(a, b) < 1e-6


@pytest.mark.parametrize("memory,retention,why", [
    ("kernel=stickbreaking", "decay(alpha=gate)", "already forgets"),
    ("kernel=stickbreaking, causal=false", "none", "no order"),
    ("kernel=stickbreaking, hops=2", "none", "hops=1"),
    ("kernel=stickbreaking, temporal=4", "none", "drop temporal"),
    ("kernel=softmax, remainder=current", "none", "kernel=stickbreaking"),
    ("kernel=softmax, attend_current=true", "none", "kernel=stickbreaking"),
])
def test_rejections(memory, retention, why):
    text = f"model s {{ memory = nonparametric({memory})\n bias = l2\n retention = {retention} }}"
    with pytest.raises(mirasc.SpecError, match="illegal combination") as info:
        mirasc.parse_text(text)
    assert why in str(info.value)
