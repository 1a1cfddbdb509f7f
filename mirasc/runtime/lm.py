"""The language model around a memory layer: Llama-style blocks (RMSNorm, mixer, SwiGLU MLP), tied byte-level
embeddings, hybrid stacks, and cached generation.

A runtime piece: it imports only torch and the standard library, and its body (everything after the imports) is
appended to an emitted module by `mirasc compile --model` and `mirasc export --hf` (mirasc.codegen.standalone), so
that a model file stays standalone. Mixers are given as factories `make(d_model, num_heads) -> nn.Module` with
`forward(x)`, `init_cache(batch)`, `step(x_t, cache)` (and `step(x_t, cache, mask=...)` for batches with padding) —
exactly the emitted `Layer` API.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LMConfig:
    vocab_size: int = 256          # bytes
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden: int = 0            # SwiGLU hidden size (0: 8/3·d_model rounded up to a multiple of 32)
    hybrid_every: int = 0          # every N-th block uses the hybrid mixer (sliding-window attention); 0: never
    window: int = 256              # window of the hybrid attention mixer
    layer_options: dict = field(default_factory=dict)  # passed to the memory Layer (conv, gate_rank, ...)

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or 32 * math.ceil(8 * self.d_model / 3 / 32)

    def is_hybrid(self, i: int) -> bool:
        return self.hybrid_every > 0 and (i + 1) % self.hybrid_every == 0


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LMConfig, mixer: nn.Module):
        super().__init__()
        self.mixer_norm, self.mlp_norm = RMSNorm(cfg.d_model), RMSNorm(cfg.d_model)
        self.mixer, self.mlp = mixer, SwiGLU(cfg.d_model, cfg.hidden)

    def forward(self, x):
        x = x + self.mixer(self.mixer_norm(x))
        return x + self.mlp(self.mlp_norm(x))

    def step(self, x_t, cache, mask=None):
        if mask is None:
            h, cache = self.mixer.step(self.mixer_norm(x_t), cache)
        else:
            h, cache = self.mixer.step(self.mixer_norm(x_t), cache, mask=mask)
        x_t = x_t + h
        return x_t + self.mlp(self.mlp_norm(x_t)), cache


class LanguageModel(nn.Module):
    """Byte-level causal LM. `make_mixer(d_model, n_heads)` builds the memory layer of each block and
    `make_hybrid(d_model, n_heads)` the sliding-window attention layer of hybrid blocks."""

    def __init__(self, cfg: LMConfig, make_mixer, make_hybrid=None):
        super().__init__()
        if cfg.hybrid_every and make_hybrid is None:
            raise ValueError("hybrid_every > 0 needs a hybrid mixer factory")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(
            Block(cfg, (make_hybrid if cfg.is_hybrid(i) else make_mixer)(cfg.d_model, cfg.n_heads))
            for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.apply(self._init)
        nn.init.normal_(self.embed.weight, std=0.02)
        for name, p in self.named_parameters():  # GPT-2 style: scale residual projections by depth
            if name.endswith(("o_proj.weight", "down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear) and m.bias is None:
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets=None):
        """idx [B, T] (bytes) -> logits [B, T, V]; with targets, also the mean cross-entropy (nats/byte)."""
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.norm(x), self.embed.weight)  # tied embeddings
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def init_cache(self, batch_size):
        return [block.mixer.init_cache(batch_size) for block in self.blocks]

    def step(self, token, cache, mask=None):
        """token [B] -> logits [B, V] for the next byte; O(1) memory per token for parametric mixers. mask:
        optional [B] booleans, False where the token is padding, which every mixer's cache skips (the mixer's
        `step(..., mask=)`), so each row reads only its own tokens."""
        x = self.embed(token)
        new_cache = []
        for block, c in zip(self.blocks, cache):
            x, c = block.step(x, c, mask)
            new_cache.append(c)
        return F.linear(self.norm(x), self.embed.weight), new_cache

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """Prefill the prompt token by token through the state cache, then sample. idx: [B, T0] -> [B, T0+n]."""
        cache = self.init_cache(idx.shape[0])
        logits = None
        for t in range(idx.shape[1]):
            logits, cache = self.step(idx[:, t], cache)
        out = [idx]
        for _ in range(max_new_tokens):
            if temperature == 0:
                nxt = logits.argmax(-1)
            else:
                scaled = logits / temperature
                if top_k is not None:
                    kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
                    scaled = scaled.masked_fill(scaled < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(scaled.float(), -1), 1, generator=generator)[:, 0]
            out.append(nxt[:, None])
            logits, cache = self.step(nxt, cache)
        return torch.cat(out, dim=1)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
