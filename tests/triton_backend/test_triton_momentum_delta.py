"""The chunked Triton kernels for the momentum delta rule (linear memory, `l2` bias, `momentum(lr, theta)`, `none` or
`decay` retention, gates per head: Momentum DeltaNet, specs/momentum_deltanet.miras; docs/semantics.md), run by the
interpreter on the CPU (float32): backend="triton", algorithm="chunked" against

1. the independent float64 token loop (tests/reference.py) and the float64 torch chunk form: outputs, final W and S,
   gradients of q, k, v, every gate and the initial W and S — decay order pre and post, no retention, a constant θ;
   T not a multiple of the chunk, Dk, Dv not powers of two (padded lanes), one case with two 16-row sub-blocks a
   chunk and two Dv tiles;
2. each sequence run alone, for packed sequences (cu_seqlens: one launch with padded rows, whose padding is no
   no-op for momentum — the chunks end at each row's last token);
3. flash-linear-attention's CPU reference `momentum_delta_rule` with its read key p = k, mapped as in
   tests/peers/test_fla_mappings.py::test_momentum_deltanet_with_p_equal_k.
"""

from __future__ import annotations

import pytest
import torch
from reference import make_inputs, make_state, reference_apply, rel
from test_fla_mappings import momentum_deltanet_vs_fla
from test_triton_recurrent import one_launch

import mirasc

pytest.importorskip("triton")
f64 = torch.float64

# name -> (retention, theta, reference retention config)
CASES = {
    "decay-post": ("decay(alpha=gate, order=post)", "gate", dict(kind="decay", alpha="gate", order="post")),
    "decay-pre": ("decay(alpha=gate, order=pre)", "gate", dict(kind="decay", alpha="gate", order="pre")),
    "none-const-theta": ("none", "0.9", dict(kind="none")),
}
# (B, T, H, Dk, Dv, chunk): T = 19 over chunks of 8 (two full, one partial); WIDE: chunks of 32 (two 16-row
# sub-blocks in the scans), Dk = 20 (BK = 32), Dv = 20 (two Dv tiles of 16), T = 37 (a partial second chunk)
SMALL = (2, 19, 2, 6, 5, 8)
WIDE = (1, 37, 1, 20, 20, 32)
SHAPES = [(n, SMALL) for n in CASES] + [("decay-pre", WIDE)]


def _module(name):
    retention, theta, _ = CASES[name]
    return mirasc.compile_spec(f"model m {{ memory = linear\n bias = l2\n retention = {retention}\n"
                               f" learner = momentum(lr=gate, theta={theta}) }}")


def _cfg(name):
    _, theta, retention = CASES[name]
    return dict(memory=dict(kind="linear"), bias=dict(kind="l2"), parallel=None, retention=retention,
                learner=dict(kind="momentum", lr="gate", theta="gate" if theta == "gate" else float(theta)))


def _loss(o, s, w_o, w_w, w_s):
    return (o * w_o.to(o.dtype)).sum() + (s["W"] * w_w.to(o.dtype)).sum() + (s["S_W"] * w_s.to(o.dtype)).sum()


@pytest.mark.parametrize("name,shape", SHAPES, ids=[f"{n}-T{s[1]}-Dk{s[3]}" for n, s in SHAPES])
def test_triton_chunked_matches_reference(name, shape):
    B, T, H, Dk, Dv, chunk = shape
    mod, cfg = _module(name), _cfg(name)
    assert "_mom_state_fwd" in mod.launch_plan(Dk, Dv, device="sm_90", backend="triton", algorithm="chunked")["kernels"]
    q, k, v, gates = make_inputs(cfg, B, T, H, Dk, Dv, f64, seed=3)
    state = make_state(cfg, B, H, Dk, Dv, f64, seed=3)
    state["S_W"] = 0.1 * torch.randn(state["W"].shape, generator=torch.Generator().manual_seed(5), dtype=f64)
    leaves64 = {"q": q, "k": k, "v": v, **gates, "W": state["W"], "S_W": state["S_W"]}
    leaves32 = {n: x.float().requires_grad_(True) for n, x in leaves64.items()}
    for x in leaves64.values():
        x.requires_grad_(True)

    def run(x, **kw):
        return mod.apply(x["q"], x["k"], x["v"], {n: x[n] for n in gates}, state={"W": x["W"], "S_W": x["S_W"]},
                         **kw)

    want = [reference_apply(cfg, q, k, v, gates, {"W": state["W"], "S_W": state["S_W"]}),
            run(leaves64, backend="torch", algorithm="chunked", chunk_size=chunk)]
    got_o, got_s = run(leaves32, backend="triton", algorithm="chunked", chunk_size=chunk)
    for o, s in want:
        errs = (rel(got_o, o), rel(got_s["W"], s["W"]), rel(got_s["S_W"], s["S_W"]))
        assert max(errs) < 1e-5, errs
    gen = torch.Generator().manual_seed(8)
    w = [torch.randn(x.shape, generator=gen, dtype=f64) for x in (want[0][0], state["W"], state["S_W"])]
    got = torch.autograd.grad(_loss(got_o, got_s, *w), list(leaves32.values()))
    for o, s in want:
        ref = torch.autograd.grad(_loss(o, s, *w), list(leaves64.values()))
        errs = {n: rel(a, b) for n, a, b in zip(leaves64, got, ref)}
        assert max(errs.values()) < 1e-5, errs


