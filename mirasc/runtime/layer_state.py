"""The Layer's state handling: the learned form of the initial state (positive weights through their logits), the
dtype the memory computes in, a decoding cache's dtype, and a cache kept where a row's token is padding (a runtime
piece: its body is copied into every emitted module by mirasc.codegen; docs/module-api.md, "Layer" and "Precision of
the Layer")."""

import torch


def _compute_dtype(dtype):
    """The dtype the memory computes in and keeps its state in, for parameters (or inputs) of `dtype`: float32 and
    float64 as they are; bf16 and fp16 in float32 (docs/module-api.md, "Precision of the Layer")."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _state_dtype(cache):
    """The dtype of a decoding cache's memory state (the first floating-point tensor of its carry)."""
    todo = [cache["carry"]]
    while todo:
        x = todo.pop(0)
        if torch.is_tensor(x) and x.is_floating_point():
            return x.dtype
        if isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
    return torch.float32


def _keep_rows(keep, new, old):
    """The cache `new` in the rows where `keep` [B] is True and `old` in the others: a padding token leaves its
    row's cache as it was. The token count t then becomes one count per row."""
    if isinstance(new, dict):
        return {n: _keep_rows(keep, x, old[n]) if n in old else x for n, x in new.items()}
    if isinstance(new, (list, tuple)):
        return type(new)(_keep_rows(keep, x, y) for x, y in zip(new, old))
    if torch.is_tensor(new):
        if old is None:  # the conv history starts as None: zeros
            old = torch.zeros_like(new)
        return torch.where(keep.view(-1, *([1] * (new.dim() - 1))), new, old)
    if isinstance(new, int) and not isinstance(new, bool) and isinstance(old, int):
        return old + (new - old) * keep.long()
    return new


def _carried_as_is(name):
    """State entries that keep any sign and are never re-parametrised: momentum buffers S_* and the Omega window's
    past keys, values and weights win_* (both start empty), and the preconditioner's statistic A (a sum of squares
    from 0). The accumulators A_* of lq's chunk readout are weights like the others."""
    return name.startswith(("S_", "win_")) or name == "A"


def _unconstrained(name, w, positive, scale=1.0):
    """The learned form of an initial state entry w. positive: how the retention keeps the weights positive,
    "softmax" (kl: each row of W_0 sums to `scale`, so log(W_0 / scale) are logits whose row softmax times `scale`
    is W_0 again), "exp" (log-weights), or None (any sign: w as it is)."""
    if positive is None or _carried_as_is(name):
        return w
    return torch.log(w / scale) if positive == "softmax" else torch.log(w)


def _constrained(name, p, positive, scale=1.0):
    """The initial state entry the op reads, from its learned form p (the inverse of `_unconstrained`)."""
    if positive is None or _carried_as_is(name):
        return p
    return scale * torch.softmax(p, dim=-1) if positive == "softmax" else torch.exp(p)
