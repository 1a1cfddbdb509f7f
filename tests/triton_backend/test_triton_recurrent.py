"""The generated fused recurrent Triton kernel, run by the interpreter on the CPU:
for every parametric spec, backend="triton" vs the torch recurrence — outputs, final state and the
gradients of q, k, v, every gate and the initial state (the backward recomputes the torch recurrence);
fp16 inputs; dimensions that are not powers of two (padded lanes must stay zero); Dk != Dv."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mirasc

triton = pytest.importorskip("triton")
ALL_SPECS = sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.miras"))
# Chunk readouts (docs/semantics.md: chunk readouts: moneta, memora) have no fused recurrent kernel (see the test
# below).
CHUNK_READOUT = sorted(p.stem for p in ALL_SPECS if getattr(mirasc.parse_file(p).parallel, "readout", "") == "chunk")
# The Atlas pieces feature=poly on an MLP memory and muon have no Triton kernel; tests/module/test_omega_atlas.py
# checks that backend="triton" says why (the Omega rule runs on the recurrent kernel: also
# tests/triton_backend/test_triton_omega.py).
def _atlas(spec) -> bool:
    return spec.parametric and (bool(spec.poly_degree) or spec.learner.kind == "muon")


ATLAS = sorted(p.stem for p in ALL_SPECS if _atlas(mirasc.parse_file(p)))
SPECS = [p for p in ALL_SPECS if mirasc.parse_file(p).parametric and p.stem not in CHUNK_READOUT + ATLAS]
RANGES = {"eta": (0.05, 0.5), "alpha": (0.8, 1.0), "theta": (0.0, 0.9), "delta": (0.5, 3.0), "gamma": (0.0, 1.0),
          "nu": (0.8, 1.0), "rho": (0.1, 1.0)}  # gamma: the Omega token weight; nu, rho: precond's statistic


def _channels(mod, name, Dk, Dv):
    """The trailing shape of a gate: none per head, (Dk,) or (Dv,) channel-wise (docs/semantics.md, channel-wise
    gates)."""
    side = getattr(mod, "GATE_CHANNELS", {}).get(name)
    return () if side is None else (Dk,) if side == "k" else (Dv,)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def one_launch(mod, q, v, algorithm="auto", chunk_size=None):
    """Whether packed sequences (cu_seqlens) of these inputs run in one launch of the module's chunk or mini-batch
    kernels under backend='triton', not one call per sequence: the module packs (PACKED) and the call's route is its
    chunked kernels (launch_plan, on the inputs' device and dtype)."""
    plan = mod.launch_plan(q.shape[-1], v.shape[-1], dtype=q.dtype, device=q.device, backend="triton",
                           algorithm=algorithm, chunk_size=chunk_size)
    return mod.PACKED and (plan["backend"], plan["algorithm"]) == ("triton", "chunked")


def inputs(mod, B, T, H, Dk, Dv, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    sub = (mod.STEPS,) if hasattr(mod, "STEPS") else ()  # a multi-step learner: n keys, values, η, κ per token
    q = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=g), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, *sub, Dk, generator=g), dim=-1).to(dtype)
    v = torch.randn(B, T, H, *sub, Dv, generator=g).to(dtype)
    gates = {n: RANGES[n][0] + (RANGES[n][1] - RANGES[n][0])
             * torch.rand(B, T, H, *(sub if n == "eta" else ()), *_channels(mod, n, Dk, Dv), generator=g)
             for n in mod.GATES}
    for n in getattr(mod, "EXTRAS", ()):  # key inputs (κ): unit-norm rows, kept with the gates here
        gates[n] = torch.nn.functional.normalize(torch.randn(B, T, H, *sub, Dk, generator=g), dim=-1).to(dtype)
    state = mod.init_state(B, H, Dk, Dv)
    # a non-zero momentum buffer, so its initial value matters
    state = {n: s + 0.01 * torch.randn(s.shape, generator=g) if n.startswith("S_") else s for n, s in state.items()}
    return q, k, v, gates, state


# omega_yaad (an MLP memory, c = 4 factor evaluations per token: ~20 s interpreted) is covered by the same memory and
# bias at expansion 2 against the float64 reference in tests/triton_backend/test_triton_omega.py (huber_mlp).
@pytest.mark.parametrize("path", [p for p in SPECS if p.stem != "omega_yaad"],
                         ids=[p.stem for p in SPECS if p.stem != "omega_yaad"])
