"""The torch chunked algorithms (a runtime piece: the functions a spec needs are copied into its emitted module by
mirasc.codegen; docs/semantics.md gives each rule, docs/module-api.md `algorithm`).

The delta-rule families walk the sequence in chunks of `chunk` tokens and solve, per chunk, one unit lower triangular
system for the tokens' updates (the WY/UT form of the product of the chunk's transitions), so that they compute the
token recurrence exactly up to rounding. The mini-batch (dual) form takes every gradient of a chunk at its anchor, so
each accumulator is a decay-weighted prefix sum of rank-1 terms (_chunk_matrices, _dual_form). Inputs are
[B, H, T, D] (q, k: D = Dk; v: Dv), coefficients [B, H, T] (a channel-wise one [B, H, T, D]); an optional term is
None where the spec has none (no decay: alpha None), and a choice the spec fixes (the decay's order, the implicit
step) is a flag."""

import torch

from .channel_decay import _chunk_decay, _decay_scores, _log_decay, _mix, _scores
from .segments import _segment_products


def _chunks(T, chunk):
    """(c0, c1) of each chunk of `chunk` tokens over T (the last one partial)."""
    for c0 in range(0, T, chunk):
        yield c0, min(c0 + chunk, T)


def _solve_unit_lower(lower, rhs):
    """X with (I + lower) X = rhs, lower strictly lower triangular over its last two axes (one chunk's tokens)."""
    eye = torch.eye(lower.shape[-1], dtype=lower.dtype, device=lower.device)
    return torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)


def _delta_chunks(q, k, v, eta, alpha, W, chunk, implicit, pre_decay):
    """The delta rule (linear memory, l2 bias, a decay per head): per token W_t = α_t W_{t-1} - u_t k_tᵀ with
    u_t = β_t (W' k_t - v_t), W' = α_t W_{t-1} (pre_decay) or W_{t-1}, β = η (or η / (1 + η‖k‖²), the implicit
    step). Unrolled in a chunk: W_t = γ_t W_0 - Σ_{s<=t} D[t,s] u_s k_sᵀ, so the u's solve (I + L) U = R with
    L[t,s] = β_t M[t,s] (k_s·k_t) for s < t. W [B, H, Dv, Dk]; returns (o, final W)."""
    outs = []
    for c0, c1 in _chunks(q.shape[2], chunk):
        qc, kc, vc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1]
        e = eta[:, :, c0:c1]
        beta = e / (1 + e * (kc * kc).sum(-1)) if implicit else e  # implicit: the proximal step
        a_c = torch.ones_like(e) if alpha is None else alpha[:, :, c0:c1]
        decay = _segment_products(a_c)
        gamma = torch.cumprod(a_c, dim=-1)
        if pre_decay:  # u_t = β_t(γ_t W_0 k_t - Σ_{s<t} D[t,s](k_s·k_t) u_s - v_t)
            a, m = gamma, decay
        else:  # the gradient sees W_{t-1}: u_t = β_t(γ_{t-1} W_0 k_t - Σ_{s<t} D[t-1,s](k_s·k_t) u_s - v_t)
            a = torch.cat([torch.ones_like(gamma[..., :1]), gamma[..., :-1]], dim=-1)
            m = torch.cat([torch.zeros_like(decay[..., :1, :]), decay[..., :-1, :]], dim=-2)
        kk = kc @ kc.transpose(-1, -2)
        lower = beta.unsqueeze(-1) * (m * kk).tril(-1)
        rhs = beta.unsqueeze(-1) * (a.unsqueeze(-1) * (kc @ W.transpose(-1, -2)) - vc)
        u = _solve_unit_lower(lower, rhs)
        o = gamma.unsqueeze(-1) * (qc @ W.transpose(-1, -2)) - (decay * (qc @ kc.transpose(-1, -2))) @ u
        W = gamma[:, :, -1, None, None] * W - (decay[:, :, -1, :, None] * u).transpose(-1, -2) @ kc
        outs.append(o)
    return torch.cat(outs, dim=2), W


