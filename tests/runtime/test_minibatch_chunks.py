"""The mini-batch form's chunked algorithm (mirasc/runtime/minibatch_chunks.py), imported as it is with the example
memory of mirasc/runtime/memory_hooks.py (a linear memory, l2 bias): each readout's chunk step, with and without
momentum, and the Omega window, against a token-by-token float64 recurrence written here in which every gradient of a
mini-batch is taken at its anchor. The emitted modules' own memories are checked through them (tests/module)."""

import pytest
import torch

from mirasc.runtime import memory_hooks as mh
from mirasc.runtime import minibatch_chunks as mc

B, H, T, DK, DV, C = 1, 2, 11, 4, 3, 4


def _inputs(seed, momentum):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    c = {"eta": torch.sigmoid(rnd(B, H, T)) * 0.5, "alpha": torch.sigmoid(rnd(B, H, T) + 2)}
    if momentum:
        c["theta"] = torch.sigmoid(rnd(B, H, T))
    state = {"W": rnd(B, H, DV, DK) * 0.5}
    if momentum:
        state["S_W"] = rnd(B, H, DV, DK) * 0.1
    return rnd(B, H, T, DK), torch.nn.functional.normalize(rnd(B, H, T, DK), dim=-1), rnd(B, H, T, DV), c, state


def _grad(w, k, v):
    """∇ of ½‖W k − v‖² at W: (W k − v) kᵀ."""
    return (w @ k[..., None] - v[..., None]) @ k[..., None, :]


def _reference(q, k, v, c, state, read, anchor_of, lag=False):
    """Token by token: Y_t = α_t Y_{t-1} + S_t, S_t = θ_t S_{t-1} − η_t ∇ℓ_t(anchor) (no momentum: Y_t = α_t Y_{t-1}
    − η_t ∇ℓ_t(anchor)), the anchor the chunk's (anchor_of(Y at its start, W carried)); o_t = read(Y_t, n_c) q_t.
    lag: the chunk's first token takes a plain step at W carried and becomes the rest's anchor."""
    Y, S, W = state["W"], state.get("S_W"), state["W"]
    outs = []
    for c0 in range(0, T, C):
        anchor, scale = anchor_of(Y, W)
        for t in range(c0, min(c0 + C, T)):
            eta, alpha = c["eta"][:, :, t, None, None], c["alpha"][:, :, t, None, None]
            if lag and t == c0:
                Y = alpha * W - eta * _grad(W, k[:, :, t], v[:, :, t])
                anchor = Y
            else:
                step = -eta * _grad(anchor, k[:, :, t], v[:, :, t])
                if S is not None:
                    S = c["theta"][:, :, t, None, None] * S + step
                    step = S
                Y = alpha * Y + step
            outs.append((read(Y, scale) @ q[:, :, t, :, None])[..., 0])
        W = read(Y, scale)
    return torch.stack(outs, 2), W, S


@pytest.mark.parametrize("momentum", [False, True])
@pytest.mark.parametrize("readout", ["identity", "token", "lq"])
def test_chunk_steps(readout, momentum):
    q, k, v, c, state = _inputs(0, momentum)
    step = {"identity": mc._identity_chunk, "token": mc._token_chunk, "lq": mc._lq_chunk}[readout]
    read = {"identity": lambda y, s: y, "token": lambda y, s: mh._readout(y), "lq": lambda y, s: y * s}[readout]
    # gradients at W carried (the identity's and the per-token readout's), or at A_{s-1} / n_c (lq)
    anchor = {"lq": lambda y, w: (y / mh._lq_norm(y), 1 / mh._lq_norm(y))}.get(readout, lambda y, w: (w, None))
    if readout != "identity":  # the readout's accumulator, carried apart from W
        state["A_W"] = state["W"]
    o, final = mc._minibatch_chunks(q, k, v, c, state, C, step)
    o_ref, w_ref, s_ref = _reference(q, k, v, c, state, read, anchor)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final["W"], w_ref, rtol=1e-10, atol=1e-10)
    if momentum:
        torch.testing.assert_close(final["S_W"], s_ref, rtol=1e-10, atol=1e-10)


