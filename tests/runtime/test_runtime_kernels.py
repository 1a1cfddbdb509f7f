"""The Triton kernels that live as real modules (mirasc/runtime/kernels/), imported and launched directly under the
interpreter, against float64 torch written from their contracts; and that the emitted modules carry them
verbatim (mirasc.codegen.standalone.kernels_source).

- dots.py: `_chunk_dot` for each PREC — exact fp32 ("ieee"), bf16 operands rounded to nearest, split bf16
  (hi·hi + lo·hi + hi·lo), always accumulating in fp32.
- minibatch.py: `_mb_dot`, exact ("ieee") and with each fp32 operand as two bf16 parts ("bf16x3_emulated",
  what the interpreter runs for the GPU's bf16x3).
- chunk.py: the state scan (1) with one log-decay per head or per key channel (one kernel, CH), with and without
  a second key block, and the output kernel (2), against (1)-(2) in float64 (the families'
  kernels as a whole: tests/triton_backend/test_triton_chunked.py, test_triton_channel_chunks.py through the
  emitted modules).
- attention.py, flash.py: the causal flash forward (output and log-sum-exp) and the backward's δ, against softmax
  attention in float64 (the flash and stick-breaking paths as a whole: tests/attention/test_attention_triton.py,
  test_stickbreaking.py).
- momentum.py: the momentum delta rule's scans over [W, S] (docs/semantics.md, the momentum learner): the
  forward's chunk states, u and final state, and the reverse scan against torch autograd of the same recurrence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mirasc.codegen.standalone import kernels_source  # noqa: E402
from mirasc.compiler import compile_text  # noqa: E402
from mirasc.runtime.kernels import (  # noqa: E402
    attention,
    chunk,
    dots,
    flash,
    minibatch,
    momentum,
)

f64 = torch.float64
SPECS = Path(__file__).resolve().parents[2] / "specs"


def _bf16(x):  # round to nearest bf16, as the GPU's conversion (and the kernels' interpreter path) does
    return x.to(torch.bfloat16).to(f64)


@triton.jit
def _dot_probe(A, B, C, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, PREC: tl.constexpr):
    rm, rk, rn = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(A + rm[:, None] * K + rk[None, :])
    b = tl.load(B + rk[:, None] * N + rn[None, :])
    tl.store(C + rm[:, None] * N + rn[None, :], dots._chunk_dot(a, b, PREC))


@pytest.mark.parametrize("prec", ["ieee", "bf16_widened", "bf16x2_widened"])
def test_chunk_dot_rounds_only_its_operands(prec):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 32, generator=g), torch.randn(32, 16, generator=g)
    out = torch.empty(16, 16)
    _dot_probe[(1,)](a, b, out, 16, 32, 16, PREC=prec)
    a64, b64 = a.double(), b.double()
    if prec == "ieee":
        want = a64 @ b64
    elif prec == "bf16_widened":
        want = _bf16(a64) @ _bf16(b64)
    else:  # the lo·lo product dropped
        ah, bh = _bf16(a64), _bf16(b64)
        want = ah @ bh + _bf16(a64 - ah) @ bh + ah @ _bf16(b64 - bh)
    assert (out.double() - want).abs().max() < 1e-5 * want.abs().max()
    if prec != "ieee":  # and the rounding is really there: exact products differ by about a bf16 unit
        assert (out.double() - a64 @ b64).abs().max() > 1e-7 * want.abs().max()


@triton.jit
def _mb_dot_probe(A, B, C, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, PREC: tl.constexpr):
    rm, rk, rn = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(A + rm[:, None] * K + rk[None, :])
    b = tl.load(B + rk[:, None] * N + rn[None, :])
    tl.store(C + rm[:, None] * N + rn[None, :], minibatch._mb_dot(a, b, PREC))


@pytest.mark.parametrize("prec", ["ieee", "bf16x3_emulated"])
def test_minibatch_dot_splits_fp32_operands(prec):
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(16, 32, generator=g), torch.randn(32, 16, generator=g)
    out = torch.empty(16, 16)
    _mb_dot_probe[(1,)](a, b, out, 16, 32, 16, PREC=prec)
    a64, b64 = a.double(), b.double()
    ah, bh = _bf16(a64), _bf16(b64)
    want = a64 @ b64 if prec == "ieee" else ah @ bh + _bf16(a64 - ah) @ bh + ah @ _bf16(b64 - bh)
    assert (out.double() - want).abs().max() < 1e-5 * want.abs().max()
    if prec != "ieee":  # about 16 significant bits: not exact, and far closer than one bf16 rounding of each
        exact = a64 @ b64
        err = (out.double() - exact).abs().max()
        assert 0 < err < (ah @ bh - exact).abs().max() / 10


def _scan(kw, ks, wkw, wks, u, mix, w0, s0, BT, rnd):
    """(3) of the momentum delta rule chunk by chunk in float64: the chunk states, u and the final [W, S]; `rnd`
    rounds each product's operands (the kernels' PREC)."""
    NT = kw.shape[2] // BT
    w, s, ckw, cks, uu = w0, s0, [], [], []
    for c in range(NT):
        rows = slice(c * BT, (c + 1) * BT)
        ckw.append(w)
        cks.append(s)
        uc = rnd(wkw[:, :, rows]) @ rnd(w).transpose(-1, -2) + rnd(wks[:, :, rows]) @ rnd(s).transpose(-1, -2)
        uc = uc - u[:, :, rows]
        uu.append(uc)
        fa, fc, ft = (mix[:, :, c, i, None, None] for i in range(3))
        w, s = (fa * w + fc * s - rnd(uc).transpose(-1, -2) @ rnd(kw[:, :, rows]),
                ft * s - rnd(uc).transpose(-1, -2) @ rnd(ks[:, :, rows]))
    return w, s, torch.stack(ckw, 2), torch.stack(cks, 2), torch.cat(uu, 2)


def _inputs(B, H, T, Dk, Dv, NT, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return scale * torch.randn(*shape, generator=g, dtype=f64)

    mix = 0.5 + 0.5 * torch.rand(B, H, NT, 3, generator=g, dtype=f64)
    return [r(B, H, T, Dk), r(B, H, T, Dk), r(B, H, T, Dk), r(B, H, T, Dk), r(B, H, T, Dv), mix, r(B, H, Dv, Dk),
            r(B, H, Dv, Dk)]


# (B, H, Dk, Dv, chunk rows BT, chunks): padded key lanes (Dk = 20 in BK = 32), two Dv tiles of 16 (one partial),
# two 16-row sub-blocks per chunk
SHAPE = (2, 1, 20, 20, 32, 3)


@pytest.mark.parametrize("prec", ["ieee", "bf16_widened"])
def test_momentum_scans_against_float64(prec):
    B, H, Dk, Dv, BT, NT = SHAPE
    T = BT * NT
    args = _inputs(B, H, T, Dk, Dv, NT)
    rnd = (lambda x: x) if prec == "ieee" else _bf16
    leaves = [a.clone().requires_grad_() for a in args]
    want = _scan(*leaves, BT, rnd)
    f32 = [a.float().contiguous() for a in args]
    got = [torch.empty(B, H, T, Dv), torch.empty(B, H, Dv, Dk), torch.empty(B, H, Dv, Dk),
           torch.empty(B, H, NT, Dv, Dk), torch.empty(B, H, NT, Dv, Dk)]  # uu, W, S, CKW, CKS
    momentum._mom_state_fwd[(triton.cdiv(Dv, 16), B * H)](*f32, *got, T, Dk, Dv, BT=BT, BK=32, BV=16, BC=16,
                                                          PREC=prec)
    uu, w_final, s_final, ckw, cks = got
    for name, a, b in zip(("W", "S", "CKW", "CKS", "u"), (w_final, s_final, ckw, cks, uu), want[:2] + want[2:]):
        err = (a.double() - b.detach()).norm() / b.detach().norm()
        assert err < 1e-5, (name, prec, err)

    # the reverse scan: the cotangents of every chunk's state, of u and of the initial state; its float64
    # reference is checked against autograd of the forward (exact products), and the kernel against it
    g = torch.Generator().manual_seed(1)
    cot = [torch.randn(x.shape, generator=g, dtype=f64) for x in want]  # dW, dS (final), dCKW, dCKS, dUU
    ref = _reverse(*args[:4], args[5], cot[2], cot[3], cot[4], cot[0], cot[1], BT, rnd)
    if prec == "ieee":
        torch.autograd.backward(list(want), cot)
        uc = want[4].detach().view(B, H, NT, BT, Dv)
        for name, a, b in (("dW_0", ref[3], leaves[6].grad), ("dS_0", ref[4], leaves[7].grad),
                           ("dU", -ref[2], leaves[4].grad),  # and dK as the module's backward forms it
                           ("dKW", -(uc @ ref[0]).view(B, H, T, Dk), leaves[0].grad)):
            assert (a - b).norm() / b.norm() < 1e-12, name
    got = [torch.empty(B, H, NT, Dv, Dk), torch.empty(B, H, NT, Dv, Dk), torch.empty(B, H, T, Dv),
           torch.empty(B, H, Dv, Dk), torch.empty(B, H, Dv, Dk)]  # dHW, dHS, dU, dW_0, dS_0
    kw, ks, wkw, wks, _, mix = f32[:6]
    momentum._mom_state_bwd[(triton.cdiv(Dv, 16), B * H)](
        kw, ks, wkw, wks, mix, *(c.float().contiguous() for c in (cot[2], cot[3], cot[4], cot[0], cot[1])),
        *got, T, Dk, Dv, BT=BT, BK=32, BV=16, BC=16, PREC=prec)
    for name, a, b in zip(("dHW", "dHS", "dU", "dW_0", "dS_0"), got, ref):
        err = (a.double() - b).norm() / b.norm()
        assert err < 1e-5, (name, prec, err)


def _reverse(kw, ks, wkw, wks, mix, dckw, dcks, duu, dw, ds, BT, rnd):
    """The reverse of (3) in float64: with dw, ds the cotangents of the state after chunk c, per chunk from the
    last: du = dUU - Kw dwᵀ - Ks dsᵀ, dw <- A dw + dCKW[c] + duᵀ Wkw, ds <- C dw + Θ ds + dCKS[c] + duᵀ Wks."""
    NT = kw.shape[2] // BT
    dhw, dhs, du = [None] * NT, [None] * NT, [None] * NT
    for c in reversed(range(NT)):
        rows = slice(c * BT, (c + 1) * BT)
        dhw[c], dhs[c] = dw, ds
        d = duu[:, :, rows] - rnd(kw[:, :, rows]) @ rnd(dw).transpose(-1, -2) - rnd(ks[:, :, rows]) @ rnd(
            ds).transpose(-1, -2)
        du[c] = d
        fa, fc, ft = (mix[:, :, c, i, None, None] for i in range(3))
        dw, ds = (fa * dw + dckw[:, :, c] + rnd(d).transpose(-1, -2) @ rnd(wkw[:, :, rows]),
                  fc * dw + ft * ds + dcks[:, :, c] + rnd(d).transpose(-1, -2) @ rnd(wks[:, :, rows]))
    return torch.stack(dhw, 2), torch.stack(dhs, 2), torch.cat(du, 2), dw, ds


def _chunk_reference(k, wk, u_in, g, w0, BT):
    """(1) chunk by chunk in float64: per chunk W_0 (stored), u = Wk W_0ᵀ - U and W <- W_0 e^{g_n} - uᵀ (K ∘ e^{g_n -
    g}), with g the chunk's cumulative log-decay, [T] per head or [T, Dk] per key channel."""
    NT = k.shape[1] // BT
    w, ckpt, uu = w0, [], []
    for c in range(NT):
        rows = slice(c * BT, (c + 1) * BT)
        gc = g[:, rows] if g.dim() == 3 else g[:, rows, None]
        ckpt.append(w)
        u = wk[:, rows] @ w.transpose(-1, -2) - u_in[:, rows]
        uu.append(u)
        w = w * gc[:, -1:].exp() - u.transpose(-1, -2) @ (k[:, rows] * (gc[:, -1:] - gc).exp())
    return w, torch.stack(ckpt, 1), torch.cat(uu, 1)


