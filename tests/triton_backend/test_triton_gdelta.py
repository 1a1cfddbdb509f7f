"""The chunked Triton kernels for the generalized delta transition (`l2(read=kappa)`, `l2(erase=kappa)`:
Comba, RWKV-7, IPLR; docs/semantics.md), run by the interpreter on the CPU (float32): backend="triton",
algorithm="chunked" against

1. the independent float64 token loop (tests/reference.py) and the float64 torch chunk form, on the variants a
   user could write (decay order, decay and learning rate per head or over key channels, no retention): outputs,
   final state, gradients of q, k, v, κ, every gate and the initial state — T not a multiple of the chunk, Dk,
   Dv not powers of two (padded lanes), chunks of two 16-row sub-blocks and two Dk tiles;
2. each sequence run alone, for packed sequences (cu_seqlens, one launch with padded rows, incl. κ);
3. flash-linear-attention's CPU references (DPLR for RWKV-7; Comba's two references, one per decay order).
"""

from __future__ import annotations

import pytest
import torch
from reference import make_inputs, make_state, reference_apply, rel
from test_generalized_delta import (
    CASES,
    SPECS,
    _check,
    _fla_inputs,
    _hm,
    _split,
    fla_refs,  # noqa: F401 (a fixture)
    module,
)
from test_triton_recurrent import one_launch

import mirasc

pytest.importorskip("triton")
f64 = torch.float64


def _grads(o, s, leaves, w_o, w_s):
    return torch.autograd.grad((o * w_o.to(o.dtype)).sum() + (s["W"] * w_s.to(o.dtype)).sum(), list(leaves))


# erase/read × every decay form; (B, T, H, Dk, Dv, chunk): T = 23 is no multiple of 8 (four erase=kappa tokens a
# chunk, eight read=kappa tokens); the first variants also run at Dk = 20 (two Dk tiles of 16 in the chunk-parallel
# kernels, two K blocks in the scans) with chunk 32 (two 16-row sub-blocks per chunk).
SMALL = (2, 23, 2, 6, 5, 8)
WIDE = (1, 37, 1, 20, 5, 32)
SHAPES = [(name, SMALL) for name in sorted(CASES)] + [
    (name, WIDE) for name in ("erase-gate(k)-post-gate(k)", "read-gate-pre-gate(k)", "read-gate(k)-pre-gate")]


@pytest.mark.parametrize("name,shape", SHAPES, ids=[f"{n}-T{s[1]}-Dk{s[3]}" for n, s in SHAPES])
def test_triton_chunked_matches_reference(name, shape):
    B, T, H, Dk, Dv, chunk = shape
    mod = module(name)
    cfg = CASES[name][1]
    q, k, v, gates = make_inputs(cfg, B, T, H, Dk, Dv, f64, seed=4)
    state = make_state(cfg, B, H, Dk, Dv, f64, seed=4)
    leaves64 = {"q": q, "k": k, "v": v, **gates, "W": state["W"]}
    leaves32 = {n: x.float().requires_grad_(True) for n, x in leaves64.items()}
    for x in leaves64.values():
        x.requires_grad_(True)
    want_o, want_s = reference_apply(cfg, q, k, v, gates, state)
    g64, x64 = _split(gates)
    torch_o, torch_s = mod.apply(q, k, v, g64, state={"W": state["W"]}, extras=x64, backend="torch",
                                 algorithm="chunked", chunk_size=chunk)
    g32, x32 = _split({n: leaves32[n] for n in gates})
    got_o, got_s = mod.apply(leaves32["q"], leaves32["k"], leaves32["v"], g32, state={"W": leaves32["W"]},
                             extras=x32, backend="triton", algorithm="chunked", chunk_size=chunk)
    for o, s in ((want_o, want_s), (torch_o, torch_s)):
        assert rel(got_o, o) < 1e-5 and rel(got_s["W"], s["W"]) < 1e-5, (rel(got_o, o), rel(got_s["W"], s["W"]))
    gen = torch.Generator().manual_seed(8)
    w_o, w_s = torch.randn(want_o.shape, generator=gen, dtype=f64), torch.randn(want_s["W"].shape, generator=gen,
                                                                                dtype=f64)
    got = _grads(got_o, got_s, leaves32.values(), w_o, w_s)
    for o, s in ((want_o, want_s), (torch_o, torch_s)):
        want = _grads(o, s, leaves64.values(), w_o, w_s)
        errs = {n: rel(a, b) for n, a, b in zip(leaves64, got, want)}
        assert max(errs.values()) < 1e-5, errs


