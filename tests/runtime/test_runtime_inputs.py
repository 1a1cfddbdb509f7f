"""mirasc.runtime.inputs and mirasc.runtime.packing, the checks at `apply`'s door and the packed-sequence runner that
every emitted module carries: each bad input a plain error naming it; offsets checked, sequences run one by one from
their own state rows, and the padded batch equal to them, on a toy memory (a running sum whose state is the sum so
far) so that a wrong cut, a lost state row or padding that leaks into a row shows as a number."""

from __future__ import annotations

import re

import pytest
import torch

from mirasc.runtime.inputs import (
    _check_dtypes,
    _check_triton_device,
    _check_types,
    _checked_gates,
    _extra_inputs,
    _offsets,
)
from mirasc.runtime.packing import _packed, _packed_padded


def _running_sum(q, k, v, gates, state, extras, valid=None):
    """o_t = s_0 + Σ_{u≤t} v_u·g_u (+ κ_u), final state s_T; padding (valid False) adds nothing."""
    x = v * gates["eta"][..., None]
    if extras is not None:
        x = x + extras["kappa"]
    if valid is not None:
        x = x * valid[..., None, None]
    s0 = x.new_zeros(x.shape[0], 1, *x.shape[2:]) if state is None else state["S"][:, None]
    o = s0 + x.cumsum(1)
    return o, {"S": o[:, -1] if o.shape[1] else s0[:, 0]}


def _inputs(T, extras=False):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, 2, 3, generator=g) for _ in range(3))
    gates = {"eta": torch.rand(1, T, 2, generator=g)}
    return q, k, v, gates, ({"kappa": torch.randn(1, T, 2, 3, generator=g)} if extras else None)


def test_types_and_dtypes_are_checked_naming_the_argument():
    t = torch.zeros(1, 2, 1, 3)
    _check_types(t, t, t, {"eta": t}, {"kappa": t})
    _check_dtypes(t, t, t.double(), {"eta": t.half()}, {"kappa": t.bfloat16()})
    for args, words in [((t.tolist(), t, t, None), "q must be a tensor, not list"),
                        ((t, t, t, [t]), "gates must be a dict of name -> tensor, not list"),
                        ((t, t, t, {"eta": 0.5}), r"gates\['eta'\] must be a tensor of per-token values, not float"),
                        ((t, t, t, None, {"kappa": 1}), r"extras\['kappa'\] must be a tensor")]:
        with pytest.raises(TypeError, match=words):
            _check_types(*args)
    with pytest.raises(TypeError, match="apply: v has dtype torch.int64"):
        _check_dtypes(t, t, t.long())
    with pytest.raises(TypeError, match="apply: extra input 'kappa' has dtype torch.int32"):
        _check_dtypes(t, t, t, {"eta": t}, {"kappa": t.int()})


def test_triton_backend_needs_triton_and_somewhere_to_run():
    class Knobs:  # a Triton whose interpreter is off
        class runtime:
            interpret = False

    class Triton:
        knobs = Knobs

    x = torch.zeros(2)
    with pytest.raises(RuntimeError, match="needs the triton package"):
        _check_triton_device(x, None)
    with pytest.raises(RuntimeError, match="runs its kernels on CUDA tensors and these are on cpu"):
        _check_triton_device(x, Triton)
    Knobs.runtime.interpret = True
    _check_triton_device(x, Triton)  # the CPU interpreter runs them


def test_gates_checked_by_name_and_shape_then_laid_out_per_head():
    B, T, H, Dk, Dv = 2, 5, 3, 4, 6
    q = torch.zeros(B, T, H, Dk, dtype=torch.bfloat16)
    names, channels = ("eta", "alpha"), {"alpha": "v"}
    eta, alpha = torch.rand(B, T, H, dtype=torch.bfloat16), torch.rand(B, T, H, Dv)
    out = _checked_gates({"eta": eta, "alpha": alpha}, q, Dv, names, channels)
    assert out["eta"].dtype == torch.float32 and torch.equal(out["eta"], eta.float().transpose(1, 2))
    assert torch.equal(out["alpha"], alpha.transpose(1, 2))  # [B, H, T, Dv]
    missing = re.escape("missing gate 'alpha'; this op takes eta [B, T, H], alpha [B, T, H, Dv]")
    for gates, words in [({"eta": eta}, missing),
                         ({"eta": eta, "alpha": alpha, "beta": eta}, r"unknown gate\(s\) \['beta'\]"),
                         ({"eta": eta, "alpha": alpha[..., :Dk]}, r"gate 'alpha' has shape \(2, 5, 3, 4\), "
                                                                  r"expected \[B, T, H, Dv\] = \[2, 5, 3, 6\]")]:
        with pytest.raises(ValueError, match=words):
            _checked_gates(gates, q, Dv, names, channels)
    with pytest.raises(ValueError, match="unknown gate.*this op takes no gates"):
        _checked_gates({"eta": eta}, q, Dv, (), {})


