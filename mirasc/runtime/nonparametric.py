"""The nonparametric memories' torch path (a runtime piece: its body is copied into every emitted module of a
nonparametric memory, by mirasc.codegen.attention_backend): the scores and reads (softmax, poly, stick-breaking, the
Multi-Token Attention convolutions, hops), the recurrent reference, the chunked algorithm over query blocks, the
cache's trim. It reads the spec's choices as module constants (mirasc.runtime.attention_spec; docs/semantics.md,
nonparametric memories)."""

import math

import torch
import torch.nn.functional as F

from .attention_spec import (
    ATTEND_CURRENT,
    CAUSAL,
    DECAY,
    DEGREE,
    HEAD_MIX,
    HEAD_NORM,
    HOPS,
    KERNEL,
    REMAINDER,
    SCALE,
    SCORE_CONV,
    SINK,
    TEMPORAL,
    TYING,
    WINDOW,
    _per_head_coefficients,
)
from .layer_state import _keep_rows


def _scale(d_k):
    return 1.0 / math.sqrt(d_k) if SCALE is None else SCALE


def _coefficients(gates, like, d_v=None):
    """The op's per-token inputs as the algorithms read them: {"log_alpha": [B, H, T]} with a decay (log of the
    forget gate, of the per-head constant or of the constant α; like: q [B, T, H, Dk]), else {}."""
    if DECAY is None:
        return {}
    if DECAY == "gate":
        alpha = gates["alpha"].to(like.dtype)
        # α = 0 forgets everything before: log 0 is floored at the dtype's smallest normal number (−87 in fp32,
        # −708 in fp64), a weight exp(−87) that vanishes next to the pair's own weight 1, and never −inf − −inf.
        log_alpha = torch.log(alpha.clamp_min(torch.finfo(like.dtype).tiny))
        return {"log_alpha": log_alpha.transpose(1, 2)}
    floor = math.log(torch.finfo(like.dtype).tiny)
    if DECAY == "per_head":  # a constant forget gate per head (e.g. ALiBi's slopes), the same floor at α = 0
        alpha = _per_head_coefficients(like.shape[2], like.device)["alpha"]
        log_alpha = torch.log(alpha.clamp_min(math.exp(floor))).to(like.dtype)
        return {"log_alpha": log_alpha[None, :, None].expand(like.shape[0], -1, like.shape[1]).contiguous()}
    log_alpha = math.log(DECAY) if DECAY > 0 else floor
    return {"log_alpha": like.new_full((like.shape[0], like.shape[2], like.shape[1]), log_alpha)}