def _momentum_delta_chunks(q, k, v, eta, theta, alpha, W, S, chunk, pre_decay):
    """The momentum delta rule: per token, with u_t = W_{t-1} k_t and δ_t = η_t v_t − β_t u_t (β = η, or α η with
    pre_decay), S_t = θ_t S_{t-1} + δ_t k_tᵀ and W_t = α_t W_{t-1} + S_t: the state X = [W, S] follows
    X_t = X_{t-1} (G_t ⊗ I) + δ_t [k_t; k_t]ᵀ with G_t = [[α_t, 0], [θ_t, θ_t]]. Products of such factors over
    tokens s+1..t are [[A(t,s), 0], [C(t,s), Θ(t,s)]] (A, Θ the segment products of α, θ; A + C = A·Θ), so in a chunk
    W_t = A(t,0) W_0 + C(t,0) S_0 + Σ_{s<=t} (A·Θ)(t,s) δ_s k_sᵀ, S_t = Θ(t,0) S_0 + Σ_{s<=t} Θ(t,s) δ_s k_sᵀ, and
    the δ's solve one unit lower triangular system (u_t reads W_{t-1}). Returns (o, final W, final S)."""
    outs = []
    for c0, c1 in _chunks(q.shape[2], chunk):
        qc, kc, vc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1]
        e, th = eta[:, :, c0:c1], theta[:, :, c0:c1]
        a_c = torch.ones_like(e) if alpha is None else alpha[:, :, c0:c1]
        beta = a_c * e if pre_decay else e  # pre_decay: the gradient is taken at the decayed state α_t W_{t-1}
        # factors from the chunk start (a virtual token 0 with α = θ = 1) to every token, and between tokens
        one = torch.ones_like(a_c[..., :1])
        seg_a = _segment_products(torch.cat([one, a_c], dim=-1))  # [.., n+1, n+1], index 0: the chunk start
        seg_t = _segment_products(torch.cat([one, th], dim=-1))
        write = seg_a @ seg_t  # (A·Θ)(t,s): how δ_s k_sᵀ reaches W_t (A + C)
        from_w, from_s = seg_a[..., 1:, 0], (write - seg_a)[..., 1:, 0]  # A(t,0), C(t,0): W_0 and S_0 in W_t
        # u_t reads W_{t-1}: the factors up to token t-1
        kk = kc @ kc.transpose(-1, -2)
        lower = beta.unsqueeze(-1) * (write[..., :-1, 1:] * kk).tril(-1)
        u0 = (seg_a[..., :-1, 0, None] * (kc @ W.transpose(-1, -2))
              + (write - seg_a)[..., :-1, 0, None] * (kc @ S.transpose(-1, -2)))
        rhs = e.unsqueeze(-1) * vc - beta.unsqueeze(-1) * u0
        delta = _solve_unit_lower(lower, rhs)
        o = (from_w.unsqueeze(-1) * (qc @ W.transpose(-1, -2)) + from_s.unsqueeze(-1) * (qc @ S.transpose(-1, -2))
             + (write[..., 1:, 1:] * (qc @ kc.transpose(-1, -2))) @ delta)
        W = (from_w[..., -1, None, None] * W + from_s[..., -1, None, None] * S
             + (write[..., -1, 1:, None] * delta).transpose(-1, -2) @ kc)
        S = seg_t[..., -1, 0, None, None] * S + (seg_t[..., -1, 1:, None] * delta).transpose(-1, -2) @ kc
        outs.append(o)
    return torch.cat(outs, dim=2), W, S


