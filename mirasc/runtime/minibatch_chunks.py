"""The chunked algorithm of the parametric memories' mini-batch form (a runtime piece: an emitted module's `_chunked`
is a call of `_minibatch_chunks` with its readout's chunk step, copied in by mirasc.codegen.torch_backend). Inside a
chunk every gradient is taken at the chunk's anchor state, so each accumulator is a decay-weighted prefix sum of
rank-1 terms,
    Y_t = γ_t Y_0 + b_t S_0 + Σ_{r<=t} K[t, r] δ_r x_rᵀ,
with K built from the decay and momentum segment products (mirasc.runtime.chunk_forms). Outputs come from masked
matmuls (the identity readout and the chunk readouts of docs/semantics.md, "chunk readouts") or from the per-token
weights of the chunk (nonlinear per-token readouts). The memory's own functions (`_memory_grad`, `_memory_forward`,
`_start`, …) are the emitted module's; mirasc.runtime.memory_hooks has examples."""

import torch

from .chunk_forms import _chunk_matrices, _dual_form
from .memory_hooks import _finish, _lag_step, _lq_norm, _memory_forward, _memory_grad, _readout, _start
from .memory_ops import _newton_schulz, _per_token, _token_coefs
from .memory_spec import WINDOW, WINDOW_COEFS
from .segments import _segment_products


def _minibatch_chunks(q, k, v, c, state, chunk, step, window=None):
    """q, k, v [B, H, T, D], the per-token coefficients c, the state; `chunk` tokens per chunk (the mini-batch).
    step(W, Y, S, qc, kc, vc, cc, g, omega) -> (o, W, Y, S) is the readout's chunk: W the weights read at the chunk's
    start, Y the accumulators, S the momentum (None: none), cc and g the chunk's coefficients as the dual form and the
    memory read them, omega the Omega rule's (factors, Ω) or None. window: the Omega rule's (_omega_sequence,
    _omega_factors), or None."""
    carry = _start(state)
    W, Y, S = carry["W"], carry["Y"], carry["S"]
    if window is not None:
        k_all, v_all, c_all, win = window[0](carry["win"], k, v, c)
    outs = []
    T = q.shape[2]
    for c0 in range(0, T, chunk):
        c1 = min(c0 + chunk, T)
        cc = {name: val[:, :, c0:c1] for name, val in c.items()}  # per head [B, H, n] (eta_ch: [B, H, n, D])
        g = _token_coefs(c, c0, c1)
        omega = None if window is None else window[1](W, k_all, v_all, c_all, c0, c1)
        o, W, Y, S = step(W, Y, S, q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], cc, g, omega)
        outs.append(o)
    final = {"W": W, "Y": Y, "S": S} | ({} if window is None else {"win": win})
    return torch.cat(outs, dim=2), _finish(final)


def _coefs_of(cc):
    """A chunk's η, α, θ as the dual form reads them (α, θ None where the spec has no decay, no momentum)."""
    return cc["eta"], cc.get("alpha"), cc.get("theta")


def _identity_chunk(W, Y, S, qc, kc, vc, cc, g, omega):
    """The identity readout: gradients at W, every read a masked matmul of the dual form (K Ω under the Omega rule)."""
    factors, window = omega if omega is not None else (_memory_grad(W, kc, vc, g), None)
    o, W, S = _dual_form(_memory_forward, W, S, factors, qc, *_coefs_of(cc), window=window)
    return o, W, Y, S


def _chunk_run(anchor, Y0, S, qc, kc, vc, cc, g, scale=None):
    """The identity-readout chunk a chunk readout runs: gradients at `anchor`, the accumulators Y0 (and momentum S)
    stepped by the dual form, every read W_t = Y_t·scale_i (scale_i per weight, or 1). Returns (o, Y, S) at the
    chunk's end. (The channel-wise decays' is mirasc.runtime.channel_chunks'.)"""
    factors = _memory_grad(anchor, kc, vc, g)
    return _dual_form(_memory_forward, Y0, S, factors, qc, *_coefs_of(cc), scale=scale)


