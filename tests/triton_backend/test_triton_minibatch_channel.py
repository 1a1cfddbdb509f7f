"""Channel-wise learning rates (and Huber thresholds) on the mini-batch Triton kernels (docs/semantics.md:
channel-wise gates).

`lr=gate(v)` weights the loss per output channel, ℓ_t = Σᵢ η_{t,i} ℓ(eᵢ): in the IR the coefficient `eta_ch` is
an input of the gradient graph `memory_grad` that scales dℓ/dy (`lr=gate(k)` on a linear memory scales the
first layer's input instead), and `huber(delta=gate(v))` is a threshold per output channel. The mini-batch
kernels read these as [C, n] token tiles of that graph, like k and v, and their reverse-mode graph gives the
cotangent of η (δ) per channel, so nothing here is special-cased per model. Run by the interpreter on the CPU:
backend="triton", algorithm="chunked" in float32 against the independent float64 token loop of
tests/reference.py (autograd on the written-out loss) — outputs, final state and the gradients of q, k, v,
every gate (the channel-wise η included) and every initial-state tensor — on the single-tile and the
streamed schedules, and through the chunk readouts of Moneta (lq) and Memora (kl, Memora's lag token). The
emitted float64 torch chunked path is checked against the same reference, so the configurations below are
the specs' own semantics. None of these specs is bundled (held out).
"""

from __future__ import annotations

import functools

import pytest
import torch
from reference import make_inputs, make_state, reference_apply, rel
from test_triton_recurrent import one_launch

import mirasc

triton = pytest.importorskip("triton")

f64, f32 = torch.float64, torch.float32
MLP = "mlp(depth=2, expansion=2, act=gelu, residual=true, norm=layernorm)"
MLP_REF = dict(kind="mlp", depth=2, expansion=2, act="gelu", residual=True, norm="layernorm")
DEEP = "mlp(depth=3, expansion=2, act=tanh, residual=false, norm=none)"
DEEP_REF = dict(kind="mlp", depth=3, expansion=2, act="tanh", residual=False, norm="none")
LIN = dict(kind="linear")

