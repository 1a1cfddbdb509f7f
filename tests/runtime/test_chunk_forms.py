"""The delta families' torch chunked algorithms (mirasc.runtime.chunk_forms) as units, against token-by-token
float64 recurrences written here from docs/semantics.md, over every flag and optional term; chunks of 1, of 5 (a
partial last one) and of the whole sequence."""

from __future__ import annotations

import itertools

import pytest
import torch

from mirasc.runtime import chunk_forms as cf

B, H, T, DK, DV = 2, 3, 13, 5, 4
CHUNKS = (1, 5, T)


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, low=None):
        x = torch.rand(*shape, generator=g, dtype=torch.float64)
        return x if low is None else low + (1 - low) * x

    q, k, kappa = (torch.nn.functional.normalize(torch.randn(B, H, T, DK, generator=g, dtype=torch.float64), dim=-1)
                   for _ in range(3))
    v = torch.randn(B, H, T, DV, generator=g, dtype=torch.float64)
    return dict(q=q, k=k, v=v, kappa=kappa, eta=rnd(B, H, T), theta=rnd(B, H, T, low=0.3), alpha=rnd(B, H, T, low=0.7),
                alpha_k=rnd(B, H, T, DK, low=0.7), eta_k=rnd(B, H, T, DK, low=0.2),
                W=torch.randn(B, H, DV, DK, generator=g, dtype=torch.float64),
                S=torch.randn(B, H, DV, DK, generator=g, dtype=torch.float64))


def _outer(a, b):
    return a.unsqueeze(-1) * b.unsqueeze(-2)


