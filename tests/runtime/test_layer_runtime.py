"""mirasc.runtime.layer, the Layer every emitted module carries, over the example memory of
mirasc.runtime.memory_hooks (a delta rule W ← W − η (W k − v) kᵀ with its own token loop): decoding token by token
equals the whole sequence, padding rows keep their cache, bad options are refused with their reasons."""

import pytest
import torch

from mirasc.language import layer_options
from mirasc.runtime import layer, memory_spec

D64 = torch.float64


def _layer(**options):
    torch.manual_seed(0)
    return layer.Layer(16, 2, **options).to(D64)


def test_the_stand_in_schema_is_the_language_s():
    assert memory_spec.LAYER_SCHEMA == layer_options.schema()
    assert set(memory_spec.LAYER_DEFAULTS) == set(layer_options.schema())


@pytest.mark.parametrize("options", [{}, {"conv": 0, "out_gate": False}, {"v_norm": "rms", "head_dim": 4}])
def test_step_by_step_equals_forward(options):
    lay, x = _layer(**options), torch.randn(3, 9, 16, dtype=D64)
    want = lay(x)
    cache, outs = lay.init_cache(3), []
    for t in range(x.shape[1]):
        y, cache = lay.step(x[:, t], cache)
        outs.append(y)
    torch.testing.assert_close(torch.stack(outs, 1), want, rtol=1e-10, atol=1e-12)
    assert cache["carry"]["t"] == 9 and set(cache) == {"carry", "conv"}


def test_a_padding_row_keeps_its_cache():
    lay, x = _layer(), torch.randn(2, 5, 16, dtype=D64)
    cache = lay.init_cache(2)
    for t in range(3):
        _, cache = lay.step(x[:, t], cache)
    _, skipped = lay.step(x[:, 3], cache, mask=torch.tensor([True, False]))
    _, stepped = lay.step(x[:, 3], cache)
    torch.testing.assert_close(skipped["carry"]["W"][0][0], stepped["carry"]["W"][0][0])
    torch.testing.assert_close(skipped["carry"]["W"][0][1], cache["carry"]["W"][0][1])
    torch.testing.assert_close(skipped["conv"][1], cache["conv"][1])
    assert skipped["carry"]["t"].tolist() == [4, 3]  # one token count per row once a row skipped one
    with pytest.raises(ValueError, match="one entry per row"):
        lay.step(x[:, 3], cache, mask=torch.tensor([True]))


def test_bad_options_and_inputs_are_refused_with_reasons():
    with pytest.raises(TypeError, match="conv"):
        layer.Layer(16, 2, convv=4)
    with pytest.raises(ValueError, match="algorithm must be"):
        layer.Layer(16, 2, algorithm="fast")
    with pytest.raises(ValueError, match="conv"):
        layer.Layer(16, 2, conv=99)
    lay = _layer()
    with pytest.raises(ValueError, match="float32 or float64"):
        lay.init_cache(1, dtype=torch.float16)
    with pytest.raises(TypeError, match="init_cache"):
        lay.step(torch.randn(1, 16, dtype=D64), {})
    with pytest.raises(TypeError, match="x is torch.float32"):
        lay(torch.randn(1, 4, 16))