@pytest.mark.parametrize("variant", ["head", "head-sub-blocks", "channel"])
@pytest.mark.parametrize("two_k", [False, True], ids=["one-K-block", "two-K-blocks"])
def test_chunk_state_scan_and_output_against_float64(variant, two_k):
    BH, BT, NT, Dk, Dv = 2, 32, 3, 20, 20  # Dk = 20: padded lanes in one block of 32 or two of 16
    T, BK = BT * NT, 16 if two_k else 32
    g = torch.Generator().manual_seed(2)
    k, wk, q = (torch.nn.functional.normalize(torch.randn(BH, T, Dk, generator=g, dtype=f64), dim=-1)
                for _ in range(3))
    u_in = torch.randn(BH, T, Dv, generator=g, dtype=f64)
    w0 = 0.3 * torch.randn(BH, Dv, Dk, generator=g, dtype=f64)
    shape = (BH, NT, BT) + ((Dk,) if variant == "channel" else ())
    head = variant.startswith("head")
    logs = torch.log(0.8 + 0.2 * torch.rand(shape, generator=g, dtype=f64))
    gates = logs.cumsum(2).reshape(BH, T, *shape[3:])  # the cumulative log-decay, restarting every chunk
    want_w, want_ckpt, want_uu = _chunk_reference(k, wk, u_in, gates, w0, BT)
    f32 = dict(dtype=torch.float32)
    uu, w_out, ckpt = torch.empty(BH, T, Dv, **f32), torch.empty(BH, Dv, Dk, **f32), torch.empty(BH, NT, Dv, Dk, **f32)
    eta = torch.ones(BH, T, **f32)  # (read only when U is v as given: SCALE_U)
    args = [x.float().contiguous() for x in (k, wk, u_in)] + [eta, gates.float().contiguous(), w0.float()]
    common = dict(BT=BT, BK=BK, BV=16, TWO_K=two_k, HAS_WK=True, PREC="ieee", SCALE_U=False, TF=False)
    # one kernel for both decays: one per head in sub-blocks of the whole chunk or of 16 rows, per key channel
    # of 16 rows
    chunk._chunk_state_fwd[(2, BH)](*args, uu, w_out, ckpt, T, Dk, Dv, 1, BC=BT if variant == "head" else 16,
                                    CH=not head, **common)
    for name, a, b in (("W", w_out, want_w), ("W_0", ckpt, want_ckpt), ("u", uu, want_uu)):
        assert (a.double() - b).norm() / b.norm() < 1e-5, (variant, name)
    if head:  # (2): o = e^{g} ∘ (Q W_0ᵀ) - ((Q Kᵀ) ∘ D) u, D_ts = e^{g_t - g_s} for s <= t
        o = torch.empty(BH, T, Dv, **f32)
        chunk._chunk_output_fwd[(2, NT, BH)](q.float().contiguous(), args[0], uu, args[4], ckpt, o, T, Dk, Dv, 1,
                                             BT=BT, BK=BK, BV=16, PREC="ieee", TF=False, CH=False)
        qc, kc, gc = (x.view(BH, NT, BT, -1) for x in (q, k, gates.unsqueeze(-1)))
        causal = torch.ones(BT, BT, dtype=torch.bool).tril()
        d = torch.where(causal, (gc - gc.transpose(-1, -2)).exp(), 0.0)
        want_o = gc.exp() * (qc @ want_ckpt.transpose(-1, -2)) - ((qc @ kc.transpose(-1, -2)) * d) @ want_uu.view(
            BH, NT, BT, Dv)
        assert (o.double() - want_o.reshape(BH, T, Dv)).norm() / want_o.norm() < 1e-5