def _channel_delta_chunks(q, k, v, eta, eta_ch, eta_side, alpha, alpha_side, W, chunk, implicit, pre_decay):
    """The delta rule with channel-wise gates (Kimi Delta Attention: α over key channels, pre_decay). Per token
    W_t = diag(a^v_t)·W_{t-1}·diag(a^k_t) - u_t w_tᵀ, u_t = β_t ⊙ (W' k_t - v_t), W' the decayed W_{t-1}
    (pre_decay) or W_{t-1}, with a^k / a^v the decay over key / value channels (alpha_side "k" / "v"; a per-head α,
    alpha_side None, counts as a key-side one), w_t = η^k_t ⊙ k_t the write key (eta_side "k") and β_t = η_t (or
    η_t / (1 + η_t‖k_t‖²), the implicit step; times η^v_t for eta_side "v"). Unrolled in a chunk,
    W_t = Γ^v_t ∘ W_0 ∘ Γ^k_t - Σ_{s<=t} (D^v[t,s] ⊙ u_s)(D^k[t,s] ⊙ w_s)ᵀ, so the u's solve, per value channel i,
    (I + L_i) u_{:,i} = R_{:,i} with L_i[t, s] = β_{t,i} D^v[t,s,i] Σ_j k_tj w_sj D^k[t,s,j] for s < t (one shared
    system when no gate is over value channels). α over key channels goes through log-space scores (FLA's
    secondary chunking: no [n, n, Dk] tensor). eta_ch: the channel-wise η [B, H, T, D], or None; alpha [B, H, T]
    or [B, H, T, D], or None. Returns (o, final W)."""
    coefs = {} if alpha is None else {"alpha": alpha}
    outs = []
    for c0, c1 in _chunks(q.shape[2], chunk):
        n = c1 - c0
        qc, kc, vc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1]
        e = eta[:, :, c0:c1].unsqueeze(-1)  # [B, H, n, 1]
        beta = e / (1 + e * (kc * kc).sum(-1, keepdim=True)) if implicit else e  # implicit: the proximal step
        wk = kc  # the write key
        if eta_side == "k":
            wk = kc * eta_ch[:, :, c0:c1]
        elif eta_side == "v":
            beta = beta * eta_ch[:, :, c0:c1]  # [B, H, n, Dv]
        # lower triangular over (t, s) (a .tril() of the 5-d tensor would act on its last two axes, (s, 1))
        ones_t = torch.ones(n, n, dtype=q.dtype, device=q.device).tril()[None, None, :, :, None]
        gv, dv = torch.ones_like(e), ones_t  # value-side Γ and D (width 1: none)
        if alpha is not None and alpha_side == "k":  # log-space scores
            G = _log_decay(coefs, "alpha", c0, c1)
            gk = torch.exp(G)
            if pre_decay:  # the gradient sees W'_t = W_{t-1}·diag(α_t)
                Ga, ak = G, gk
            else:  # it sees W_{t-1}
                Ga = torch.cat([torch.zeros_like(G[:, :, :1]), G[:, :, :-1]], dim=2)
                ak = torch.exp(Ga)
            av, mv = gv, dv
            kk = _decay_scores(kc, Ga, wk, G, strict=True)  # Σ_j k_tj w_sj e^{Ga_tj − G_sj}, s < t
            qk = _decay_scores(qc, G, wk, G, strict=False)  # Σ_j q_tj w_sj e^{G_tj − G_sj}, s <= t
            wk_end = wk * torch.exp(G[:, :, -1:] - G)
        else:
            gk, dk = torch.ones_like(e), ones_t  # key-side Γ and D (width 1: none)
            if alpha is not None and alpha_side == "v":
                gv, dv = _chunk_decay(coefs, "alpha", c0, c1)
            elif alpha is not None:
                gk, dk = _chunk_decay(coefs, "alpha", c0, c1)
            if pre_decay:  # the gradient sees W'_t = decayed W_{t-1}
                ak, av, mk, mv = gk, gv, dk, dv
            else:  # it sees W_{t-1}: Γ_{t-1} and D[t-1, s]
                def shift(g, d):
                    return (torch.cat([torch.ones_like(g[:, :, :1]), g[:, :, :-1]], dim=2),
                            torch.cat([torch.zeros_like(d[:, :, :1]), d[:, :, :-1]], dim=2))
                (ak, mk), (av, mv) = shift(gk, dk), shift(gv, dv)
            kk = _scores(kc, wk, mk)  # Σ_j k_tj w_sj D^k[t, s, j]
            qk = _scores(qc, wk, dk)  # Σ_j q_tj w_sj D^k[t, s, j]
            wk_end = dk[:, :, -1] * wk
        rhs = beta * (av * ((kc * ak) @ W.transpose(-1, -2)) - vc)
        if beta.shape[-1] == 1 and mv.shape[-1] == 1:  # one system shared by all value channels
            u = _solve_unit_lower((beta * mv[..., 0] * kk).tril(-1), rhs)
        else:  # one system per value channel: L_i[t, s] = β_{t,i} D^v[t,s,i] kk[t, s]
            lower = (beta.unsqueeze(-2) * mv * kk.unsqueeze(-1)).permute(0, 1, 4, 2, 3).tril(-1)
            u = _solve_unit_lower(lower, rhs.transpose(-1, -2).unsqueeze(-1)).squeeze(-1).transpose(-1, -2)
        o = gv * ((qc * gk) @ W.transpose(-1, -2)) - _mix(qk, dv, u)
        W = gv[:, :, -1, :, None] * W * gk[:, :, -1, None, :] - (dv[:, :, -1] * u).transpose(-1, -2) @ wk_end
        outs.append(o)
    return torch.cat(outs, dim=2), W


