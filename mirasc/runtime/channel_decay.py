"""Channel-wise decays inside a chunk, in torch (a runtime piece: its body is copied into the emitted modules whose
chunked algorithms have a coefficient over channels, by mirasc.codegen.torch_backend): their segment products and
cumulative log decays per channel, and the scores and mixes they weight (docs/semantics.md: channel-wise gates)."""

import math

import torch

from .segments import _segment_products


# ----------------------------------------------------------------------------------------------
# Channel-wise decays in a chunk (docs/semantics.md: channel-wise gates). A coefficient over key (value) channels
# scales the columns (rows) of the weight, so the segment products become one [n, n] matrix per channel:
# D[t, s, j] = a_{s+1, j}…a_{t, j}. They are materialised per chunk (n²·D numbers, computed by cumulative products:
# exact, no division, a gate may be 0); a per-head coefficient is the width-1 case.
# ----------------------------------------------------------------------------------------------
def _chunk_decay(c, name, c0, c1, width=1):
    """Γ [B, H, n, d] (Γ_t = a_1…a_t) and D [B, H, n, n, d] of coefficient `name` in tokens c0:c1
    (d = the channel width; a per-head coefficient is broadcast to `width`)."""
    a = c[name][:, :, c0:c1]
    a = a if a.dim() == 4 else a.unsqueeze(-1).expand(*a.shape, width)
    return torch.cumprod(a, dim=2), _segment_products(a.transpose(-1, -2)).permute(0, 1, 3, 4, 2)


def _log_decay(c, name, c0, c1):
    """G [B, H, n, D]: the cumulative log decay of a channel-wise coefficient in tokens c0:c1 (α is clamped
    at the smallest normal float, so a gate of exactly 0 decays by e^-87 instead of to 0)."""
    a = c[name][:, :, c0:c1]
    return torch.cumsum(torch.log(a.clamp_min(torch.finfo(a.dtype).tiny)), dim=2)


def _decay_scores(a, ga, b, gb, strict, sub=8):
    """P[t, s] = Σ_j a_tj b_sj exp(ga_tj − gb_sj) for s <= t (s < t if strict), 0 elsewhere; ga, gb are
    cumulative log decays with ga_t <= gb_s whenever s precedes t. As flash-linear-attention computes the
    intra-chunk scores of GLA/KDA: each block of `sub` rows is factored through the log decay at its first
    row (every exponent <= 0, so no overflow however fast the decay), and inside the diagonal block the
    factor is materialised ([sub, sub, D]; 8 rows measured faster than 16 on CPU, fwd+bwd of GLA and KDA)."""
    n = a.shape[-2]
    rows = []
    for i0 in range(0, n, sub):
        i1 = min(i0 + sub, n)
        ref = ga[..., i0:i0 + 1, :]
        a_i = a[..., i0:i1, :]
        parts = []
        if i0 > 0:
            earlier = b[..., :i0, :] * torch.exp(ref - gb[..., :i0, :])
            parts.append((a_i * torch.exp(ga[..., i0:i1, :] - ref)) @ earlier.transpose(-1, -2))
        diff = ga[..., i0:i1, None, :] - gb[..., None, i0:i1, :]
        keep = torch.ones(i1 - i0, i1 - i0, dtype=torch.bool, device=a.device).tril(-1 if strict else 0)[..., None]
        factor = torch.exp(torch.where(keep, diff, torch.full_like(diff, -math.inf)))
        parts.append((a_i.unsqueeze(-2) * b[..., None, i0:i1, :] * factor).sum(-1))
        parts.append(a.new_zeros(*a.shape[:-2], i1 - i0, n - i1))
        rows.append(torch.cat(parts, dim=-1))
    return torch.cat(rows, dim=-2)


def _scores(a, b, d):
    """P[t, s] = Σ_j a_tj b_sj d[t, s, j] (d: [.., n, n, D] or [.., n, n, 1])."""
    if d.shape[-1] == 1:
        return (a @ b.transpose(-1, -2)) * d[..., 0]
    return torch.einsum("...tj,...sj,...tsj->...ts", a, b, d)


def _mix(p, d, u):
    """o[t, i] = Σ_s p[t, s] d[t, s, i] u[s, i] (d: [.., n, n, D] or [.., n, n, 1])."""
    if d.shape[-1] == 1:
        return (p * d[..., 0]) @ u
    return torch.einsum("...ts,...tsi,...si->...ti", p, d, u)
