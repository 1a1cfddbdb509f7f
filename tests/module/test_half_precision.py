"""Half precision and padding in the emitted module (docs/module-api.md, "apply" and "Precision of the Layer"):
the Layer's cache keeps the memory state in float32 for bf16/fp16 parameters (their own dtype for float32 and
float64), bf16 decoding agrees with the bf16 forward, bf16 inputs to `apply` are computed in float32 (a decay near
1 is not rounded to bf16), integer inputs are refused, and `Layer.step(..., mask=)` skips padding tokens exactly
(each row of a left-padded batch computes what its tokens alone give, also across mini-batch boundaries and
through attention caches)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mirasc

SPECS = Path(__file__).resolve().parents[2] / "specs"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _module(name, minibatch=None):
    text = (SPECS / f"{name}.miras").read_text()
    if minibatch is not None:  # a small mini-batch, so that short sequences cross its boundaries
        text = text.replace("minibatch(64", f"minibatch({minibatch}")
    return mirasc.compile_spec(text)


def _floating(tree):
    if torch.is_tensor(tree):
        return [tree] if tree.is_floating_point() else []
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    return [t for x in items for t in _floating(x)]


def _steps(layer, x, cache, mask=None):
    outs = []
    for t in range(x.shape[1]):
        y, cache = layer.step(x[:, t], cache, *(() if mask is None else (mask[:, t],)))
        outs.append(y)
    return torch.stack(outs, 1), cache


@pytest.mark.parametrize("name", ["gated_deltanet", "titans"])
def test_cache_dtype_follows_the_parameters(name):
    mod = _module(name)
    torch.manual_seed(0)
    layer = mod.Layer(16, 2)
    x = torch.randn(2, 3, 16)
    for dtype, state in ((torch.float64, torch.float64), (torch.float32, torch.float32),
                         (torch.bfloat16, torch.float32), (torch.float16, torch.float32)):
        layer = layer.to(dtype)
        cache = layer.init_cache(2)
        assert {t.dtype for t in _floating(cache["carry"])} == {state}, dtype
        y, cache = _steps(layer, x.to(dtype), cache)
        assert y.dtype == dtype and {t.dtype for t in _floating(cache["carry"])} == {state}
        assert cache["conv"].dtype == dtype  # the convolution history: the parameters' dtype
    assert {t.dtype for t in _floating(layer.init_cache(1, dtype=torch.float64)["carry"])} == {torch.float64}
    with pytest.raises(ValueError, match="float32 or float64"):
        layer.init_cache(1, dtype=torch.bfloat16)


@pytest.mark.parametrize("name", ["gated_deltanet", "titans"])
def test_bf16_step_agrees_with_bf16_forward(name):
    mod = _module(name)
    torch.manual_seed(0)
    layer = mod.Layer(32, 2).to(torch.bfloat16)
    x = torch.randn(2, 12, 32).to(torch.bfloat16)
    with torch.no_grad():
        full = layer(x)
        stepped, _ = _steps(layer, x, layer.init_cache(2))
    assert full.dtype == stepped.dtype == torch.bfloat16
    # both compute the memory in float32 from the same bf16 projections; they differ by the rounding of the
    # float32 results (chunked against recurrent) to bf16: a few units of bf16's 2^-8 relative step
    scale = full.float().abs().max().item()
    assert (stepped.float() - full.float()).abs().max().item() <= 4 * 2 ** -8 * scale


def test_bf16_apply_computes_in_float32():
    """RetNet's per-head decays γ_h = 1 − 2^(−5−h) reach 1 − 2^-12 at h = 7, which bf16 rounds to 1: computed in
    float32, the bf16 run equals the float64 op on the same (bf16) inputs up to the output's rounding."""
    mod = _module("retnet")
    g = torch.Generator().manual_seed(0)
    B, T, H, D = 1, 512, 8, 4
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, D, generator=g)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    o, state = mod.apply(q, k, v, backend="torch")
    ref, _ = mod.apply(q.double(), k.double(), v.double(), backend="torch")
    assert o.dtype == torch.bfloat16 and state["W"].dtype == torch.float32
    err = (o.double() - ref).abs() / ref.abs().amax(dim=(1, 3), keepdim=True)
    assert err.max().item() <= 2 ** -8  # half of bf16's relative step, a little more for the float32 sums


