"""A parametric memory's token recurrence, the reference of every other algorithm (a runtime piece: copied into every
emitted memory module by mirasc.codegen.torch_backend; docs/semantics.md, "Parametric memories", steps 1-5). One token
takes the gradient of the attentional bias at the weights (or at its mini-batch's anchor, or summed over the Omega
window), the learner turns it into an update and the retention turns the update into the next weights. What the spec
chose comes in through three printed functions (mirasc.codegen.torch_retention and torch_learner):

- `_before_gradient(W, carry, c, first)`: the retention's move before the gradient (decay first under order=pre; a
  chunk readout's frozen normaliser at a mini-batch's first token); the weights the gradient and the step start from;
- `_learn(grads, S, c)`: the learner, from the gradients to the updates U (and the momentum buffers S);
- `_retain(W, Y, updates, c, carry, first)`: the retention, from the updates to the next weights W (and the
  accumulators Y it keeps).

The rest is the spec's constants (MINIBATCH, WINDOW_COEFS, ERASE_WRITE), the memory's printed `_memory_grad` and
`_memory_forward` (mirasc.runtime.memory_spec and memory_hooks have examples), and which gradient a token takes,
`_token_factors`: its own (`_token_grad`), or the Omega window's (`_window_factors`)."""

import torch

from .memory_hooks import _before_gradient, _finish, _learn, _memory_forward, _memory_grad, _retain, _start
from .memory_ops import _dense, _on_weight, _token_coefs
from .memory_spec import ERASE_WRITE, KL_C, MINIBATCH, WINDOW_COEFS


def _per_row(first, new, old):
    """`new` where `first` holds, else `old`; `first` is a bool, or one bool per batch row where the rows have read
    different numbers of tokens (a decoding batch whose rows skipped padding tokens)."""
    if not torch.is_tensor(first):
        return new if first else old
    return torch.where(first.view(-1, *([1] * (new.dim() - 1))), new, old)


def _token_grad(carry, at, k_t, v_t, c_t):
    """The gradient's factors at the weights `at`, this token's alone: (δ_i, x_i) per weight i, ∇_{W_i} ℓ = δ_i x_iᵀ."""
    return _memory_grad(at, k_t, v_t, c_t)


def _window_factors(carry, at, k_t, v_t, c_t):
    """The Omega rule's gradient factors: ∇ Σ_{i=t−c+1..t} γ_i ℓ(W; k_i, v_i), every term at the same weights `at`; the
    window is the carried c − 1 previous tokens and this one, each with its own coefficients, and moves on by one."""
    win = carry["win"]
    k_w, v_w = torch.cat([win["k"], k_t], dim=2), torch.cat([win["v"], v_t], dim=2)
    c_w = {n: torch.cat([win[n], c_t[n]], dim=2) for n in WINDOW_COEFS}
    carry["win"] = {"k": k_w[:, :, 1:], "v": v_w[:, :, 1:], **{n: x[:, :, 1:] for n, x in c_w.items()}}
    return [(delta_i * c_w["gamma"], input_i) for delta_i, input_i in _memory_grad(at, k_w, v_w, c_w)]


def _token_step(carry, q_t, k_t, v_t, c_t, params=None):
    """One token. q_t, k_t, v_t: [B, H, 1, D]; c_t: coefficient name -> [B, H, 1, 1] or [B, H, 1, D]."""
    carry = dict(carry)
    # under minibatch(C), whether this token starts a mini-batch (t: the tokens read, an int or one count per row [B])
    first = None if MINIBATCH is None else carry["t"] % MINIBATCH == 0
    W = _before_gradient(list(carry["W"]), carry, c_t, first)
    if first is None:
        at = W
    else:  # gradients are taken at the mini-batch's anchor, the weights at its first token, until the next one
        if torch.is_tensor(first) or first:
            carry["anchor"] = tuple(_per_row(first, w, a) for w, a in zip(W, carry["anchor"]))
        at = carry["anchor"]
    factors = _token_factors(carry, at, k_t, v_t, c_t)  # (over the Omega window under the Omega rule)
    grads = [delta_i.transpose(-1, -2) @ input_i for delta_i, input_i in factors]  # ∇_{W_i} ℓ = Σ_r δ_r x_rᵀ
    updates, S = _learn(grads, carry["S"], c_t)
    if ERASE_WRITE:  # l2(erase=kappa): the write v kᵀ, at unit rate
        updates = [update + v_t.transpose(-1, -2) @ k_t for update in updates]
    W, Y = _retain(W, carry["Y"], updates, c_t, carry, first)
    o_t = _memory_forward(_dense(W), q_t)
    carry.update(W=W, Y=Y, S=S, t=carry["t"] + 1)
    return carry, o_t


def _recurrent(q, k, v, c, state):
    """The memory over a sequence by the token: q, k, v [B, H, T, D], c their coefficients [B, H, T] (or [B, H, T, D]);
    returns the outputs [B, H, T, Dv] and the final state."""
    carry = _start(state)
    outs = []
    for t in range(q.shape[2]):
        c_t = _token_coefs(c, t, t + 1)
        carry, o_t = _token_step(carry, q[:, :, t, None], k[:, :, t, None], v[:, :, t, None], c_t)
        outs.append(o_t)
    return torch.cat(outs, dim=2), _finish(carry)


def _read_tokens(carry, q, k, v, c, params):
    """Layer.step's memory over the n tokens of one Layer token (n = 1; a multi-step learner's STEPS sub-steps): q, k,
    v [B, n, H, D] in the state's dtype, c their coefficients, params the read's; returns the carry after the last
    token and its read o_t [B, H, 1, Dv]."""
    for j in range(q.shape[1]):
        c_j = {name: val.to(q.dtype) for name, val in _token_coefs(c, j, j + 1).items()}
        carry, o_t = _token_step(carry, *(t[:, j:j + 1].transpose(1, 2) for t in (q, k, v)), c_j, params)
    return carry, o_t


def _kl_step(w, update, alpha):
    """kl's full step from weights w in log space, W = c·softmax(α log W̃ + U), W̃ = max(w, 1e-12): a chunk readout's
    lag token (docs/semantics.md: chunk readouts)."""
    return KL_C * torch.softmax(alpha * torch.log(w.clamp_min(1e-12)) + update, dim=-1)


def _lag_step(W, S, q1, k1, v1, g1):
    """readout=chunk, kl (docs/semantics.md: chunk readouts): the chunk's first token s alone, one full step from
    W_{s-1} with the gradient there: W_s = c·softmax(α_s log max(W_{s-1}, 1e-12) + U_s). q1, k1, v1: [B, H, 1, D];
    g1: name -> [B, H, 1, 1] (channel-wise: [B, H, 1, D]). Returns (o_s, W_s, S_s)."""
    grads = [delta_i.transpose(-1, -2) @ input_i for delta_i, input_i in _memory_grad(W, k1, v1, g1)]
    updates, S = _learn(grads, S, g1)
    W = [_kl_step(w, update, _on_weight("alpha", g1["alpha"])) for w, update in zip(W, updates)]
    return _memory_forward(_dense(W), q1), W, S


_token_factors = _token_grad  # (the module's own: _window_factors under the Omega rule)
