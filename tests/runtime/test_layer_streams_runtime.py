"""mirasc.runtime.layer_streams, the Layer's q, k, v streams every emitted module carries: the convolution's initial
weights (key_shift on the key rows' previous-token tap only, and a one-tap convolution, which has none) and the
projection cut into q and each inner step's k and v."""

from __future__ import annotations

import torch

from mirasc.runtime.layer_streams import _conv_weight, _per_step, _streams


def test_conv_weight_starts_near_identity_with_the_key_shift_on_key_rows():
    torch.manual_seed(0)
    plain = _conv_weight(12, 4, slice(4, 8))
    torch.manual_seed(0)
    shifted = _conv_weight(12, 4, slice(4, 8), key_shift=0.5)
    assert plain.requires_grad and (plain[:, -1] - 1).abs().max() < 0.2 and plain[:, :-1].abs().max() < 0.2
    want = torch.zeros(12, 4)
    want[4:8, -2] = 0.5
    assert torch.allclose(shifted - plain, want, atol=1e-7)
    one_tap = _conv_weight(12, 1, slice(4, 8))  # no tap one token back: nothing to shift, and no error
    assert one_tap.shape == (12, 1)


def test_streams_cut_q_then_each_steps_keys_then_values():
    B, T, H, D = 2, 3, 2, 4
    n = H * D
    qkv = torch.arange(B * T * 3 * n, dtype=torch.float64).view(B, T, 3 * n)
    q, k, v = _streams(qkv, H, D)
    assert torch.equal(q, qkv[..., :n].view(B, T, H, D)) and torch.equal(k, qkv[..., n:2 * n].view(B, T, H, D))
    assert torch.equal(v, qkv[..., 2 * n:].view(B, T, H, D))
    S = 3
    qkv = torch.randn(B, T, (1 + 2 * S) * n)
    q, k, v = _streams(qkv, H, D, S)
    assert q.shape == (B, T, H, D) and k.shape == v.shape == (B, T, H, S, D)
    for j in range(S):  # step j's keys are the j-th block of H·D after q, head-major within it
        assert torch.equal(k[:, :, :, j], qkv[..., n + j * n:n + (j + 1) * n].view(B, T, H, D))
        assert torch.equal(v[:, :, :, j], qkv[..., (1 + S + j) * n:(2 + S + j) * n].view(B, T, H, D))
    assert torch.equal(_per_step(qkv[..., :S * n], H, D, S)[:, :, 1, 2], qkv[..., 2 * n + D:2 * n + 2 * D])
