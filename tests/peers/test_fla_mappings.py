"""FLA models that mirasc computes once the caller reshapes the inputs (docs/coverage.md, "exact up to inputs").

Each case maps one flash-linear-attention 0.6 CPU reference onto a bundled or inline spec with the input
transformation the coverage page states, and compares outputs, final states and the gradients of every raw
input (through the transformation, so FLA's parametrisation is what is differentiated) on both sides.
Conventions as in tests/peers/test_peers_fla.py: FLA's state S [B, H, K, V] is our Wᵀ, FLA's scale is passed as 1.0
(or q is fed pre-scaled where the reference fixes it), FLA's log gates g are log α. The references compute in
float32, so the tolerance is float32's: ‖ours − fla‖ / ‖fla‖ < 1e-5 (outputs, states), 1e-4 (gradients).
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import pytest
import torch
from reference import rel

import mirasc

SPECS = Path(__file__).resolve().parents[2] / "specs"
B, T, H, DK, DV = 2, 19, 2, 8, 6  # T = 19: chunk_size 8 gives two full chunks and a partial one
ALGORITHMS = [("recurrent", None), ("chunked", 8)]

INLINE = {
    "gdn2": "memory = linear; bias = l2(read=kappa); retention = decay(alpha=gate(k), order=pre); learner = gd(lr=1)",
    "hgrn": "memory = linear; bias = dot; retention = decay(alpha=gate(v)); learner = gd(lr=1)",
    "momentum_delta": "memory = linear; bias = l2; retention = decay(alpha=gate); "
                      "learner = momentum(lr=gate, theta=gate)",
    "based": "memory = nonparametric(kernel=poly, degree=2); bias = l2",
}


@functools.cache
def spec(name: str):
    if name in INLINE:
        body = "\n    ".join(part.strip() for part in INLINE[name].split(";"))
        return mirasc.compile_spec(f"model {name} {{\n    {body}\n}}\n")
    return mirasc.compile_spec(str(SPECS / f"{name}.miras"))


def fla(module: str, name: str):
    pytest.importorskip("fla")
    return getattr(importlib.import_module(f"fla.ops.{module}"), name)


def leaves(seed: int, **shapes):
    """float32 leaves: 'n:' unit rows, 'u:' uniform in (0, 1), otherwise normal."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, (kind, shape) in shapes.items():
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        if kind == "n":
            x = torch.nn.functional.normalize(x, dim=-1)
        elif kind == "u":
            x = torch.rand(shape, generator=gen, dtype=torch.float64)
        out[name] = x.float().requires_grad_(True)
    return out


def compare(ours, theirs, x: dict, seed: int = 0):
    """ours(), theirs(): (o, final state in our layout: a tensor, a list of tensors, or None); outputs (1e-5), every
    final tensor (1e-5) and every leaf's gradient (1e-4), through the same random upstream gradients."""
    gen = torch.Generator().manual_seed(seed)
    results = []
    for fn in (ours, theirs):
        o, finals = fn()
        finals = [] if finals is None else [finals] if torch.is_tensor(finals) else list(finals)
        loss = (o * torch.randn(o.shape, generator=gen).float()).sum()
        for f in finals:
            loss = loss + (f * torch.randn(f.shape, generator=gen).float()).sum()
        gen.manual_seed(seed)  # the same upstream gradients for both sides
        results.append((o, finals, torch.autograd.grad(loss, list(x.values()))))
    (o_a, f_a, g_a), (o_b, f_b, g_b) = results
    assert rel(o_a, o_b) < 1e-5, rel(o_a, o_b)
    assert len(f_a) == len(f_b)
    for i, (a, b) in enumerate(zip(f_a, f_b)):
        assert rel(a, b) < 1e-5, (i, rel(a, b))
    for name, a, b in zip(x, g_a, g_b):
        assert rel(a, b) < 1e-4, (name, rel(a, b))


def _T(S):
    return S.transpose(-1, -2)


@pytest.mark.parametrize("algorithm,chunk", ALGORITHMS)
def test_gdn2_is_read_kappa_with_gated_values(algorithm, chunk):
    """GDN-2: κ = b ⊙ k (erase gate on the read key), v ← w ⊙ v (write gate), η = 1, α = e^g per key channel, pre."""
    naive = fla("gdn2.naive", "naive_recurrent_gdn2")
    x = leaves(1, q=("n", (B, T, H, DK)), k=("n", (B, T, H, DK)), v=("", (B, T, H, DV)), g=("u", (B, T, H, DK)),
               b=("u", (B, T, H, DK)), w=("u", (B, T, H, DV)), S0=("", (B, H, DK, DV)))
    mod = spec("gdn2")

    def ours():
        o, st = mod.apply(x["q"], x["k"], x["w"] * x["v"], {"alpha": torch.exp(-0.3 * x["g"])},
                          state={"W": _T(x["S0"])}, extras={"kappa": x["b"] * x["k"]},
                          algorithm=algorithm, chunk_size=chunk)
        return o, st["W"]

    def theirs():
        o, S = naive(x["q"], x["k"], x["v"], -0.3 * x["g"], x["b"], x["w"], scale=1.0, initial_state=x["S0"],
                     output_final_state=True)
        return o, _T(S)

    compare(ours, theirs, x)