def _lq_chunk(W, Y, S, qc, kc, vc, cc, g, omega):
    """readout=chunk of lq retention (docs/semantics.md: chunk readouts): n_c = ‖A_{s-1}‖_q^(q-2) once; the anchor is
    W_{s-1} = A_{s-1} / n_c and every read is W_t = A_t / n_c, linear in A: the identity-readout chunk over A with
    each weight's reads scaled by 1/n_c."""
    inv = [1.0 / _lq_norm(y) for y in Y]
    o, Y, S = _chunk_run([y * s for y, s in zip(Y, inv)], Y, S, qc, kc, vc, cc, g, scale=inv)
    return o, [y * s for y, s in zip(Y, inv)], Y, S  # W: what the chunk's last read used, A_e / n_c


def _kl_chunk(W, Y, S, qc, kc, vc, cc, g, omega):
    """readout=chunk of kl retention (docs/semantics.md: chunk readouts), Memora's lag token: token s alone takes the
    full step from W_{s-1} (_lag_step); tokens s+1..e decay steps in weight space with gradients at W_s, the
    identity-readout chunk."""
    o, W, S = _lag_step(W, S, qc[:, :, :1], kc[:, :, :1], vc[:, :, :1], {n: x[:, :, :1] for n, x in g.items()})
    if qc.shape[2] > 1:
        rest = {name: val[:, :, 1:] for name, val in cc.items()}
        o_rest, W, S = _chunk_run(W, W, S, qc[:, :, 1:], kc[:, :, 1:], vc[:, :, 1:], rest,
                                  {name: val[:, :, 1:] for name, val in g.items()})
        o = torch.cat([o, o_rest], dim=2)
    return o, W, Y, S


def _token_chunk(W, Y, S, qc, kc, vc, cc, g, omega):
    """A nonlinear per-token readout W_t = readout(Y_t): every token's accumulator of the chunk materialised, then
    read (gradients at W, the readout of the chunk's anchor accumulator)."""
    gamma, b, kmat, kmom, big_theta = _chunk_matrices(*_coefs_of(cc))
    if omega is not None:
        factors, window = omega
        kmat, kmom = kmat @ window, (None if kmom is None else kmom @ window)  # the Omega rule: K Ω
    else:
        factors = _memory_grad(W, kc, vc, g)
    acc_t = []
    for i, (delta_i, input_i) in enumerate(factors):
        a = gamma[..., None, None] * Y[i].unsqueeze(2)
        if S is not None:
            a = a + b[..., None, None] * S[i].unsqueeze(2)
        rank1 = (delta_i.unsqueeze(-1) * input_i.unsqueeze(-2)).flatten(-2)  # δ_r x_rᵀ, flattened
        acc_t.append(a + (kmat @ rank1).view(a.shape))
    o = _memory_forward(_per_token([_readout(a) for a in acc_t]), qc)
    Y = [a[:, :, -1] for a in acc_t]
    if S is not None:
        S = [torch.addcmul((kmom[:, :, -1, :, None] * d).transpose(-1, -2) @ x, big_theta[:, :, -1, None, None], s)
             for s, (d, x) in zip(S, factors)]
    return o, [_readout(y) for y in Y], Y, S


