"""The Hugging Face wrapper of a language model (a runtime piece: `mirasc export --hf` appends every class
below to the exported modeling file, after the emitted module and mirasc.runtime.lm; mirasc.lab.hf builds the same
classes in-process): MirascConfig (config.json) and MirascForCausalLM (AutoModelForCausalLM).

`generate()` decodes with the Layer's O(1) state cache (MirascCache), one token per forward after the prompt, which is
fed token by token through the same cache (as LanguageModel.generate does). Padding (attention_mask 0) is skipped by
every block's cache (Layer.step's mask). `build_language_model(config)` is the carrying file's own (the exported file's
builds its Layer in every block); mirasc.lab.hf's subclass builds through mirasc.lab.models instead.
"""

from dataclasses import dataclass as _dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from .lm import LMConfig


def build_language_model(config):
    """The LanguageModel of `config` (a MirascConfig): a stand-in here; every file that carries these classes
    defines its own."""
    raise NotImplementedError("build_language_model is defined by the file that carries the wrapper")


class MirascConfig(PretrainedConfig):
    """The spec text and the LanguageModel's sizes (mirasc.runtime.lm.LMConfig's fields)."""

    model_type = "mirasc"
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads"}

    def __init__(self, spec="", vocab_size=256, d_model=256, n_layers=4, n_heads=4, mlp_hidden=0, hybrid_every=0,
                 window=256, layer_options=None, **kwargs):
        self.spec = spec
        self.vocab_size, self.d_model, self.n_layers, self.n_heads = vocab_size, d_model, n_layers, n_heads
        self.mlp_hidden, self.hybrid_every, self.window = mlp_hidden, hybrid_every, window
        self.layer_options = dict(layer_options or {})
        kwargs.setdefault("tie_word_embeddings", True)  # the LM reads its logits off the embedding matrix
        super().__init__(**kwargs)

    def lm_config(self):
        return LMConfig(vocab_size=self.vocab_size, d_model=self.d_model, n_layers=self.n_layers,
                        n_heads=self.n_heads, mlp_hidden=self.mlp_hidden, hybrid_every=self.hybrid_every,
                        window=self.window, layer_options=dict(self.layer_options))


class MirascCache:
    """The decoding cache of every block (the memory's carry and conv history) and how many tokens it
    has read. Not a transformers `Cache`: it holds recurrent state, not keys and values."""

    is_compileable = False

    def __init__(self, blocks, seen_tokens=0):
        self.blocks, self.seen_tokens = blocks, seen_tokens

    def get_seq_length(self, layer_idx=0):
        return self.seen_tokens


@_dataclass
class MirascCausalLMOutput(ModelOutput):
    """Logits (and loss); the cache under both names transformers has used for it (`past_key_values`
    before 5.x, `cache` from 5.x on)."""

    loss: Any | None = None
    logits: Any | None = None
    past_key_values: Any | None = None
    cache: Any | None = None


class MirascForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = MirascConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = False

    def __init__(self, config):
        super().__init__(config)
        # transformers (5.x) builds models on the meta device before loading the weights; the Layer makes
        # its initial state with real tensor arithmetic, so it is built on the CPU (or the given device)
        device = torch.empty(0).device
        with torch.device("cpu" if device.type == "meta" else device):
            self.model = self.language_model(config)
        self.post_init()

    def language_model(self, config):
        """The LanguageModel of `config`: the carrying file's build_language_model."""
        return build_language_model(config)

    def _init_weights(self, module):
        pass  # LanguageModel initialises its own parameters; loading overwrites them all

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # the state cache is made by forward(), not a DynamicCache

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return None  # logits are computed with the (tied) embedding matrix

    def forward(self, input_ids=None, attention_mask=None, labels=None, past_key_values=None, cache=None,
                use_cache=None, return_dict=None, **kwargs):
        """input_ids [B, T] -> logits [B, T, V]. Without a cache and use_cache not True: the whole sequence
        at once (the chunked/parallel algorithm). With a cache or use_cache=True: token by token through
        the state cache, which is returned. attention_mask [B, L >= T] (its last T columns are these
        tokens'): a token marked 0 is padding, which every block's cache skips, so each row computes what
        its own tokens alone give (the logits at padding positions mean nothing); with padding before
        a token (left padding) the sequence runs token by token through a fresh cache. labels: next-token
        loss on logits[:, :-1] vs labels[:, 1:] (-100 ignored), the transformers convention; the mean over
        labelled tokens, or their sum divided by num_items_in_batch when given (the Trainer's gradient
        accumulation)."""
        T = input_ids.shape[1]
        mask = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != input_ids.shape[0] \
                    or attention_mask.shape[1] < T:
                raise ValueError(f"attention_mask must be [B, L] with L >= T, for input_ids of shape "
                                 f"{list(input_ids.shape)}; got {list(attention_mask.shape)}")
            mask = attention_mask[:, attention_mask.shape[1] - T:].to(torch.bool)
            if bool(mask.all()):
                mask = None
        state = cache if cache is not None else past_key_values
        # padding before a token must be skipped in the state; padding only after the tokens (right padding)
        # changes no earlier logit, so the whole-sequence forward stays exact for the real tokens
        left_padded = mask is not None and bool((mask[:, 1:] & ~mask[:, :-1]).any())
        if state is None and (use_cache or left_padded):
            state = MirascCache(self.model.init_cache(input_ids.shape[0]))
        if state is None:
            logits = self.model(input_ids)
        else:
            steps, blocks = [], state.blocks
            for t in range(T):
                step_mask = None if mask is None or bool(mask[:, t].all()) else mask[:, t]
                step_logits, blocks = self.model.step(input_ids[:, t], blocks, step_mask)
                steps.append(step_logits)
            logits = torch.stack(steps, dim=1)
            state = MirascCache(blocks, state.seen_tokens + input_ids.shape[1])
        loss = None
        if labels is not None:
            # transformers' Trainer passes num_items_in_batch (the labelled tokens of the whole accumulated
            # batch) so that gradient accumulation averages over tokens, not over micro-batches
            num_items = kwargs.get("num_items_in_batch")
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100,
                                   reduction="mean" if num_items is None else "sum")
            if num_items is not None:
                loss = loss / num_items
        if return_dict is False:
            return tuple(x for x in (loss, logits, state) if x is not None)
        return MirascCausalLMOutput(loss=loss, logits=logits, past_key_values=state, cache=state)

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, cache=None, attention_mask=None,
                                      **kwargs):
        """The whole prompt on the first call (read through a fresh cache), then only the newest token."""
        state = cache if cache is not None else past_key_values
        if state is not None:
            input_ids = input_ids[:, state.seen_tokens:]
        return {"input_ids": input_ids, "cache": state, "use_cache": True, "attention_mask": attention_mask}

    def _reorder_cache(self, past_key_values, beam_idx):
        """Beam search: select the beams' rows of every tensor in the cache."""
        def pick(x):
            if isinstance(x, torch.Tensor):
                return x.index_select(0, beam_idx.to(x.device))
            if isinstance(x, dict):
                return {k: pick(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return type(x)(pick(v) for v in x)
            return x
        return MirascCache(pick(past_key_values.blocks), past_key_values.seen_tokens)
