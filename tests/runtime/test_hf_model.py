"""mirasc.runtime.hf_model, the Hugging Face wrapper, over a LanguageModel whose mixer is a small hand-written
recurrence (a gated running sum with a state cache): whole-sequence and cached forward agree, padding is skipped,
the loss is transformers' convention, beams reorder every tensor of the cache."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

pytest.importorskip("transformers")

from mirasc.runtime import hf_model  # noqa: E402
from mirasc.runtime.lm import LanguageModel  # noqa: E402


class RunningSum(nn.Module):
    """s_t = a·s_{t-1} + W x_t, y_t = s_t: the Layer API (forward, init_cache, step with a padding mask)."""

    def __init__(self, d, h):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.a = 0.7

    def forward(self, x):
        u, s, out = self.proj(x), torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            s = self.a * s + u[:, t]
            out.append(s)
        return self.o_proj(torch.stack(out, 1))

    def init_cache(self, batch_size):
        return {"s": torch.zeros(batch_size, self.proj.in_features)}

    def step(self, x_t, cache, mask=None):
        s = self.a * cache["s"] + self.proj(x_t)
        if mask is not None:
            s = torch.where(mask[:, None], s, cache["s"])
        return self.o_proj(s), {"s": s}


class Tiny(hf_model.MirascForCausalLM):
    def language_model(self, config):
        return LanguageModel(config.lm_config(), RunningSum)


def _model(seed=0):
    torch.manual_seed(seed)
    config = hf_model.MirascConfig(spec="(none)", vocab_size=32, d_model=16, n_layers=2, n_heads=2)
    return Tiny(config).eval()


def test_config_carries_the_lm_sizes():
    config = hf_model.MirascConfig(spec="s", d_model=48, n_layers=3, n_heads=6, layer_options={"conv": 0})
    lm = config.lm_config()
    assert (lm.d_model, lm.n_layers, lm.n_heads, lm.layer_options) == (48, 3, 6, {"conv": 0})
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (48, 3, 6)
    assert config.tie_word_embeddings


def test_the_stand_in_builder_refuses():
    with pytest.raises(NotImplementedError, match="defined by the file"):
        hf_model.build_language_model(None)


def test_cached_forward_equals_the_whole_sequence_and_counts_tokens():
    model, ids = _model(), torch.randint(0, 32, (2, 7))
    with torch.no_grad():
        whole = model(ids).logits
        first = model(ids[:, :4], use_cache=True)
        rest = model(ids[:, 4:], cache=first.cache)
    assert first.cache.get_seq_length() == 4 and rest.cache.get_seq_length() == 7
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), whole, rtol=1e-5, atol=1e-5)


def test_left_padding_is_skipped():
    model, ids = _model(1), torch.randint(0, 32, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0  # row 1: two padding tokens, then its own four
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        alone = model(ids[1:, 2:]).logits
    torch.testing.assert_close(padded[1, 2:], alone[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="attention_mask must be"):
        model(ids, attention_mask=mask[:, :3])


def test_loss_is_the_shifted_mean_or_the_sum_over_num_items():
    model, ids = _model(2), torch.randint(0, 32, (2, 5))
    labels = ids.clone()
    labels[0, 3] = -100
    out = model(ids, labels=labels)
    keep = labels[:, 1:] != -100
    nll = -F.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, labels[:, 1:].clamp(min=0)[..., None])[..., 0]
    torch.testing.assert_close(out.loss, nll[keep].mean())
    summed = model(ids, labels=labels, num_items_in_batch=20).loss
    torch.testing.assert_close(summed, nll[keep].sum() / 20)
    assert len(model(ids, labels=labels, return_dict=False)) == 2  # (loss, logits): no cache was asked for


def test_reorder_cache_selects_beams_in_every_tensor():
    model = _model()
    cache = hf_model.MirascCache([{"s": torch.arange(3.0)[:, None].expand(3, 4), "n": 5}, [torch.arange(3)]], 9)
    picked = model._reorder_cache(cache, torch.tensor([2, 2, 0]))
    assert picked.seen_tokens == 9 and picked.blocks[0]["n"] == 5
    assert picked.blocks[0]["s"][:, 0].tolist() == [2.0, 2.0, 0.0] and picked.blocks[1][0].tolist() == [2, 2, 0]


def test_generation_feeds_the_prompt_then_one_token():
    model, ids = _model(), torch.randint(0, 32, (1, 5))
    first = model.prepare_inputs_for_generation(ids)
    assert first["input_ids"].shape[1] == 5 and first["cache"] is None
    cache = model(ids, use_cache=True).cache
    nxt = model.prepare_inputs_for_generation(torch.cat([ids, ids[:, :1]], 1), cache=cache)
    assert nxt["input_ids"].tolist() == ids[:, :1].tolist() and nxt["use_cache"]