# name -> (spec body, reference configuration). Mini-batch sizes: powers of two and odd ones (3), chunks that do
# not divide T; Dk != Dv wherever the memory allows it (no residual), so a gate on the wrong side cannot broadcast.
CASES = {
    # Titans with a channel-wise η: momentum, decay, LayerNorm, residual, GELU
    "titans_lr_v": (f"memory = {MLP}; bias = l2; retention = decay(alpha=gate); "
                    "learner = momentum(lr=gate(v), theta=gate); parallel = minibatch(16)",
                    dict(memory=MLP_REF, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate"),
                         learner=dict(kind="momentum", lr="gate(v)", theta="gate"), parallel=16)),
    # TTT-MLP-like: gd, no retention, an odd mini-batch
    "ttt_mlp_lr_v": (f"memory = {MLP}; bias = l2; retention = none; learner = gd(lr=gate(v)); parallel = minibatch(3)",
                     dict(memory=MLP_REF, bias=dict(kind="l2"), retention=dict(kind="none"),
                          learner=dict(kind="gd", lr="gate(v)"), parallel=3)),
    # depth 3, tanh, no norm, no residual, Dk != Dv
    "deep_tanh_lr_v": (f"memory = {DEEP}; bias = l2; retention = decay(alpha=gate); learner = gd(lr=gate(v)); "
                       "parallel = minibatch(8)",
                       dict(memory=DEEP_REF, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate"),
                            learner=dict(kind="gd", lr="gate(v)"), parallel=8)),
    # Yaad: the Huber mixture (a per-head δ against ‖e‖) with a channel-wise η
    "yaad_lr_v": (f"memory = {MLP}; bias = huber(delta=gate, mode=mixture); retention = decay(alpha=gate); "
                  "learner = gd(lr=gate(v)); parallel = minibatch(16)",
                  dict(memory=MLP_REF, bias=dict(kind="huber", delta="gate", mode="mixture"),
                       retention=dict(kind="decay", alpha="gate"), learner=dict(kind="gd", lr="gate(v)"),
                       parallel=16, gate_ranges=dict(delta=(2.5, 6.0)))),
    # a Huber threshold per output channel (coordinate mode) as well as η
    "huber_delta_v": (f"memory = {MLP}; bias = huber(delta=gate(v)); retention = decay(alpha=gate); "
                      "learner = momentum(lr=gate(v), theta=gate); parallel = minibatch(8)",
                      dict(memory=MLP_REF, bias=dict(kind="huber", delta="gate(v)", mode="coordinate"),
                           retention=dict(kind="decay", alpha="gate"),
                           learner=dict(kind="momentum", lr="gate(v)", theta="gate"), parallel=8,
                           gate_ranges=dict(delta=(0.5, 2.0)))),
    # Moneta and Memora as the paper trains them (readout=chunk, docs/semantics.md: chunk readouts), channel-wise η
    "moneta_lr_v": (f"memory = {MLP}; bias = lp(p=3); retention = lq(q=4, alpha=gate); learner = gd(lr=gate(v)); "
                    "parallel = minibatch(8, readout=chunk)",
                    dict(memory=MLP_REF, bias=dict(kind="lp", p=3.0, eps=1e-6),
                         retention=dict(kind="lq", q=4.0, alpha="gate"), learner=dict(kind="gd", lr="gate(v)"),
                         parallel=8, readout="chunk")),
    "memora_lr_v": (f"memory = {MLP}; bias = l2; retention = kl(c=1, alpha=gate); learner = gd(lr=gate(v)); "
                    "parallel = minibatch(8, readout=chunk)",
                    dict(memory=MLP_REF, bias=dict(kind="l2"), retention=dict(kind="kl", c=1.0, alpha="gate"),
                         learner=dict(kind="gd", lr="gate(v)"), parallel=8, readout="chunk")),
    "memora_momentum_lr_v": (f"memory = {MLP}; bias = l2; retention = kl(c=1, alpha=gate); "
                             "learner = momentum(lr=gate(v), theta=gate); parallel = minibatch(3, readout=chunk)",
                             dict(memory=MLP_REF, bias=dict(kind="l2"), retention=dict(kind="kl", c=1.0, alpha="gate"),
                                  learner=dict(kind="momentum", lr="gate(v)", theta="gate"), parallel=3,
                                  readout="chunk")),
    # linear memories under minibatch(C): η over the value rows; over the key columns with momentum
    "linear_lr_v": ("memory = linear; bias = l2; retention = decay(alpha=gate); learner = gd(lr=gate(v)); "
                    "parallel = minibatch(16)",
                    dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate"),
                         learner=dict(kind="gd", lr="gate(v)"), parallel=16)),
    "linear_lr_k_momentum": ("memory = linear; bias = l2; retention = none; "
                             "learner = momentum(lr=gate(k), theta=gate); parallel = minibatch(3)",
                             dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="none"),
                                  learner=dict(kind="momentum", lr="gate(k)", theta="gate"), parallel=3)),
    # a linear lq memory under readout=chunk with a channel-wise Huber threshold and η (starts from A = 0)
    "lq_linear_huber_v": ("memory = linear; bias = huber(delta=gate(v)); retention = lq(q=3, alpha=gate); "
                          "learner = gd(lr=gate(v)); parallel = minibatch(8, readout=chunk)",
                          dict(memory=LIN, bias=dict(kind="huber", delta="gate(v)", mode="coordinate"),
                               retention=dict(kind="lq", q=3.0, alpha="gate"), learner=dict(kind="gd", lr="gate(v)"),
                               parallel=8, readout="chunk", gate_ranges=dict(delta=(0.2, 1.0)))),
}
CHUNK_READOUT = {name for name, (_, cfg) in CASES.items() if cfg.get("readout") == "chunk"}


@functools.cache
def module(name: str):
    body = "\n    ".join(part.strip() for part in CASES[name][0].split(";"))
    return mirasc.compile_spec(f"model {name} {{\n    {body}\n}}\n")


def dims(name: str, d: int) -> tuple[int, int]:
    return (d, d) if "residual=true" in CASES[name][0] else (d, d - 3)


def case(name: str, B: int, T: int, H: int, d: int):
    cfg = CASES[name][1]
    dk, dv = dims(name, d)
    q, k, v, gates = make_inputs(cfg, B, T, H, dk, dv, f64, seed=5)
    state = make_state(cfg, B, H, dk, dv, f64, seed=5)
    if cfg["memory"]["kind"] == "linear" and cfg["retention"]["kind"] == "lq":
        state = {n: torch.zeros_like(s) for n, s in state.items()}  # a linear lq memory's empty start, A = 0
    gen = torch.Generator().manual_seed(13)
    for key in state:  # a non-zero momentum buffer, so every initial-state tensor matters
        if key.startswith("S_"):
            state[key] = 0.02 * torch.randn(state[key].shape, generator=gen, dtype=f64)
    return q, k, v, gates, state