def test_triton_recurrent_matches_torch(path):
    mod = mirasc.compile_spec(path)
    residual = "residual=true" in mod.SPEC
    Dk, Dv = (6, 6) if residual else (6, 5)  # not powers of two: padded lanes are exercised
    q, k, v, gates, state = inputs(mod, 1, 7, 2, Dk, Dv)
    leaves = [q, k, v, *gates.values(), *[s for n, s in state.items() if not n.startswith("S_")]]
    for t in leaves:
        t.requires_grad_(True)
    gs = {n: x for n, x in gates.items() if n not in mod.EXTRAS}
    ex = {"extras": {n: gates[n] for n in mod.EXTRAS}} if mod.EXTRAS else {}
    o, final = mod.apply(q, k, v, gs, state=state, backend="triton", algorithm="recurrent", **ex)
    ref, ref_final = mod.apply(q, k, v, gs, state=state, backend="torch", algorithm="recurrent", **ex)
    assert rel(o, ref) < 2e-5
    assert set(final) == set(ref_final)
    for n in ref_final:
        assert rel(final[n], ref_final[n]) < 2e-5, n
    w = torch.randn_like(ref)
    wf = {n: torch.randn_like(t) for n, t in ref_final.items()}
    loss = (o * w).sum() + sum((final[n] * wf[n]).sum() for n in final)
    ref_loss = (ref * w).sum() + sum((ref_final[n] * wf[n]).sum() for n in ref_final)
    grads = torch.autograd.grad(loss, leaves)
    ref_grads = torch.autograd.grad(ref_loss, leaves)
    for a, b in zip(grads, ref_grads):
        assert rel(a, b) < 1e-4


@pytest.mark.parametrize("name", ["gated_deltanet", "titans"])
def test_triton_recurrent_fp16_inputs(name):
    mod = mirasc.compile_spec(SPECS[0].parent / f"{name}.miras")
    q, k, v, gates, state = inputs(mod, 1, 6, 2, 8, 8, dtype=torch.float16)
    o, final = mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="recurrent")
    assert o.dtype == torch.float16 and all(t.dtype == torch.float32 for t in final.values())
    ref, _ = mod.apply(q.float(), k.float(), v.float(), gates, state=state, backend="torch", algorithm="recurrent")
    assert rel(o, ref) < 2e-3


def test_chunk_readout_has_no_fused_recurrent_kernel():
    """readout=chunk (docs/semantics.md: chunk readouts) has no fused recurrent kernel: backend="triton" with
    algorithm="recurrent" is a clear error naming readout=chunk, never the per-token kernel's (different) function;
    backend="auto" runs torch on the CPU. (Memora's chunked Triton path:
    tests/triton_backend/test_triton_chunk_readout.py.)"""
    assert CHUNK_READOUT == ["memora", "moneta"]
    for name in CHUNK_READOUT:
        mod = mirasc.compile_spec(ALL_SPECS[0].parent / f"{name}.miras")
        q, k, v, gates, state = inputs(mod, 1, 4, 1, 4, 4)
        with pytest.raises(RuntimeError, match="readout=chunk"):
            mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="recurrent")
        o, _ = mod.apply(q, k, v, gates, state=state)
        assert torch.isfinite(o).all()


def test_triton_chunked_is_refused_plainly():
    """lq retention has no chunked Triton kernel: asking for one is an error, not a silent fallback."""
    mod = mirasc.compile_spec(SPECS[0].parent / "moneta_token.miras")
    q, k, v, gates, state = inputs(mod, 1, 4, 1, 4, 4)
    with pytest.raises(RuntimeError, match="no chunked Triton kernel"):
        mod.apply(q, k, v, gates, backend="triton", algorithm="chunked")


def test_recurrent_op_compiles_without_graph_breaks():
    """The fused kernel is a registered custom op (fake implementation + autograd formula):
    torch.compile(fullgraph=True) traces apply(backend="triton") and its backward in one graph."""
    mod = mirasc.compile_spec(SPECS[0].parent / "gated_deltanet.miras")
    q, k, v, gates, state = inputs(mod, 1, 5, 2, 4, 4)
    for t in (q, k, v, *gates.values()):
        t.requires_grad_(True)

    def run(q, k, v, gates, state):
        o, final = mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="recurrent")
        return o, final["W"]

    assert_compiled_matches_eager(run, q, k, v, gates, state)


