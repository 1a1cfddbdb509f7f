"""Composite linear memories (issue 12 item 6): per-head constant coefficients.

Per-head constants (docs/language.md, "Per-head constants"): a coefficient written as an expression in the head
index h and the head count H, e.g. RetNet's γ_h = 1 − 2^(−5−h). Checked here: parsing, the canonical round trip,
located errors for out-of-range or unknown names, the op's own range check for head counts past the compiler's,
RetNet against the float64 token-by-token reference (tests/reference.py evaluates the γ_h itself; outputs, final
states and every gradient, recurrent and chunked) and ALiBi (a nonparametric memory with a per-head decay) against
softmax attention with the linear bias −m_h (t − s) written out. RetNet against flash-linear-attention's
naive_retention (every head) is in tests/test_peers_fla.py; the Triton kernels against torch in
tests/test_triton_chunked.py and tests/test_triton_recurrent.py (both include retnet).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from reference import make_inputs, make_state, reference_apply, rel

import mirasc
from mirasc.frontend import SpecError, parse_text

ROOT = Path(__file__).resolve().parents[1]
D64 = torch.float64


def linear_spec(alpha="1 - 2^(-5 - h)", lr="1", bias="dot"):
    return (f"model m {{ memory = linear\n bias = {bias}\n retention = decay(alpha={alpha})\n"
            f" learner = gd(lr={lr}) }}")


# ------------------------------------------------------------------------------------------------- the language
def test_per_head_constant_parses_and_round_trips():
    spec = parse_text(linear_spec())
    (name, coef), = spec.per_head().items()
    assert name == "alpha" and {s.name for s in coef.expr.free_symbols} == {"h"}
    assert spec.gates == ()  # not an input of the op
    assert parse_text(spec.canonical()).canonical() == spec.canonical()
    # an expression without h or H is folded to a number
    assert parse_text(linear_spec(alpha="1 - 2^(-5)")).retention.alpha == 0.96875


@pytest.mark.parametrize("alpha,message", [
    ("2 - h", "at head h = 0 it is 2"),                          # α outside [0, 1]
    ("1 - 2^(-h)/x", "unknown name `x` in expression"),          # only h, H, numbers and pi
    ("log(h - 1)", "at head h = 0 it is not a finite real number"),
    ("h/(H - 2)", "at head h = 0 of H = 2"),                     # the H-dependent form is checked for every H
])
def test_bad_per_head_constants_are_located(alpha, message):
    with pytest.raises(SpecError) as err:
        parse_text(linear_spec(alpha=alpha))
    assert message in str(err.value) and str(err.value).startswith("<spec>:3:")


def test_op_checks_the_range_past_the_compilers_head_counts():
    # lr_h = 1 − h/64 is >= 0 for every head the compiler checks (H <= 64) and negative at h = 65
    mod = mirasc.compile_spec(linear_spec(lr="1 - h/64", alpha="1"))
    q = torch.randn(1, 3, 66, 4, dtype=D64)
    with pytest.raises(ValueError, match="per-head eta"):
        mod.apply(q, q, q)
    mod.apply(q[:, :, :64], q[:, :, :64], q[:, :, :64])


# ------------------------------------------------------------------------------------------------ RetNet, exact
@pytest.mark.parametrize("algorithm,chunk", [("recurrent", None), ("chunked", 4)])
def test_retnet_matches_the_float64_reference(algorithm, chunk):
    mod = mirasc.compile_spec(ROOT / "specs" / "retnet.miras")
    B, T, H, Dk, Dv = 2, 11, 3, 4, 5
    q, k, v, gates = make_inputs("retnet", B, T, H, Dk, Dv)
    state = make_state("retnet", B, H, Dk, Dv)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, state["W"])]
    o, fin = mod.apply(*leaves[:3], state={"W": leaves[3]}, algorithm=algorithm, chunk_size=chunk)
    o_ref, fin_ref = reference_apply("retnet", *leaves[:3], gates, {"W": leaves[3]})
    assert rel(o, o_ref) < 1e-12 and rel(fin["W"], fin_ref["W"]) < 1e-12
    g = torch.Generator().manual_seed(3)
    do, dW = torch.randn(o.shape, generator=g, dtype=D64), torch.randn(fin["W"].shape, generator=g, dtype=D64)
    ours = torch.autograd.grad((o * do).sum() + (fin["W"] * dW).sum(), leaves)
    ref = torch.autograd.grad((o_ref * do).sum() + (fin_ref["W"] * dW).sum(), leaves)
    for a, b in zip(ours, ref):
        assert rel(a, b) < 1e-10
    # the heads decay at their own rates: head 2 (γ = 1 − 2⁻⁷) keeps more of W0 than head 0 (γ = 1 − 2⁻⁵)
    zero = {"W": torch.zeros_like(state["W"])}
    o0, _ = mod.apply(q, k, v, state=zero)
    kept = (o - o0).detach()[:, -1].norm(dim=(0, 2))
    assert kept[2] > kept[0]


# ----------------------------------------------------------------------------------- ALiBi: decaying attention
def test_alibi_is_softmax_attention_with_a_linear_bias_per_head():
    """α_h = exp(−m_h), m_h = 2^(−8(h+1)/H): the pair stored at s has weight α_h^(t−s) = exp(−m_h (t − s)),
    ALiBi's bias (Press et al. 2022) on the softmax logits."""
    mod = mirasc.compile_spec("model alibi { memory = nonparametric(kernel=softmax)\n"
                              " retention = decay(alpha=exp(-2^(-8*(h + 1)/H))) }")
    assert mod.GATES == ()
    B, T, H, D = 2, 13, 4, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=D64, requires_grad=True) for _ in range(3))
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], dtype=D64)
    pos = torch.arange(T, dtype=D64)
    bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :])  # [H, T, T]
    logits = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D) + bias
    logits = logits.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
    ref = torch.einsum("bhts,bshd->bthd", torch.softmax(logits, -1), v)
    for algorithm in ("recurrent", "chunked"):
        o, _ = mod.apply(q, k, v, algorithm=algorithm)
        assert rel(o, ref) < 1e-12
        ours = torch.autograd.grad(o.square().sum(), (q, k, v))
        theirs = torch.autograd.grad(ref.square().sum(), (q, k, v), retain_graph=True)
        for a, b in zip(ours, theirs):
            assert rel(a, b) < 1e-10
