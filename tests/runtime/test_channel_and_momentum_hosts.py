"""The chunk hosts that the emitted modules otherwise exercise only as a whole, imported and run as they are under the
interpreter, each against float64 torch written from its contract (outputs and gradients):

- chunk_channel_host.py (a decay over key channels): `_log_decays`, the cumulative log-decays inside each chunk, and
  `_channel_scores`, P_ts = Σ_j a_tj b_sj e^{x_tj − y_sj} for s < t, each one op over the kernels of
  mirasc/runtime/kernels/chunk_channel.py;
- momentum_host.py: the momentum delta rule's chunked path (`_chunked_triton`: torch preparation, the scans of
  mirasc/runtime/kernels/momentum.py, the outputs), against its token recurrence (docs/semantics.md, the momentum
  learner), and the scans' autotuning space;
- chunk_ops.py: the Hebbian write as one op (`_hebbian_on_kernels`), against its token recurrence.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from mirasc.runtime import chunk_channel_host as cch  # noqa: E402
from mirasc.runtime import chunk_ops, momentum_host  # noqa: E402

f64 = torch.float64


def _grads(out, inputs, seed=0):
    """The gradients of a fixed random projection of `out` (a tuple of tensors) with respect to `inputs`."""
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o.double() * torch.randn(o.shape, generator=gen, dtype=f64)).sum() for o in out)
    return torch.autograd.grad(loss, inputs)


def test_log_decays_are_the_chunks_cumulative_log_alphas():
    """g [B, H, NT, n, Dk]: Σ_{r<=t} log α_r inside each chunk of n tokens, tokens past T as α = 1, α = 0 clamped at
    the smallest normal float; α read in its layout ([B, T, H, Dk] viewed as [B, H, T, Dk] too)."""
    B, H, T, Dk, n = 2, 3, 21, 20, 8
    NT = -(-T // n)
    gen = torch.Generator().manual_seed(1)
    for tf in (False, True):
        raw = 0.5 + 0.5 * torch.rand((B, T, H, Dk) if tf else (B, H, T, Dk), generator=gen)
        (raw.transpose(1, 2) if tf else raw)[0, 1, 3, 2] = 0.0  # (α = 0: log clamped, not -inf)
        raw.requires_grad_(True)
        alpha = raw.transpose(1, 2) if tf else raw
        assert alpha.is_contiguous() != tf
        g = cch._log_decays(alpha, n, NT)
        ref_alpha = torch.nn.functional.pad(alpha.detach().double(), (0, 0, 0, NT * n - T), value=1.0)
        logs = torch.log(ref_alpha.clamp_min(torch.finfo(torch.float32).tiny))
        ref = logs.view(B, H, NT, n, Dk).cumsum(3)
        assert g.shape == (B, H, NT, n, Dk) and torch.allclose(g.double(), ref, rtol=1e-5, atol=1e-5), tf
        live = alpha.detach() > 0  # (the clamp's gradient is 0 at α = 0; elsewhere d/dα Σ log α = 1/α)
        (da,) = _grads((g,), (raw,))
        alpha64 = alpha.detach().double().requires_grad_(True)
        ref64 = torch.nn.functional.pad(torch.log(alpha64.clamp_min(torch.finfo(torch.float32).tiny)),
                                        (0, 0, 0, NT * n - T)).view(B, H, NT, n, Dk).cumsum(3)
        (da_ref,) = _grads((ref64,), (alpha64,))
        da = da.transpose(1, 2) if tf else da
        assert torch.allclose(da.double()[live], da_ref[live], rtol=1e-4, atol=1e-4), tf


def test_channel_scores_match_their_sum_and_its_gradients():
    """P_ts = Σ_j a_tj b_sj e^{x_tj − y_sj} for s < t (0 on and above the diagonal) of every chunk, with x = y the
    falling cumulative log-decay (the chunk form's use); a chunk of 12 rows runs on tiles of 16."""
    B, H, NT, n, Dk = 1, 2, 2, 12, 24
    gen = torch.Generator().manual_seed(2)
    a, b = (torch.randn(B, H, NT, n, Dk, generator=gen).requires_grad_(True) for _ in range(2))
    logs = torch.log(0.6 + 0.4 * torch.rand(B, H, NT, n, Dk, generator=gen))
    y = logs.cumsum(3).requires_grad_(True)
    p = cch._channel_scores(a, b, y, y)
    a64, b64, y64 = (t.detach().double().requires_grad_(True) for t in (a, b, y))
    ref = torch.einsum("bhctj,bhcsj,bhctj,bhcsj->bhcts", a64, b64, y64.exp(), (-y64).exp())
    ref = ref * torch.ones(n, n, dtype=f64).tril(-1)
    assert p.shape == (B, H, NT, n, n) and torch.allclose(p.double(), ref, rtol=1e-4, atol=1e-5)
    got, want = _grads((p,), (a, b, y)), _grads((ref,), (a64, b64, y64))
    for name, g, r in zip("aby", got, want):
        assert torch.allclose(g.double(), r, rtol=1e-4, atol=1e-4), name


def _momentum_reference(q, k, v, eta, theta, w0, s0):
    """The momentum delta rule token by token: δ_t = η_t (v_t − W_{t−1} k_t), S_t = θ_t S_{t−1} + δ_t k_tᵀ,
    W_t = W_{t−1} + S_t, o_t = W_t q_t (no decay)."""
    W, S, outs = w0, s0, []
    for t in range(q.shape[2]):
        kt = k[:, :, t, :, None]
        delta = eta[:, :, t, None, None] * (v[:, :, t, :, None] - W @ kt)
        S = theta[:, :, t, None, None] * S + delta @ kt.transpose(-1, -2)
        W = W + S
        outs.append((W @ q[:, :, t, :, None])[..., 0])
    return torch.stack(outs, 2), W, S


def test_momentum_delta_rule_chunks_match_the_token_recurrence():
    """momentum_host._chunked_triton (the chunk-local solve in torch, the [W, S] scans, the outputs as matmuls) over
    3 chunks of 16 with a partial last one, against the float64 token recurrence: outputs, final W and S, and the
    gradients of q, k, v, η, θ and the initial W and S."""
    B, H, T, D, n = 1, 2, 37, 16, 16
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(B, H, T, D, generator=gen)
    eta, theta = 0.5 * torch.rand(B, H, T, generator=gen), 0.8 * torch.rand(B, H, T, generator=gen)
    w0, s0 = 0.1 * torch.randn(B, H, D, D, generator=gen), 0.1 * torch.randn(B, H, D, D, generator=gen)
    inputs = [x.clone().requires_grad_(True) for x in (q, k, v, eta, theta, w0, s0)]
    o, final = momentum_host._chunked_triton(*inputs[:3], {"eta": inputs[3], "theta": inputs[4]},
                                             {"W": inputs[5], "S_W": inputs[6]}, n)
    inputs64 = [x.detach().double().requires_grad_(True) for x in inputs]
    o_ref, w_ref, s_ref = _momentum_reference(*inputs64)
    for got, want, name in ((o, o_ref, "o"), (final["W"], w_ref, "W"), (final["S_W"], s_ref, "S")):
        assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4), name
    got, want = _grads((o, final["W"], final["S_W"]), inputs), _grads((o_ref, w_ref, s_ref), inputs64)
    for name, g, r in zip(("q", "k", "v", "eta", "theta", "W0", "S0"), got, want):
        assert torch.allclose(g.double(), r, rtol=1e-3, atol=1e-3), name