@pytest.mark.parametrize("window", [0, 24], ids=["causal", "window-24"])
def test_flash_forward_and_delta_against_float64(window):
    B, H, T, D = 2, 2, 40, 24  # T and D not multiples of the 16-wide tiles (masked rows and lanes)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=f64) for _ in range(3))
    scale = D ** -0.5
    t = torch.arange(T)
    visible = (t[None, :] <= t[:, None]) & ((t[:, None] - t[None, :] < window) if window else True)
    logits = torch.where(visible, scale * q @ k.transpose(-1, -2), float("-inf"))
    want_o, want_lse = logits.softmax(-1) @ v, logits.logsumexp(-1)
    q32, k32, v32 = (x.float().contiguous() for x in (q, k, v))
    o, lse = torch.empty(B, H, T, D), torch.empty(B, H, T)

    def strides(x):  # head, time, feature, batch: the kernels' (s?b, s?t, s?d, s?z)
        return x.stride(1), x.stride(2), x.stride(3), x.stride(0)

    s_q, s_k, s_v, s_o = (strides(x) for x in (q32, k32, v32, o))
    flash._flash_fwd[(triton.cdiv(T, 16), B * H)](
        q32, k32, v32, o, lse, lse, lse, lse, scale, T, T, T, T, H, D, D, *s_q[:3], *s_k[:3], *s_v[:3], *s_o[:3],
        s_q[3], s_k[3], s_v[3], s_o[3], CAUSAL_=True, WINDOW_=window, DECAY_=False, VARLEN_=False, SINK_=False,
        BM=16, BN=16, BDK=32, BDV=32, PREC="ieee", WIDEN_=False)
    assert (o.double() - want_o).norm() / want_o.norm() < 1e-5
    assert (lse.double() - want_lse).abs().max() < 1e-5 * want_lse.abs().max()
    do = torch.randn(B, H, T, D, generator=g)
    delta = torch.empty(B * H, T)
    attention._flash_bwd_delta[(triton.cdiv(T, 16), B * H)](o, do, delta, T, H, D, *strides(o), *strides(do),
                                                            BM=16, BDV=16)
    assert torch.allclose(delta.view(B, H, T).double(), (o.double() * do.double()).sum(-1), atol=1e-5)