def assert_compiled_matches_eager(run, q, k, v, gates, state):
    """torch.compile(fullgraph=True) of run(...) -> (o, W): same outputs and same gradients of q, k, v
    and the gates as the eager call (a graph break would raise under fullgraph=True)."""
    compiled = torch.compile(run, backend="aot_eager", fullgraph=True)
    o, w = compiled(q, k, v, gates, state)
    ref_o, ref_w = run(q, k, v, gates, state)
    assert rel(o, ref_o) < 1e-6 and rel(w, ref_w) < 1e-6
    leaves = (q, k, v, *gates.values())
    grads = torch.autograd.grad(o.sum() + w.sum(), leaves)
    ref_grads = torch.autograd.grad(ref_o.sum() + ref_w.sum(), leaves)
    for a, b in zip(grads, ref_grads):
        assert rel(a, b) < 1e-5


# The recurrent kernel's generated backward (reverse sweep over checkpointed segments; the read, the bias
# derivative, activations and LayerNorm through ir.vjp; retention readouts, learner and anchor in the
# skeleton) exists for every parametric spec. The multi-segment test runs the linear memories and the MLP
# memories that cover each remaining piece (momentum + LN: titans; lq: moneta; kl: memora).
SEGMENT_SPECS = ["custom_cauchy", "deltanet", "gated_deltanet", "hyperbolic_mirror", "linear_attention", "longhorn",
                 "mamba2", "memora_token", "moneta_token", "retnet", "sparse_lp", "titans", "ttt_linear"]


def test_every_parametric_spec_has_the_generated_backward():
    missing = sorted(p.stem for p in SPECS if not mirasc.compile_spec(p)._BWD_STATE)
    assert missing == []


# Variants: the per-token factor path of an exact spec, and of a mini-batch too small for tl.dot (4).
SEGMENT_VARIANTS = {
    "kl_linear": "memory = linear\nbias = l2\nretention = kl(c=1, alpha=gate)\nlearner = gd(lr=gate)",
    "lq_linear": "memory = linear\nbias = l2\nretention = lq(q=4, alpha=gate)\nlearner = gd(lr=gate)",
    "huber_momentum_decay_post": "memory = linear\nbias = huber(delta=gate)\nretention = decay(alpha=gate, "
                                 "order=post)\nlearner = momentum(lr=gate, theta=gate)",
    "kl_minibatch4": "memory = mlp(depth=2, expansion=2, act=silu)\nbias = l2\nretention = kl(c=1, alpha=gate)\n"
                     "learner = gd(lr=gate)\nparallel = minibatch(4)",
}


@pytest.mark.parametrize("name", SEGMENT_SPECS + sorted(SEGMENT_VARIANTS))
def test_generated_backward_over_several_segments(name):
    """T = 40 crosses a checkpoint boundary (segments of 32, the last one partial) and mini-batch
    boundaries (16, 32); the MLP memories run at Dk = Dv = 4 to keep the interpreter quick. Mini-batch
    specs with C >= 16 compute each mini-batch's factors and their reverse as tile computations.
    Tolerance: 2e-5, or twice the float32 torch path's own worst error where the problem is worse
    conditioned (Memora: ~7e-5 on k for both)."""
    mod = _module(name)
    _check_vs_float64(mod, (4, 4) if "residual=true" in mod.SPEC else (6, 5))


def _module(name):
    if name in SEGMENT_VARIANTS:
        return mirasc.compile_spec(f"model {name} {{\n{SEGMENT_VARIANTS[name]}\n}}\n")
    return mirasc.compile_spec(SPECS[0].parent / f"{name}.miras")


def _check_vs_float64(mod, dims, T=40):
    """backend="triton" vs the float64 torch recurrence: outputs, final state and the gradients of q, k, v,
    every gate and the initial state, through a random linear loss."""
    q, k, v, gates, state = inputs(mod, 1, T, 1, *dims, seed=1)
    names = ["q", "k", "v", *gates, *state]

    def run(backend, dtype):  # the reference is the torch recurrence in float64 (fp32's own rounding is ~5e-5)
        leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v, *gates.values(), *state.values())]
        gs = dict(zip(gates, leaves[3:3 + len(gates)]))
        st = dict(zip(state, leaves[3 + len(gates):]))
        o, final = mod.apply(*leaves[:3], gs, state=st, backend=backend, algorithm="recurrent")
        gen = torch.Generator().manual_seed(2)
        loss = (o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(dtype)).sum()
        loss = loss + sum((final[n] * torch.randn(final[n].shape, generator=gen, dtype=torch.float64).to(dtype)).sum()
                          for n in sorted(final))
        return torch.autograd.grad(loss, leaves)

    ref = run("torch", torch.float64)
    fp32_worst = max(rel(c, b) for c, b in zip(run("torch", torch.float32), ref))
    for n, a, b in zip(names, run("triton", torch.float32), ref):
        assert rel(a, b) < max(2e-5, 2 * fp32_worst), n