def _read(W, x):
    return (W @ x.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("implicit,pre_decay,decays", itertools.product([False, True], repeat=3))
def test_delta_rule(implicit, pre_decay, decays):
    x = _inputs(0)
    alpha = x["alpha"] if decays else None
    W, outs = x["W"].clone(), []
    for t in range(T):
        k, v, eta = x["k"][:, :, t], x["v"][:, :, t], x["eta"][:, :, t, None]
        a = torch.ones_like(eta) if alpha is None else alpha[:, :, t, None]
        beta = eta / (1 + eta * (k * k).sum(-1, keepdim=True)) if implicit else eta
        seen = a[..., None] * W if pre_decay else W
        u = beta * (_read(seen, k) - v)
        W = a[..., None] * W - _outer(u, k)
        outs.append(_read(W, x["q"][:, :, t]))
    for chunk in CHUNKS:
        o, final = cf._delta_chunks(x["q"], x["k"], x["v"], x["eta"], alpha, x["W"], chunk, implicit, pre_decay)
        torch.testing.assert_close(o, torch.stack(outs, 2), rtol=0, atol=1e-12)
        torch.testing.assert_close(final, W, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pre_decay,decays", itertools.product([False, True], repeat=2))
def test_momentum_delta_rule(pre_decay, decays):
    x = _inputs(1)
    alpha = x["alpha"] if decays else None
    W, S, outs = x["W"].clone(), x["S"].clone(), []
    for t in range(T):
        k, v = x["k"][:, :, t], x["v"][:, :, t]
        eta, theta = x["eta"][:, :, t, None], x["theta"][:, :, t, None]
        a = torch.ones_like(eta) if alpha is None else alpha[:, :, t, None]
        beta = a * eta if pre_decay else eta
        delta = eta * v - beta * _read(W, k)
        S = theta[..., None] * S + _outer(delta, k)
        W = a[..., None] * W + S
        outs.append(_read(W, x["q"][:, :, t]))
    for chunk in CHUNKS:
        o, fw, fs = cf._momentum_delta_chunks(x["q"], x["k"], x["v"], x["eta"], x["theta"], alpha, x["W"], x["S"],
                                              chunk, pre_decay)
        torch.testing.assert_close(o, torch.stack(outs, 2), rtol=0, atol=1e-11)
        torch.testing.assert_close((fw, fs), (W, S), rtol=0, atol=1e-11)


@pytest.mark.parametrize("erase_kappa,pre_decay,decay,channel_eta",
                         itertools.product([False, True], [False, True], [None, "head", "keys"], [False, True]))
def test_generalized_delta_transition(erase_kappa, pre_decay, decay, channel_eta):
    x = _inputs(2)
    alpha = {None: None, "head": x["alpha"], "keys": x["alpha_k"]}[decay]
    eta_k = x["eta_k"] if channel_eta else None
    W, outs = x["W"].clone(), []
    for t in range(T):
        k, v, kap = x["k"][:, :, t], x["v"][:, :, t], x["kappa"][:, :, t]
        eta = x["eta"][:, :, t, None] * (1 if eta_k is None else eta_k[:, :, t])
        d = torch.ones_like(k) if alpha is None else (alpha[:, :, t] if alpha.dim() == 4 else alpha[:, :, t, None]) \
            * torch.ones_like(k)  # diag(D_t) over key channels
        erase, write = (eta * kap, k) if erase_kappa else (eta * k, eta * k)
        u = _read(W, d * kap if pre_decay else kap)
        W = W * d.unsqueeze(-2) - _outer(u, erase) + _outer(v, write)
        outs.append(_read(W, x["q"][:, :, t]))
    for chunk in CHUNKS:
        o, final = cf._gdelta_chunks(x["q"], x["k"], x["v"], x["kappa"], x["eta"], eta_k, alpha, x["W"], chunk,
                                     erase_kappa, pre_decay)
        torch.testing.assert_close(o, torch.stack(outs, 2), rtol=0, atol=1e-11)
        torch.testing.assert_close(final, W, rtol=0, atol=1e-11)


@pytest.mark.parametrize("implicit,pre_decay,decay,eta_side",
                         itertools.product([False, True], [False, True], [None, "head", "k", "v"], [None, "k", "v"]))
def test_delta_rule_with_channel_gates(implicit, pre_decay, decay, eta_side):
    x = _inputs(3)
    alpha = {None: None, "head": x["alpha"], "k": x["alpha_k"], "v": x["alpha_k"][..., :DV]}[decay]
    eta_ch = {None: None, "k": x["eta_k"], "v": x["eta_k"][..., :DV]}[eta_side]
    W, outs = x["W"].clone(), []
    for t in range(T):
        k, v, eta = x["k"][:, :, t], x["v"][:, :, t], x["eta"][:, :, t, None]
        a_k, a_v = torch.ones_like(k), torch.ones_like(v)  # diag(a^k_t), diag(a^v_t)
        if decay in ("head", "k"):
            a_k = a_k * (alpha[:, :, t] if decay == "k" else alpha[:, :, t, None])
        elif decay == "v":
            a_v = alpha[:, :, t]
        beta = eta / (1 + eta * (k * k).sum(-1, keepdim=True)) if implicit else eta
        w = k * eta_ch[:, :, t] if eta_side == "k" else k
        beta = beta * eta_ch[:, :, t] if eta_side == "v" else beta
        decayed = a_v.unsqueeze(-1) * W * a_k.unsqueeze(-2)
        u = beta * (_read(decayed if pre_decay else W, k) - v)
        W = decayed - _outer(u, w)
        outs.append(_read(W, x["q"][:, :, t]))
    side = {None: None, "head": None, "k": "k", "v": "v"}[decay]
    for chunk in CHUNKS:
        o, final = cf._channel_delta_chunks(x["q"], x["k"], x["v"], x["eta"], eta_ch, eta_side, alpha, side, x["W"],
                                            chunk, implicit, pre_decay)
        torch.testing.assert_close(o, torch.stack(outs, 2), rtol=0, atol=1e-11)
        torch.testing.assert_close(final, W, rtol=0, atol=1e-11)


@pytest.mark.parametrize("decays,momentum,scaled", itertools.product([False, True], repeat=3))
def test_dual_form_is_the_prefix_sum_of_its_steps(decays, momentum, scaled):
    """One chunk of the mini-batch form, two weights read one after the other (a stand-in for the memory's forward):
    every token's accumulator from its steps Y_t = α_t Y_{t-1} + S_t, S_t = θ_t S_{t-1} − η_t δ_t x_tᵀ (without
    momentum Y_t = α_t Y_{t-1} − η_t δ_t x_tᵀ), each read scaled by scale_i, against _dual_form's masked matmuls."""
    x = _inputs(4)
    n, D = 7, 4
    g = torch.Generator().manual_seed(5)
    eta, theta, alpha = (x[name][:, :, :n] for name in ("eta", "theta", "alpha"))
    alpha, theta = (alpha if decays else None), (theta if momentum else None)
    Y0 = [torch.randn(B, H, D, D, generator=g, dtype=torch.float64) for _ in range(2)]
    S0 = [torch.randn(B, H, D, D, generator=g, dtype=torch.float64) for _ in range(2)] if momentum else None
    factors = [tuple(torch.randn(B, H, n, D, generator=g, dtype=torch.float64) for _ in range(2)) for _ in range(2)]
    scale = [torch.rand(B, H, 1, 1, generator=g, dtype=torch.float64) + 0.5 for _ in range(2)] if scaled else None
    h = torch.randn(B, H, n, D, generator=g, dtype=torch.float64)

    def forward(layer, q):  # two layers, the second reading the first's output
        return layer(1, layer(0, q))

    Y, S, outs = list(Y0), (list(S0) if momentum else None), []
    for t in range(n):
        a = 1.0 if alpha is None else alpha[:, :, t, None, None]
        for i, (delta, inp) in enumerate(factors):
            step = -eta[:, :, t, None, None] * _outer(delta[:, :, t], inp[:, :, t])
            if momentum:
                S[i] = theta[:, :, t, None, None] * S[i] + step
                Y[i] = a * Y[i] + S[i]
            else:
                Y[i] = a * Y[i] + step
        read = h[:, :, t]
        for i in range(2):
            read = _read(Y[i], read) * (1 if scale is None else scale[i][..., 0])
        outs.append(read)
    o, Y_end, S_end = cf._dual_form(forward, Y0, S0, factors, h, eta, alpha, theta, scale=scale)
    torch.testing.assert_close(o, torch.stack(outs, 2), rtol=0, atol=1e-11)
    torch.testing.assert_close(Y_end, Y, rtol=0, atol=1e-11)
    assert (S_end is None) == (not momentum)
    if momentum:
        torch.testing.assert_close(S_end, S, rtol=0, atol=1e-11)


@pytest.mark.parametrize("side,decays,momentum,nonlinear",
                         itertools.product(["k", "v"], [False, True], [False, True], [False, True]))
def test_channel_dual_form_is_the_prefix_sum_of_its_steps(side, decays, momentum, nonlinear):
    """One chunk of the mini-batch form with decays over the columns (side k) or rows (side v) of W: every token's
    accumulator from its steps Y_t = Y_{t-1}∘α_t + S_t, S_t = S_{t-1}∘θ_t − η_t δ_t x_tᵀ (without momentum
    Y_t = Y_{t-1}∘α_t − η_t δ_t x_tᵀ), read as Y_t q_t or through a nonlinear per-token readout (tanh of the
    weights); with α over key columns, no momentum and the identity read also by the log-space path (fast)."""
    n = 6
    g = torch.Generator().manual_seed(6)
    width = DK if side == "k" else DV

    def rnd(*shape, low=0.5):
        return low + (1 - low) * torch.rand(*shape, generator=g, dtype=torch.float64)

    eta = rnd(B, H, n, low=0.0)
    alpha, theta = (rnd(B, H, n, width) if decays else None), (rnd(B, H, n, width) if momentum else None)
    W0 = torch.randn(B, H, DV, DK, generator=g, dtype=torch.float64)
    S0 = torch.randn(B, H, DV, DK, generator=g, dtype=torch.float64) if momentum else None
    qc, x = (torch.randn(B, H, n, DK, generator=g, dtype=torch.float64) for _ in range(2))
    delta = torch.randn(B, H, n, DV, generator=g, dtype=torch.float64)

    def scale(w, f):  # f over the side's channels
        return w * (f.unsqueeze(-2) if side == "k" else f.unsqueeze(-1))

    def read(acc, q):
        return torch.einsum("...tvk,...tk->...tv", torch.tanh(acc), q), [torch.tanh(acc[:, :, -1])]

    Y, S, outs = W0.clone(), (S0.clone() if momentum else None), []
    for t in range(n):
        step = -eta[:, :, t, None, None] * _outer(delta[:, :, t], x[:, :, t])
        if momentum:
            S = scale(S, theta[:, :, t]) + step
        Y = (Y if alpha is None else scale(Y, alpha[:, :, t])) + (S if momentum else step)
        outs.append(_read(torch.tanh(Y) if nonlinear else Y, qc[:, :, t]))
    o, W, Y_end, S_end = cf._channel_chunk_form([W0], None, [S0] if momentum else None, qc, delta, x, eta, alpha,
                                                theta, side, fast=False, read=read if nonlinear else None)
    torch.testing.assert_close(o, torch.stack(outs, 2), rtol=0, atol=1e-11)
    torch.testing.assert_close(W[0], torch.tanh(Y) if nonlinear else Y, rtol=0, atol=1e-11)
    if nonlinear:
        torch.testing.assert_close(Y_end[0], Y, rtol=0, atol=1e-11)
    if momentum:
        torch.testing.assert_close(S_end[0], S, rtol=0, atol=1e-11)
    if side == "k" and decays and not momentum and not nonlinear:
        o_fast, W_fast, _, _ = cf._channel_chunk_form([W0], None, None, qc, delta, x, eta, alpha, None, side, fast=True)
        torch.testing.assert_close(o_fast, o, rtol=0, atol=1e-11)
        torch.testing.assert_close(W_fast[0], W[0], rtol=0, atol=1e-11)


def test_each_form_s_entry_reads_the_module_s_coefficients_and_state():
    """The entries a module names as its `_chunked` (with the spec's choices bound) are their forms over c and the
    state: the same numbers as the forms called directly, a feature map applied to q and k first, a channel-wise η
    read only on the side it is bound to."""
    x = _inputs(7)
    c = {"eta": x["eta"], "alpha": x["alpha"], "theta": x["theta"], "kappa": x["kappa"], "eta_ch": x["eta_k"]}
    q, k, v, W = x["q"], x["k"], x["v"], x["W"]
    o, final = cf._delta_chunked(q, k, v, c, {"W": W}, 5, implicit=True, pre_decay=False)
    assert set(final) == {"W"} and torch.equal(o, cf._delta_chunks(q, k, v, c["eta"], c["alpha"], W, 5, True, False)[0])
    def phi(x):  # (a feature map of the same width; q and k are unit vectors)
        return torch.nn.functional.normalize(x, dim=-1)

    o, _ = cf._delta_chunked(q * 3, k * 3, v, c, {"W": W}, 5, implicit=False, pre_decay=True, features=phi)
    assert torch.allclose(o, cf._delta_chunks(q, k, v, c["eta"], c["alpha"], W, 5, False, True)[0], atol=1e-12)
    o, final = cf._momentum_delta_chunked(q, k, v, c, {"W": W, "S_W": x["S"]}, 5, pre_decay=True)
    ref = cf._momentum_delta_chunks(q, k, v, c["eta"], c["theta"], c["alpha"], W, x["S"], 5, True)
    assert set(final) == {"W", "S_W"} and torch.equal(o, ref[0]) and torch.equal(final["S_W"], ref[2])
    o, _ = cf._channel_delta_chunked(q, k, v, c, {"W": W}, 5, eta_side="k", alpha_side=None, implicit=False,
                                     pre_decay=False)
    ref = cf._channel_delta_chunks(q, k, v, c["eta"], c["eta_ch"], "k", c["alpha"], None, W, 5, False, False)[0]
    assert torch.equal(o, ref)
    for side, eta_k in (("k", c["eta_ch"]), (None, None)):
        o, _ = cf._gdelta_chunked(q, k, v, c, {"W": W}, 5, eta_side=side, erase_kappa=True, pre_decay=False)
        ref = cf._gdelta_chunks(q, k, v, c["kappa"], c["eta"], eta_k, c["alpha"], W, 5, True, False)[0]
        assert torch.equal(o, ref)
    assert not torch.allclose(o, cf._gdelta_chunked(q, k, v, c, {"W": W}, 5, eta_side="k", erase_kappa=True,
                                                    pre_decay=False)[0])