def init_params(heads, d_k, d_v, *, dtype=torch.float32, device="cpu", generator=None, layer_idx=0):
    """Learned parameters of the memory read (empty for plain softmax attention). Deterministic with
    generator=None (seed 0)."""
    if generator is None:
        generator = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, std):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * std).to(dtype=dtype, device=device)

    p = {}
    if KERNEL == "additive":  # κ(q, k) = exp(wᵀ tanh(W_q q + W_k k)), hidden size d_k
        p["additive_q"] = randn(heads, d_k, d_k, std=1 / math.sqrt(d_k))
        p["additive_k"] = randn(heads, d_k, d_k, std=1 / math.sqrt(d_k))
        p["additive_w"] = randn(heads, d_k, std=1 / math.sqrt(d_k))
    if HOPS > 1 and TYING == "adjacent":  # values of hop h+1 = values of hop h @ P_h (keys of h+1 = values of h)
        p["hop_value"] = (torch.eye(d_v, dtype=torch.float64).expand(HOPS - 1, heads, d_v, d_v)
                          + randn(HOPS - 1, heads, d_v, d_v, std=0.1 / math.sqrt(d_v)).double()).to(dtype=dtype,
                                                                                                device=device)
    if HOPS > 1 and TYING == "layerwise":  # u^{h+1} = u^h H + o^h
        p["hop_query"] = torch.eye(d_k, dtype=dtype, device=device).expand(heads, d_k, d_k).clone()
    if TEMPORAL:
        p["temporal_key"] = randn(heads, TEMPORAL, d_k, std=0.02)
        p["temporal_value"] = randn(heads, TEMPORAL, d_v, std=0.02)
    if SCORE_CONV is not None:  # identity init: a 1 at the newest query row and the centre key column
        cq, ck = SCORE_CONV
        theta = torch.zeros(heads, cq, ck, dtype=dtype, device=device)
        theta[:, cq - 1, ck // 2] = 1.0
        p["score_conv"] = theta
    if HEAD_MIX > 1:
        p["head_mix"] = torch.eye(HEAD_MIX, dtype=dtype, device=device).expand(heads // HEAD_MIX, HEAD_MIX,
                                                                              HEAD_MIX).clone()
    if SINK:  # e^{b_h} in every denominator; zero: the sink weighs as much as a key with logit 0 at first
        p["sink"] = torch.zeros(heads, dtype=dtype, device=device)
    if KERNEL == "stickbreaking" and REMAINDER == "bias":  # o_t += (1 − Σ_s w_ts) b_h; zero: no remainder at first
        p["remainder_bias"] = torch.zeros(heads, d_v, dtype=dtype, device=device)
    if HEAD_NORM:  # DIFF-Transformer depth scaling: (1 - λ_init), λ_init = 0.8 - 0.6 exp(-0.3 layer_idx)
        lam = 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        p["head_norm"] = torch.full((heads, d_v), 1.0 - lam, dtype=dtype, device=device)
    return p


PARAM_NAMES = tuple(init_params(2, 2, 2))  # the learned parameters this read takes


def init_state(batch, heads, d_k, d_v, *, dtype=torch.float32, device="cpu", generator=None):
    """A nonparametric memory stores pairs: the state is the key/value cache (and, for the MTA query
    convolution, the last queries): K [B, H, 0, Dk], V [B, H, 0, Dv], Q [B, H, 0, Dk]; with a decay also
    log_weight [B, H, 0], the log of each stored pair's decayed weight after the last stored token. Nothing random."""
    state = {"K": torch.zeros(batch, heads, 0, d_k, dtype=dtype, device=device),
             "V": torch.zeros(batch, heads, 0, d_v, dtype=dtype, device=device),
             "Q": torch.zeros(batch, heads, 0, d_k, dtype=dtype, device=device)}
    if DECAY is not None:
        state["log_weight"] = torch.zeros(batch, heads, 0, dtype=dtype, device=device)
    return state


# ----------------------------------------------------------------------------------------------
# The read, for a block of queries at absolute positions q_pos against keys at k_pos.
# ----------------------------------------------------------------------------------------------
def _visible(q_pos, k_pos):
    """Mask [Tq, Tk]: which keys each query may read."""
    if not CAUSAL:
        return torch.ones(len(q_pos), len(k_pos), dtype=torch.bool, device=q_pos.device)
    diff = q_pos[:, None] - k_pos[None, :]
    mask = diff > 0 if KERNEL == "stickbreaking" and not ATTEND_CURRENT else diff >= 0
    if WINDOW:
        mask = mask & (diff < WINDOW)
    return mask


def _distance(q_pos, k_pos, n_keys):
    """Temporal index of each pair: t - s for causal memories, the reverse memory index otherwise."""
    if CAUSAL:
        return (q_pos[:, None] - k_pos[None, :]).clamp_min(0)
    return (n_keys - 1 - k_pos)[None, :].expand(len(q_pos), -1)


def _logits(u, k, params, q_pos, k_pos):
    """log κ(u_t, k_s) for exp kernels, [B, H, Tq, Tk] (unmasked)."""
    if KERNEL == "additive":
        a = u @ params["additive_q"].unsqueeze(0).transpose(-1, -2)  # [B, H, Tq, d]
        b = k @ params["additive_k"].unsqueeze(0).transpose(-1, -2)  # [B, H, Tk, d]
        hidden = torch.tanh(a.unsqueeze(-2) + b.unsqueeze(-3))  # [B, H, Tq, Tk, d]: the query block bounds it
        s = hidden @ params["additive_w"][None, :, None, :, None]
        s = s.squeeze(-1)
    else:
        s = (u @ k.transpose(-1, -2)) * _scale(u.shape[-1])
    if TEMPORAL:
        d = _distance(q_pos, k_pos, k.shape[2])
        qt = u @ params["temporal_key"].unsqueeze(0).transpose(-1, -2)  # [B, H, Tq, TEMPORAL]
        inside = d < TEMPORAL
        bias = torch.gather(qt, -1, d.clamp_max(TEMPORAL - 1).expand(*qt.shape[:2], -1, -1))
        s = s + _scale(u.shape[-1]) * torch.where(inside, bias, torch.zeros_like(bias))
    return s


def _mta(logits, mask, q_pos, k_pos, params):
    """Multi-Token Attention on the pre-softmax scores: the key-query convolution over (past queries,
    neighbouring keys) with Mask_0 before and Mask_-inf after, then head mixing within groups."""
    if SCORE_CONV is not None:
        cq, ck = SCORE_CONV
        x = logits.masked_fill(~mask, 0.0)  # Mask_0
        B, H, Tq, Tk = x.shape
        x = F.pad(x, (ck // 2, ck // 2, cq - 1, 0))  # past queries only; keys centred
        w = params["score_conv"].to(x.dtype).unsqueeze(1)  # [H, 1, cq, ck]
        logits = F.conv2d(x, w, groups=H)
    if HEAD_MIX > 1:
        B, H, Tq, Tk = logits.shape
        groups = logits.view(B, H // HEAD_MIX, HEAD_MIX, Tq, Tk)
        logits = torch.einsum("bgjqk,gij->bgiqk", groups, params["head_mix"].to(logits.dtype)).reshape(B, H, Tq, Tk)
    return logits


def _read(u, k, v, params, q_pos, k_pos, decay=None, rows=None):
    """One Nadaraya–Watson read: o_t = Σ_s a_ts κ_ts v_s / Σ_s a_ts κ_ts over visible keys; a_ts = 1 without a
    decay, else exp(cq_t − ck_s) from `decay` = (cq [B, H, Tq], ck [B, H, Tk]) (see _decay_offsets). rows: None, or
    [B, 1, Tq, Tk] booleans, False at the pairs of a row's padding tokens (read as if they were not there)."""
    mask = _visible(q_pos, k_pos)
    if rows is not None:
        mask = mask & rows
    log_a = None if decay is None else decay[0][..., :, None] - decay[1][..., None, :]  # log a_ts <= 0 where visible
    if KERNEL == "stickbreaking":
        return _stickbreaking_read(u, k, v, params, q_pos, k_pos, mask)
    if KERNEL == "poly":  # κ = Σ_{i<=p} x^i / i!, x = scale·u·k: positive for even p
        x = (u @ k.transpose(-1, -2)) * _scale(u.shape[-1])
        kappa = sum(x ** i / math.factorial(i) for i in range(DEGREE + 1))
        if log_a is not None:
            kappa = kappa * torch.exp(log_a.masked_fill(~mask, 0.0))
        weights = kappa.masked_fill(~mask, 0.0)
        weights = weights / weights.sum(-1, keepdim=True)
    else:
        logits = _logits(u, k, params, q_pos, k_pos)
        if log_a is not None:  # exp kernels: the decay is a bias on the logits
            logits = logits + log_a
        if SCORE_CONV is not None or HEAD_MIX > 1:
            logits = _mta(logits, mask, q_pos, k_pos, params)
        logits = logits.masked_fill(~mask, float("-inf"))
        if SINK:  # one more logit b_h per row, whose value is 0: its weight is dropped after the softmax
            sink = params["sink"].to(logits.dtype)[None, :, None, None].expand(*logits.shape[:3], 1)
            weights = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        else:
            weights = torch.softmax(logits, dim=-1)  # max-shifted: no overflow
    out = weights @ v
    if TEMPORAL:
        d = _distance(q_pos, k_pos, k.shape[2])
        inside = (d < TEMPORAL) & mask
        # Σ_s p_ts T_C[d_ts]: scatter the weights onto their temporal index, then one matmul.
        per_index = torch.zeros(*weights.shape[:-1], TEMPORAL, dtype=weights.dtype, device=weights.device)
        per_index = per_index.scatter_add(-1, d.clamp_max(TEMPORAL - 1).expand(*weights.shape[:2], -1, -1),
                                          weights * inside)
        out = out + per_index @ params["temporal_value"].unsqueeze(0).to(out.dtype)
    return out


def _stickbreaking_read(u, k, v, params, q_pos, k_pos, mask):
    """o_t = Σ_s w_ts v_s, w_ts = β_ts Π_{s<l<t, l visible} (1 − β_tl), β_ts = σ(scale·u_t·k_s), in log space:
    log w_ts = log σ(z_ts) + Σ_{l>s} log σ(−z_tl) over visible l (a reversed cumulative sum along the keys, never
    a product of many factors). The remainder 1 − Σ_s w_ts = Π_l (1 − β_tl) goes where REMAINDER says."""
    z = (u @ k.transpose(-1, -2)) * _scale(u.shape[-1])
    log_keep = F.logsigmoid(-z).masked_fill(~mask, 0.0)  # log(1 − β); an invisible key leaves the stick whole
    after = log_keep.flip(-1).cumsum(-1).flip(-1) - log_keep  # Σ over the visible keys after s
    weights = torch.exp(F.logsigmoid(z) + after).masked_fill(~mask, 0.0)
    out = weights @ v
    if REMAINDER != "none":
        left = torch.exp(log_keep.sum(-1, keepdim=True))  # [B, H, Tq, 1]
        if REMAINDER == "current":  # the query's own value: v at the key position equal to q_pos
            out = out + left * v[:, :, q_pos - k_pos[0]]
        else:
            out = out + left * params["remainder_bias"][None, :, None, :].to(out.dtype)
    return out


def _hops(u, k, v, params, q_pos, k_pos, decay=None, rows=None):
    """HOPS reads with MemN2N query refinement; returns u^{K+1} - u^1 (for one hop: the read o^1)."""
    u0 = u
    keys, values = k, v
    out = None
    for h in range(HOPS):
        o = _read(u, keys, values, params, q_pos, k_pos, decay, rows)
        if HOPS == 1:
            out = o
            break
        if TYING == "adjacent":
            u = u + o
            if h < HOPS - 1:  # A^{h+1} = C^h: this hop's values are the next hop's keys
                keys, values = values, values @ params["hop_value"][h].unsqueeze(0).to(v.dtype)
        else:
            u = u @ params["hop_query"].unsqueeze(0).to(u.dtype) + o
    if out is None:
        out = u - u0
    if HEAD_NORM:
        out = F.rms_norm(out, (out.shape[-1],), eps=1e-6) * params["head_norm"][None, :, None, :].to(out.dtype)
    return out


# ----------------------------------------------------------------------------------------------
# Algorithms.
# ----------------------------------------------------------------------------------------------
def _start(state):
    return dict(state)


def _token_step(carry, q_t, k_t, v_t, c_t, params=None, keep=None):
    """Decoding: append (k_t, v_t) (and q_t for the query convolution) to the cache, read with q_t. With a
    decay, every stored pair's log weight first gains log α_t (c_t["log_alpha"] [B, H, 1]); the new pair's is 0.
    keep: None, or [B] booleans, False where this token is padding before the row's first token (left padding):
    the cache then records which stored keys and queries are real ("valid", "qvalid" [B, N]) and every read skips
    the others, so each row reads what its own tokens alone give (its padding rows' outputs mean nothing)."""
    if not CAUSAL:
        raise RuntimeError("causal=false reads a whole given memory; there is no token-by-token decoding")
    K = torch.cat([carry["K"], k_t], dim=2)
    V = torch.cat([carry["V"], v_t], dim=2)
    Q = torch.cat([carry["Q"], q_t], dim=2)  # the last cq-1 queries and this one
    start = carry.get("start", 0)  # absolute position of K[:, :, 0]
    k_pos = torch.arange(start, start + K.shape[2], device=K.device)
    cache, decay, rows = {"K": K, "V": V, "Q": Q, "start": start}, None, None
    if keep is not None or "valid" in carry:
        B = K.shape[0]
        real = torch.ones(B, 1, dtype=torch.bool, device=K.device) if keep is None else keep[:, None]
        seen = carry.get("seen", torch.zeros(B, dtype=torch.bool, device=K.device))
        if bool((seen & ~real[:, 0]).any()):
            raise ValueError("this memory (attention) skips padding only before a row's first token (left padding): "
                             "its keys keep their positions, so a gap after a token would shift them")
        past = carry.get("valid", torch.ones(B, K.shape[2] - 1, dtype=torch.bool, device=K.device))
        past_q = carry.get("qvalid", torch.ones(B, Q.shape[2] - 1, dtype=torch.bool, device=K.device))
        cache.update(valid=torch.cat([past, real], 1), qvalid=torch.cat([past_q, real], 1), seen=seen | real[:, 0])
        rows = cache["valid"][:, None, None, :] & cache["qvalid"][:, None, :, None]
    if DECAY is not None:
        log_alpha = c_t["log_alpha"].to(carry["log_weight"].dtype)
        if keep is not None:  # a padding token decays nothing
            log_alpha = torch.where(keep[:, None, None], log_alpha, torch.zeros_like(log_alpha))
        log_weight = carry["log_weight"] + log_alpha
        cache["log_weight"] = torch.cat([log_weight, log_weight.new_zeros(*log_weight.shape[:2], 1)], dim=2)
        decay = (cache["log_weight"].new_zeros(*log_weight.shape[:2], 1), -cache["log_weight"])
    o = _hops(Q, K, V, params or {}, k_pos[K.shape[2] - Q.shape[2]:], k_pos, decay, rows)
    return _trim(cache), o[:, :, -1:]


def _recurrent(q, k, v, state, params, c):
    """The reference: one query at a time against the growing cache."""
    carry = _start(state)
    outs = []
    for t in range(q.shape[2]):
        carry, o_t = _token_step(carry, q[:, :, t, None], k[:, :, t, None], v[:, :, t, None], _token_coefs(c, t, t + 1),
                                 params)
        outs.append(o_t)
    return torch.cat(outs, dim=2), carry


class _RecomputedBlock(torch.autograd.Function):
    """Activation checkpointing of one query block: the forward keeps only its inputs, the backward
    recomputes the block's scores and differentiates them (training memory O(block x T))."""

    @staticmethod
    def forward(ctx, q_pos, k_pos, names, u, k, v, *values):
        ctx.save_for_backward(q_pos, k_pos, u, k, v, *values)
        ctx.names = names
        params, decay = _split(names, values)
        with torch.no_grad():
            return _hops(u, k, v, params, q_pos, k_pos, decay)

    @staticmethod
    def backward(ctx, grad_out):
        q_pos, k_pos, *tensors = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in tensors]
            u, k, v, *values = leaves
            params, decay = _split(ctx.names, values)
            out = _hops(u, k, v, params, q_pos, k_pos, decay)
            grads = torch.autograd.grad(out, leaves, grad_out, allow_unused=True)
        return (None, None, None, *grads)


def _split(names, values):
    """(params, decay) from the flat inputs of _RecomputedBlock: the decay offsets travel as two extra values."""
    params = dict(zip(names, values))
    decay = (params.pop(" decay_q"), params.pop(" decay_k")) if " decay_q" in params else None
    return params, decay


def _block(u, k, v, params, q_pos, k_pos, decay=None):
    """One query block; recomputed in the backward pass when gradients are needed."""
    extra = {} if decay is None else {" decay_q": decay[0], " decay_k": decay[1]}  # not a parameter name
    if torch.is_grad_enabled() and any(t.requires_grad for t in (u, k, v, *params.values(), *extra.values())):
        names = tuple(params) + tuple(extra)
        values = [params[n] for n in params] + list(extra.values())
        return _RecomputedBlock.apply(q_pos, k_pos, names, u, k, v, *values)
    return _hops(u, k, v, params, q_pos, k_pos, decay)


def _decay_offsets(log_alpha, log_weight):
    """The decay of a run of T new tokens after a cache, as offsets with log a_ts = cq_t − ck_s.

    cumulative [B, H, T] = Σ_{l≤t} log α_l over the new tokens (a running sum of logs, not a product);
    query t: cq_t = cumulative_t; new key s: ck_s = cumulative_s (so log a_ts = Σ_{s<l≤t} log α_l);
    cached key s: ck_s = −log_weight_s (its log weight after the cache's last token, then the new tokens' sum).
    Also returns the log weight of every pair after the last new token: the next cache's log_weight."""
    cumulative = torch.cumsum(log_alpha, dim=-1)
    ck = torch.cat([-log_weight, cumulative], dim=-1)
    return (cumulative, ck), cumulative[..., -1:] - ck


def _chunked(q, k, v, state, params, block, c):
    """All queries, a block of `block` queries at a time (bounds the score memory to block x T)."""
    P, start, nq0 = state["K"].shape[2], state.get("start", 0), state["Q"].shape[2]
    K = torch.cat([state["K"], k], dim=2)
    V = torch.cat([state["V"], v], dim=2)
    Qall = torch.cat([state["Q"], q], dim=2)  # the cached last cq-1 queries, then the new ones
    k_pos = torch.arange(start, start + K.shape[2], device=q.device)
    q_pos = k_pos[P - nq0:]  # positions of the rows of Qall
    history = SCORE_CONV[0] - 1 if SCORE_CONV is not None else 0
    cache = {"K": K, "V": V, "Q": Qall, "start": start}
    decay = None
    if DECAY is not None:  # no MTA with a decay (the spec rejects it): Qall holds only the new queries
        decay, cache["log_weight"] = _decay_offsets(c["log_alpha"], state["log_weight"])
    outs = []
    for b0 in range(0, q.shape[2], block):
        b1 = min(b0 + block, q.shape[2])
        lo, hi = max(0, nq0 + b0 - history), nq0 + b1  # the query convolution reads `history` earlier rows
        d = None if decay is None else (decay[0][..., lo:hi], decay[1])
        o = _block(Qall[:, :, lo:hi], K, V, params, q_pos[lo:hi], k_pos, d)
        outs.append(o[:, :, o.shape[2] - (b1 - b0):])
    return torch.cat(outs, dim=2), _trim(cache)


def _trim(cache):
    """Keep what the next read needs: the last cq-1 queries; with a plain sliding window, its last pairs."""
    history = SCORE_CONV[0] - 1 if SCORE_CONV is not None else 0
    cut = cache["Q"].shape[2] - min(history, cache["Q"].shape[2])
    cache["Q"] = cache["Q"][:, :, cut:]
    if "qvalid" in cache:
        cache["qvalid"] = cache["qvalid"][:, cut:]
    if WINDOW and SCORE_CONV is None:  # O(WINDOW) memory; positions stay absolute through "start"
        drop = max(0, cache["K"].shape[2] - WINDOW)
        cache.update(K=cache["K"][:, :, drop:], V=cache["V"][:, :, drop:], start=cache["start"] + drop)
        if "log_weight" in cache:
            cache["log_weight"] = cache["log_weight"][:, :, drop:]
        if "valid" in cache:
            cache["valid"] = cache["valid"][:, drop:]
    return cache


def _cross(q, k, v, params, block):
    """Non-causal: every query reads the whole memory (k, v), in query blocks."""
    k_pos = torch.arange(k.shape[2], device=q.device)
    outs = []
    for b0 in range(0, q.shape[2], block):
        b1 = min(b0 + block, q.shape[2])
        outs.append(_block(q[:, :, b0:b1], k, v, params, torch.arange(b0, b1, device=q.device), k_pos))
    return torch.cat(outs, dim=2)


def _token_coefs(c, t0, t1):
    return {n: val[..., t0:t1] for n, val in c.items()}


def _layer_read(cache, q, k, v, gates, extras, read_params, keep=None):
    """Layer.step's read (mirasc.runtime.layer): the cache keeps every pair; padding tokens (keep False) are marked in
    it, and every read skips them."""
    c = _coefficients(gates, q, v.shape[-1])
    params = {n: p.to(q.dtype) for n, p in read_params.items()}
    c_t = {n: val.to(q.dtype) for n, val in _token_coefs(c, 0, 1).items()}
    carry, o_t = _token_step(cache["carry"], q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), c_t, params,
                             keep=keep)
    return {"carry": carry}, o_t


def _layer_keep(keep, y, new, cache):
    """Layer.step's output and cache with padding rows (keep [B] False): the attention cache marked the padding
    itself; the convolution history of a padding row stays as it was, and a padding row reads nothing."""
    new["conv"] = _keep_rows(keep, new["conv"], cache["conv"])
    return torch.where(keep[:, None], y, torch.zeros_like(y)), new