@pytest.mark.parametrize("spec", ["rwkv7", "comba"])
def test_packed_sequences_in_one_launch(spec):
    """cu_seqlens on the chunk kernels (padded rows of one batch, κ cut like k): equal to each sequence run alone
    by the float64 torch recurrence — outputs, states and the gradients of v and κ."""
    mod = mirasc.compile_spec(SPECS / f"{spec}.miras")
    cu = [0, 5, 5, 17, 22]  # includes an empty sequence
    Dk, Dv, H = 8, 6, 2
    gen = torch.Generator().manual_seed(3)
    q, k, kap = (torch.nn.functional.normalize(torch.randn(1, cu[-1], H, Dk, generator=gen), dim=-1)
                 for _ in range(3))
    v = torch.randn(1, cu[-1], H, Dv, generator=gen)
    ch = mod.GATE_CHANNELS
    gates = {n: (0.8 if n == "alpha" else 0.1) + 0.2 * torch.rand(1, cu[-1], H, *([Dk] if n in ch else []),
                                                                   generator=gen) for n in mod.GATES}
    state = {"W": 0.3 * torch.randn(len(cu) - 1, H, Dv, Dk, generator=gen)}
    v.requires_grad_(True)
    kap.requires_grad_(True)
    assert one_launch(mod, q, v, "chunked", 8)  # the one-launch path, not a loop
    o, final = mod.apply(q, k, v, gates, state=state, extras={"kappa": kap}, backend="triton", algorithm="chunked",
                         cu_seqlens=cu, chunk_size=8)
    ref_v, ref_kap = v.detach().double().requires_grad_(True), kap.detach().double().requires_grad_(True)
    ref_o = []
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        o_i, f_i = mod.apply(q[:, a:b].double(), k[:, a:b].double(), ref_v[:, a:b],
                             {n: x[:, a:b].double() for n, x in gates.items()},
                             state={"W": state["W"][i:i + 1].double()}, extras={"kappa": ref_kap[:, a:b]},
                             backend="torch", algorithm="recurrent")
        if a < b:
            assert rel(o[:, a:b], o_i) < 1e-5
        assert rel(final["W"][i:i + 1], f_i["W"]) < 1e-5
        ref_o.append(o_i)
    assert torch.equal(final["W"][1], state["W"][1])
    got = torch.autograd.grad(o.square().sum(), [v, kap])
    want = torch.autograd.grad(torch.cat(ref_o, dim=1).square().sum(), [ref_v, ref_kap])
    assert rel(got[0], want[0]) < 1e-5 and rel(got[1], want[1]) < 1e-5


def test_rwkv7_vs_fla_dplr(fla_refs):  # noqa: F811
    """RWKV-7 on the Triton chunk kernels against FLA's DPLR recurrence (a = −κ, b = η ⊙ κ, gk = log α)."""
    mod = mirasc.compile_spec(SPECS / "rwkv7.miras")
    x = _fla_inputs(11, T=24)
    x32 = {n: t.float() for n, t in x.items()}
    Dk = x["q"].shape[-1]
    o, s = mod.apply(x32["q"] * Dk ** -0.5, x32["k"], x32["v"], {"eta": x32["eta"], "alpha": x32["alpha"]},
                     state={"W": x32["W0"]}, extras={"kappa": x32["kappa"]}, backend="triton", algorithm="chunked",
                     chunk_size=16)
    args = [_hm(x["q"]), _hm(x["k"]), _hm(x["v"]), _hm(-x["kappa"]), _hm(x["eta"] * x["kappa"]),
            _hm(torch.log(x["alpha"]))]
    o_ref, s_ref = fla_refs["dplr"].dplr_recurrence(*args, initial_state=x["W0"].transpose(-1, -2).float(),
                                                   output_final_state=True)
    _check((o.double(), s["W"].double().transpose(-1, -2)), (_hm(o_ref), s_ref), x, 1e-5)