def _gdelta_chunks(q, k, v, kappa, eta, eta_k, alpha, W, chunk, erase_kappa, pre_decay):
    """The generalized delta transition (l2 with read=kappa or erase=kappa): per token, with D_t = diag(α_t) over key
    channels (a per-head α: α_t·I), W_t = W_{t-1}·D_t − u_t b_tᵀ + v_t w_tᵀ, u_t = W_{t-1}·P_t κ_t (P_t = D_t with
    pre_decay, else I), the erase key b = η ⊙ k and write key w = b for read=kappa, b = η ⊙ κ and w = k for
    erase=kappa. Unrolled in a chunk from W_0, with Γ_t = D_1⋯D_t and Γ_{t←s} = D_{s+1}⋯D_t,
    W_t = W_0 Γ_t + Σ_{s<=t} (v_s w_sᵀ − u_s b_sᵀ) Γ_{t←s}, so u_t = W_0 Γ'_t κ_t + Σ_{s<t} [(w_s·Γ'_{t←s} κ_t) v_s −
    (b_s·Γ'_{t←s} κ_t) u_s] (Γ' = Γ_t for pre, Γ_{t-1} for post): the u's solve (I + A) U = R + B V per chunk.
    kappa [B, H, T, Dk]; eta [B, H, T]; eta_k [B, H, T, Dk] a channel-wise η over keys, or None; alpha [B, H, T]
    or [B, H, T, Dk], or None (no decay). Returns (o, final W)."""
    coefs = {} if alpha is None else {"alpha": alpha}
    outs = []
    for c0, c1 in _chunks(q.shape[2], chunk):
        qc, kc, vc, kap = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], kappa[:, :, c0:c1]
        e = eta[:, :, c0:c1].unsqueeze(-1)  # [B, H, n, 1]
        if eta_k is not None:
            e = e * eta_k[:, :, c0:c1]  # [B, H, n, Dk]
        if erase_kappa:  # erase along η ⊙ κ, write v along k at unit rate
            erase, write = e * kap, kc
        else:  # read=kappa: the error read at κ is stepped along η ⊙ k
            erase = write = e * kc
        if alpha is not None:
            G = _log_decay(coefs, "alpha", c0, c1)
            G = G if G.dim() == 4 else G.unsqueeze(-1).expand_as(kc)  # [B, H, n, Dk]
        else:
            G = torch.zeros_like(kc)
        # the erase reads W_{t-1}·D_t (pre_decay), else W_{t-1}
        Ga = G if pre_decay else torch.cat([torch.zeros_like(G[:, :, :1]), G[:, :, :-1]], dim=2)
        a_erase = _decay_scores(kap, Ga, erase, G, strict=True)  # (b_s·Γ'_{t←s} κ_t), s < t
        a_write = _decay_scores(kap, Ga, write, G, strict=True)  # (w_s·Γ'_{t←s} κ_t), s < t
        rhs = (kap * torch.exp(Ga)) @ W.transpose(-1, -2) + a_write @ vc
        u = _solve_unit_lower(a_erase, rhs)
        o = ((qc * torch.exp(G)) @ W.transpose(-1, -2) + _decay_scores(qc, G, write, G, strict=False) @ vc
             - _decay_scores(qc, G, erase, G, strict=False) @ u)
        to_end = torch.exp(G[:, :, -1:] - G)  # Γ_{n←s}, every exponent <= 0
        W = (W * torch.exp(G[:, :, -1, None, :]) + vc.transpose(-1, -2) @ (write * to_end)
             - u.transpose(-1, -2) @ (erase * to_end))
        outs.append(o)
    return torch.cat(outs, dim=2), W


