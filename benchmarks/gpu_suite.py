"""GPU benchmark suite: one command, meant to finish in well under 8 minutes on one H200.

    python benchmarks/gpu_suite.py --out benchmarks/gpu_results.md      # on the GPU machine
    TRITON_INTERPRET=1 python benchmarks/gpu_suite.py --smoke            # CPU: checks the harness only

The GPU image has torch and triton but not lark/sympy/pydantic, so the modules are compiled here first
(`--emit DIR` writes them) and carried; the suite imports only the emitted files, torch, triton and,
if present, flash-linear-attention (`fla`) and titans-pytorch.

Cases (bf16 inputs, fp32 accumulation), each timed with triton.testing.do_bench (median), forward and
forward+backward, reported as ms, tokens/s, the ratio against the peer measured in the same run, and
achieved TFLOP/s and GB/s from simple FLOP/byte models against the H200's ceilings:
  * softmax attention: mirasc flash kernel (generated) vs torch SDPA (flash backend), causal and window;
  * gated_deltanet / deltanet / mamba2: mirasc chunked Triton kernels, the torch chunked path and the
    fused recurrent Triton kernel vs fla chunk_gated_delta_rule / chunk_delta_rule / chunk_simple_gla;
  * gla / kda (a decay over key channels, docs/semantics.md: channel-wise gates): the chunked Triton kernels vs
    fla chunk_gla / chunk_kda (g = log α, β = η: the same functions, tests/peers/test_peers_fla.py);
  * ttt_linear: the chunked Triton kernels vs fla chunk_ttt_linear (a similar model, see the case);
  * rwkv7 / comba (generalized delta transition): the chunked Triton kernels and the torch chunked path vs fla
    chunk_dplr_delta_rule (a = −κ, b = η ⊙ κ, gk = log α: the same function) / chunk_comba (p = κ; fla's chunk
    kernel reads at the undecayed state, the bundled comba decays first: same cost, not the same function);
  * momentum_deltanet: the chunked Triton kernels (own scans over [W, S]) and the torch chunked path vs fla
    chunk_momentum_delta_rule with p = k (a cost peer: the gates are not mapped, θ = μ, η = β);
  * titans memory op at head size 32: the mini-batch Triton kernels vs the torch chunked path;
  * moneta / memora / yaad (the Miras models) memory ops at head size 32: the chunked Triton path (chunk readouts
    on the dual-form kernels; Yaad's mini-batch kernels) vs the torch chunked path (no peer implements them);
  * titans (MLP memory): mirasc Layer (chunked) vs titans-pytorch NeuralMemory.
A case that fails prints its error and the suite goes on. Each row is printed when its case ends, and with --out the
table so far is written to OUT.partial after every case (a call cut off by the device's time limit keeps them);
at the end the table is appended to OUT and the .partial file removed.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# the sibling script's loader and version string
from gpu_check import load as load_module  # noqa: E402, I001
from gpu_check import triton_version  # noqa: E402

EMIT_DIR = HERE / "emitted"
SPECS = ["transformer", "sliding_window", "forgetting_transformer", "stickbreaking", "gated_deltanet", "deltanet",
         "mamba2", "gla", "kda", "ttt_linear", "titans", "rwkv7", "comba", "momentum_deltanet", "moneta", "memora",
         "yaad"]


def emit(out_dir: Path) -> None:
    """Compile the specs the suite needs (run where mirasc is installed)."""
    sys.path.insert(0, str(HERE.parent))
    from mirasc.cli import main

    for name in SPECS:
        main(["compile", str(HERE.parent / "specs" / f"{name}.miras"), "-o", str(out_dir)])


def load(name: str, emit_dir: Path):
    return load_module(emit_dir / f"{name}.py")


def bench(fn, device) -> float:
    """Median milliseconds on a GPU; on the CPU (the smoke run, which checks the harness, not speed) one call."""
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def make_inputs(B, T, H, D, dtype, device, gates=(), requires_grad=True):
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    q = torch.nn.functional.normalize(rnd(B, T, H, D).float(), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(rnd(B, T, H, D).float(), dim=-1).to(dtype)
    v = rnd(B, T, H, D)
    ranges = {"eta": (0.05, 0.5), "alpha": (0.9, 1.0), "theta": (0.0, 0.9), "delta": (0.2, 1.0)}
    gs = {n: (ranges[n][0] + (ranges[n][1] - ranges[n][0]) * torch.rand(B, T, H, generator=g)).to(device)
          for n in gates}
    if requires_grad:
        for t in (q, k, v, *gs.values()):
            t.requires_grad_(True)
    return q, k, v, gs


# Ceilings of one H200 (vendor datasheet, see the device notes): dense bf16 matmul and HBM bandwidth.
PEAK_TFLOPS, PEAK_TBS = 990.0, 4.8


def flops_attention(B, H, T, D, window=0):
    """Forward matmul FLOPs of causal (or windowed) attention: QKᵀ and PV over the visible pairs."""
    pairs = T * (T + 1) / 2 if not window else T * min(window, T)
    return 4 * B * H * pairs * D


def flops_chunked_linear(B, H, T, D, C=64, delta=False):
    """Forward matmul FLOPs of the chunk form per token: QKᵀ and (D∘QKᵀ)u (4CD), QW₀ᵀ and the state update
    (4D²); the delta rule adds Wk W₀ᵀ (2D²), KKᵀ and the triangular solve (about 4CD)."""
    per_token = 4 * C * D + 4 * D * D + ((2 * D * D + 4 * C * D) if delta else 0)
    return B * H * T * per_token


ONLY = [None]  # --only: run the cases whose label starts with one of these (a process per group keeps a sticky CUDA
# error from costing the other groups)
DEADLINE = [float("inf")]  # perf_counter() after which cases are skipped (--budget-s): a lent GPU's time is short


def timed(label, fwd, rows, device, tokens, peer=None, flops=None, nbytes=None):
    """fwd() returns a tensor; times forward and forward+backward, and the peer's if given.
    flops: forward matmul FLOPs of the model (fwd+bwd counted as 3x); nbytes: the forward's compulsory
    HBM traffic (inputs read once, outputs written once). Past the deadline the case is listed as skipped."""
    if ONLY[0] and not label.startswith(tuple(ONLY[0])):
        return
    if time.perf_counter() > DEADLINE[0]:
        rows.append((label + " SKIPPED (time budget)", None, None, None, None, tokens, None, None))
        return

    def fb(f):
        def run():
            out = f()
            out.float().sum().backward()
        return run

    try:
        t_f = bench(fwd, device)
        t_fb = bench(fb(fwd), device)
        p_f = bench(peer, device) if peer else None
        p_fb = bench(fb(peer), device) if peer else None
        rows.append((label, t_f, t_fb, p_f, p_fb, tokens, flops, nbytes))
    except Exception as err:  # keep going: one broken case must not cost the whole GPU run
        rows.append((label + f" FAILED: {type(err).__name__}: {str(err)[:120]}", None, None, None, None, tokens,
                     None, None))
        traceback.print_exc()
    progress(rows)


PARTIAL = [None]  # OUT.partial while the suite runs with --out


def progress(rows) -> None:
    """Print the case that just ended and keep the table so far in OUT.partial."""
    print(table(rows[-1:], "").splitlines()[-1], flush=True)
    if PARTIAL[0] is not None:
        PARTIAL[0].write_text(table(rows, "(partial)"), encoding="utf-8")


def run(args) -> list:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    smoke = args.smoke or device == "cpu"
    B, T, H, D = (1, 64, 2, 16) if smoke else (8, 4096, 16, 128)
    dtype = torch.float32 if smoke else torch.bfloat16
    tokens = B * T
    mods = {n: load(n, args.emit_dir) for n in SPECS}
    rows: list = []

    # -- softmax attention: generated flash kernel vs SDPA
    q, k, v, _ = make_inputs(B, T, H, D, dtype, device)
    for name in ("transformer", "sliding_window"):
        mod = mods[name]
        window = mod.WINDOW

        def sdpa(q=q, k=k, v=v, window=window):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            if window:
                i = torch.arange(T, device=device)
                mask = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        timed(f"{name}: mirasc flash (triton) vs torch SDPA", lambda mod=mod: mod.apply(q, k, v, backend="triton")[0],
              rows, device, tokens, peer=sdpa, flops=flops_attention(B, H, T, D, window),
              nbytes=4 * B * T * H * D * q.element_size())

    # -- the Forgetting Transformer: the same flash kernel with the decay bias, vs FLA's forgetting attention
    q, k, v, gs = make_inputs(B, T, H, D, dtype, device, ("alpha",))
    peer = None
    if not smoke:
        try:
            from fla.ops.forgetting_attn import parallel_forgetting_attn

            def peer(q=q, k=k, v=v, gs=gs):
                return parallel_forgetting_attn(q, k, v, g=gs["alpha"].log())
        except ImportError:
            pass
    timed("forgetting_transformer: mirasc flash (triton) vs FLA parallel_forgetting_attn",
          lambda: mods["forgetting_transformer"].apply(q, k, v, gs, backend="triton")[0], rows, device, tokens,
          peer=peer, flops=flops_attention(B, H, T, D), nbytes=4 * B * T * H * D * q.element_size())

    # -- packed sequences (cu_seqlens): the B·T tokens as one row of 2B sequences of uneven lengths, one launch per
    # kernel (the varlen grid), vs FLA's forgetting attention with the same offsets
    lengths = [T // 2 + (T // 4 if i % 2 else -T // 4) for i in range(2 * B)]  # T/4 and 3T/4, alternating
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    q1, k1, v1 = (x.detach().reshape(1, B * T, *x.shape[2:]).requires_grad_() for x in (q, k, v))
    gs1 = {"alpha": gs["alpha"].detach().reshape(1, B * T, H).requires_grad_()}
    cu = torch.tensor(bounds, device=device)
    peer = None
    if not smoke:
        try:
            from fla.ops.forgetting_attn import parallel_forgetting_attn

            def peer(q1=q1, k1=k1, v1=v1, gs1=gs1, cu=cu):
                return parallel_forgetting_attn(q1, k1, v1, g=gs1["alpha"].log(), cu_seqlens=cu)
        except ImportError:
            pass
    timed(f"forgetting_transformer: packed ({2 * B} sequences), mirasc flash varlen vs FLA parallel_forgetting_attn",
          lambda: mods["forgetting_transformer"].apply(q1, k1, v1, gs1, backend="triton", cu_seqlens=cu)[0], rows,
          device, tokens, peer=peer, flops=sum(flops_attention(1, H, n, D) for n in lengths),
          nbytes=4 * B * T * H * D * q.element_size())

    # -- stick-breaking attention: its own flash kernels (newest key tile first), vs FLA's parallel kernel; both
    # with the remainder on the query's own value (FLA returns it apart: o + rem·v, the authors' reference)
    q, k, v, _ = make_inputs(B, T, H, D, dtype, device)
    peer = None
    if not smoke:
        try:
            from fla.ops.stickbreaking_attn import parallel_stickbreaking_attn

            def peer(q=q, k=k, v=v):
                o, rem = parallel_stickbreaking_attn(q, k, v)
                return o + rem[..., None].to(o.dtype) * v
        except ImportError:
            pass
    timed("stickbreaking: mirasc flash (triton) vs FLA parallel_stickbreaking_attn",
          lambda: mods["stickbreaking"].apply(q, k, v, backend="triton")[0], rows, device, tokens,
          peer=peer, flops=flops_attention(B, H, T, D), nbytes=4 * B * T * H * D * q.element_size())

    # -- linear-memory families vs flash-linear-attention
    try:
        import fla.ops as fops
    except ImportError:
        fops = None
    for name, gates in (("gated_deltanet", ("eta", "alpha")), ("deltanet", ("eta",)), ("mamba2", ("eta", "alpha"))):
        mod = mods[name]
        q, k, v, gs = make_inputs(B, T, H, D, dtype, device, gates)
        peer = None
        if fops is not None and not smoke:
            if name == "gated_deltanet":
                def peer(q=q, k=k, v=v, gs=gs):
                    return fops.chunk_gated_delta_rule(q, k, v, g=gs["alpha"].log(), beta=gs["eta"], scale=1.0)[0]
            elif name == "deltanet":
                def peer(q=q, k=k, v=v, gs=gs):
                    return fops.chunk_delta_rule(q, k, v, beta=gs["eta"], scale=1.0)[0]
            else:
                def peer(q=q, k=k, v=v, gs=gs):
                    return fops.chunk_simple_gla(q, k, v * gs["eta"][..., None], g=gs["alpha"].log(), scale=1.0)[0]
        cost = dict(flops=flops_chunked_linear(B, H, T, D, delta=name != "mamba2"),
                    nbytes=4 * B * T * H * D * q.element_size() + 4 * B * T * H * len(gs))
        timed(f"{name}: mirasc chunked (triton) vs fla chunk", lambda mod=mod, q=q, k=k, v=v, gs=gs:
              mod.apply(q, k, v, gs, backend="triton", algorithm="chunked")[0], rows, device, tokens, peer=peer,
              **cost)
        timed(f"{name}: mirasc chunked (torch) vs fla chunk", lambda mod=mod, q=q, k=k, v=v, gs=gs:
              mod.apply(q, k, v, gs, backend="torch", algorithm="chunked")[0], rows, device, tokens, peer=peer,
              **cost)
        # the recurrent kernel walks tokens: a shorter sequence keeps the suite short (the interpreter's smoke: 16)
        Ts = 16 if smoke else min(T, 512)
        qs, ks, vs = (x[:, :Ts].detach().requires_grad_() for x in (q, k, v))
        gss = {n: t[:, :Ts].detach().requires_grad_() for n, t in gs.items()}
        timed(f"{name}: mirasc fused recurrent (triton fwd) T={Ts}", lambda mod=mod, qs=qs, ks=ks, vs=vs, gss=gss:
              mod.apply(qs, ks, vs, gss, backend="triton", algorithm="recurrent")[0], rows, device, B * Ts)

    # -- the generalized delta transition: RWKV-7 (η, α over key channels) vs fla's DPLR chunk kernels, Comba
    # (per head) vs fla's chunk_comba; κ a unit key, as both layers give it
    for name in ("rwkv7", "comba"):
        mod = mods[name]
        q, k, v, _ = make_inputs(B, T, H, D, dtype, device)
        g = torch.Generator(device="cpu").manual_seed(1)
        width = (D,) if name == "rwkv7" else ()
        gs = {"eta": 0.05 + 0.45 * torch.rand(B, T, H, *width, generator=g),
              "alpha": 0.9 + 0.1 * torch.rand(B, T, H, *width, generator=g)}
        gs = {n: t.to(device).requires_grad_(True) for n, t in gs.items()}
        kap = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1).to(device, dtype)
        kap.requires_grad_(True)
        peer = None
        if fops is not None and not smoke:
            if name == "rwkv7":
                from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule

                def peer(q=q, k=k, v=v, gs=gs, kap=kap):
                    return chunk_dplr_delta_rule(q, k, v, -kap, (gs["eta"] * kap).to(kap.dtype),
                                                 gs["alpha"].log().to(kap.dtype), scale=1.0)[0]
            else:
                from fla.ops.comba import chunk_comba

                def peer(q=q, k=k, v=v, gs=gs, kap=kap):
                    return chunk_comba(q, k, v, kap, gs["alpha"].log(), gs["eta"], scale=1.0)[0]
        cost = dict(flops=2 * flops_chunked_linear(B, H, T, D, delta=True),
                    nbytes=5 * B * T * H * D * q.element_size() + 4 * B * T * H * sum(t[0, 0, 0].numel()
                                                                                       for t in gs.values()))
        for backend in ("triton", "torch"):
            timed(f"{name}: mirasc chunked ({backend}) vs fla chunk", lambda mod=mod, q=q, k=k, v=v, gs=gs, kap=kap,
                  backend=backend: mod.apply(q, k, v, gs, extras={"kappa": kap}, backend=backend,
                                             algorithm="chunked")[0], rows, device, tokens, peer=peer, **cost)

    # -- the momentum delta rule (α, θ, η per head): its own [W, S] scans vs fla's chunk_momentum_delta_rule, p = k.
    # A cost peer: fla's op differs in its gate parametrisation (θ_t = μ_t β_t / β_{t-1} maps it, tests), not in work.
    mod = mods["momentum_deltanet"]
    q, k, v, gs = make_inputs(B, T, H, D, dtype, device, ("alpha", "eta", "theta"))
    peer = None
    if fops is not None and not smoke:
        from fla.ops.momentum_delta_rule import chunk_momentum_delta_rule

        def peer(q=q, k=k, v=v, gs=gs):
            return chunk_momentum_delta_rule(q, k, v, gs["alpha"].log(), gs["theta"].clamp_min(1e-6).log(), p=k,
                                             beta=gs["eta"], scale=1.0, use_qk_l2norm_in_kernel=False)[0]
    for backend in ("triton", "torch"):
        timed(f"momentum_deltanet: mirasc chunked ({backend}) vs fla chunk_momentum_delta_rule (cost peer)",
              lambda q=q, k=k, v=v, gs=gs, backend=backend: mod.apply(q, k, v, gs, backend=backend,
                                                                      algorithm="chunked")[0],
              rows, device, tokens, peer=peer, flops=2 * flops_chunked_linear(B, H, T, D, delta=True),
              nbytes=5 * B * T * H * D * q.element_size() + 12 * B * T * H)

    # -- a decay over key channels (docs/semantics.md: channel-wise gates): GLA (Hebbian write) and KDA (delta rule)
    # vs fla's chunk kernels
    for name, gates in (("gla", ("alpha",)), ("kda", ("eta", "alpha"))):
        mod = mods[name]
        q, k, v, _ = make_inputs(B, T, H, D, dtype, device)
        g = torch.Generator(device="cpu").manual_seed(2)
        gs = {"alpha": 0.9 + 0.1 * torch.rand(B, T, H, D, generator=g)}
        if "eta" in gates:
            gs["eta"] = 0.05 + 0.45 * torch.rand(B, T, H, generator=g)
        gs = {n: t.to(device).requires_grad_(True) for n, t in gs.items()}
        peer = None
        if fops is not None and not smoke:
            if name == "gla":
                def peer(q=q, k=k, v=v, gs=gs):
                    return fops.chunk_gla(q, k, v, g=gs["alpha"].log().to(q.dtype), scale=1.0)[0]
            else:
                from fla.ops.kda import chunk_kda

                def peer(q=q, k=k, v=v, gs=gs):
                    return chunk_kda(q, k, v, g=gs["alpha"].log().to(q.dtype), beta=gs["eta"].to(q.dtype),
                                     scale=1.0)[0]
        timed(f"{name}: mirasc chunked (triton) vs fla chunk_{name}", lambda mod=mod, q=q, k=k, v=v, gs=gs:
              mod.apply(q, k, v, gs, backend="triton", algorithm="chunked")[0], rows, device, tokens, peer=peer,
              flops=flops_chunked_linear(B, H, T, D, delta=name == "kda"),
              nbytes=4 * B * T * H * D * q.element_size() + 4 * B * T * H * (D + len(gs) - 1))

    # -- TTT-linear (mini-batch 16) vs fla's chunk_ttt_linear. Not the same function: fla's TTT puts a
    # LayerNorm with a residual on the memory's output inside the inner loss; same shapes, similar cost.
    mod = mods["ttt_linear"]
    q, k, v, gs = make_inputs(B, T, H, D, dtype, device, ("eta",))
    peer = None
    if not smoke:
        try:
            from fla.ops.ttt import chunk_ttt_linear

            ln_w = torch.ones(H, D, device=device, dtype=dtype)
            ln_b = torch.zeros(H, D, device=device, dtype=dtype)

            def peer(q=q, k=k, v=v, gs=gs):
                return chunk_ttt_linear(q, k, v, ln_w, ln_b, gs["eta"][..., None], scale=1.0, chunk_size=16)[0]
        except ImportError:
            pass
    timed("ttt_linear: mirasc chunked (triton) vs fla chunk_ttt_linear (LN inside: similar, not equal)",
          lambda: mod.apply(q, k, v, gs, backend="triton", algorithm="chunked")[0], rows, device, tokens, peer=peer,
          flops=flops_chunked_linear(B, H, T, D, C=16), nbytes=4 * B * T * H * D * q.element_size() + 4 * B * T * H)

    # -- Titans' memory op: the mini-batch Triton kernels vs the torch chunked path (cuBLAS), same run.
    # Heads of 32 (E = 128): the kernels hold each weight as one register tile, the size backend="auto" uses.
    mod = mods["titans"]
    Dm = 16 if smoke else 32
    q, k, v, gs = make_inputs(B, T, H, Dm, dtype, device, ("eta", "alpha", "theta"))
    E, C = 4 * Dm, mod.MINIBATCH
    # factors (3 matmuls of C·D·E), the read (W and S terms of both layers, plus the [C, C] dual terms),
    # the chunk-end updates of W and S: 2 FLOPs per multiply-add
    per_chunk = 2 * (3 * C * Dm * E + 4 * C * Dm * E + 2 * (C * C * Dm + C * C * E) + 4 * C * Dm * E)
    timed(f"titans memory op (D={Dm}, E={E}, C={C}): mirasc mini-batch (triton) vs mirasc torch chunked",
          lambda: mod.apply(q, k, v, gs, backend="triton", algorithm="chunked")[0], rows, device, tokens,
          peer=lambda: mod.apply(q, k, v, gs, backend="torch", algorithm="chunked")[0],
          flops=B * H * (T // C) * per_chunk, nbytes=4 * B * T * H * Dm * q.element_size())

    # -- the Miras models (MLP memories at heads of 32): Moneta and Memora read at chunk granularity
    # (docs/semantics.md: chunk readouts) on the dual-form kernels, Yaad on the mini-batch kernels; no peer implements
    # them, so the torch chunked path is the comparison, as for Titans' op above
    for name in ("moneta", "memora", "yaad"):
        mod = mods[name]
        qm, km, vm, _ = make_inputs(B, T, H, Dm, dtype, device)
        g = torch.Generator(device="cpu").manual_seed(3)
        lo_hi = {"eta": (0.05, 0.5), "alpha": (0.9, 1.0), "delta": (0.2, 1.0)}
        # channel-wise gates (docs/semantics.md: channel-wise gates) over their side
        gm = {n: (lo_hi[n][0] + (lo_hi[n][1] - lo_hi[n][0])
                  * torch.rand(B, T, H, *((Dm,) if n in mod.GATE_CHANNELS else ()), generator=g)).to(device)
              .requires_grad_(True) for n in mod.GATES}
        timed(f"{name} memory op (D={Dm}, C={mod.MINIBATCH}): mirasc chunked (triton) vs mirasc torch chunked",
              lambda mod=mod, qm=qm, km=km, vm=vm, gm=gm: mod.apply(qm, km, vm, gm, backend="triton",
                                                                   algorithm="chunked")[0],
              rows, device, tokens,
              peer=lambda mod=mod, qm=qm, km=km, vm=vm, gm=gm: mod.apply(qm, km, vm, gm, backend="torch",
                                                                        algorithm="chunked")[0])

    # -- Titans: MLP memory layer vs titans-pytorch
    mod = mods["titans"]
    dim, heads, Tt = (32, 2, 64) if smoke else (256, 4, 2048)
    layer = mod.Layer(dim, heads, head_dim=dim).to(device)
    x = torch.randn(1, Tt, dim, device=device, requires_grad=True)
    peer = None
    try:
        from titans_pytorch import NeuralMemory

        mem = NeuralMemory(dim=dim, chunk_size=64, heads=heads,
                           default_model_kwargs=dict(depth=2, expansion_factor=4.0)).to(device)

        def peer():
            return mem(x)[0]
    except ImportError:
        pass
    timed(f"titans layer (dim {dim}, {heads} heads, T={Tt}) vs titans-pytorch", lambda: layer(x), rows, device,
          Tt, peer=peer)
    return rows


def table(rows, device_name) -> str:
    lines = [f"\n### mirasc GPU suite — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {device_name}, torch "
             f"{torch.__version__}, triton {triton_version()}\n",
             "| case | fwd ms | fwd+bwd ms | peer fwd ms | peer fwd+bwd ms | fwd+bwd tokens/s | speed vs peer "
             f"(fwd+bwd) | fwd TFLOP/s (% of {PEAK_TFLOPS:.0f}) | fwd+bwd TFLOP/s | fwd GB/s (% of {PEAK_TBS} TB/s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def f(x):
        return "—" if x is None else f"{x:.3f}"

    for label, t_f, t_fb, p_f, p_fb, tokens, flops, nbytes in rows:
        tps = "—" if not t_fb else f"{tokens / (t_fb / 1e3):,.0f}"
        ratio = "—" if not (t_fb and p_fb) else f"{p_fb / t_fb:.2f}x"
        tf = "—" if not (flops and t_f) else f"{flops / t_f / 1e9:.1f} ({100 * flops / t_f / 1e9 / PEAK_TFLOPS:.1f}%)"
        tfb = "—" if not (flops and t_fb) else f"{3 * flops / t_fb / 1e9:.1f}"
        bw = "—" if not (nbytes and t_f) else f"{nbytes / t_f / 1e6:.0f} ({100 * nbytes / t_f / 1e9 / PEAK_TBS:.1f}%)"
        cells = [label, f(t_f), f(t_fb), f(p_f), f(p_fb), tps, ratio, tf, tfb, bw]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emit", type=Path, help="compile the suite's specs into this folder and exit")
    ap.add_argument("--emit-dir", type=Path, default=EMIT_DIR, help="where the emitted modules are")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU, TRITON_INTERPRET=1): harness check")
    ap.add_argument("--out", type=Path, help="append the markdown table to this file")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no new case after this many seconds (kernel compiles can be slow)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only the cases whose label starts with one of these")
    args = ap.parse_args(argv)
    ONLY[0] = args.only
    DEADLINE[0] = time.perf_counter() + args.budget_s
    if args.emit:
        emit(args.emit)
        return 0
    if not args.emit_dir.exists():
        emit(args.emit_dir)
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (smoke)"
    if args.out:
        PARTIAL[0] = args.out.with_name(args.out.name + ".partial")
    text = table(run(args), device_name)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(text)
        PARTIAL[0].unlink(missing_ok=True)
        PARTIAL[0] = None
    return 0



if __name__ == "__main__":
    sys.exit(main())
