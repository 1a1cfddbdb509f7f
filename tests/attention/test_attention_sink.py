"""Attention sinks: `memory = nonparametric(kernel=softmax, sink=true)` puts a learned logit b_h per head in every
read's denominator with no value, o_t = Σ_s e^{ℓ_ts} v_s / (e^{b_h} + Σ_s e^{ℓ_ts}) (GPT-OSS's sinks; FLA's
`sink_bias`). Checked against flash-linear-attention's `naive_parallel_attn(..., sink_bias=b)` in float64 (plain,
windowed, with FoX's decay g = log α), outputs and the gradients of q, k, v, α and b, on the torch recurrent and
chunked algorithms and on the flash Triton kernels under TRITON_INTERPRET=1 (packed sequences too); decoding
(Layer.step) against forward; the rejections."""

from __future__ import annotations

import pytest
import torch
from reference import rel

import mirasc

D64 = torch.float64
CASES = [("kernel=softmax, sink=true", "none", None), ("kernel=softmax, sink=true, window=5", "none", 5),
         ("kernel=softmax, sink=true", "decay(alpha=gate)", None)]


def spec(memory, retention="none"):
    return f"model s {{ memory = nonparametric({memory})\n bias = l2\n retention = {retention} }}"


def inputs(T=23, H=2, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, H, D, generator=g, dtype=D64) for _ in range(3))
    alpha = 0.5 + 0.5 * torch.rand(1, T, H, generator=g, dtype=D64)
    sink = torch.randn(H, generator=g, dtype=D64)
    return q, k, v, alpha, sink


def grads(out, leaves, seed=1):
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=D64).to(out.dtype)
    return torch.autograd.grad(out, leaves, cot, allow_unused=True)


@pytest.mark.parametrize("memory,retention,window", CASES)
def test_torch_matches_flash_linear_attention(memory, retention, window):
    naive = pytest.importorskip("fla.ops.attn.naive").naive_parallel_attn
    mod = mirasc.compile_spec(spec(memory, retention))
    assert mod.PARAM_NAMES == ("sink",) and mod.SINK
    leaves = tuple(t.clone().requires_grad_() for t in inputs())
    q, k, v, alpha, sink = leaves
    decay = bool(mod.GATES)
    theirs, _ = naive(q, k, v, window_size=window, g=alpha.log() if decay else None, sink_bias=sink)
    want = grads(theirs, leaves)
    # FLA's reference takes the cumulative sum of g in float32: 7e-8 off float64 with a decay
    tol = 1e-6 if decay else 1e-12
    for algorithm in ("recurrent", "chunked"):
        ours, _ = mod.apply(q, k, v, {"alpha": alpha} if decay else {}, params={"sink": sink}, algorithm=algorithm,
                            chunk_size=4, backend="torch")
        assert rel(ours, theirs) < tol, algorithm
        for name, a, b in zip(("q", "k", "v", "alpha", "sink"), grads(ours, leaves), want):
            if b is not None and (name != "alpha" or decay):
                assert rel(a, b) < 100 * tol, (algorithm, name)


@pytest.mark.parametrize("memory,retention,window", CASES + [("kernel=softmax, sink=true", "none", "bf16")])
def test_triton_matches_torch(memory, retention, window):
    """The flash kernels start the online softmax from the sink (m = b, l = 1); their logsumexp includes it, so the
    backward kernels are unchanged and ∂L/∂b = −Σ_t e^{b − lse_t} δ_t is summed in torch."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(spec(memory, retention))
    dtype, tol = (torch.bfloat16, 1e-2) if window == "bf16" else (torch.float32, 1e-5)
    q, k, v, alpha, sink = inputs(T=37, D=16, seed=2)
    decay = bool(mod.GATES)
    leaves = (*(t.to(dtype).requires_grad_() for t in (q, k, v)), alpha.float().requires_grad_(),
              sink.float().requires_grad_())
    o, _ = mod.apply(*leaves[:3], {"alpha": leaves[3]} if decay else {}, params={"sink": leaves[4]},
                     backend="triton")
    exact = tuple(t.detach().double().requires_grad_() for t in leaves)
    ref, _ = mod.apply(*exact[:3], {"alpha": exact[3]} if decay else {}, params={"sink": exact[4]}, backend="torch")
    assert rel(o, ref) < tol
    for name, a, b in zip(("q", "k", "v", "alpha", "sink"), grads(o, leaves), grads(ref, exact)):
        if b is not None and (name != "alpha" or decay):
            assert rel(a, b) < 4 * tol, name


def test_triton_packed_sequences_with_a_sink():
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(spec("kernel=softmax, sink=true"))
    q, k, v, _, sink = inputs(T=45, D=16, seed=3)
    bounds = torch.tensor([0, 17, 17, 45])
    leaves = tuple(t.float().requires_grad_() for t in (q, k, v, sink))
    o, _ = mod.apply(*leaves[:3], params={"sink": leaves[3]}, backend="triton", cu_seqlens=bounds)
    exact = tuple(t.clone().requires_grad_() for t in (q, k, v, sink))
    ref, _ = mod.apply(*exact[:3], params={"sink": exact[3]}, backend="torch", cu_seqlens=bounds)
    assert rel(o, ref) < 1e-5
    for a, b in zip(grads(o, leaves), grads(ref, exact)):
        assert rel(a, b) < 4e-5


def test_layer_learns_the_sink_and_decodes():
    mod = mirasc.compile_spec(spec("kernel=softmax, sink=true"))
    torch.manual_seed(0)
    layer = mod.Layer(16, 2).double()
    x = torch.randn(2, 11, 16, dtype=D64)
    y = layer(x)
    y.square().sum().backward()
    sinks = [p for n, p in layer.named_parameters() if n.endswith("sink")]
    assert len(sinks) == 1 and sinks[0].grad.abs().sum() > 0
    cache, steps = layer.init_cache(2), []
    for t in range(11):
        y_t, cache = layer.step(x[:, t], cache)
        steps.append(y_t)
    assert rel(torch.stack(steps, 1), y) < 1e-12


def test_canonical_text_and_rejections():
    assert "sink" not in mirasc.parse_text(spec("kernel=softmax")).canonical()
    assert "sink=true" in mirasc.parse_text(spec("kernel=softmax, sink=true")).canonical()
    for memory in ("kernel=additive, sink=true", "kernel=stickbreaking, sink=true",
                   "kernel=softmax, hops=2, sink=true"):
        with pytest.raises(mirasc.SpecError, match="illegal combination") as info:
            mirasc.parse_text(spec(memory))
        assert "attention sink" in str(info.value)
