"""The chunked Triton kernels for linear memories, run by the interpreter on the CPU:
backend="triton", algorithm="chunked" vs the torch recurrence (the reference path) — outputs, final
state and the gradients of q, k, v, every gate and the initial state, which exercise the generated
reverse sweep (dq, dk, dWk, dU, dg, dW_0) and the torch preparation it feeds. Shapes cover T not a
multiple of the chunk, T = 1, Dk != Dv, Dk below tl.dot's 16 (padded lanes) and two Dv tiles."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_triton_recurrent import assert_compiled_matches_eager, one_launch, rel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import mirasc

triton = pytest.importorskip("triton")
SPEC_DIR = Path(__file__).resolve().parents[2] / "specs"
RANGES = {"eta": (0.05, 0.5), "alpha": (0.8, 1.0), "theta": (0.5, 0.95)}
# The linear memories the kernels cover; every other parametric spec must say it has none (below).
CHUNK_SPECS = ["deltanet", "gated_deltanet", "linear_attention", "longhorn", "mamba2", "retnet", "ttt_linear"]
# with a decay over key channels (alpha=gate(k)): tests/triton_backend/test_triton_channel_chunks.py
CHANNEL_CHUNK_SPECS = ["gla", "hgrn2", "kda"]
# the Hebbian kernels on the features φ(q), φ(k) and the values [v, 1] (feature maps and the normaliser):
# tests/module/test_linear_composite.py
COMPOSITE_CHUNK_SPECS = ["based", "hedgehog", "linear_attention_elu"]
# n inner steps per token run as n sub-tokens through the delta chunk kernels: tests/module/test_multistep.py
MULTISTEP_CHUNK_SPECS = ["deltaproduct", "gated_deltaproduct"]
# the generalized delta transition (l2 with read=kappa / erase=kappa): tests/triton_backend/test_triton_gdelta.py
GDELTA_CHUNK_SPECS = ["comba", "rwkv7"]
# the momentum delta rule (the state [W, S], its own scan kernels): tests/triton_backend/test_triton_momentum_delta.py
MOMENTUM_CHUNK_SPECS = ["momentum_deltanet"]
# the preconditioned learner on the delta kernels (gd(lr=gate(k)) after the statistic's scan):
# tests/module/test_precond.py
PRECOND_CHUNK_SPECS = ["precond_gated_deltanet", "precond_kda"]
VARIANTS = {
    # delta rule with the decay after the step (the gradient sees W_{t-1}, not α_t W_{t-1})
    "delta_post_decay": "memory = linear\nbias = l2\nretention = decay(alpha=gate, order=post)\nlearner = gd(lr=gate)",
    # the implicit (Longhorn) step with a constant pre-decay
    "implicit_decay": "memory = linear\nbias = l2\nretention = decay(alpha=0.9)\nlearner = implicit(lr=gate)",
    # Hebbian write with a gated decay and a constant step
    "hebbian_gate_decay": "memory = linear\nbias = dot\nretention = decay(alpha=gate)\nlearner = gd(lr=0.5)",
    # mini-batch l2 (TTT-linear) with a gated decay
    "minibatch_decay": "memory = linear\nbias = l2\nretention = decay(alpha=gate)\nlearner = gd(lr=gate)\n"
                       "parallel = minibatch(16)",
}


def _channels(mod, name, Dk, Dv):
    """The trailing shape of a gate: none per head, (Dk,) or (Dv,) channel-wise (docs/semantics.md, channel-wise
    gates)."""
    side = getattr(mod, "GATE_CHANNELS", {}).get(name)
    return () if side is None else (Dk,) if side == "k" else (Dv,)


def inputs(mod, B, T, H, Dk, Dv, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=g), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=g), dim=-1).to(dtype)
    v = torch.randn(B, T, H, Dv, generator=g).to(dtype)
    gates = {n: RANGES[n][0] + (RANGES[n][1] - RANGES[n][0])
             * torch.rand(B, T, H, *_channels(mod, n, Dk, Dv), generator=g)
             for n in mod.GATES}
    state = {"W": 0.3 * torch.randn(B, H, Dv, Dk, generator=g)}  # a non-zero initial memory
    return q, k, v, gates, state


def check(mod, shape, chunk, tol=1e-5):
    q, k, v, gates, state = inputs(mod, *shape)
    leaves = [q, k, v, *gates.values(), state["W"]]
    for t in leaves:
        t.requires_grad_(True)
    kw = {} if mod.MINIBATCH_SIZE else {"chunk_size": chunk}
    o, final = mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="chunked", **kw)
    # the reference: the token-by-token torch recurrence in float64 on the same inputs
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    rq, rk, rv, *rg, rw = ref_leaves
    ref, ref_final = mod.apply(rq, rk, rv, dict(zip(gates, rg)), state={"W": rw}, backend="torch",
                               algorithm="recurrent")
    assert rel(o.double(), ref) < tol
    assert rel(final["W"].double(), ref_final["W"]) < tol
    gen = torch.Generator().manual_seed(1)
    w, wf = torch.randn(ref.shape, generator=gen), torch.randn(ref_final["W"].shape, generator=gen)
    grads = torch.autograd.grad((o * w).sum() + (final["W"] * wf).sum(), leaves)
    ref_grads = torch.autograd.grad((ref * w.double()).sum() + (ref_final["W"] * wf.double()).sum(), ref_leaves)
    names = ["q", "k", "v", *gates, "W0"]
    for n, a, b in zip(names, grads, ref_grads):
        assert rel(a.double(), b) < tol, n


def compile_named(name):
    if name in VARIANTS:
        mod = mirasc.compile_spec(f"model {name} {{\n{VARIANTS[name]}\n}}\n")
    else:
        mod = mirasc.compile_spec(SPEC_DIR / f"{name}.miras")
    mod.MINIBATCH_SIZE = getattr(mod, "MINIBATCH", None)
    return mod


@pytest.mark.parametrize("name", CHUNK_SPECS + sorted(VARIANTS))
@pytest.mark.parametrize("shape", [(2, 37, 2, 16, 24), (1, 1, 1, 8, 8), (1, 20, 1, 8, 5)],
                         ids=["T37_Dk16_Dv24", "T1", "Dk8_Dv5"])
def test_triton_chunked_matches_recurrence(name, shape):
    check(compile_named(name), shape, chunk=16)


def test_chunk_sizes_are_schedule_only():
    """Chunk length 32 and 16 give the same function (and the default 64 with T < 64)."""
    mod = compile_named("gated_deltanet")
    check(mod, (1, 70, 1, 16, 16), chunk=32)
    check(mod, (1, 40, 1, 16, 16), chunk=64)


def test_which_specs_have_chunked_kernels():
    """The covered set is exactly the spec lists above; every other parametric spec says why it has none."""
    have = sorted(p.stem for p in SPEC_DIR.glob("*.miras")
                  if hasattr(mirasc.compile_spec(p), "_chunked_triton"))
    assert have == sorted(CHUNK_SPECS + CHANNEL_CHUNK_SPECS + COMPOSITE_CHUNK_SPECS + MULTISTEP_CHUNK_SPECS
                         + GDELTA_CHUNK_SPECS + MOMENTUM_CHUNK_SPECS + PRECOND_CHUNK_SPECS)


def test_triton_default_is_the_chunked_kernel():
    """backend="triton" with algorithm="auto" runs the chunk kernels (bitwise the explicit call)."""
    mod = compile_named("mamba2")
    q, k, v, gates, state = inputs(mod, 1, 33, 2, 16, 16)
    a, _ = mod.apply(q, k, v, gates, state=state, backend="triton")
    b, _ = mod.apply(q, k, v, gates, state=state, backend="triton", algorithm="chunked")
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["deltanet", "mamba2"])
@pytest.mark.parametrize("chunk", [1, 5, 24])
def test_any_chunk_length_tiles(name, chunk):
    """A chunk that is not a power of two >= 16 is one zero-padded tile of the kernels (same function)."""
    # Dk = 40: two K blocks in the scans; T covers several chunks and a partial last one
    check(compile_named(name), (1, 11 if chunk == 1 else 29, 2, 40, 20), chunk=chunk)


@pytest.mark.parametrize("C", [1, 3, 4, 8, 16, 64])
def test_minibatch_any_size(C):
    """Every minibatch(C) runs on the chunk kernels (the mini-batch is the chunk, padded to a tile)."""
    body = VARIANTS["minibatch_decay"].replace("minibatch(16)", f"minibatch({C})")
    mod = mirasc.compile_spec(f"model mb{C} {{\n{body}\n}}\n")
    mod.MINIBATCH_SIZE = C
    check(mod, (1, 20 if C == 1 else 70, 2, 8, 16), chunk=C)  # (several mini-batches and a partial last one)


def test_triton_chunked_fp16_inputs():
    mod = compile_named("gated_deltanet")
    q, k, v, gates, state = inputs(mod, 1, 40, 2, 16, 16, dtype=torch.float16)
    o, final = mod.apply(q, k, v, gates, state=state, backend="triton", chunk_size=16)
    assert o.dtype == torch.float16 and final["W"].dtype == torch.float32
    ref, _ = mod.apply(q.float(), k.float(), v.float(), gates, state=state, backend="torch", algorithm="recurrent")
    assert rel(o, ref) < 2e-3


@pytest.mark.parametrize("T,dtype", [(20, torch.float32), (32, torch.bfloat16)], ids=["fp32_padded", "bf16_in_place"])
def test_chunk_op_compiles_without_graph_breaks(T, dtype):
    """The chunk kernels are a registered custom op (fake implementation + autograd formula), also where the
    delta op reads 16-bit [B, T, H, D] inputs in place (T a whole number of chunks)."""
    mod = compile_named("deltanet")
    q, k, v, gates, state = inputs(mod, 1, T, 2, 16, 16, dtype=dtype)
    for t in (q, k, v, *gates.values()):
        t.requires_grad_(True)

    def run(q, k, v, gates, state):
        o, final = mod.apply(q, k, v, gates, state=state, backend="triton", chunk_size=16)
        return o, final["W"]

    assert_compiled_matches_eager(run, q, k, v, gates, state)


class _FullSizeAllocations(TorchDispatchMode):
    """Records every torch op outside the module's custom ops (the kernels) that returns a new tensor of at least
    `size` elements: a copy, cast or temporary the size of q, k or v between the launches."""

    def __init__(self, size):
        super().__init__()
        self.size, self.seen = size, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace != "mirasc":
            given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                     if isinstance(t, torch.Tensor)}
            if any(isinstance(t, torch.Tensor) and t.numel() >= self.size
                   and t.untyped_storage().data_ptr() not in given for t in tree_flatten(out)[0]):
                self.seen.append(str(func))
        return out


@pytest.mark.parametrize("name", ["retnet", "mamba2", "gla", "kda", "gated_deltanet"])
def test_chunk_op_reads_16bit_inputs_in_place(name):
    """bf16 [B, T, H, D] inputs with T a whole number of chunks run one op that reads q, k, v in place: the Hebbian
    write's (U = η v formed in the scan), the key-channel delta rule's (scores, preparation and scan, the key's and
    g's gradients added up inside the kernels) and the per-head delta rule's. Between the launches no torch op makes
    a tensor the size of q, k or v (no fp32 copies, no transposing copies, no casts or additions of gradients),
    forward or backward; the outputs and gradients agree with the same inputs widened to float32."""
    mod = compile_named(name)
    q, k, v, gates, state = inputs(mod, 2, 32, 2, 16, 16, dtype=torch.bfloat16)
    leaves = [q, k, v, *gates.values()]
    for t in leaves:
        t.requires_grad_(True)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with _FullSizeAllocations(q.numel()) as forward:
        o, _ = mod.apply(q, k, v, gates, state=state, backend="triton", chunk_size=16)
    with _FullSizeAllocations(q.numel()) as backward:
        grads = torch.autograd.grad(o, leaves, do)
    assert forward.seen == [] and backward.seen == [], (forward.seen, backward.seen)
    assert o.dtype == torch.bfloat16 and all(g.dtype == t.dtype for g, t in zip(grads, leaves))
    wide = [t.detach().float().requires_grad_(True) for t in leaves]
    ref, _ = mod.apply(*wide[:3], dict(zip(gates, wide[3:])), state=state, backend="triton", chunk_size=16)
    assert rel(o, ref) < 1e-2
    for g, r in zip(grads, torch.autograd.grad(ref, wide, do.float())):
        assert rel(g, r) < 2e-2


@pytest.mark.parametrize("name", ["gated_deltanet", "retnet", "ttt_linear"])
def test_packed_sequences_in_one_launch(name):
    """cu_seqlens on the chunk kernels: sequences become padded rows of one batch (padding tokens are
    exact no-ops, incl. a constant decay); equal to each sequence run alone, outputs, states, gradients."""
    mod = compile_named(name)
    cu = [0, 5, 5, 23, 40]  # includes an empty sequence
    q, k, v, gates, _ = inputs(mod, 1, cu[-1], 2, 16, 8)
    state = {"W": 0.3 * torch.randn(len(cu) - 1, 2, 8, 16)}
    v.requires_grad_(True)
    assert one_launch(mod, q, v, chunk_size=16)  # the one-launch path, not a loop
    o, final = mod.apply(q, k, v, gates, state=state, backend="triton", cu_seqlens=cu, chunk_size=16)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        o_i, f_i = mod.apply(q[:, a:b], k[:, a:b], v[:, a:b], {n: x[:, a:b] for n, x in gates.items()},
                             state={"W": state["W"][i:i + 1]}, backend="torch", algorithm="recurrent")
        if a < b:
            assert rel(o[:, a:b], o_i) < 1e-5
        assert rel(final["W"][i:i + 1], f_i["W"]) < 1e-5
    assert torch.equal(final["W"][1], state["W"][1])
    grad = torch.autograd.grad(o.square().sum(), v)[0]
    ref = torch.cat([torch.autograd.grad(mod.apply(q[:, a:b], k[:, a:b], v[:, a:b],
                                                   {n: x[:, a:b] for n, x in gates.items()},
                                                   state={"W": state["W"][i:i + 1]})[0].square().sum(), v)[0][:, a:b]
                     for i, (a, b) in enumerate(zip(cu, cu[1:])) if a < b], dim=1)
    assert rel(grad, ref) < 1e-5


# How fp16/bf16 inputs' dots multiply (docs/semantics.md "Numerics"): 16-bit operands on the tensor cores in the
# chunk kernels (per-head and key-channel decays, the momentum delta scans); fp32 operands as two bf16 parts in the
# MLP memories' mini-batch kernels; every other build (the linear memories' chunk readouts) runs exact fp32 dots.
INPUT_DOTS = set(CHUNK_SPECS + CHANNEL_CHUNK_SPECS + GDELTA_CHUNK_SPECS + MOMENTUM_CHUNK_SPECS + MULTISTEP_CHUNK_SPECS
                 + PRECOND_CHUNK_SPECS)
SPLIT_DOTS = {"titans", "moneta", "memora"}  # fp32 operands as two bf16 parts (the MLP memories' mini-batch kernels)
# 16-bit features and values as they are, the fp32 state and dO as two bf16 parts (a feature map or normaliser)
INPUT_SPLIT_DOTS = set(COMPOSITE_CHUNK_SPECS)


class _Launched(Exception):
    pass


DOTS_CHECKED = sorted(set(CHUNK_SPECS + CHANNEL_CHUNK_SPECS + GDELTA_CHUNK_SPECS + MOMENTUM_CHUNK_SPECS
                          + MULTISTEP_CHUNK_SPECS + PRECOND_CHUNK_SPECS + COMPOSITE_CHUNK_SPECS
                          + ["titans", "moneta", "memora"]))


@pytest.mark.parametrize("name", DOTS_CHECKED)
def test_dot_precision_policy(name, monkeypatch):
    mod = mirasc.compile_spec(SPEC_DIR / f"{name}.miras")
    seen = []

    def capture(fn, *args, prec=None, **kw):
        seen.append(prec)
        raise _Launched

    monkeypatch.setattr(mod, "_on_chunk_kernels", capture)
    sub = (mod.STEPS,) if hasattr(mod, "STEPS") else ()
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        q = torch.nn.functional.normalize(torch.randn(1, 8, 1, 8), dim=-1).to(dtype)
        k, v = (torch.nn.functional.normalize(torch.randn(1, 8, 1, *sub, 8), dim=-1).to(dtype) for _ in range(2))
        gates = {n: 0.1 + 0.8 * torch.rand(1, 8, 1, *(sub if n == "eta" else ()), *_channels(mod, n, 8, 8))
                 for n in mod.GATES}
        ex = {"extras": {n: k for n in mod.EXTRAS}} if getattr(mod, "EXTRAS", ()) else {}
        with pytest.raises(_Launched):
            mod.apply(q, k, v, gates, state=mod.init_state(1, 1, 8, 8), backend="triton", algorithm="chunked", **ex)
    expected = (["bf16", "fp16"] if name in INPUT_DOTS else ["bf16x3"] * 2 if name in SPLIT_DOTS
                else ["bf16x2"] * 2 if name in INPUT_SPLIT_DOTS else ["ieee"] * 2)
    assert seen == expected + ["ieee"]
    assert mod.HALF_DOTS == ("input" if name in INPUT_DOTS else "split" if name in SPLIT_DOTS
                             else "input_split" if name in INPUT_SPLIT_DOTS else "ieee")


# 16-bit inputs on the tensor cores (docs/semantics.md "Numerics"): every product of the chunk kernels takes operands
# rounded to the inputs' type and accumulates in fp32; the running state, log-decays and the triangular solve stay
# fp32. The interpreter computes the same numbers (bf16 operands rounded to nearest by hand, then widened exactly
# before each product: test_interpreter_rounds_to_nearest). Judged as
# flash-linear-attention judges its kernels: against the float64 recurrence on the same (16-bit) inputs, outputs,
# final state and every input's gradient within 3 unit roundoffs of the input type (relative RMS error), and the
# outputs and gradients within 3x the error of the module's own torch path (fp32 inside, 16-bit only at its edges).
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["gated_deltanet", "mamba2", "longhorn", "ttt_linear", "comba", "kda", "rwkv7",
                                  "momentum_deltanet", "linear_attention_elu", "hedgehog", "based"])
def test_half_inputs_round_only_operands(name, dtype):
    """(Under a feature map and normaliser, φ(q) and φ(k) are rounded to the inputs' type as the memory's operands:
    the torch path rounds them too, so its error is the bound's reference. Based's φ at D = 16 is 153 wide: the
    kernels see it zero-padded to 160.)"""
    mod = mirasc.compile_spec(SPEC_DIR / f"{name}.miras")
    composite = name in INPUT_SPLIT_DOTS
    assert mod.launch_plan(16, 16, dtype=dtype, backend="triton")["precision"] == (
        "bf16x2" if composite else "bf16" if dtype == torch.bfloat16 else "fp16")
    q, k, v, gates, state = inputs(mod, 1, 40, 1, 16 if composite else 32, 24, dtype=dtype)
    if composite:  # the state in feature space: W [B, H, Dv, Dφ] and the normaliser's z > 0 [B, H, 1, Dφ]
        g = torch.Generator().manual_seed(3)
        width = mod.feature_dim(16)
        state = {"W": 0.3 * torch.randn(1, 1, 24, width, generator=g),
                 "z": 0.5 + torch.rand(1, 1, 1, width, generator=g)}
    if "S_W" in mod.init_state(1, 1, 32, 24):  # (momentum: a non-zero initial velocity too)
        state["S_W"] = 0.1 * torch.randn(state["W"].shape, generator=torch.Generator().manual_seed(2))
    gates = {n: g.to(dtype).float() for n, g in gates.items()}  # gates the 16-bit run and the reference share
    w = torch.randn(1, 40, 1, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    kw = {} if getattr(mod, "MINIBATCH", None) else {"chunk_size": 16}

    def run(to, backend, algorithm, **kw):
        leaves = [t.detach().to(to).requires_grad_() for t in (q, k, v, *gates.values())]
        extras = {"extras": {n: leaves[1] for n in mod.EXTRAS}} if getattr(mod, "EXTRAS", ()) else {}
        s = {n: x.to(torch.float64 if to == torch.float64 else torch.float32) for n, x in state.items()}
        o, final = mod.apply(*leaves[:3], dict(zip(gates, leaves[3:])), state=s, backend=backend,
                             algorithm=algorithm, **extras, **kw)
        (o.double() * w).sum().backward()
        return [o, *(final[n] for n in state), *(t.grad for t in leaves)]

    ref = run(torch.float64, "torch", "recurrent")
    fast = run(dtype, "triton", "chunked", **kw)
    edges = run(dtype, "torch", "chunked", **kw)
    assert fast[0].dtype == dtype
    names = ["o", *state, "dq", "dk", "dv", *(f"d{n}" for n in gates)]
    for label, a, b, r in zip(names, fast, edges, ref, strict=True):
        err = rel(a.double(), r)
        assert err < 3 * UNIT_ROUNDOFF[dtype], (label, err)
        if label not in state:  # (the torch path's state is fp32 throughout: no 16-bit error to compare with)
            assert err < 3 * rel(b.double(), r), (label, err, rel(b.double(), r))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gates_are_not_rounded_to_16_bits(dtype):
    """With fp16/bf16 q, k, v the gates and constants stay float32 (docs/semantics.md "Numerics"): α = 0.9995 would
    be 1.0 in bf16 (steps of 2^-8 near 1), a memory that never forgets."""
    mod = mirasc.compile_spec(SPEC_DIR / "gated_deltanet.miras")
    q = torch.zeros(1, 4, 2, 8, dtype=dtype)
    gates = {"eta": torch.full((1, 4, 2), 0.3), "alpha": torch.full((1, 4, 2), 0.9995)}
    c = mod._coefficients(gates, q)
    assert c["alpha"].dtype == torch.float32 and bool((c["alpha"] == gates["alpha"].transpose(1, 2)).all())
    decay = mirasc.compile_spec("model m {\n memory = linear\n bias = l2\n retention = decay(alpha=0.9995)\n"
                                " learner = gd(lr=gate)\n}")
    assert decay._coefficients({"eta": gates["eta"]}, q)["alpha"].dtype == torch.float32
    assert bool((decay._coefficients({"eta": gates["eta"]}, q)["alpha"] == torch.tensor(0.9995)).all())


_TO_BF16 = None


tl = triton.language


@triton.jit
def _round_kernel(X, Y, Z, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(X + r)
    tl.store(Y + r, _TO_BF16(x, True))  # the kernels' rounding under the interpreter (fp32 out)
    tl.store(Z + r, x.to(tl.bfloat16))  # the interpreter's own conversion


def test_interpreter_rounds_to_nearest():
    """The chunk kernels' bf16 operands and 16-bit results under the interpreter are rounded to nearest, ties to
    even, as the GPU's conversion does; the interpreter's own fp32 -> bf16 conversion truncates (twice the
    error), which would make every bf16 accuracy figure measured here worse than the GPU's."""
    global _TO_BF16
    mod = compile_named("gated_deltanet")
    _TO_BF16 = mod._to_bf16
    x = torch.randn(1024, generator=torch.Generator().manual_seed(0))
    x[:4] = torch.tensor([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 3.0e38])  # ties, a sign, overflow
    y, z = torch.empty(1024), torch.empty(1024, dtype=torch.bfloat16)
    _round_kernel[(1,)](x, y, z, N=1024)
    assert torch.equal(y, x.bfloat16().float())  # torch rounds to nearest even
    truncated = (z.float() != x.bfloat16().float()).float().mean().item()
    assert truncated > 0.3, "the interpreter's conversion now rounds: drop the hand rounding (_to_bf16's WIDEN)"


@pytest.mark.parametrize("name", ["gated_deltanet", "longhorn", "precond_gated_deltanet"])
def test_half_inputs_read_in_place(name):
    """bf16 q, k, v as a layer hands them over ([B, T, H, D]) reach the delta chunk op in that layout when T fills
    whole chunks (docs/module-api.md): contiguous ones without a copy; strided ones (slices of a fused projection)
    copied once in that layout; the results are the same."""
    mod = mirasc.compile_spec(SPEC_DIR / f"{name}.miras")
    g = torch.Generator().manual_seed(0)
    B, T, H, D = 2, 32, 2, 32
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1).bfloat16() for _ in "qk")
    v = torch.randn(B, T, H, D, generator=g).bfloat16()
    gates = {n: 0.05 + 0.45 * torch.rand(B, T, H, *_channels(mod, n, D, D), generator=g) for n in mod.GATES}
    seen, op, leaves, strided = [], mod._DELTA_OP, [], [False]

    def spy(*args):
        seen.append(args[-1])  # tf: read as [B, T, H, D]
        if not strided[0]:  # the layer's own tensors
            assert args[1].data_ptr() == leaves[1].data_ptr() and args[3].data_ptr() == leaves[2].data_ptr()
        return op(*args)

    mod._DELTA_OP = spy
    try:
        runs = []
        for copy in (False, True):
            leaves[:], strided[0] = [t.detach().clone().requires_grad_() for t in (q, k, v)], copy
            inp = [t.transpose(1, 2).contiguous().transpose(1, 2) if copy else t for t in leaves]  # strided
            o, final = mod.apply(*inp, gates, backend="triton", chunk_size=16)
            o.float().square().sum().backward()
            runs.append([o.float(), final["W"], *(t.grad.float() for t in leaves)])
    finally:
        mod._DELTA_OP = op
    assert seen == [True, True]
    for a, b in zip(*runs):
        assert rel(a.double(), b.double()) < 1e-6


@pytest.mark.parametrize("name", ["gated_deltanet", "kda"])
def test_widest_key_blocks(name):
    """Key widths up to 256 padded columns run on the kernels (the scans' two K blocks of 128): Dk = 200, masked
    columns in the second block, per-head and key-channel decays, against the float64 recurrence."""
    check(compile_named(name), (1, 21, 1, 200, 20), chunk=16)


@pytest.mark.parametrize("name", ["gated_deltanet", "hebbian_gate_decay"])
@pytest.mark.parametrize("rows", [16, 32], ids=["sub-blocks", "whole-chunk"])
def test_scan_rows_are_schedule_only(name, rows, monkeypatch):
    """With one log-decay per head the scans take a chunk's rows in 16-row sub-blocks or whole (a schedule choice,
    mirasc.runtime.chunk_space): both against the float64 recurrence, at a chunk of 32 and Dk = 40 (two K blocks
    of 32, masked columns in the second)."""
    mod = compile_named(name)
    monkeypatch.setattr(mod, "_scan_rows", lambda BT, two_k, ch, prec: (rows,))  # (what the interpreter launches)
    check(mod, (1, 70, 1, 40, 20), chunk=32)
