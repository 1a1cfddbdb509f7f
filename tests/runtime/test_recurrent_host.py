"""The fused recurrent kernels' host side (mirasc/runtime/recurrent_host.py), imported as it is with the stand-ins
of mirasc/runtime/recurrent_spec.py (a linear memory, l2 bias, gd): the state a launch carries, launch_plan's kernels
and their refusal, and the Omega window's rows (the chunk kernels' inputs). The launches run through emitted modules
(tests/triton_backend/test_triton_recurrent.py, test_triton_omega.py)."""

import pytest
import torch

from mirasc.runtime import recurrent_host as rh


def test_state_keys_and_plan(monkeypatch):
    assert rh._state_keys() == ["W"]
    monkeypatch.setattr(rh, "_STORE_ACC", True)
    monkeypatch.setattr(rh, "_MOMENTUM", True)
    assert rh._state_keys() == ["W", "A_W", "S_W"]
    plan = rh._recurrent_plan(64, 64)
    assert set(plan) == {"_fused_recurrent_fwd", "_fused_recurrent_bwd"} and all(plan.values())
    with pytest.raises(RuntimeError, match="registers|fit"):
        rh._recurrent_plan(1 << 14, 1 << 14)  # no configuration holds such a state


def test_omega_rows_fold_the_window(monkeypatch):
    """_on_chunk_kernels with a window of c: token t becomes c rows, row j writing window token t − c + 1 + j (the
    carried c − 1 tokens first) at rate η_t γ_i, α_t on row 0 only, q_t on the last row only, whose output is token
    t's; a chunk of n tokens is n·c rows, and the window left is the last c − 1 tokens."""
    monkeypatch.setattr(rh, "_WINDOW", 3)
    monkeypatch.setattr(rh, "_WINDOW_COEFS", ("gamma",))
    B, H, T, D = 1, 1, 4, 2
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    c = {"eta": torch.rand(B, H, T, dtype=torch.float64), "gamma": torch.rand(B, H, T, dtype=torch.float64),
         "alpha": torch.rand(B, H, T, dtype=torch.float64)}
    state = {"W": torch.zeros(B, H, D, D, dtype=torch.float64), "win_k": torch.randn(B, H, 2, D, dtype=torch.float64),
             "win_v": torch.randn(B, H, 2, D, dtype=torch.float64), "win_gamma": torch.rand(B, H, 2, 1,
                                                                                        dtype=torch.float64)}
    seen = {}

    def fn(q_rows, k_rows, v_rows, c_rows, st, chunk):
        seen.update(q=q_rows, k=k_rows, v=v_rows, c=c_rows, chunk=chunk)
        return q_rows[..., :1].expand(*q_rows.shape[:3], D), {"W": st["W"]}

    o, final = rh._on_chunk_kernels(fn, q, k, v, c, state, 4)
    assert seen["chunk"] == 12 and seen["q"].shape[2] == 12  # c rows a token, a chunk of n tokens n·c rows
    k_all = torch.cat([state["win_k"], k], 2)
    g_all = torch.cat([state["win_gamma"][..., 0], c["gamma"]], 2)
    for t in range(T):
        rows = slice(3 * t, 3 * t + 3)
        torch.testing.assert_close(seen["k"][:, :, rows], k_all[:, :, t:t + 3])  # window tokens t−2 .. t
        torch.testing.assert_close(seen["c"]["eta"][:, :, rows], c["eta"][:, :, t, None] * g_all[:, :, t:t + 3])
        assert seen["c"]["alpha"][0, 0, 3 * t] == c["alpha"][0, 0, t]  # α once a step, on its first row
        assert bool((seen["c"]["alpha"][:, :, 3 * t + 1:3 * t + 3] == 1).all())
        assert bool((seen["q"][:, :, 3 * t:3 * t + 2] == 0).all())  # q on the last row only
    torch.testing.assert_close(o[..., 0], q[..., 0])  # the output is the last row's
    torch.testing.assert_close(final["win_k"], k[:, :, -2:])