def _chunk_matrices(eta, alpha, theta):
    """Prefix-sum coefficients of one chunk of the mini-batch form (eta [B, H, n]; alpha, theta [B, H, n] or None: no
    decay, no momentum): γ, b, K with Y_t = γ_t Y_0 + b_t S_0 + Σ_r K[t, r] δ_r x_rᵀ, and with momentum Kₘ, Θ with
    S_t = Θ_t S_0 + Σ_r Kₘ[t, r] δ_r x_rᵀ (b, Kₘ, Θ None without)."""
    if alpha is not None:
        decay = _segment_products(alpha)  # decay[t, s] = α_{s+1}…α_t
        gamma = torch.cumprod(alpha, dim=-1)  # γ_t = α_1…α_t
    else:
        n = eta.shape[-1]
        decay = torch.ones(n, n, dtype=eta.dtype, device=eta.device).tril()
        gamma = torch.ones_like(eta)
    if theta is None:
        return gamma, None, -decay * eta.unsqueeze(-2), None, None
    mom = _segment_products(theta)  # mom[t, r] = θ_{r+1}…θ_t
    kmom = -mom * eta.unsqueeze(-2)  # S_t = Θ_t S_0 + Σ_r kmom[t, r] δ_r x_rᵀ
    kmat = decay @ kmom  # Y_t = γ_t Y_0 + b_t S_0 + Σ_r (decay @ kmom)[t, r] δ_r x_rᵀ
    big_theta = torch.cumprod(theta, dim=-1)
    b = (decay @ big_theta.unsqueeze(-1)).squeeze(-1)
    return gamma, b, kmat, kmom, big_theta


def _dual_form(forward, Y0, S, factors, qc, eta, alpha, theta, scale=None, window=None):
    """The identity-readout dual form of one chunk: reads W_t = Y_t·scale_i (scale_i [B, H, 1, 1] per weight, or 1)
    as masked matmuls, W_t h = (γ_t Y_0 h + b_t S_0 h + Σ_r K[t, r] (x_r·h) δ_r)·scale, with no per-token weights.
    forward(layer, h): the memory's read with `layer(i, h)` in place of weight i's product (the module's
    _memory_forward); Y0, S: each weight's accumulator and momentum at the chunk's start (S None: no momentum);
    factors: each weight's gradient factors (δ, x) at the anchor; eta, alpha, theta: as _chunk_matrices. window (the
    Omega rule): Ω [B, H, n, n + c − 1], step s's gradient is Σ_r Ω[s, r] δ_r x_rᵀ over the factors of the chunk's
    tokens and the c − 1 before it, so K becomes K Ω. Returns (o [B, H, n, Dv], Y and S at the chunk's end)."""
    gamma, b, kmat, kmom, big_theta = _chunk_matrices(eta, alpha, theta)
    if window is not None:
        kmat, kmom = kmat @ window, (None if kmom is None else kmom @ window)

    def layer(i, h):
        delta_i, input_i = factors[i]
        out = gamma.unsqueeze(-1) * (h @ Y0[i].transpose(-1, -2))
        if S is not None:
            out = out + b.unsqueeze(-1) * (h @ S[i].transpose(-1, -2))
        out = out + (kmat * (h @ input_i.transpose(-1, -2))) @ delta_i
        return out if scale is None else out * scale[i]

    o = forward(layer, qc)
    last = kmat[:, :, -1, :, None]
    new = []
    for i, (delta_i, input_i) in enumerate(factors):
        # one fused pass per term over the (large) weight matrices: addcmul(x, s, y) = x + s·y
        w = torch.addcmul((last * delta_i).transpose(-1, -2) @ input_i, gamma[:, :, -1, None, None], Y0[i])
        if S is not None:
            w = torch.addcmul(w, b[:, :, -1, None, None], S[i])
        new.append(w)
    if S is not None:
        S = [torch.addcmul((kmom[:, :, -1, :, None] * d).transpose(-1, -2) @ x, big_theta[:, :, -1, None, None], s)
             for s, (d, x) in zip(S, factors)]
    return o, new, S