def test_emitted_modules_carry_the_runtime_kernels():
    """An emitted module carries the kernels it launches as the runtime modules write them (indented into its
    `if triton is not None:` block), and no other family's."""
    momentum_source = compile_text("model m { memory = linear\n bias = l2\n retention = none\n"
                                   " learner = momentum(lr=gate, theta=gate) }").source
    gdn_source = compile_text("model m { memory = linear\n bias = l2\n retention = decay(alpha=gate)\n"
                              " learner = gd(lr=gate) }").source
    for module, functions, source in (("dots", None, momentum_source), ("momentum", None, momentum_source),
                                      ("dots", None, gdn_source), ("chunk_head", ("_chunk_grads_bwd", "_wy_fwd"),
                                                                   gdn_source),
                                      ("chunk", ("_row", "_chunk_state_fwd", "_chunk_output_fwd"), gdn_source)):
        for f in functions or (None,):
            assert kernels_source(module, (f,) if f else None) in source, (module, f)
    assert "def _mom_state_fwd" not in gdn_source and "def _chunk_scores_fwd" not in gdn_source
    assert "def _chunk_output_fwd" not in momentum_source
    softmax = compile_text((SPECS / "transformer.miras").read_text()).source
    stick = compile_text((SPECS / "stickbreaking.miras").read_text()).source
    for module, source in (("attention", softmax), ("flash", softmax), ("attention", stick), ("stickbreaking", stick)):
        assert kernels_source(module) in source, module
    assert "def _sb_fwd" not in softmax and "def _flash_fwd(" not in stick


def test_a_missing_kernel_is_named():
    with pytest.raises(KeyError, match=r"mirasc/runtime/kernels/chunk.py defines no _no_such_kernel"):
        kernels_source("chunk", ("_row", "_no_such_kernel"))
