"""mirasc.runtime.lm_factory, what `mirasc compile --model` appends: a LanguageModel over the module's Layer (here the
runtime Layer over the example memory), its options passed through, hybrid stacks refused."""

import pytest
import torch

from mirasc.runtime.layer import Layer
from mirasc.runtime.lm import LMConfig
from mirasc.runtime.lm_factory import make_model


def test_every_block_mixes_with_the_layer_and_decoding_matches():
    torch.manual_seed(0)
    model = make_model(LMConfig(d_model=32, n_layers=2, n_heads=2, layer_options={"conv": 0})).double()
    assert all(isinstance(b.mixer, Layer) and b.mixer.conv_size == 0 for b in model.blocks)
    idx = torch.randint(0, 256, (2, 6))
    logits = model(idx)
    cache, steps = model.init_cache(2), []
    for t in range(6):
        out, cache = model.step(idx[:, t], cache)
        steps.append(out)
    torch.testing.assert_close(torch.stack(steps, 1), logits)


def test_hybrid_stacks_are_refused_with_the_way():
    with pytest.raises(ValueError, match="mirasc.lab.models.build"):
        make_model(LMConfig(hybrid_every=2))

