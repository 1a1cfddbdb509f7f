"""The runtime's custom-op registration (mirasc/runtime/custom_ops.py), whose body the emitted modules carry: an op
and its backward op, their fake implementations and the autograd formula; each module's ops its own."""

from __future__ import annotations

import torch

from mirasc.runtime.custom_ops import _register_op


def _scale_op(op_id):
    """y = 3 x ∘ s, with the backward (dx = 3 s ∘ dy, ds = 3 x ∘ dy) as an op of its own."""
    calls = []

    def op(x: torch.Tensor, s: torch.Tensor) -> list[torch.Tensor]:
        calls.append("fwd")
        return [3 * x * s]

    def op_fake(x, s):
        return [torch.empty_like(x)]

    def backward_op(x: torch.Tensor, s: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
        calls.append("bwd")
        return [3 * s * dy, 3 * x * dy]

    def backward_fake(x, s, dy):
        return [torch.empty_like(x), torch.empty_like(s)]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, backward_op, grads_out):
        x, s = ctx.saved_tensors
        return tuple(backward_op(x, s, grads_out[0]))

    return _register_op("scale", op_id, op, op_fake, backward_op, backward_fake, setup_context, backward), calls


def test_forward_backward_and_each_module_its_own_op():
    op, calls = _scale_op("test_a1")
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    s = torch.randn(5, dtype=torch.float64, requires_grad=True)
    (y,) = op(x, s)
    assert torch.equal(y, 3 * x.detach() * s.detach())
    dx, ds = torch.autograd.grad(y.sum(), (x, s))
    assert torch.equal(dx, 3 * s.detach()) and torch.equal(ds, 3 * x.detach())
    assert calls == ["fwd", "bwd"]
    assert callable(torch.ops.mirasc.scale_test_a1) and callable(torch.ops.mirasc.scale_bwd_test_a1)
    # the same spec loaded as a second module: its own op under the next free name, running its own functions (a
    # module's settings never reach another's op)
    again, again_calls = _scale_op("test_a1")
    assert again is not op and again._qualname == "mirasc::scale_test_a1_2"
    assert callable(torch.ops.mirasc.scale_test_a1_2) and callable(torch.ops.mirasc.scale_bwd_test_a1_2)
    assert torch.equal(again(x, s)[0], y) and again_calls == ["fwd"] and calls == ["fwd", "bwd"]
    assert _scale_op("test_a1")[0]._qualname == "mirasc::scale_test_a1_3"


def test_compiles_without_graph_breaks():
    op, _ = _scale_op("test_b1")
    x = torch.randn(4, requires_grad=True)
    s = torch.randn(4, requires_grad=True)
    compiled = torch.compile(lambda x, s: op(x, s)[0].sum(), backend="aot_eager", fullgraph=True)
    dx, ds = torch.autograd.grad(compiled(x, s), (x, s))
    assert torch.allclose(dx, 3 * s.detach()) and torch.allclose(ds, 3 * x.detach())


def test_none_without_custom_ops(monkeypatch):
    monkeypatch.delattr(torch.library, "custom_op")
    assert _scale_op("test_c1")[0] is None


def test_an_op_returning_a_tuple_gets_one_cotangent_per_output():
    def op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return 2 * x, x * x

    def op_fake(x):
        return torch.empty_like(x), torch.empty_like(x)

    def backward_op(x: torch.Tensor, da: torch.Tensor, db: torch.Tensor) -> torch.Tensor:
        return 2 * da + 2 * x * db

    def backward_fake(x, da, db):
        return torch.empty_like(x)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def backward(ctx, backward_op, da, db):
        return backward_op(ctx.saved_tensors[0], da, db)

    pair = _register_op("pair", "test_d1", op, op_fake, backward_op, backward_fake, setup_context, backward)
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    a, b = pair(x)
    (dx,) = torch.autograd.grad(a.sum() + 5 * b.sum(), x)
    assert torch.allclose(dx, 2 + 10 * x.detach())
