"""Segment products, the retention's and momentum's products over a chunk (a runtime piece: its body is copied into
every emitted module by mirasc.codegen.torch_backend; docs/semantics.md, "Chunked algorithms")."""

import torch


def _segment_products(a):
    """P[..., t, s] = a[s+1]·…·a[t] for s <= t (1 on the diagonal) and 0 for s > t. a: [..., n].
    Computed by a cumulative product (no division, no log), so a may be 0."""
    n = a.shape[-1]
    strictly_lower = torch.ones(n, n, dtype=torch.bool, device=a.device).tril(-1)
    factors = torch.where(strictly_lower, a.unsqueeze(-1), torch.ones_like(a).unsqueeze(-1))
    return torch.cumprod(factors, dim=-2).tril()