def _channel_chunk_form(W, Y, S, qc, delta, x, eta, alpha, theta, side, fast, read=None):
    """One chunk of the mini-batch form with channel-wise decays, linear memory W [B, H, Dv, Dk]. Every update is rank
    one at the anchor, U_r = -η_r δ_r x_rᵀ, and the decays scale `side` of W ("k": columns, "v": rows), so each
    accumulator is Y_t = Y_0∘Γ_t + S_0∘B_t + Σ_{r<=t} K[t, r] ∘ (δ_r x_rᵀ),
    K[t, r, j] = Σ_u D[t, u, j] M[u, r, j] (-η_r) with D the retention's and M the momentum's channel segment products
    (∘ broadcasts over the side).
    W, Y (None: W), S (None: no momentum): one-weight lists at the chunk's start; qc [B, H, n, Dk]; delta [B, H, n, Dv]
    and x [B, H, n, Dk]: the chunk's gradient factors at the anchor; eta [B, H, n]; alpha, theta: [B, H, n] or
    [B, H, n, D], or None. fast: α over key channels, no momentum, an identity read (GLA, HGRN2): log-space scores,
    no [n, n, D] tensor. read(acc, qc) -> (o, W): a nonlinear per-token readout from every token's accumulator
    [B, H, n, Dv, Dk] (None: the identity, read by masked matmuls). Returns (o [B, H, n, Dv], W, Y, S) at the chunk's
    end; with the identity read the returned W is the accumulator at the end."""
    n = qc.shape[2]
    coefs = {name: t for name, t in (("alpha", alpha), ("theta", theta)) if t is not None}
    if fast:
        G = _log_decay(coefs, "alpha", 0, n)
        scores = _decay_scores(qc, G, x, G, strict=False) * -eta.unsqueeze(-2)  # K[t, r] contracted with q_t, x_r
        o = (qc * torch.exp(G)) @ W[0].transpose(-1, -2) + scores @ delta
        last = torch.exp(G[:, :, -1:] - G) * -eta.unsqueeze(-1)  # e^{G_n − G_r}·(−η_r), every exponent <= 0
        return o, [W[0] * torch.exp(G[:, :, -1, None, :]) + delta.transpose(-1, -2) @ (x * last)], Y, S
    width = x.shape[-1] if side == "k" else delta.shape[-1]
    if alpha is not None:
        gamma, decay = _chunk_decay(coefs, "alpha", 0, n, width)
    else:
        gamma = torch.ones(*eta.shape, width, dtype=qc.dtype, device=qc.device)
        decay = torch.ones(n, n, dtype=qc.dtype, device=qc.device).tril()[..., None].expand(n, n, width)
    if theta is not None:
        big_theta, mom = _chunk_decay(coefs, "theta", 0, n, width)
        kmom = -mom * eta[:, :, None, :, None]  # S_t = S_0∘Θ_t + Σ_r kmom[t, r] ∘ δ_r x_rᵀ
        kmat = torch.einsum("...tud,...urd->...trd", decay, kmom)
        b = torch.einsum("...tud,...ud->...td", decay, big_theta)
    else:
        kmat = -decay * eta[:, :, None, :, None]
    Y0 = W if Y is None else Y
    if side == "k":  # Σ_r K[t, r] ∘ (δ_r x_rᵀ) applied to h is Σ_r δ_r Σ_j x_rj h_j K[t, r, j]
        def on_side(w, f):  # a weight [.., Dv, Dk] scaled by per-token factors f [.., n, d] of its columns
            return w.unsqueeze(2) * f.unsqueeze(-2)
        end = torch.einsum("...rv,...rk->...vk", delta, x * kmat[:, :, -1])
    else:
        def on_side(w, f):  # rows scaled
            return w.unsqueeze(2) * f.unsqueeze(-1)
        end = torch.einsum("...rv,...rk->...vk", delta * kmat[:, :, -1], x)
    if read is not None:  # each token's accumulator in the chunk, then read
        acc = on_side(Y0[0], gamma)
        if theta is not None:
            acc = acc + on_side(S[0], b)
        if side == "k":
            acc = acc + torch.einsum("...rv,...trk->...tvk", delta, x.unsqueeze(2) * kmat)
        else:
            acc = acc + torch.einsum("...trv,...rk->...tvk", delta.unsqueeze(2) * kmat, x)
        o, W = read(acc, qc)
        Y = [acc[:, :, -1]]
    else:  # o_t = (Y_0∘Γ_t) q_t + (S_0∘B_t) q_t + Σ_r (K[t, r] ∘ δ_r x_rᵀ) q_t, no per-token W
        if side == "k":
            o = (qc * gamma) @ Y0[0].transpose(-1, -2)
            if theta is not None:
                o = o + (qc * b) @ S[0].transpose(-1, -2)
            o = o + torch.einsum("...tk,...rk,...trk->...tr", qc, x, kmat) @ delta
        else:
            o = gamma * (qc @ Y0[0].transpose(-1, -2))
            if theta is not None:
                o = o + b * (qc @ S[0].transpose(-1, -2))
            o = o + torch.einsum("...tr,...trv,...rv->...tv", qc @ x.transpose(-1, -2), kmat, delta)
        w = on_side(Y0[0], gamma[:, :, -1:])[:, :, 0] + end
        if theta is not None:
            w = w + on_side(S[0], b[:, :, -1:])[:, :, 0]
        W = [w]
    if theta is not None:
        mom_end = kmom[:, :, -1]
        rank1 = (torch.einsum("...rv,...rk->...vk", delta, x * mom_end) if side == "k"
                 else torch.einsum("...rv,...rk->...vk", delta * mom_end, x))
        S = [on_side(S[0], big_theta[:, :, -1:])[:, :, 0] + rank1]
    return o, W, Y, S