# V tiles: where every value row of a linear memory updates on its own, the recurrent kernels
# run on a grid (cdiv(Dv, BV), B·H) and each program owns BV rows of the state; dq, dk and the gates'
# gradients are per-tile partial sums. The interpreter uses BV = 4 (16 with batched factors, for tl.dot).
# (comba, rwkv7: the generalized delta transition W(diag(w) − a bᵀ) + v kᵀ acts on each row of W on its own)
# (based, hedgehog, linear_attention_elu: a feature map before a Hebbian memory, the normaliser one more value row;
# deltaproduct, gated_deltaproduct: sub-steps of the delta rule; momentum_deltanet: the momentum is per entry)
V_TILED = ["based", "comba", "custom_cauchy", "deltanet", "deltaproduct", "gated_deltanet", "gated_deltaproduct", "gla",
           "hedgehog", "hgrn2", "hyperbolic_mirror", "kda", "linear_attention", "linear_attention_elu", "longhorn",
           "mamba2", "momentum_deltanet", "precond_gated_deltanet", "precond_kda", "retnet", "rwkv7", "sparse_lp",
           "ttt_linear"]


def _plan(name):
    """The Plan of a bundled spec or of a variant above (mirasc.compile_text: the module's source and its Plan)."""
    if name in SEGMENT_VARIANTS:
        return mirasc.compile_text(f"model {name} {{\n{SEGMENT_VARIANTS[name]}\n}}\n").plan
    path = SPECS[0].parent / f"{name}.miras"
    return mirasc.compile_text(path.read_text(encoding="utf-8"), str(path)).plan


def test_v_tiles_cover_the_row_separable_specs():
    tiled = sorted(p.stem for p in SPECS if _plan(p.stem).v_tiles)
    assert tiled == V_TILED
    for name, why in [("moneta_token", "MLP"), ("lq_linear", "q-norm of the whole matrix")]:
        plan = _plan(name)
        assert not plan.v_tiles and why in plan.no_v_tiles
        kernels = _module(name).launch_plan(8, 24, device="sm_90", backend="triton", algorithm="recurrent")["kernels"]
        assert all(c["BV"] >= 24 for c in kernels["_fused_recurrent_fwd"])  # one program holds every row
    assert _plan("kl_linear").v_tiles  # softmax over each row (over K): rows stay separable


@pytest.mark.parametrize("name", ["custom_cauchy", "gated_deltanet", "hyperbolic_mirror", "kl_linear", "longhorn",
                                  "huber_momentum_decay_post", "sparse_lp", "ttt_linear"])
def test_v_tiles_match_the_float64_recurrence(name):
    """Dv = 20 spans 2 tiles of 16 (batched factors: sparse_lp, hyperbolic_mirror, ttt_linear) or 5 tiles of 4,
    the last one partly padded; T = 40 crosses checkpoint and mini-batch boundaries."""
    assert _plan(name).v_tiles  # (the interpreter's tiles: tests/runtime/test_recurrent_space.py)
    _check_vs_float64(_module(name), (6, 20))


