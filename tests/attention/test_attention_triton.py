"""The generated flash-style Triton kernel for softmax memories, under TRITON_INTERPRET=1 on the CPU:
outputs and gradients against the torch path (float64-checked elsewhere), fp32 and fp16, causal,
sliding window (T > window, T not a multiple of the tile), cross-attention with Tq != Tk, Dk != Dv;
bf16 (16-bit dot operands) against a float64 token-by-token softmax."""

from __future__ import annotations

import pytest
import torch

import mirasc

triton = pytest.importorskip("triton")

CASES = {
    "causal": "model a { memory = nonparametric(kernel=softmax)\n bias = l2 }",
    "window": "model w { memory = nonparametric(kernel=softmax, window=8)\n bias = l2 }",
    "cross": "model x { memory = nonparametric(kernel=softmax, causal=false, scale=0.3)\n bias = l2 }",
}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 5e-3)])
def test_flash_matches_torch(case, dtype, tol):
    mod = mirasc.compile_spec(CASES[case])
    g = torch.Generator().manual_seed(0)
    B, T, H, Dk, Dv = 1, 37, 2, 16, 12
    Tk = 21 if case == "cross" else T
    q = torch.randn(B, T, H, Dk, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, Tk, H, Dk, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, Tk, H, Dv, generator=g).to(dtype).requires_grad_()
    o, _ = mod.apply(q, k, v, backend="triton")
    assert o.dtype == dtype and o.shape == (B, T, H, Dv)
    ref, _ = mod.apply(q.double(), k.double(), v.double(), backend="torch")
    assert rel(o, ref) < tol
    do = torch.randn(o.shape, generator=g).to(dtype)
    grads = torch.autograd.grad((o * do).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * do.double()).sum(), (q, k, v))
    for name, a, b in zip("qkv", grads, ref_grads):
        assert rel(a, b) < 4 * tol, name


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_flash_backward_reads_do_in_another_layout(dtype, tol):
    """dO whose layout differs from O's (heads before time underneath, here) is read where it is, as is δ's kernel
    (no copy into O's layout): the gradients equal the torch path's."""
    mod = mirasc.compile_spec(CASES["causal"])
    g = torch.Generator().manual_seed(3)
    B, T, H, D = 2, 29, 3, 16
    q, k, v = (torch.randn(B, T, H, D, generator=g).to(dtype).requires_grad_() for _ in range(3))
    w = torch.randn(B, H, T, D, generator=g).to(dtype)  # the loss reads O heads-first: dO is [B, H, T, D] underneath
    grads = torch.autograd.grad((mod.apply(q, k, v, backend="triton")[0].transpose(1, 2).contiguous() * w).sum(),
                                (q, k, v))
    refs = torch.autograd.grad((mod.apply(q, k, v, backend="torch")[0].double().transpose(1, 2) * w.double()).sum(),
                               (q, k, v))
    for name, a, b in zip("qkv", grads, refs):
        assert rel(a, b) < tol, name


@pytest.mark.parametrize("case", ["causal", "window", "cross"])
@pytest.mark.parametrize("tiles", [(16, 32), (32, 16)])
def test_flash_tiles_of_different_sizes(monkeypatch, case, tiles):
    """A GPU may launch any configuration of the autotuning space, which pairs query tiles BM with key tiles
    BN of another size (the causal and window loop bounds then start inside a tile): outputs and gradients
    are the same for each pairing."""
    mod = mirasc.compile_spec(CASES[case])
    monkeypatch.setattr(mod, "_flash_kernel", lambda kernel, x, *sizes: (kernel, {"BM": tiles[0], "BN": tiles[1]}))
    g = torch.Generator().manual_seed(1)
    T, Tk = 45, (29 if case == "cross" else 45)
    q = torch.randn(1, T, 2, 16, generator=g, requires_grad=True)
    k = torch.randn(1, Tk, 2, 16, generator=g, requires_grad=True)
    v = torch.randn(1, Tk, 2, 12, generator=g, requires_grad=True)
    o, _ = mod.apply(q, k, v, backend="triton")
    ref, _ = mod.apply(q.double(), k.double(), v.double(), backend="torch")
    assert rel(o, ref) < 1e-5
    do = torch.randn(o.shape, generator=g)
    grads = torch.autograd.grad((o * do).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * do.double()).sum(), (q, k, v))
    for name, a, b in zip("qkv", grads, ref_grads):
        assert rel(a, b) < 4e-5, name