@pytest.mark.parametrize("algorithm,chunk", ALGORITHMS)
def test_gated_delta_product_is_gated_deltanet_on_interleaved_substeps(algorithm, chunk):
    """Gated DeltaProduct with n_h = 2: the n_h (k, v, β) of a token become n_h consecutive tokens of Gated
    DeltaNet, α = e^g on the first and 1 on the others; the token's output is the last sub-step's."""
    nh = 2
    naive = fla("gated_delta_product.naive", "naive_recurrent_gated_delta_product")
    x = leaves(3, q=("n", (B, T, H, DK)), k=("n", (B, T * nh, H, DK)), v=("", (B, T * nh, H, DV)),
               beta=("u", (B, T * nh, H)), g=("u", (B, T, H)), S0=("", (B, H, DK, DV)))
    mod = spec("gated_deltanet")

    def ours():
        g = -0.3 * x["g"]
        alpha = torch.stack([g.exp()] + [torch.ones_like(g)] * (nh - 1), 2).flatten(1, 2)
        o, st = mod.apply(x["q"].repeat_interleave(nh, dim=1), x["k"], x["v"], {"eta": x["beta"], "alpha": alpha},
                          state={"W": _T(x["S0"])}, algorithm=algorithm, chunk_size=chunk)
        return o[:, nh - 1::nh], st["W"]

    def theirs():
        o, S = naive(x["q"], x["k"], x["v"], -0.3 * x["g"], x["beta"], scale=1.0, initial_state=x["S0"].clone(),
                     output_final_state=True, num_householder=nh)
        return o, _T(S)

    compare(ours, theirs, x)


@pytest.mark.parametrize("algorithm,chunk", ALGORITHMS)
def test_hgrn_is_a_value_channel_decay_with_unit_keys(algorithm, chunk):
    """HGRN: h_t = e^{g_t} ⊙ h_{t−1} + x_t, o_t = h_t: one head, Dk = 1, q = k = 1, v = x, alpha=gate(v)."""
    naive = fla("hgrn.naive", "naive_recurrent_hgrn")
    D = 10
    x = leaves(4, x=("", (B, T, D)), g=("u", (B, T, D)), h0=("", (B, D)))
    one = torch.ones(B, T, 1, 1)
    mod = spec("hgrn")

    def ours():
        o, st = mod.apply(one, one, x["x"][:, :, None], {"alpha": torch.exp(-x["g"])[:, :, None]},
                          state={"W": x["h0"][:, None, :, None]}, algorithm=algorithm, chunk_size=chunk)
        return o[:, :, 0], st["W"][:, 0, :, 0]

    def theirs():
        return naive(x["x"], -x["g"], initial_state=x["h0"], output_final_state=True)

    compare(ours, theirs, x)


@pytest.mark.parametrize("algorithm,chunk", ALGORITHMS)
def test_rwkv6_is_gla_on_shifted_inputs_plus_the_bonus(algorithm, chunk):
    """RWKV-6 reads h_{t−1} before writing, plus the bonus (q_t·(u ⊙ k_t)) v_t: GLA on k, v, w shifted one token
    later (α = 1, k = 0 at the first token; one extra token at the end so that the final state is h_T), plus the
    bonus added by the caller."""
    naive = fla("rwkv6.recurrent_naive", "naive_recurrent_rwkv6")
    x = leaves(5, q=("", (B, T, H, DK)), k=("", (B, T, H, DK)), v=("", (B, T, H, DV)), w=("u", (B, T, H, DK)),
               u=("", (H, DK)), S0=("", (B, H, DK, DV)))
    mod = spec("gla")

    def later(t, fill):
        return torch.cat([torch.full_like(t[:, :1], fill), t], 1)

    def ours():
        q = torch.cat([x["q"], torch.zeros_like(x["q"][:, :1])], 1)
        o, st = mod.apply(q, later(x["k"], 0.0), later(x["v"], 0.0), {"alpha": later(torch.exp(-0.5 * x["w"]), 1.0)},
                          state={"W": _T(x["S0"])}, algorithm=algorithm, chunk_size=chunk)
        bonus = (x["q"] * x["u"] * x["k"]).sum(-1, keepdim=True) * x["v"]
        return o[:, :T] + bonus, st["W"]

    def theirs():
        hf = [t.transpose(1, 2) for t in (x["q"], x["k"], x["v"], -0.5 * x["w"])]
        o, S = naive(*hf, x["u"], scale=1.0, initial_state=x["S0"], output_final_state=True)
        return o.transpose(1, 2), _T(S)

    compare(ours, theirs, x)