@pytest.mark.parametrize("name", ["gated_deltanet", "transformer", "linear_attention_elu", "deltaproduct"])
def test_apply_refuses_integer_inputs(name):
    mod = _module(name)
    steps = getattr(mod, "STEPS", 1)
    q = torch.randn(1, 4, 2, 8)
    k, v = (torch.randn(1, 4, 2, *((steps,) if steps > 1 else ()), 8) for _ in range(2))
    gates = {n: torch.full((1, 4, 2, *((steps,) if n == "eta" and steps > 1 else ())), 0.5) for n in mod.GATES}
    with pytest.raises(TypeError, match="q has dtype torch.int64; the memory takes floating-point tensors"):
        mod.apply(q.long(), k.long(), v.long(), gates)
    if gates:
        name = next(iter(gates))
        with pytest.raises(TypeError, match=f"gate '{name}' has dtype torch.int32"):
            mod.apply(q, k, v, {**gates, name: gates[name].int()})


@pytest.mark.parametrize("name, minibatch", [("gated_deltanet", None), ("titans", 4), ("memora", 3)])
def test_padding_is_skipped_exactly(name, minibatch):
    """Rows left-padded by 5 and 2 tokens (not multiples of the mini-batch) compute what each alone computes."""
    mod = _module(name, minibatch)
    torch.manual_seed(1)
    layer = mod.Layer(16, 2).double()
    x = torch.randn(3, 13, 16, dtype=torch.float64)
    pads = [5, 2, 0]
    mask = torch.arange(13)[None, :] >= torch.tensor(pads)[:, None]
    with torch.no_grad():
        stepped, cache = _steps(layer, x, layer.init_cache(3), mask)
        for row, pad in enumerate(pads):
            alone, alone_cache = _steps(layer, x[row:row + 1, pad:], layer.init_cache(1))
            torch.testing.assert_close(stepped[row:row + 1, pad:], alone, rtol=0, atol=1e-12)
            for a, b in zip(_floating(cache["carry"]), _floating(alone_cache["carry"])):
                torch.testing.assert_close(a[row:row + 1], b, rtol=0, atol=1e-12)
            torch.testing.assert_close(alone, layer(x[row:row + 1, pad:]), rtol=0, atol=1e-12)
    assert cache["carry"]["t"].tolist() == [13 - p for p in pads]


@pytest.mark.parametrize("name, window", [("transformer", None), ("forgetting_transformer", None), ("mta", None),
                                          ("stickbreaking", None), ("sliding_window", 4)])
def test_attention_skips_left_padding_exactly(name, window):
    """Attention caches keep the padding pairs, marked, and every read skips them: each row equals its tokens
    alone, also through a sliding window shorter than the padding; padding after a row's first token (a gap,
    which would shift the positions of the keys before it) is refused."""
    text = (SPECS / f"{name}.miras").read_text()
    if window is not None:
        text = text.replace("window=64", f"window={window}")
    mod = mirasc.compile_spec(text)
    layer = mod.Layer(16, 2).double()
    x = torch.randn(3, 13, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pads = [5, 2, 0]
    mask = torch.arange(13)[None, :] >= torch.tensor(pads)[:, None]
    with torch.no_grad():
        stepped, cache = _steps(layer, x, layer.init_cache(3), mask)
        assert torch.isfinite(stepped).all() and not stepped[0, :5].any()  # a padding row reads nothing
        for row, pad in enumerate(pads):
            torch.testing.assert_close(stepped[row:row + 1, pad:], layer(x[row:row + 1, pad:]), rtol=0, atol=1e-12)
        if window is not None:
            assert cache["carry"]["K"].shape[2] == window
        with pytest.raises(ValueError, match="only before a row's first token"):
            layer.step(x[:, 0], cache, mask=torch.tensor([True, False, True]))
        q = torch.randn(3, 1, 2, 8, dtype=torch.float64)
        gates = {n: torch.full((3, 1, 2), 0.9, dtype=torch.float64) for n in mod.GATES}
        with pytest.raises(ValueError, match="holds padding tokens"):  # apply would read the padding pairs
            mod.apply(q, q, q, gates, state=cache["carry"], backend="torch")