def test_momentum_scans_space():
    """The scans' GPU space: full-fp32 dots only BV = 16 at 8 warps; bf16 BV 16 and 32 (no wider than Dv), 4 and 8
    warps up to Dk = 64 and 8 above; one stage. On the CPU interpreter a launch takes BV = 16, untuned."""
    def space(Dk, Dv, prec):
        return [(c.kwargs["BV"], c.num_warps, c.num_stages) for c in momentum_host._mom_configs(Dk, Dv, prec)]

    assert space(128, 128, "ieee") == [(16, 8, 1)]
    assert space(64, 64, "bf16") == [(16, 4, 1), (16, 8, 1), (32, 4, 1), (32, 8, 1)]
    assert space(128, 64, "bf16") == [(16, 8, 1), (32, 8, 1)]
    assert space(64, 16, "bf16") == [(16, 4, 1), (16, 8, 1)]
    kernel, tile = momentum_host._mom_kernel(momentum_host._mom_state_fwd, torch.empty(1), 64, 64, 16, "bf16")
    assert kernel is momentum_host._mom_state_fwd and tile == {"BV": 16}


def test_hebbian_write_on_one_op_matches_its_recurrence():
    """chunk_ops._hebbian_on_kernels (one op, q, k, v read as they are, a key width padded to a multiple of 16):
    W_t = α_t W_{t−1} + η_t v_t k_tᵀ, o_t = W_t q_t with one log-decay per head, against float64, and gradients."""
    B, H, T, Dk, Dv, n = 1, 2, 32, 20, 16, 16
    NT = T // n
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(B, H, T, Dk, generator=gen) / Dk ** 0.5 for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=gen)
    eta, alpha = 0.5 * torch.rand(B, H, T, generator=gen), 0.7 + 0.3 * torch.rand(B, H, T, generator=gen)
    w0 = 0.1 * torch.randn(B, H, Dv, Dk, generator=gen)
    inputs = [x.clone().requires_grad_(True) for x in (q, k, v, eta, alpha, w0)]
    g = torch.log(inputs[4]).view(B, H, NT, n).cumsum(-1)
    o, final = chunk_ops._hebbian_on_kernels(inputs[0], inputs[1], inputs[2], {}, {"W": inputs[5]},
                                             inputs[3].view(B, H, NT, n), g, lambda x: x.unflatten(2, (NT, n)), "ieee")
    q64, k64, v64, eta64, alpha64, w64 = (x.detach().double().requires_grad_(True) for x in inputs)
    W, outs = w64, []
    for t in range(T):
        W = alpha64[:, :, t, None, None] * W + eta64[:, :, t, None, None] * (v64[:, :, t, :, None]
                                                                          @ k64[:, :, t, None, :])
        outs.append((W @ q64[:, :, t, :, None])[..., 0])
    o_ref = torch.stack(outs, 2)
    assert torch.allclose(o.double(), o_ref, rtol=1e-4, atol=1e-4)
    assert torch.allclose(final["W"].double(), W, rtol=1e-4, atol=1e-4)
    got = _grads((o, final["W"]), inputs)
    want = _grads((o_ref, W), (q64, k64, v64, eta64, alpha64, w64))
    for name, a, b in zip(("q", "k", "v", "eta", "alpha", "W0"), got, want):
        assert torch.allclose(a.double(), b, rtol=1e-3, atol=1e-3), name