def _muon_chunk(W, Y, S, qc, kc, vc, cc, g, omega):
    """muon (Atlas §5.1): every gradient of a chunk is taken at its anchor W_0, so the momentum does not depend on the
    weights inside the chunk: S_t = Θ_t S_0 + Σ_r Kₘ[t, r] δ_r x_rᵀ with Kₘ[t, r] = θ_{r+1}…θ_t (times the Omega window
    matrix Ω). Every S_t of the chunk is materialised and orthogonalised at once (batched Newton–Schulz), and
    W_t = α_t W_{t-1} − η_t NS(S_t) unrolls to W_t = Γ_t W_0 − Σ_{s<=t} D[t, s] η_s NS(S_s); each token reads its own
    W_t."""
    theta, eta, alpha = cc["theta"], cc["eta"], cc.get("alpha")
    n = theta.shape[-1]
    mom = _segment_products(theta)  # mom[t, r] = θ_{r+1}…θ_t
    if omega is not None:
        factors, window = omega
        mom = mom @ window
    else:
        factors = _memory_grad(W, kc, vc, g)
    big_theta = torch.cumprod(theta, dim=-1)
    if alpha is not None:
        decay, gamma = _segment_products(alpha), torch.cumprod(alpha, dim=-1)
    else:
        decay, gamma = torch.ones(n, n, dtype=qc.dtype, device=qc.device).tril(), torch.ones_like(eta)
    steps = -decay * eta.unsqueeze(-2)  # W_t = Γ_t W_0 + Σ_s steps[t, s] NS(S_s)
    per_token, S = [], list(S)
    for i, (delta_i, input_i) in enumerate(factors):
        rank1 = (delta_i.unsqueeze(-1) * input_i.unsqueeze(-2)).flatten(-2)  # δ_r x_rᵀ, flattened
        shape = (*theta.shape, *W[i].shape[-2:])  # [B, H, n, out, in]
        s_t = big_theta[..., None, None] * S[i].unsqueeze(2) + (mom @ rank1).view(shape)
        ortho = _newton_schulz(s_t).flatten(-2)
        per_token.append(gamma[..., None, None] * W[i].unsqueeze(2) + (steps @ ortho).view(shape))
        S[i] = s_t[:, :, -1]
    o = _memory_forward(_per_token(per_token), qc)
    return o, [w[:, :, -1] for w in per_token], Y, S


def _omega_sequence(win, k, v, c):
    """The sequence with the carried Omega window in front (c − 1 earlier tokens, then the T given ones): keys, values
    and the window's coefficients [B, H, c − 1 + T, ·], and the window left at its end (the last c − 1 tokens)."""
    T = k.shape[2]
    coefs = _token_coefs(c, 0, T)
    k_all, v_all = torch.cat([win["k"], k], dim=2), torch.cat([win["v"], v], dim=2)
    c_all = {n: torch.cat([win[n], coefs[n]], dim=2) for n in WINDOW_COEFS}
    last = slice(T, T + WINDOW - 1)  # (indices in the prepended sequence)
    end = {"k": k_all[:, :, last], "v": v_all[:, :, last], **{n: x[:, :, last] for n, x in c_all.items()}}
    return k_all, v_all, c_all, end


def _omega_factors(W, k_all, v_all, c_all, c0, c1):
    """Tokens c0:c1 under the Omega rule with every gradient at W: the gradient factors of the n + c − 1 tokens their
    windows cover (c0 − c + 1 .. c1 − 1), and Ω [B, H, n, n + c − 1], Ω[t, r] = γ_r for the tokens r in t's window, so
    that step t's gradient is Σ_r Ω[t, r] δ_r x_rᵀ."""
    n = c1 - c0
    span = slice(c0, c1 + WINDOW - 1)  # (indices in the prepended sequence)
    c_w = {name: val[:, :, span] for name, val in c_all.items()}
    factors = _memory_grad(W, k_all[:, :, span], v_all[:, :, span], c_w)
    t = torch.arange(n, device=k_all.device)[:, None]
    r = torch.arange(n + WINDOW - 1, device=k_all.device)[None, :]
    inside = (r >= t) & (r < t + WINDOW)  # token r (prepended index) is one of the last WINDOW tokens up to t
    window = torch.where(inside, c_w["gamma"][..., 0].unsqueeze(-2), k_all.new_zeros(()))
    return factors, window