def test_packed_sequences_in_one_launch():
    """cu_seqlens on the scan kernels (padded rows of one batch): equal to each sequence run alone by the float64
    torch recurrence — outputs, W and S, and the gradients of v and of the gates. With momentum a padding token is
    no no-op whatever its gates (W_t = W_{t-1} + S_t at α = θ = 1), so this checks that each row's chunks end at
    its last token (the final state of a short row is not the padded row's)."""
    mod = _module("decay-post")
    cu = [0, 5, 5, 17, 22]  # includes an empty sequence; lengths 5, 12, 5 over chunks of 8
    Dk, Dv, H = 8, 6, 2
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.nn.functional.normalize(torch.randn(1, cu[-1], H, Dk, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(1, cu[-1], H, Dv, generator=gen).requires_grad_(True)
    gates = {n: (0.7 if n == "alpha" else 0.1) + 0.3 * torch.rand(1, cu[-1], H, generator=gen) for n in mod.GATES}
    gates = {n: x.requires_grad_(True) for n, x in gates.items()}
    state = {"W": 0.3 * torch.randn(len(cu) - 1, H, Dv, Dk, generator=gen),
             "S_W": 0.3 * torch.randn(len(cu) - 1, H, Dv, Dk, generator=gen)}
    assert one_launch(mod, q, v, "chunked", 8)  # the one-launch path, not a loop
    o, final = mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="chunked", cu_seqlens=cu,
                         chunk_size=8)
    ref_v = v.detach().double().requires_grad_(True)
    ref_g = {n: x.detach().double().requires_grad_(True) for n, x in gates.items()}
    ref_o, ref_loss = [], 0.0
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        o_i, f_i = mod.apply(q[:, a:b].double(), k[:, a:b].double(), ref_v[:, a:b],
                             {n: x[:, a:b] for n, x in ref_g.items()},
                             state={n: s[i:i + 1].double() for n, s in state.items()}, backend="torch",
                             algorithm="recurrent")
        if a < b:
            assert rel(o[:, a:b], o_i) < 1e-5
        for n in ("W", "S_W"):
            assert rel(final[n][i:i + 1], f_i[n]) < 1e-5, (i, n)
        ref_o.append(o_i)
        ref_loss = ref_loss + f_i["W"].sum() + f_i["S_W"].square().sum()
    assert torch.equal(final["W"][1], state["W"][1]) and torch.equal(final["S_W"][1], state["S_W"][1])
    loss = o.square().sum() + final["W"].sum() + final["S_W"].square().sum()
    got = torch.autograd.grad(loss, [v, *gates.values()])
    ref_loss = ref_loss + torch.cat(ref_o, dim=1).square().sum()
    want = torch.autograd.grad(ref_loss, [ref_v, *ref_g.values()])
    for name, a, b in zip(["v", *gates], got, want):
        assert rel(a, b) < 1e-5, (name, rel(a, b))


def test_momentum_deltanet_vs_fla_with_p_equal_k():
    """FLA's naive `momentum_delta_rule` with p = k (M_t = μ M + η (S p − v) kᵀ, S_t = α S − β M_t) on the chunked
    Triton kernels: mirasc's momentum with θ_t = μ_t β_t / β_{t−1}, lr = β_t η_t (β_0 := 1, M_0 = 0), chunks of 8
    over T = 19. Outputs, the final state and the gradients of every raw FLA input."""
    momentum_deltanet_vs_fla(backend="triton", algorithm="chunked")


def test_channel_gates_have_no_chunked_triton_kernel():
    """A decay over key channels makes the 2x2 factors per channel: no chunk form, and the request says so (a call
    and its launch plan alike, whatever the backend)."""
    mod = mirasc.compile_spec("model m { memory = linear\n bias = l2\n retention = decay(alpha=gate(k))\n"
                              " learner = momentum(lr=gate, theta=gate) }")
    q = torch.randn(1, 4, 1, 3)
    gates = {"eta": torch.rand(1, 4, 1), "alpha": torch.rand(1, 4, 1, 3), "theta": torch.rand(1, 4, 1)}
    for backend in ("triton", "torch"):
        with pytest.raises(ValueError, match="no chunked algorithm for this spec: the momentum delta rule"):
            mod.apply(q, q, q, gates, backend=backend, algorithm="chunked")
        with pytest.raises(ValueError, match="no chunked algorithm for this spec"):
            mod.launch_plan(3, 3, backend=backend, algorithm="chunked")
    plan = mod.launch_plan(3, 3, backend="triton")
    assert plan["algorithm"] == "recurrent" and set(plan["kernels"]) == {"_fused_recurrent_fwd", "_fused_recurrent_bwd"}


def test_chunk_path_compiles_without_graph_breaks():
    """The momentum chunk path (the solve, the scan ops, the torch outputs) under torch.compile(fullgraph=True): the
    same outputs, final W and S and gradients as eager."""
    mod = _module("decay-pre")
    gen = torch.Generator().manual_seed(6)
    q, k = (torch.nn.functional.normalize(torch.randn(1, 20, 2, 16, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(1, 20, 2, 16, generator=gen)
    gates = {n: 0.5 + 0.5 * torch.rand(1, 20, 2, generator=gen) for n in mod.GATES}
    state = {"W": 0.3 * torch.randn(1, 2, 16, 16, generator=gen), "S_W": 0.3 * torch.randn(1, 2, 16, 16, generator=gen)}
    leaves = [q, k, v, *gates.values(), *state.values()]
    for t in leaves:
        t.requires_grad_(True)

    def run(q, k, v, gates, state):
        o, final = mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="chunked", chunk_size=16)
        return o, final["W"], final["S_W"]

    got = torch.compile(run, backend="aot_eager", fullgraph=True)(q, k, v, gates, state)
    ref = run(q, k, v, gates, state)
    assert all(rel(a, b) < 1e-6 for a, b in zip(got, ref))
    grads = torch.autograd.grad(sum(x.sum() for x in got), leaves)
    ref_grads = torch.autograd.grad(sum(x.sum() for x in ref), leaves)
    for a, b in zip(grads, ref_grads):
        assert rel(a, b) < 1e-5


def test_any_chunk_length_and_gates_of_zero():
    """A chunk of 1 token, 5 (a 16-row tile, mostly padding), 16, and one chunk longer than T; α = 0 and θ = 0 at
    some tokens (the segment products have no division): o, W and S equal the float64 torch recurrence."""
    mod = _module("decay-post")
    gen = torch.Generator().manual_seed(2)
    B, T, H, Dk, Dv = 1, 19, 1, 6, 5
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=gen, dtype=f64), dim=-1)
            for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=gen, dtype=f64)
    gates = {n: torch.rand(B, T, H, generator=gen, dtype=f64) for n in mod.GATES}
    gates["alpha"][0, 3, 0] = 0.0
    gates["theta"][0, 7, 0] = 0.0
    state = {n: 0.3 * torch.randn(B, H, Dv, Dk, generator=gen, dtype=f64) for n in ("W", "S_W")}
    o_r, f_r = mod.apply(q, k, v, gates, state=state, backend="torch", algorithm="recurrent")
    for chunk in (1, 5, 16, 64):
        o, f = mod.apply(q.float(), k.float(), v.float(), {n: x.float() for n, x in gates.items()},
                         state={n: x.float() for n, x in state.items()}, backend="triton", algorithm="chunked",
                         chunk_size=chunk)
        errs = (rel(o, o_r), rel(f["W"], f_r["W"]), rel(f["S_W"], f_r["S_W"]))
        assert max(errs) < 1e-5, (chunk, errs)
