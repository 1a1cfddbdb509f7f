"""The Forgetting Transformer (FoX, Lin et al. 2025) as a decaying nonparametric memory: `retention = decay(...)`
on `memory = nonparametric(...)` (docs/semantics.md, "Decaying pairs").

Every path against an independent float64 reference written token by token with the decayed weight of each pair
as an explicit product Π_{s<l≤t} α_l (autograd for the gradients of q, k, v and the forget gate): the torch
recurrent and chunked algorithms (1e-10), the flash Triton kernel under TRITON_INTERPRET=1 (fp32 1e-5, fp16
5e-3, bf16 1e-2; gradients 4x), with a window, constant α, the additive and poly kernels; flash-linear-attention's
`naive_forgetting_attn` (its g is log α); decoding (Layer.step) against forward; a cache continued across calls;
packed sequences; α = 0; rejections."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from reference import rel

import mirasc

ROOT = Path(__file__).resolve().parents[2]
FOX = ROOT / "specs" / "forgetting_transformer.miras"
D64 = torch.float64


def spec(memory="kernel=softmax", alpha="gate"):
    return f"model f {{ memory = nonparametric({memory})\n bias = l2\n retention = decay(alpha={alpha}) }}"


def inputs(B=2, T=23, H=2, Dk=8, Dv=6, seed=0, alpha_low=0.6):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, Dk, generator=g, dtype=D64)
    k = torch.randn(B, T, H, Dk, generator=g, dtype=D64)
    v = torch.randn(B, T, H, Dv, generator=g, dtype=D64)
    alpha = alpha_low + (1 - alpha_low) * torch.rand(B, T, H, generator=g, dtype=D64)
    return q, k, v, alpha


def reference(q, k, v, alpha, *, kernel="softmax", window=0, scale=None, params=None, degree=2):
    """Token by token in float64: o_t = Σ_s a_ts κ(q_t, k_s) v_s / Σ_s a_ts κ(q_t, k_s) over s ≤ t (and
    t − s < window), a_ts = Π_{s<l≤t} α_l as a product. alpha: [B, T, H] (or a number)."""
    B, T, H, Dk = q.shape
    scale = 1 / math.sqrt(Dk) if scale is None else scale
    if not torch.is_tensor(alpha):
        alpha = torch.full((B, T, H), float(alpha), dtype=q.dtype)
    outs = []
    for t in range(T):
        lo = max(0, t - window + 1) if window else 0
        rows = []
        for s in range(lo, t + 1):
            a = torch.ones(B, H, dtype=q.dtype)
            for step in range(s + 1, t + 1):
                a = a * alpha[:, step]
            x = (q[:, t] * k[:, s]).sum(-1) * scale  # [B, H]
            if kernel == "softmax":
                kappa = torch.exp(x)
            elif kernel == "poly":
                kappa = sum(x ** i / math.factorial(i) for i in range(degree + 1))
            else:  # additive: exp(wᵀ tanh(W_q q + W_k k)) per head
                hidden = torch.tanh(torch.einsum("hij,bhj->bhi", params["additive_q"], q[:, t])
                                    + torch.einsum("hij,bhj->bhi", params["additive_k"], k[:, s]))
                kappa = torch.exp((hidden * params["additive_w"]).sum(-1))
            rows.append((a * kappa, v[:, s]))
        num = sum(w[..., None] * val for w, val in rows)
        den = sum(w for w, _ in rows)
        outs.append(num / den[..., None])
    return torch.stack(outs, 1)


def grads(out, tensors, seed=1):
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=D64)
    return torch.autograd.grad((out.double() * do).sum(), tensors)


def test_bundled_spec_declares_the_forget_gate():
    mod = mirasc.compile_spec(FOX)
    assert mod.GATES == ("alpha",) and mod.GATE_CHANNELS == {} and mod.DECAY == "gate"
    assert mod.init_state(2, 3, 4, 5)["log_weight"].shape == (2, 3, 0)
    text = mirasc.parse_file(FOX).canonical()
    assert "retention = decay(alpha=gate, order=post)" in text


@pytest.mark.parametrize("algorithm,chunk", [("recurrent", None), ("chunked", 5), ("chunked", 64)])
def test_torch_matches_reference(algorithm, chunk):
    mod = mirasc.compile_spec(FOX)
    q, k, v, alpha = (t.requires_grad_() for t in inputs())
    o, state = mod.apply(q, k, v, {"alpha": alpha}, algorithm=algorithm, chunk_size=chunk)
    ref = reference(q, k, v, alpha)
    assert rel(o, ref) < 1e-12
    # the final state: every pair's log weight after the last token, Σ_{s<l≤T} log α_l
    T = q.shape[1]
    log_weight = torch.stack([torch.log(alpha[:, s + 1:]).sum(1) for s in range(T)], -1)
    assert rel(state["log_weight"], log_weight) < 1e-12
    for name, a, b in zip(("q", "k", "v", "alpha"), grads(o, (q, k, v, alpha)), grads(ref, (q, k, v, alpha))):
        assert rel(a, b) < 1e-10, name


@pytest.mark.parametrize("memory,alpha", [("kernel=softmax, window=4", "gate"), ("kernel=softmax, scale=0.4", "0.8"),
                                          ("kernel=poly, degree=4", "gate"), ("kernel=additive", "gate")])
def test_torch_variants_match_reference(memory, alpha):
    """A window with the decay (both masks), a constant α (ALiBi-like: log a_ts = (t − s)·log α), the other
    kernels (the decay multiplies the kernel value)."""
    mod = mirasc.compile_spec(spec(memory, alpha))
    q, k, v, a = (t.requires_grad_() for t in inputs(T=17))
    gates = {"alpha": a} if alpha == "gate" else {}
    params = mod.init_params(2, 8, 6, dtype=D64) if mod.PARAM_NAMES else {}
    ref = reference(q, k, v, a if alpha == "gate" else float(alpha), kernel=mod.KERNEL, window=mod.WINDOW,
                    scale=mod.SCALE, params=params, degree=mod.DEGREE)
    leaves = (q, k, v, a) if alpha == "gate" else (q, k, v)
    ref_grads = grads(ref, leaves)
    for algorithm in ("recurrent", "chunked"):
        o, _ = mod.apply(q, k, v, gates, params=params, algorithm=algorithm, chunk_size=4)
        assert rel(o, ref) < 1e-12, algorithm
        for name, x, y in zip("qkva", grads(o, leaves), ref_grads):
            assert rel(x, y) < 1e-10, (algorithm, name)


def test_cache_continues_across_calls():
    """[0:9] then [9:23] with the returned cache (log weights carried) equals one call; also with a window."""
    for memory in ("kernel=softmax", "kernel=softmax, window=5"):
        mod = mirasc.compile_spec(spec(memory))
        q, k, v, alpha = inputs()
        full, end = mod.apply(q, k, v, {"alpha": alpha})
        for algorithm in ("recurrent", "chunked"):
            a, cache = mod.apply(q[:, :9], k[:, :9], v[:, :9], {"alpha": alpha[:, :9]}, algorithm=algorithm)
            b, last = mod.apply(q[:, 9:], k[:, 9:], v[:, 9:], {"alpha": alpha[:, 9:]}, state=cache,
                                algorithm=algorithm, chunk_size=4)
            assert rel(torch.cat([a, b], 1), full) < 1e-12, (memory, algorithm)
            assert rel(last["log_weight"], end["log_weight"]) < 1e-12
        if "window" in memory:
            assert end["log_weight"].shape[-1] == 5


def test_layer_step_equals_forward_and_gate_starts_near_one():
    mod = mirasc.compile_spec(FOX)
    torch.manual_seed(0)
    layer = mod.Layer(16, 2).double()
    assert layer.gate_proj[-1].bias.detach().eq(5.0).all()  # α = σ(5) ≈ 0.993 at initialisation
    x = torch.randn(2, 13, 16, dtype=D64)
    y = layer(x)
    y.square().sum().backward()
    assert layer.gate_proj[-1].weight.grad.abs().sum() > 0  # the forget gate is learned
    cache = layer.init_cache(2)
    steps = []
    for t in range(13):
        y_t, cache = layer.step(x[:, t], cache)
        steps.append(y_t)
    assert rel(torch.stack(steps, 1), y) < 1e-12
    assert cache["carry"]["log_weight"].shape == (2, 2, 13)


def test_packed_sequences():
    mod = mirasc.compile_spec(FOX)
    q, k, v, alpha = inputs(B=1, T=20)
    bounds = [0, 7, 7, 20]
    o, states = mod.apply(q, k, v, {"alpha": alpha}, cu_seqlens=torch.tensor(bounds))
    for (a, b), st in zip(zip(bounds, bounds[1:]), states):
        if a == b:
            continue
        ref = reference(q[:, a:b], k[:, a:b], v[:, a:b], alpha[:, a:b])
        assert rel(o[:, a:b], ref) < 1e-12
        assert st["log_weight"].shape[-1] == b - a


def test_zero_gate_forgets_everything_before():
    """α_t = 0: the pairs before t weigh exp(log tiny) ≈ 0 next to the new pair's 1, so o_t = v_t; no NaN from
    differences of infinite sums (log α is floored at the dtype's smallest normal number)."""
    mod = mirasc.compile_spec(FOX)
    q, k, v, _ = inputs(T=12)
    zero = torch.zeros(2, 12, 2, dtype=D64, requires_grad=True)
    o, _ = mod.apply(q, k, v, {"alpha": zero})
    assert rel(o, v) < 1e-12
    const = mirasc.compile_spec(spec(alpha="0"))
    assert rel(const.apply(q, k, v)[0], v) < 1e-12


def test_matches_flash_linear_attention_naive():
    """fla.ops.forgetting_attn.naive_forgetting_attn(q, k, v, g) with g = log α (its convention: the logit bias
    is Σ_{s<l≤t} g_l, window [t − w + 1, t]); it computes in float32."""
    naive = pytest.importorskip("fla.ops.forgetting_attn.naive").naive_forgetting_attn
    for memory, window in (("kernel=softmax", None), ("kernel=softmax, window=6", 6)):
        mod = mirasc.compile_spec(spec(memory))
        q, k, v, alpha = inputs(B=2, T=29, H=2, Dk=8, Dv=8, alpha_low=0.3)
        leaves = tuple(t.float().requires_grad_() for t in (q, k, v, alpha))
        qf, kf, vf, af = leaves
        theirs = naive(qf, kf, vf, torch.log(af), window_size=window)
        ours, _ = mod.apply(*leaves[:3], {"alpha": af})
        assert rel(ours, theirs) < 1e-5, memory
        for name, a, b in zip("qkva", grads(ours, leaves), grads(theirs, leaves)):
            assert rel(a, b) < 1e-4, (memory, name)


@pytest.mark.parametrize("memory,dtype,tol", [("kernel=softmax", torch.float32, 1e-5),
                                              ("kernel=softmax, window=7", torch.float32, 1e-5),
                                              ("kernel=softmax", torch.float16, 5e-3),
                                              ("kernel=softmax, window=7", torch.bfloat16, 1e-2)])
def test_triton_matches_reference(memory, dtype, tol):
    """The flash kernel (T = 37: three 16-row tiles, the last partial), outputs and the gradients of q, k, v and
    the forget gate (the kernel's row minus column sums of P∘(dP − δ), through the running sum of log α)."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(spec(memory))
    q, k, v, alpha = inputs(B=1, T=37, H=2, Dk=16, Dv=12, seed=3, alpha_low=0.5)
    leaves = tuple(t.to(dtype).requires_grad_() for t in (q, k, v)) + (alpha.float().requires_grad_(),)
    o, state = mod.apply(*leaves[:3], {"alpha": leaves[3]}, backend="triton")
    assert o.dtype == dtype
    exact = tuple(t.detach().double().requires_grad_() for t in leaves)
    ref = reference(*exact, window=mod.WINDOW)
    assert rel(o, ref) < tol
    for name, a, b in zip("qkva", grads(o, leaves), grads(ref, exact)):
        assert rel(a, b) < 4 * tol, name
    _, torch_state = mod.apply(*exact[:3], {"alpha": exact[3]}, backend="torch")
    assert rel(state["log_weight"], torch_state["log_weight"]) < 1e-5


def test_triton_zero_and_constant_gates():
    pytest.importorskip("triton")
    q, k, v, _ = (t.float() for t in inputs(B=1, T=20, Dk=16, Dv=16))
    mod = mirasc.compile_spec(FOX)
    o, _ = mod.apply(q, k, v, {"alpha": torch.zeros(1, 20, 2)}, backend="triton")
    assert torch.isfinite(o).all() and rel(o, v) < 1e-6
    const = mirasc.compile_spec(spec(alpha="0.7"))
    o, _ = const.apply(q, k, v, backend="triton")
    assert rel(o, reference(q.double(), k.double(), v.double(), 0.7)) < 1e-5



def test_autotuned_launch_keeps_the_forget_gate_gradient(monkeypatch):
    """On a GPU each flash kernel is autotuned: every configuration is timed by running it several times before
    the chosen one runs. dq adds its row sums of dS to the column sums dk/dv stored in DC_, so each timed run
    must start from the saved DC_ (restore_value), or the gate's gradient gains one row sum per run (in bf16 the
    row sums are not zero: the gate's gradient is 0.15 off here after five timed runs). The module's own
    autotuner, timed under the interpreter with a stand-in timer, against the single launch."""
    triton = pytest.importorskip("triton")
    mod = mirasc.compile_spec(FOX)
    q, k, v, alpha = inputs(B=1, T=37, H=2, Dk=16, Dv=12, seed=3, alpha_low=0.5)
    leaves = tuple(t.to(torch.bfloat16).requires_grad_() for t in (q, k, v)) + (alpha.float().requires_grad_(),)
    o, _ = mod.apply(*leaves[:3], {"alpha": leaves[3]}, backend="triton")
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.dtype)
    single = torch.autograd.grad((o * do).sum(), leaves)
    tuned = {}

    def autotuned(kernel, x, *sizes):
        if kernel not in tuned:
            tuned[kernel] = mod._autotuned(kernel, [triton.Config({"BM": 16, "BN": 16}),
                                                    triton.Config({"BM": 32, "BN": 32})])
            tuned[kernel].do_bench = lambda run, quantiles: [run() for _ in range(5)] and [1.0, 1.0, 1.0]
        return tuned[kernel], {}

    monkeypatch.setattr(mod, "_flash_kernel", autotuned)
    o2, _ = mod.apply(*leaves[:3], {"alpha": leaves[3]}, backend="triton")
    assert len(tuned) == 1 and rel(o2, o) < 1e-6  # the forward was autotuned (first, equally timed: 16 x 16)
    for name, a, b in zip("qkva", torch.autograd.grad((o2 * do).sum(), leaves), single):
        assert rel(a, b) < 1e-6, name
    assert len(tuned) == 3


@pytest.mark.parametrize("memory,retention,why", [
    ("kernel=softmax", "decay(alpha=gate(k))", "one number per head"),
    ("kernel=softmax, causal=false", "decay(alpha=gate)", "no query step passes"),
    ("kernel=softmax, score_conv=(2, 3)", "decay(alpha=gate)", "Multi-Token Attention"),
    ("kernel=softmax, hops=2", "decay(alpha=gate)", "hops=1"),
    ("kernel=softmax", "lq(q=3)", "has none"),
    ("kernel=softmax", "kl", "has none"),
])
def test_rejections(memory, retention, why):
    text = f"model f {{ memory = nonparametric({memory})\n bias = l2\n retention = {retention} }}"
    with pytest.raises(mirasc.SpecError, match="illegal combination") as info:
        mirasc.parse_text(text)
    assert why in str(info.value)


def test_wrong_gates_are_refused():
    mod = mirasc.compile_spec(FOX)
    q, k, v, alpha = inputs(T=5)
    with pytest.raises(ValueError, match="alpha"):
        mod.apply(q, k, v)
    with pytest.raises(ValueError, match=r"\[B, T, H\]"):
        mod.apply(q, k, v, {"alpha": alpha[..., None]})


def test_flash_op_with_decay_compiles_without_graph_breaks():
    """The decay input is part of the registered custom op: torch.compile(fullgraph=True) traces the forward and
    backward (gate gradient included) without a graph break."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(FOX)
    q, k, v, alpha = (t.float().requires_grad_() for t in inputs(B=1, T=20, Dk=8, Dv=8, seed=5))

    def run(q, k, v, alpha):
        return mod.apply(q, k, v, {"alpha": alpha}, backend="triton")[0]

    compiled = torch.compile(run, backend="aot_eager", fullgraph=True)
    o, ref = compiled(q, k, v, alpha), run(q, k, v, alpha)
    assert rel(o, ref) < 1e-6
    for a, b in zip(torch.autograd.grad(o.sum(), (q, k, v, alpha)), torch.autograd.grad(ref.sum(), (q, k, v, alpha))):
        assert rel(a, b) < 1e-6


def test_long_strongly_decaying_sequence_in_fp32():
    """Σ log α reaches about −250 over 300 tokens: a product of the α (or a ratio of running products) underflows
    in fp32 (0/0), the running sum of logs does not. fp32 torch and Triton against the fp64 torch path."""
    mod = mirasc.compile_spec(FOX)
    q, k, v, _ = inputs(B=1, T=300, H=1, Dk=16, Dv=16, seed=7)
    alpha = 0.05 + 0.95 * torch.rand(1, 300, 1, generator=torch.Generator().manual_seed(8), dtype=D64)
    exact, state = mod.apply(q, k, v, {"alpha": alpha})
    assert state["log_weight"][..., 0].item() < -200  # the first pair's weight: below fp32's smallest number
    f32 = (q.float(), k.float(), v.float())
    o, _ = mod.apply(*f32, {"alpha": alpha.float()}, backend="torch")
    assert torch.isfinite(o).all() and rel(o, exact) < 1e-5
    pytest.importorskip("triton")
    o, _ = mod.apply(*f32, {"alpha": alpha.float()}, backend="triton")
    assert torch.isfinite(o).all() and rel(o, exact) < 1e-5


@pytest.mark.parametrize("text", [spec(), spec("kernel=softmax, window=5"),
                                  "model a { memory = nonparametric(kernel=softmax)\n bias = l2 }"])
def test_triton_packed_sequences_in_one_launch(text, monkeypatch):
    """cu_seqlens on the Triton path: one call of the flash kernels over all sequences (their varlen grid), an
    empty sequence among them; outputs, gradients (the forget gate's included) and each sequence's cache (log
    weights included) equal the per-sequence torch calls."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(text)
    bounds = [0, 17, 17, 20, 45]
    q, k, v, alpha = inputs(B=1, T=45, H=2, Dk=16, Dv=16, seed=8)
    calls = []
    real = mod._flash_attention
    # _flash_attention(q, k, v, scale, c, bounds, sink): record the bounds each call gets
    monkeypatch.setattr(mod, "_flash_attention", lambda *a: calls.append(a[5]) or real(*a))
    leaves = tuple(t.float().requires_grad_() for t in (q, k, v, alpha))
    gates = {"alpha": leaves[3]} if mod.GATES else {}
    o, caches = mod.apply(*leaves[:3], gates, backend="triton", cu_seqlens=torch.tensor(bounds))
    assert calls == [bounds]
    exact = tuple(t.clone().requires_grad_() for t in (q, k, v, alpha))
    ref, ref_caches = mod.apply(*exact[:3], {"alpha": exact[3]} if mod.GATES else {}, backend="torch",
                                cu_seqlens=torch.tensor(bounds))
    assert rel(o, ref) < 1e-5
    n = 4 if mod.GATES else 3
    for name, a, b in zip("qkva", grads(o, leaves[:n]), grads(ref, exact[:n])):
        assert rel(a, b) < 4e-5, name
    for mine, theirs in zip(caches, ref_caches):
        assert mine["K"].shape == theirs["K"].shape and mine["start"] == theirs.get("start", 0)
        if theirs["K"].numel():
            assert rel(mine["V"], theirs["V"]) < 1e-6
            if mod.GATES:
                assert (mine["log_weight"] - theirs["log_weight"]).abs().max() < 1e-5