def test_lag_token_chunk():
    """The kl chunk readout's orchestration: the lag token's full step, then the rest at its state."""
    q, k, v, c, state = _inputs(1, False)
    o, final = mc._minibatch_chunks(q, k, v, c, state, C, mc._kl_chunk)
    o_ref, w_ref, _ = _reference(q, k, v, c, state, lambda y, s: y, lambda y, w: (w, None), lag=True)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final["W"], w_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("readout", ["identity", "token"])
def test_omega_window(monkeypatch, readout):
    """The Omega rule: step t's gradient is Σ_{i = t−c+1..t} γ_i ∇ℓ_i at the anchor, the window carried across calls
    (the state's win_*): two calls on halves equal one call on the whole."""
    monkeypatch.setattr(mc, "WINDOW_COEFS", ("gamma",))
    window = mc.WINDOW
    q, k, v, c, state = _inputs(2, False)
    g = torch.Generator().manual_seed(3)
    c["gamma"] = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    state.update(win_k=torch.zeros(B, H, window - 1, DK, dtype=torch.float64),
                 win_v=torch.zeros(B, H, window - 1, DV, dtype=torch.float64),
                 win_gamma=torch.zeros(B, H, window - 1, 1, dtype=torch.float64))
    if readout == "token":
        state["A_W"] = state["W"]
    step = mc._identity_chunk if readout == "identity" else mc._token_chunk
    read = (lambda y: y) if readout == "identity" else mh._readout
    o, final = mc._minibatch_chunks(q, k, v, c, state, C, step, (mc._omega_sequence, mc._omega_factors))
    Y = W = state["W"]
    outs = []
    for c0 in range(0, T, C):
        anchor = W
        for t in range(c0, min(c0 + C, T)):
            grad = sum(c["gamma"][:, :, i, None, None] * _grad(anchor, k[:, :, i], v[:, :, i])
                       for i in range(max(0, t - window + 1), t + 1))
            Y = c["alpha"][:, :, t, None, None] * Y - c["eta"][:, :, t, None, None] * grad
            outs.append((read(Y) @ q[:, :, t, :, None])[..., 0])
        W = read(Y)
    torch.testing.assert_close(o, torch.stack(outs, 2), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final["W"], W, rtol=1e-10, atol=1e-10)
    # the window carried: the second half after the first equals the whole
    half = 8  # (a whole number of chunks)
    cut = lambda x, a, b: x[:, :, a:b]  # noqa: E731
    o1, s1 = mc._minibatch_chunks(cut(q, 0, half), cut(k, 0, half), cut(v, 0, half),
                                  {n: cut(x, 0, half) for n, x in c.items()}, state, C, step,
                                  (mc._omega_sequence, mc._omega_factors))
    o2, _ = mc._minibatch_chunks(cut(q, half, T), cut(k, half, T), cut(v, half, T),
                                 {n: cut(x, half, T) for n, x in c.items()}, s1, C, step,
                                 (mc._omega_sequence, mc._omega_factors))
    torch.testing.assert_close(torch.cat([o1, o2], 2), o, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("decay", [False, True])
def test_muon_chunk(decay):
    """muon's chunk: S_t = θ_t S_{t-1} + ∇ℓ_t(anchor), W_t = α_t W_{t-1} − η_t NS(S_t), every NS of a chunk at once."""
    from mirasc.runtime.memory_ops import _newton_schulz

    q, k, v, c, state = _inputs(4, True)
    if not decay:
        del c["alpha"]
    o, final = mc._minibatch_chunks(q, k, v, c, state, C, mc._muon_chunk)
    W, S, outs = state["W"], state["S_W"], []
    for c0 in range(0, T, C):
        anchor = W
        for t in range(c0, min(c0 + C, T)):
            S = c["theta"][:, :, t, None, None] * S + _grad(anchor, k[:, :, t], v[:, :, t])
            alpha = c["alpha"][:, :, t, None, None] if decay else 1.0
            W = alpha * W - c["eta"][:, :, t, None, None] * _newton_schulz(S)
            outs.append((W @ q[:, :, t, :, None])[..., 0])
    torch.testing.assert_close(o, torch.stack(outs, 2), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(final["W"], W, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(final["S_W"], S, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("side", ["k", "v"])
@pytest.mark.parametrize("readout", ["identity", "token", "lq"])
def test_channel_chunks(monkeypatch, side, readout):
    """Channel-wise decays (mirasc/runtime/channel_chunks.py): α per channel of `side` scales W's columns (k) or rows
    (v); the channel-wise step, its per-token read, and a chunk readout's step on the channel-wise _chunk_run (as an
    emitted module pastes it in place of the dual form's)."""
    from mirasc.runtime import channel_chunks as cch

    monkeypatch.setattr(cch, "CHANNEL_SIDE", side)
    monkeypatch.setattr(cch, "CHANNEL_READ", cch._token_read if readout == "token" else None)
    monkeypatch.setattr(mc, "_chunk_run", cch._chunk_run)
    q, k, v, c, state = _inputs(5, True)
    if readout != "identity":
        state["A_W"] = state["W"]
    width = DK if side == "k" else DV
    g = torch.Generator().manual_seed(6)
    c["alpha"] = torch.sigmoid(torch.randn(B, H, T, width, generator=g, dtype=torch.float64) + 2)
    step = mc._lq_chunk if readout == "lq" else cch._channel_chunk
    o, final = mc._minibatch_chunks(q, k, v, c, state, C, step)

    def on_side(w, a):
        return w * (a[..., None, :] if side == "k" else a[..., :, None])

    read = {"identity": lambda y, s: y, "token": lambda y, s: mh._readout(y), "lq": lambda y, s: y * s}[readout]
    Y, S, W = state["W"], state["S_W"], state["W"]
    outs = []
    for c0 in range(0, T, C):
        scale = 1 / mh._lq_norm(Y) if readout == "lq" else None
        anchor = Y * scale if readout == "lq" else W
        for t in range(c0, min(c0 + C, T)):
            grad = _grad(anchor, k[:, :, t], v[:, :, t])
            S = c["theta"][:, :, t, None, None] * S - c["eta"][:, :, t, None, None] * grad
            Y = on_side(Y, c["alpha"][:, :, t]) + S
            outs.append((read(Y, scale) @ q[:, :, t, :, None])[..., 0])
        W = read(Y, scale)
    torch.testing.assert_close(o, torch.stack(outs, 2), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final["W"], W, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final["S_W"], S, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("readout, momentum", [("lq", False), ("lq", True), ("kl", False)])  # (the example lag
def test_chunk_readouts_on_kernels(monkeypatch, readout, momentum):  # step carries no momentum)
    """The chunk readouts on a kernel path (mirasc/runtime/chunk_readouts.py), one launch per chunk in weight space
    (lq: anchored at A/n_c with updates scaled by the coefficient lqs0 = 1/n_c; kl: the lag token, then the rest at
    W_s), with the identity-readout torch chunks standing in for the kernels: equal to the torch path's chunk step."""
    from mirasc.runtime import chunk_readouts as cr

    monkeypatch.setattr(cr, "_MOMENTUM", momentum)
    q, k, v, c, state = _inputs(7, momentum)
    if readout == "lq":
        state["A_W"] = state["W"] * 2.0

    def kernels(q, k, v, c, state, chunk, prec=None):  # the kernels' function: W-space chunks, updates η·lqs0
        c = dict(c)
        if "lqs0" in c:
            c["eta"] = c["eta"] * c.pop("lqs0")
        return mc._minibatch_chunks(q, k, v, c, state, chunk, mc._identity_chunk)

    on_kernels = cr._lq_on_kernels if readout == "lq" else cr._kl_on_kernels
    o, final = on_kernels(q, k, v, c, state, C, "ieee", kernels)
    o_ref, final_ref = mc._minibatch_chunks(q, k, v, c, state, C, mc._lq_chunk if readout == "lq" else mc._kl_chunk)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    for key in final_ref:
        torch.testing.assert_close(final[key], final_ref[key], rtol=1e-10, atol=1e-10)