def test_no_triton_kernel_is_said_plainly():
    mod = mirasc.compile_spec("model b { memory = nonparametric(kernel=additive)\n bias = l2 }")
    x = torch.randn(1, 4, 1, 8)
    with pytest.raises(RuntimeError, match="no Triton kernel"):
        mod.apply(x, x, x, backend="triton")


def test_flash_op_compiles_without_graph_breaks():
    """The kernel is a registered custom op with a fake implementation: torch.compile(fullgraph=True)
    traces apply(backend="triton"), forward and backward, without a graph break."""
    mod = mirasc.compile_spec(CASES["window"])
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 20, 2, 8, generator=g, requires_grad=True) for _ in range(3))

    def run(q, k, v):
        return mod.apply(q, k, v, backend="triton")[0]

    compiled = torch.compile(run, backend="aot_eager", fullgraph=True)
    o = compiled(q, k, v)
    ref = run(q, k, v)
    assert rel(o, ref) < 1e-6
    grads = torch.autograd.grad(o.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        assert rel(a, b) < 1e-6


def softmax_reference(q, k, v, scale, causal=True, window=0):
    """Token by token in float64: o_t = Σ_s exp(scale q_t·k_s) v_s / Σ_s exp(scale q_t·k_s) over the keys s the
    mask shows (s <= t when causal, t − s < window when window > 0). q [B, T, H, Dk], k, v [B, T', H, D]."""
    out = []
    for t in range(q.shape[1]):
        s = torch.arange(k.shape[1])
        seen = (s <= t) & ((t - s < window) if window else True) if causal else torch.ones_like(s, dtype=torch.bool)
        logits = scale * torch.einsum("bhd,bshd->bhs", q[:, t], k[:, seen])
        out.append(torch.einsum("bhs,bshd->bhd", torch.softmax(logits, dim=-1), v[:, seen]))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_flash_bf16_operands_match_the_float64_reference(case):
    """bf16 inputs take the kernels' 16-bit operand branch: q, k, v, dO enter the dots as loaded and P, dS are
    rounded to bf16 before theirs, accumulation fp32. Against the float64 softmax of the same (bf16-rounded)
    inputs, outputs and the gradients of q, k, v (T = 37: three 16-row tiles, the last partial). The error is
    bf16's: P and dS rounded (the interpreter truncates fp32 -> bf16; a GPU rounds to nearest), the output and
    the gradients stored in bf16 (measured: output 4.0e-3 to 4.7e-3, gradients 3.2e-3 to 4.9e-3, where rounding
    the exact values to bf16 alone gives 1.6e-3). Under the interpreter the bf16 products are widened to fp32
    (exact) because its tl.dot multiplies bf16 bit patterns (without that: errors of 1e9); _dot_options says so,
    and that fp32 inputs get exact fp32 products."""
    mod = mirasc.compile_spec(CASES[case])  # (the dots' options: tests/runtime/test_attention_host.py)
    g = torch.Generator().manual_seed(5)
    B, T, H, Dk, Dv = 1, 37, 2, 16, 12
    Tk = 21 if case == "cross" else T
    leaves = [torch.randn(B, n, H, d, generator=g).to(torch.bfloat16).requires_grad_()
              for n, d in ((T, Dk), (Tk, Dk), (Tk, Dv))]
    o, _ = mod.apply(*leaves, backend="triton")
    assert o.dtype == torch.bfloat16
    exact = [t.detach().double().requires_grad_() for t in leaves]
    scale = Dk ** -0.5 if mod.SCALE is None else mod.SCALE
    ref = softmax_reference(*exact, scale, causal=mod.CAUSAL, window=mod.WINDOW)
    assert rel(o, ref) < 1e-2
    do = torch.randn(o.shape, generator=g).to(torch.bfloat16)
    grads = torch.autograd.grad((o * do).sum(), leaves)
    ref_grads = torch.autograd.grad((ref * do.double()).sum(), exact)
    for name, a, b in zip("qkv", grads, ref_grads):
        assert a.dtype == torch.bfloat16 and rel(a, b) < 1e-2, name