@pytest.mark.parametrize("algorithm,chunk", ALGORITHMS)
def test_rebased_is_linear_attention_on_squared_features(algorithm, chunk):
    """ReBased, o_t = Σ (s·q_t·k_j)² v_j / (Σ (s·q_t·k_j)² + 1e-6): linear attention on φ(x) = x ⊗ x with the
    values extended by a column of ones (the normaliser); the caller divides."""
    naive = fla("rebased.naive", "naive_parallel_rebased")
    x = leaves(6, q=("", (B, T, H, DK)), k=("", (B, T, H, DK)), v=("", (B, T, H, DV)))
    mod = spec("linear_attention")

    def ours():
        phi_q = (x["q"][..., :, None] * x["q"][..., None, :]).flatten(-2) / DK  # (Dk^-1/2)² on the query side
        phi_k = (x["k"][..., :, None] * x["k"][..., None, :]).flatten(-2)
        ones = torch.ones_like(x["v"][..., :1])
        o, _ = mod.apply(phi_q, phi_k, torch.cat([x["v"], ones], -1), {}, algorithm=algorithm, chunk_size=chunk)
        return o[..., :DV] / (o[..., DV:] + 1e-6), None

    def theirs():
        o = naive(*(t.transpose(1, 2) for t in (x["q"], x["k"], x["v"])), scale=DK**-0.5)
        return o.transpose(1, 2), None

    compare(ours, theirs, x)


def test_based_is_the_degree_two_poly_kernel_up_to_fla_epsilon():
    """Based (normalised): κ = 1 + s + s²/2, the truncated exponential of degree 2. FLA adds 1e-6 to the
    denominator and mirasc does not: the two differ by about 1e-6 relative, so the check is at 1e-5."""
    naive = fla("based.naive", "naive_parallel_based")
    x = leaves(7, q=("", (B, T, H, DK)), k=("", (B, T, H, DK)), v=("", (B, T, H, DV)))
    mod = spec("based")

    def ours():
        return mod.apply(x["q"], x["k"], x["v"], {})[0], None

    def theirs():
        return naive(*(t.transpose(1, 2) for t in (x["q"], x["k"], x["v"])), scale=DK**-0.5).transpose(1, 2), None

    compare(ours, theirs, x)


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
def test_momentum_deltanet_with_p_equal_k(algorithm):
    """Momentum DeltaNet with its read key p = k: M_t = μ M + η (S p − v) kᵀ, S_t = α S − β M_t. With
    S′ = −β M this is mirasc's momentum: θ_t = μ_t β_t / β_{t−1}, lr = β_t η_t (β_0 := 1, M_0 = 0). The chunked
    form (the state [W, S] under 2x2 scalar transitions) with chunks of 8."""
    momentum_deltanet_vs_fla(algorithm=algorithm)