def test_tile_config_on_a_gpu_fits_the_register_budget():
    """On a GPU BV comes from the resource model (launch_plan for sm_90 reads it on the CPU): every configuration of
    the forward keeps its live [BV, BK] tiles (and the batched factors' [C, BK] token tiles) within the budget of
    fp32 values per thread (or takes the smallest tile tl.dot allows at 8 warps), and at D = 64 and 128 the rows
    split into several tiles in both directions; a coupled spec whose whole state cannot stay on chip is refused with
    the limit named (the interpreter has no such limit). The live tiles and the batched factors are the compiler's
    counts (mirasc.codegen.triton_recurrent), the budget the resource model's."""
    from mirasc.codegen.triton_recurrent import batched_factors, live_tiles
    from mirasc.runtime.recurrent_space import _REG_BUDGET

    for name in ("sparse_lp", "deltanet", "hyperbolic_mirror", "custom_cauchy"):
        mod, spec = _module(name), _plan(name).kernels.spec
        tiles, factor = live_tiles(spec, False), batched_factors(spec)
        for D in (64, 128):
            kernels = mod.launch_plan(D, D, device="sm_90", backend="triton", algorithm="recurrent")["kernels"]
            assert set(kernels) == {"_fused_recurrent_fwd", "_fused_recurrent_bwd"}
            for kernel, configs in kernels.items():
                assert configs, (name, D, kernel)
                for cfg in configs:
                    bv, warps = cfg["BV"], cfg["num_warps"]
                    assert -(-D // bv) >= 2 and bv >= (16 if factor else 1), (name, D, kernel, cfg)
                    if kernel == "_fused_recurrent_fwd":
                        # batched factors: tl.dot's 16 is the least BV; at D = 128 its [C, BK] token tiles alone
                        # reach the budget, and the model falls back to BV = 16 at 8 warps (measured without spills
                        # on sm_90/sm_80)
                        fits = (tiles * bv + 2 * factor) * D <= _REG_BUDGET * 32 * warps
                        assert fits or (factor and (bv, warps) == (16, 8)), (name, D, cfg)
    mod = _module("moneta_token")
    plan = mod.launch_plan(8, 8, device="sm_90", backend="triton", algorithm="recurrent")
    assert set(plan["kernels"]) == {"_fused_recurrent_fwd", "_fused_recurrent_bwd"}
    with pytest.raises(RuntimeError, match="registers"):
        mod.launch_plan(128, 128, device="sm_90", backend="triton", algorithm="recurrent")
    # V tiles: every size has a configuration, and the autotuner times several (the model's first choice first:
    # tests/runtime/test_recurrent_space.py)
    plan = _module("deltanet").launch_plan(128, 128, device="sm_90", backend="triton", algorithm="recurrent")
    assert len(plan["kernels"]["_fused_recurrent_fwd"]) >= 3


def test_coupled_spec_past_the_limit_is_refused_on_a_gpu(monkeypatch):
    """backend="triton" at a size the coupled kernel cannot hold raises before any launch, naming the limit."""
    mod = _module("memora_token")
    monkeypatch.setattr(mod, "_interpreted", lambda: False)
    q, k, v, gates, state = inputs(mod, 1, 2, 1, 64, 64)
    with pytest.raises(RuntimeError, match="whole memory of a \\(batch, head\\) in one program"):
        mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="recurrent")


def test_v_tile_width_does_not_change_the_result(monkeypatch):
    """BV = 8 and the interpreter's BV = 4 compute the same outputs, final state and gradients."""
    mod = _module("gated_deltanet")
    q, k, v, gates, state = inputs(mod, 1, 9, 2, 6, 20, seed=3)
    leaves = [q, k, v, *gates.values()]

    def run():
        xs = [t.detach().requires_grad_(True) for t in leaves]
        o, final = mod.apply(*xs[:3], dict(zip(gates, xs[3:])), state=state, backend="triton",
                             algorithm="recurrent")
        return [o, final["W"], *torch.autograd.grad((o * o).sum() + final["W"].sum(), xs)]

    ref = run()
    monkeypatch.setattr(mod, "_TILE_OVERRIDE", (8, 4))
    for a, b in zip(run(), ref):
        assert rel(a, b) < 1e-6


# sin and cos print as tl.sin / tl.cos (docs/language.md, expressions): a custom loss whose derivative (the
# update) has sin and whose second derivative (the generated backward) has cos runs on the Triton kernel.
WAVY = """model wavy {
    memory    = linear
    bias      = custom(loss = e^2/2 - cos(e)/10)
    retention = decay(alpha=gate, order=pre)
    learner   = gd(lr=gate)
    parallel  = exact
}"""


def test_sin_and_cos_run_on_the_triton_kernel():
    mod = mirasc.compile_spec(WAVY)
    q, k, v, gates, state = inputs(mod, 1, 7, 2, 6, 5)
    leaves = [q, k, v, *gates.values(), *state.values()]
    for t in leaves:
        t.requires_grad_(True)
    o, final = mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="recurrent")
    ref, ref_final = mod.apply(q, k, v, gates, state=state, backend="torch", algorithm="recurrent")
    assert rel(o, ref) < 1e-5
    for n in ref_final:
        assert rel(final[n], ref_final[n]) < 1e-5, n
    w = torch.randn_like(ref)
    grads = torch.autograd.grad((o * w).sum() + final["W"].sum(), leaves)
    ref_grads = torch.autograd.grad((ref * w).sum() + ref_final["W"].sum(), leaves)
    for a, b in zip(grads, ref_grads):
        assert rel(a, b) < 1e-5
