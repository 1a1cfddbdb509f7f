"""mirasc/runtime/token_step.py on its own, in float64, with the example memory of mirasc.runtime.memory_hooks (a linear
memory W [Dv, Dk], the l2 bias, gd, no retention): the token recurrence against loops written here from
docs/semantics.md (plain, mini-batch anchors, the erase's write, the Omega window), the Layer's token reads, and kl's
lag token."""

import pytest
import torch

from mirasc.runtime import token_step as ts


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _inputs(B=2, H=3, T=7, Dk=4, Dv=5, seed=0):
    g = _gen(seed)
    q, k = (torch.randn(B, H, T, Dk, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
    eta = torch.rand(B, H, T, generator=g, dtype=torch.float64) * 0.5
    W0 = torch.randn(B, H, Dv, Dk, generator=g, dtype=torch.float64) * 0.3
    return q, k, v, eta, W0


def _loop(q, k, v, eta, W0, C=None, write=False):
    """W_t = W_{t−1} − η_t (A k_t − v_t) k_tᵀ (+ v_t k_tᵀ), A the weights at the token's mini-batch start (W_{t−1}
    without mini-batches), o_t = W_t q_t."""
    W, anchor, outs = W0, W0, []
    for t in range(q.shape[2]):
        if C is None or t % C == 0:
            anchor = W
        k_t, v_t = k[:, :, t, :, None], v[:, :, t, :, None]
        W = W - eta[:, :, t, None, None] * ((anchor @ k_t - v_t) @ k_t.transpose(-1, -2))
        if write:
            W = W + v_t @ k_t.transpose(-1, -2)
        outs.append((W @ q[:, :, t, :, None])[..., 0])
    return torch.stack(outs, dim=2), W


@pytest.mark.parametrize("C, write", [(None, False), (3, False), (None, True)])
def test_the_recurrence_is_the_token_loop(monkeypatch, C, write):
    monkeypatch.setattr(ts, "MINIBATCH", C)
    monkeypatch.setattr(ts, "ERASE_WRITE", write)
    q, k, v, eta, W0 = _inputs()
    o, final = ts._recurrent(q, k, v, {"eta": eta}, {"W": W0})
    o_ref, W_ref = _loop(q, k, v, eta, W0, C, write)
    assert torch.allclose(o, o_ref, atol=1e-12) and torch.allclose(final["W"], W_ref, atol=1e-12)


def test_rows_at_different_tokens_start_their_mini_batches_apart(monkeypatch):
    """A decoding batch whose rows have read different numbers of tokens (t one count per row): each row's anchor
    moves at its own mini-batch starts."""
    monkeypatch.setattr(ts, "MINIBATCH", 2)
    q, k, v, eta, W0 = _inputs(B=2, T=4)
    carry = {"W": [W0], "Y": None, "S": None, "anchor": (W0,), "t": torch.tensor([0, 1]), "win": None}
    outs = []
    for t in range(4):
        carry, o_t = ts._token_step(carry, q[:, :, t, None], k[:, :, t, None], v[:, :, t, None],
                                    {"eta": eta[:, :, t, None, None]})
        outs.append(o_t)
    o = torch.cat(outs, dim=2)
    for row, offset in ((0, 0), (1, 1)):  # row 1 is one token into its first mini-batch: it starts at t = 1
        first = [(offset + t) % 2 == 0 for t in range(4)]
        W, anchor = W0[row], W0[row]
        for t in range(4):
            if first[t]:
                anchor = W
            k_t, v_t = k[row, :, t, :, None], v[row, :, t, :, None]
            W = W - eta[row, :, t, None, None] * ((anchor @ k_t - v_t) @ k_t.transpose(-1, -2))
            assert torch.allclose(o[row, :, t], (W @ q[row, :, t, :, None])[..., 0], atol=1e-12), (row, t)


def test_per_row_picks_by_a_bool_or_one_bool_per_row():
    new, old = torch.ones(2, 3, 4), torch.zeros(2, 3, 4)
    assert ts._per_row(True, new, old) is new and ts._per_row(False, new, old) is old
    mixed = ts._per_row(torch.tensor([True, False]), new, old)
    assert torch.equal(mixed[0], new[0]) and torch.equal(mixed[1], old[1])


def test_the_omega_window_sums_the_weighted_losses_of_its_tokens():
    """The factors over a window of c = 3 tokens (two carried, this one) give Σ_i γ_i ∇ℓ_i at the same weights, and
    the window moves on by one token."""
    g = _gen(2)
    B, H, Dk, Dv = 1, 2, 3, 4
    win = {"k": torch.randn(B, H, 2, Dk, generator=g, dtype=torch.float64),
           "v": torch.randn(B, H, 2, Dv, generator=g, dtype=torch.float64),
           "gamma": torch.rand(B, H, 2, 1, generator=g, dtype=torch.float64),
           "eta": torch.rand(B, H, 2, 1, generator=g, dtype=torch.float64)}
    k_t = torch.randn(B, H, 1, Dk, generator=g, dtype=torch.float64)
    v_t = torch.randn(B, H, 1, Dv, generator=g, dtype=torch.float64)
    c_t = {"gamma": torch.rand(B, H, 1, 1, generator=g, dtype=torch.float64),
           "eta": torch.rand(B, H, 1, 1, generator=g, dtype=torch.float64)}
    W = [torch.randn(B, H, Dv, Dk, generator=g, dtype=torch.float64)]
    carry = {"win": win}
    (delta, x), = ts._window_factors(carry, W, k_t, v_t, c_t)
    ks, vs = torch.cat([win["k"], k_t], 2), torch.cat([win["v"], v_t], 2)
    gammas = torch.cat([win["gamma"], c_t["gamma"]], 2)
    expected = sum(gammas[:, :, i, :, None] * ((W[0] @ ks[:, :, i, :, None] - vs[:, :, i, :, None])
                                               @ ks[:, :, i, None, :]) for i in range(3))
    assert torch.allclose(delta.transpose(-1, -2) @ x, expected, atol=1e-12)
    assert torch.equal(carry["win"]["k"], ks[:, :, 1:]) and torch.equal(carry["win"]["gamma"], gammas[:, :, 1:])
    assert set(carry["win"]) == {"k", "v", "gamma", "eta"}


def test_read_tokens_steps_each_inner_token_in_the_state_dtype():
    """Layer.step's read over n inner tokens ([B, n, H, D] inputs) is n token steps, coefficients cast to the
    inputs' dtype, and returns the last read."""
    q, k, v, eta, W0 = _inputs(B=1, H=2, T=3)
    carry = {"W": [W0], "Y": None, "S": None, "anchor": (W0,), "t": 0, "win": None}
    carry, o_t = ts._read_tokens(carry, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 {"eta": eta.float()}, None)
    o_ref, W_ref = _loop(q, k, v, eta.float().double(), W0)
    assert carry["t"] == 3 and torch.allclose(carry["W"][0], W_ref, atol=1e-12)
    assert o_t.shape == (1, 2, 1, 5) and torch.allclose(o_t[:, :, 0], o_ref[:, :, -1], atol=1e-12)


def test_kl_lag_token_is_the_full_step_in_log_space(monkeypatch):
    """A chunk readout's lag token: W_s = c·softmax(α log max(W, 1e-12) + U) from the gradient at W_{s-1}, read at
    W_s."""
    monkeypatch.setattr(ts, "KL_C", 2.0)
    g = _gen(3)
    B, H, Dk, Dv = 1, 2, 3, 4
    W = [torch.softmax(torch.randn(B, H, Dv, Dk, generator=g, dtype=torch.float64), -1) * 2.0]
    W[0][..., 0, 0] = 0.0  # a zero weight: log of the clamp, no -inf
    q1, k1 = (torch.randn(B, H, 1, Dk, generator=g, dtype=torch.float64) for _ in range(2))
    v1 = torch.randn(B, H, 1, Dv, generator=g, dtype=torch.float64)
    g1 = {"eta": torch.full((B, H, 1, 1), 0.3, dtype=torch.float64),
          "alpha": torch.full((B, H, 1, 1), 0.9, dtype=torch.float64)}
    o, W_s, S = ts._lag_step(W, None, q1, k1, v1, g1)
    update = -0.3 * ((k1 @ W[0].transpose(-1, -2) - v1).transpose(-1, -2) @ k1)
    expected = 2.0 * torch.softmax(0.9 * torch.log(W[0].clamp_min(1e-12)) + update, dim=-1)
    assert S is None and torch.isfinite(W_s[0]).all() and torch.allclose(W_s[0], expected, atol=1e-12)
    assert torch.allclose(o, q1 @ expected.transpose(-1, -2), atol=1e-12)


def test_the_omega_rule_takes_each_step_over_the_window(monkeypatch):
    """With the Omega window as the token's gradient (`_token_factors`), W_t = W_{t−1} − η_t Σ_{i=t−2..t} γ_i
    (W_{t−1} k_i − v_i) k_iᵀ, the window starting empty (zero keys, values and γ), and the carry's window ends holding
    the last two tokens."""
    monkeypatch.setattr(ts, "_token_factors", ts._window_factors)
    q, k, v, eta, W0 = _inputs(B=1, H=2, T=6, seed=4)
    gamma = torch.rand(eta.shape, generator=_gen(5), dtype=torch.float64)
    B, H, T, Dk = k.shape
    Dv = v.shape[-1]
    win = {"k": torch.zeros(B, H, 2, Dk, dtype=torch.float64), "v": torch.zeros(B, H, 2, Dv, dtype=torch.float64),
           "gamma": torch.zeros(B, H, 2, 1, dtype=torch.float64), "eta": torch.zeros(B, H, 2, 1, dtype=torch.float64)}
    carry = {"W": [W0], "Y": None, "S": None, "anchor": (W0,), "t": 0, "win": win}
    W = W0
    for t in range(T):
        c_t = {"eta": eta[:, :, t, None, None], "gamma": gamma[:, :, t, None, None]}
        carry, o_t = ts._token_step(carry, q[:, :, t, None], k[:, :, t, None], v[:, :, t, None], c_t)
        grad = sum(gamma[:, :, i, None, None] * ((W @ k[:, :, i, :, None] - v[:, :, i, :, None])
                                                 @ k[:, :, i, None, :]) for i in range(max(0, t - 2), t + 1))
        W = W - eta[:, :, t, None, None] * grad
        assert torch.allclose(o_t[:, :, 0], (W @ q[:, :, t, :, None])[..., 0], atol=1e-12), t
    assert torch.allclose(carry["W"][0], W, atol=1e-12) and torch.equal(carry["win"]["k"], k[:, :, T - 2:])