def test_extra_inputs_checked_by_name_and_shape():
    q = torch.zeros(2, 5, 3, 4)
    kappa = torch.randn(2, 5, 3, 4, dtype=torch.float64)
    out = _extra_inputs({"kappa": kappa}, q, ("kappa",))
    assert out["kappa"].dtype == torch.float32 and out["kappa"].shape == (2, 3, 5, 4)
    for extras, words in [({}, "missing extra input 'kappa'"), ({"kappa": kappa, "mu": kappa}, "unknown extra"),
                          ({"kappa": kappa[:, :4]}, "extra input 'kappa' has shape")]:
        with pytest.raises(ValueError, match=words):
            _extra_inputs(extras, q, ("kappa",))
    assert _extra_inputs(None, q, ()) == {}


def test_offsets_are_checked():
    q = torch.zeros(1, 7, 2, 3)
    assert _offsets(q, torch.tensor([0, 3, 3, 7])) == [0, 3, 3, 7]
    with pytest.raises(ValueError, match="batch must be 1"):
        _offsets(torch.zeros(2, 7, 2, 3), [0, 7])
    for bad in ([1, 7], [0, 6], [0, 5, 3, 7]):
        with pytest.raises(ValueError, match="must rise from 0 to T = 7"):
            _offsets(q, bad)


@pytest.mark.parametrize("extras", [False, True])
def test_one_by_one_starts_each_sequence_from_its_state_row(extras):
    bounds = [0, 4, 4, 9, 11]
    q, k, v, gates, x = _inputs(11, extras)
    state = {"S": torch.randn(4, 2, 3)}
    o, final = _packed(_running_sum, q, k, v, gates, state, bounds, x)
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        xi = None if x is None else {"kappa": x["kappa"][:, a:b]}
        oi, fi = _running_sum(q[:, a:b], k[:, a:b], v[:, a:b], {"eta": gates["eta"][:, a:b]},
                              {"S": state["S"][i:i + 1]}, xi)
        assert torch.equal(o[:, a:b], oi) and torch.equal(final["S"][i:i + 1], fi["S"])


@pytest.mark.parametrize("extras", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_padded_batch_equals_one_by_one(extras, with_state):
    bounds = [0, 4, 4, 9, 11]
    q, k, v, gates, x = _inputs(11, extras)
    state = {"S": torch.randn(4, 2, 3)} if with_state else None
    seen = {}

    def rows(q, k, v, g, s, valid, x):
        seen["shape"], seen["valid"] = tuple(q.shape), valid
        assert (q[~valid] == 0).all() and (v[~valid] == 0).all()  # padding is zeroed
        return _running_sum(q, k, v, g, s, x, valid)

    def initial(n):
        return {"S": torch.full((n, 2, 3), 0.5)}

    o, final = _packed_padded(rows, _running_sum, initial, q, k, v, gates, state, bounds, x)
    want_state = state if with_state else initial(4)
    want_o, want_final = _packed(_running_sum, q, k, v, gates, want_state, bounds, x)
    assert seen["shape"] == (4, 5, 2, 3) and seen["valid"].sum(1).tolist() == [4, 0, 5, 2]
    assert torch.allclose(o, want_o) and torch.allclose(final["S"], want_final["S"])


def test_all_empty_sequences_go_one_by_one():
    q, k, v, gates, _ = _inputs(0)

    def rows(*args):
        raise AssertionError("no padded batch of length 0")

    o, final = _packed_padded(rows, _running_sum, lambda n: None, q, k, v, gates, None, [0, 0, 0])
    assert o.shape == (1, 0, 2, 3) and final["S"].shape == (2, 2, 3) and not final["S"].any()