@pytest.mark.parametrize("order", ["pre", "post"])
def test_comba_vs_fla(fla_refs, order):  # noqa: F811
    """Comba on the Triton chunk kernels against FLA's recurrent reference (decay first: order=pre) and its chunk
    reference (the read at the undecayed state: order=post)."""
    text = (SPECS / "comba.miras").read_text().replace("order=pre", f"order={order}")
    mod = mirasc.compile_spec(text.replace("model comba", f"model comba_{order}"))
    g = torch.Generator().manual_seed(13)
    x = _fla_inputs(13, T=24, decay=False)
    x.pop("eta")
    B, T, H = x["q"].shape[:3]
    x["eta"] = (0.1 + 0.8 * torch.rand(B, T, H, generator=g, dtype=f64)).requires_grad_(True)
    x["alpha"] = (0.8 + 0.2 * torch.rand(B, T, H, generator=g, dtype=f64)).requires_grad_(True)
    f = {n: t.float() for n, t in x.items()}
    Dk = x["q"].shape[-1]
    o, s = mod.apply(f["q"] * Dk ** -0.5, f["k"], f["v"], {"eta": f["eta"], "alpha": f["alpha"]},
                     state={"W": f["W0"]}, extras={"kappa": f["kappa"]}, backend="triton", algorithm="chunked",
                     chunk_size=16)
    ref = fla_refs["comba"]
    common = dict(initial_state=x["W0"].transpose(-1, -2).float(), output_final_state=True)
    if order == "pre":
        o_ref, s_ref = ref.naive_recurrent_comba(f["q"], f["k"], f["v"], f["kappa"], f["eta"], torch.log(f["alpha"]),
                                                 **common)
    else:
        o_ref, s_ref = ref.naive_chunk_comba(f["q"], f["k"], f["v"], f["kappa"], torch.log(f["alpha"]), f["eta"],
                                             chunk_size=16, **common)
    _check((o.double(), s["W"].double().transpose(-1, -2)), (o_ref, s_ref), x, 1e-5)


def test_chunk_path_compiles_without_graph_breaks():
    """RWKV-7's chunk path (the two-row presentation, the score and chunk ops) under torch.compile(fullgraph=True):
    the same outputs and gradients as eager, κ's gradient included."""
    mod = mirasc.compile_spec(SPECS / "rwkv7.miras")
    gen = torch.Generator().manual_seed(6)
    q, k, kap = (torch.nn.functional.normalize(torch.randn(1, 20, 2, 16, generator=gen), dim=-1) for _ in range(3))
    v = torch.randn(1, 20, 2, 16, generator=gen)
    gates = {"eta": 0.1 + 0.5 * torch.rand(1, 20, 2, 16, generator=gen),
             "alpha": 0.8 + 0.2 * torch.rand(1, 20, 2, 16, generator=gen)}
    state = {"W": 0.3 * torch.randn(1, 2, 16, 16, generator=gen)}
    leaves = [q, k, v, kap, *gates.values()]
    for t in leaves:
        t.requires_grad_(True)

    def run(q, k, v, kap, gates, state):
        o, final = mod.apply(q, k, v, gates, state=state, extras={"kappa": kap}, backend="triton",
                             algorithm="chunked", chunk_size=16)
        return o, final["W"]

    o, w = torch.compile(run, backend="aot_eager", fullgraph=True)(q, k, v, kap, gates, state)
    ref_o, ref_w = run(q, k, v, kap, gates, state)
    assert rel(o, ref_o) < 1e-6 and rel(w, ref_w) < 1e-6
    grads = torch.autograd.grad(o.sum() + w.sum(), leaves)
    ref_grads = torch.autograd.grad(ref_o.sum() + ref_w.sum(), leaves)
    for a, b in zip(grads, ref_grads):
        assert rel(a, b) < 1e-5