# ---- each form's entry: the chunked algorithm over a module's coefficients c and state, as `apply` calls it
# (mirasc.runtime.memory_api); the module binds the spec's choices (functools.partial) and names it `_chunked`.
def _delta_chunked(q, k, v, c, state, chunk, *, implicit, pre_decay, features=None):
    """The delta family (linear memory, l2 bias, a decay per head) over c["eta"], c["alpha"] and the state {"W"}; on
    φ(q), φ(k) where the memory reads its keys through a feature map `features` (φ_p)."""
    if features is not None:
        q, k = features(q), features(k)
    o, W = _delta_chunks(q, k, v, c["eta"], c.get("alpha"), state["W"], chunk, implicit, pre_decay)
    return o, {"W": W}


def _momentum_delta_chunked(q, k, v, c, state, chunk, *, pre_decay):
    """The momentum delta rule over c["eta"], c["theta"], c["alpha"] and the state {"W", "S_W"}."""
    o, W, S = _momentum_delta_chunks(q, k, v, c["eta"], c["theta"], c.get("alpha"), state["W"], state["S_W"], chunk,
                                     pre_decay)
    return o, {"W": W, "S_W": S}


def _channel_delta_chunked(q, k, v, c, state, chunk, *, eta_side, alpha_side, implicit, pre_decay, features=None):
    """The delta family with channel-wise gates (η over `eta_side`'s channels as c["eta_ch"], α over `alpha_side`'s)
    and the state {"W"}; on φ(q), φ(k) with a feature map `features`."""
    if features is not None:
        q, k = features(q), features(k)
    o, W = _channel_delta_chunks(q, k, v, c["eta"], c.get("eta_ch"), eta_side, c.get("alpha"), alpha_side,
                                 state["W"], chunk, implicit, pre_decay)
    return o, {"W": W}


def _gdelta_chunked(q, k, v, c, state, chunk, *, eta_side, erase_kappa, pre_decay):
    """The generalized delta transition over c["kappa"], c["eta"] (a channel-wise η over keys as c["eta_ch"] where
    `eta_side` is "k"), c["alpha"] and the state {"W"}."""
    eta_k = c["eta_ch"] if eta_side == "k" else None
    o, W = _gdelta_chunks(q, k, v, c["kappa"], c["eta"], eta_k, c.get("alpha"), state["W"], chunk, erase_kappa,
                          pre_decay)
    return o, {"W": W}