def momentum_deltanet_vs_fla(**apply_kw):
    """FLA's naive Momentum DeltaNet (p = k) against the spec's op run with `apply_kw` (chunks of 8)."""
    naive = fla("momentum_delta_rule.naive", "recurrent_momentum_delta_rule_ref")
    x = leaves(8, q=("n", (B, T, H, DK)), k=("n", (B, T, H, DK)), v=("", (B, T, H, DV)), a=("u", (B, T, H)),
               mu=("u", (B, T, H)), beta=("u", (B, T, H)), eta=("u", (B, T, H)), S0=("", (B, H, DK, DV)))
    mod = spec("momentum_delta")

    def ours():
        beta = 0.2 + x["beta"]
        before = torch.cat([torch.ones_like(beta[:, :1]), beta[:, :-1]], 1)
        gates = {"eta": beta * x["eta"], "alpha": torch.exp(-0.2 * x["a"]), "theta": x["mu"] * beta / before}
        o, st = mod.apply(x["q"], x["k"], x["v"], gates, state={"W": _T(x["S0"]), "S_W": torch.zeros(B, H, DV, DK)},
                          chunk_size=8, **apply_kw)
        return o, st["W"]

    def theirs():
        beta = 0.2 + x["beta"]
        o, final = naive(x["q"], x["k"], x["v"], -0.2 * x["a"], torch.log(x["mu"]), x["k"], beta=beta, eta=x["eta"],
                         scale=1.0, initial_S=x["S0"], output_final_state=True)
        return o, _T(final[0])

    compare(ours, theirs, x)


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
def test_momentum_deltanet_momentum_buffer_mapping(algorithm):
    """FLA's momentum buffer M (K×V) is mirasc's S_W = −β·Mᵀ: a non-zero initial_M enters as S_W,0 = −β_0·M_0ᵀ with
    β_0 := β_1 (so θ_1 = μ_1), and the final M_T = −S_W,Tᵀ / β_T (docs/coverage.md, the Momentum DeltaNet row)."""
    naive = fla("momentum_delta_rule.naive", "recurrent_momentum_delta_rule_ref")
    mod = spec("momentum_delta")
    g = torch.Generator().manual_seed(11)
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, DK, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, DV, generator=g)
    a, mu, eta = (torch.rand(B, T, H, generator=g) for _ in range(3))
    beta = 0.2 + torch.rand(B, T, H, generator=g)
    S0, M0 = torch.randn(B, H, DK, DV, generator=g), torch.randn(B, H, DK, DV, generator=g)
    o_ref, final = naive(q, k, v, -0.2 * a, torch.log(mu), k, beta=beta, eta=eta, scale=1.0, initial_S=S0,
                         initial_M=M0, output_final_state=True)
    before = torch.cat([beta[:, :1], beta[:, :-1]], 1)  # β_0 := β_1
    gates = {"eta": beta * eta, "alpha": torch.exp(-0.2 * a), "theta": mu * beta / before}
    state = {"W": _T(S0), "S_W": -beta[:, 0, :, None, None] * _T(M0)}
    o, st = mod.apply(q, k, v, gates, state=state, algorithm=algorithm, chunk_size=4)
    assert rel(o, o_ref) < 1e-5
    assert rel(st["W"], _T(final[0])) < 1e-5
    assert rel(st["S_W"], -beta[:, -1, :, None, None] * _T(final[1])) < 1e-5


@pytest.mark.parametrize("window", [None, 5])
def test_softmax_attention_and_grouped_queries(window):
    """Softmax attention (full and sliding window) with grouped queries: FLA's HQ = 2H query heads share a key
    head; the caller repeats k and v per query head. Both scale q·k by Dk^-1/2."""
    naive = fla("attn.naive", "naive_parallel_attn")
    x = leaves(9, q=("", (B, T, 2 * H, DK)), k=("", (B, T, H, DK)), v=("", (B, T, H, DV)))
    memory = "nonparametric(kernel=softmax)" if window is None else f"nonparametric(kernel=softmax, window={window})"
    mod = mirasc.compile_spec(f"model attn {{\n    memory = {memory}\n    bias = l2\n}}\n")

    def ours():
        k, v = (x[n].repeat_interleave(2, dim=2) for n in "kv")
        return mod.apply(x["q"], k, v, {})[0], None

    def theirs():
        o = naive(x["q"], x["k"], x["v"], window_size=window)
        return (o[0] if isinstance(o, tuple) else o), None

    compare(ours, theirs, x)


def test_gsa_is_two_chained_linear_memories():
    """GSA (and ABC, the same recurrence with g from the slot logits): memory 1 writes the slot vector s_t along
    k_t into M slots that decay per slot (alpha=gate(v) on W1 ∈ ℝ^{M×Dk}); its read at q (times Dk^-1/2) goes
    through a softmax over the slots and is the query of memory 2, which writes v_t along s_t and decays per slot
    (alpha=gate(k) on W2 ∈ ℝ^{Dv×M}). Two ops and a softmax between them: one spec cannot say it."""
    naive = fla("gsa.naive", "naive_recurrent_gsa")
    M = 5
    x = leaves(10, q=("", (B, T, H, DK)), k=("", (B, T, H, DK)), v=("", (B, T, H, DV)), s=("u", (B, T, H, M)),
               g=("u", (B, T, H, M)))
    slots_in = mirasc.compile_spec("model w1 {\n    memory = linear\n    bias = dot\n"
                                   "    retention = decay(alpha=gate(v))\n    learner = gd(lr=1)\n}\n")
    slots_out = spec("gla")

    def ours():
        alpha = torch.exp(-0.5 * x["g"])
        o1, st1 = slots_in.apply(x["q"] * DK**-0.5, x["k"], x["s"], {"alpha": alpha})
        o2, st2 = slots_out.apply(o1.softmax(-1), x["s"], x["v"], {"alpha": alpha})
        return o2, torch.cat([st1["W"].flatten(2), st2["W"].flatten(2)], -1)

    def theirs():
        o, (hk, hv) = naive(x["q"], x["k"], x["v"], x["s"], -0.5 * x["g"], output_final_state=True)
        return o, torch.cat([_T(hk).flatten(2), _T(hv).flatten(2)], -1)

    compare(ours, theirs, x)