def run(fn, data, dtype):
    """Outputs, final state and the gradients of q, k, v, every gate and every initial-state tensor through a fixed
    random functional of both, as one flat list of (label, tensor)."""
    q, k, v, gates, state = data
    leaves = {"q": q, "k": k, "v": v, **{f"gate {n}": g for n, g in gates.items()},
              **{f"state {n}": s for n, s in state.items()}}
    leaves = {n: x.detach().to(dtype).requires_grad_(True) for n, x in leaves.items()}
    o, final = fn(leaves["q"], leaves["k"], leaves["v"], {n: leaves[f"gate {n}"] for n in gates},
                  {n: leaves[f"state {n}"] for n in state})
    gen = torch.Generator().manual_seed(2)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=f64).to(dtype)).sum()
    for n in sorted(final):
        loss = loss + (final[n] * torch.randn(final[n].shape, generator=gen, dtype=f64).to(dtype)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    out = [("o", o)] + [(f"final {n}", final[n]) for n in sorted(final)]
    # lq: the state's W is not read (the chunk's anchor is A / n_c), so it has no gradient
    return out + [(f"d/d{n}", torch.zeros_like(x) if g is None else g) for (n, x), g in zip(leaves.items(), grads)]


@functools.cache
def reference(name: str, shape):
    return run(lambda q, k, v, g, s: reference_apply(CASES[name][1], q, k, v, g, s), case(name, *shape), f64)


def module_fn(mod, **kw):
    return lambda q, k, v, g, s: mod.apply(q, k, v, g, state=s, **kw)


# Tolerance: float32 kernels against the float64 reference, 1e-4 — or, where the case itself is worse conditioned
# in float32, 3x the error of the module's own float32 torch recurrence on it (`yard`), as 16-bit inputs are
# judged.
# Memora's chunk readout differentiates log W: its kernels measured at most 2e-5 on one x86 machine and 2.4e-4
# (final W1) on another with AVX-512, where the module's float32 torch recurrence is 2.3e-4 off too.
TOL = 1e-4


def compare(name, got, ref, yard=None):
    for i, ((label, a), (_, b)) in enumerate(zip(got, ref)):
        if b.norm() == 0:  # lq's unread initial W only
            assert a.norm() == 0, (label, a.norm().item())
            continue
        bound = TOL if yard is None else max(TOL, 3 * rel(yard[i][1], b))
        assert rel(a, b) < bound, (name, label, rel(a, b), bound)


def torch_fp32(mod, data):
    """The yardstick: the module's float32 torch recurrence (the token loop) on the same case."""
    return run(module_fn(mod, backend="torch", algorithm="recurrent"), data, f32)


SHAPE = {"titans_lr_v": (1, 37, 2, 8), "ttt_mlp_lr_v": (2, 10, 1, 8), "deep_tanh_lr_v": (1, 19, 2, 8),
         "yaad_lr_v": (1, 37, 2, 8), "huber_delta_v": (2, 19, 1, 8), "moneta_lr_v": (1, 19, 2, 8),
         "memora_lr_v": (1, 19, 2, 8), "memora_momentum_lr_v": (1, 10, 2, 8), "linear_lr_v": (2, 37, 1, 8),
         "linear_lr_k_momentum": (1, 10, 2, 8), "lq_linear_huber_v": (1, 19, 2, 8)}


def test_every_case_is_the_specs_semantics():
    """The emitted float64 torch chunked path agrees with the reference on every case (1e-9): the configurations
    are the specs' own semantics, and the torch path is a second reference."""
    for name in sorted(CASES):
        mod = module(name)
        got = run(module_fn(mod, backend="torch", algorithm="chunked"), case(name, *SHAPE[name]), f64)
        for (label, a), (_, b) in zip(got, reference(name, SHAPE[name])):
            assert rel(a, b) < 1e-9 or b.norm() == 0, (name, label, rel(a, b))


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_tile_kernels_match_the_reference(name):
    mod = module(name)
    kernels = mod.launch_plan(8, 8, device="sm_90", backend="triton", algorithm="chunked")["kernels"]
    assert "_minibatch_stream_fwd" in kernels, name  # the mini-batch kernels, not a refusal
    assert mod._mb_schedule(8, 8, torch.device("cpu")) == "tile"
    data = case(name, *SHAPE[name])
    got = run(module_fn(mod, backend="triton", algorithm="chunked"), data, f32)
    compare(name, got, reference(name, SHAPE[name]), torch_fp32(mod, data))


# The streamed kernels (the GPU schedule: weights in global memory, every dimension in 16-wide tiles), one case
# per mechanism; Titans at a head of 20 (16 + 4, E = 40) so the tiles are partial.
STREAM_SHAPE = {"titans_lr_v": (1, 19, 1, 20), "ttt_mlp_lr_v": (1, 10, 1, 8), "yaad_lr_v": (1, 19, 1, 8),
                "huber_delta_v": (1, 11, 1, 8), "moneta_lr_v": (1, 11, 1, 8), "memora_lr_v": (1, 11, 1, 8),
                "linear_lr_v": (1, 19, 1, 20)}


@pytest.mark.parametrize("name", sorted(STREAM_SHAPE))
def test_streamed_kernels_match_the_reference(name, monkeypatch):
    mod = module(name)
    monkeypatch.setattr(mod, "MINIBATCH_SCHEDULE", "stream")
    monkeypatch.setattr(mod, "MB_STREAM_TILE", 16)
    shape = STREAM_SHAPE[name]
    data = case(name, *shape)
    got = run(module_fn(mod, backend="triton", algorithm="chunked"), data, f32)
    compare(name, got, reference(name, shape), torch_fp32(mod, data))


def test_eta_enters_the_derived_gradient_graph():
    """The channel-wise η is an input of `memory_grad` (scaling dℓ/dy) printed into the kernels, and its cotangent
    is an output of that graph's reverse mode, not a hand-written formula: the generated kernels read a token tile
    G_eta_ch and write DG_eta_ch."""
    from mirasc.compiler import compile_text

    out = compile_text(module("titans_lr_v").SPEC)
    grad = {out.grad.node(n).arg: n for n in out.grad.inputs()}
    assert "eta_ch" in grad  # the graph input that weights dℓ/dy
    src = out.source
    fwd = src[src.index("def _minibatch_stream_fwd("):src.index("def _minibatch_stream_bwd_a(")]
    assert "G_eta_ch" in fwd and "dl_dy_weighted" in fwd
    assert "DG_eta_ch" in src[src.index("def _minibatch_stream_bwd_b("):]
    assert "DG_eta_ch" in src[src.index("def _minibatch_bwd("):src.index("def _minibatch_stream_fwd(")]


@pytest.mark.parametrize("name", ["ttt_mlp_lr_v", "titans_lr_v"])
def test_packed_sequences_with_channel_lr(name):
    """cu_seqlens on the mini-batch kernels in one launch with a channel-wise η: padding rows get η = 0 through the
    per-head step size; equal to the float64 torch path run per sequence (outputs, final state, gradients)."""
    mod = module(name)
    cu = [0, 5, 5, 23, 40]
    q, k, v, gates, _ = case(name, 1, cu[-1], 2, 8)
    state = case(name, len(cu) - 1, 1, 2, 8)[4]
    assert one_launch(mod, q, v)  # the one-launch path, not a loop

    def packed(backend):
        return lambda q, k, v, g, s: mod.apply(q, k, v, g, state=s, backend=backend, cu_seqlens=cu)

    got = run(packed("triton"), (q, k, v, gates, state), f32)
    ref = run(packed("torch"), (q, k, v, gates, state), f64)
    compare(name, got, ref)


def test_channel_decays_keep_their_reason():
    """A channel-wise α or θ (linear memories) makes the chunk's decay products one matrix per channel; the
    mini-batch kernels take one per head, so backend="triton", algorithm="chunked" refuses with the reason and the
    recurrent Triton kernel and torch compute them."""
    mod = mirasc.compile_spec("model momentum_value_side {\n    memory = linear\n    bias = l2\n"
                              "    retention = decay(alpha=gate)\n    learner = momentum(lr=gate(v), theta=gate(v))\n"
                              "    parallel = minibatch(8)\n}\n")
    assert not mirasc.compile_text(mod.SPEC).plan.minibatch
    q, k, v, gates = make_inputs(dict(memory=LIN, bias=dict(kind="l2"), retention=dict(kind="decay", alpha="gate"),
                                      learner=dict(kind="momentum", lr="gate(v)", theta="gate(v)"), parallel=8),
                                 1, 4, 1, 4, 3, f32)
    with pytest.raises(RuntimeError, match="no chunked Triton kernel"):
        mod.apply(q, k, v, gates, backend="triton", algorithm="chunked")
