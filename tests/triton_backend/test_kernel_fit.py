"""Generated Triton kernels fit a real GPU: compiled ahead of time for sm_90 on the CPU (no GPU
needed) through `mirasc kernels`' machinery, in a subprocess because the rest of the suite imports triton
under the interpreter. A representative set at the head size models train with (D = 128): the chunked
linear-memory kernels at the first (safest) and last (nearest the limits) configuration the resource
model keeps, for bf16 and fp32 inputs, and the flash attention kernels. Each compiled configuration must
fit the target's shared memory and compile in under 60 s; each chunked forward kernel must have a kept
configuration that does not spill; so must the flash kernels on sm_80 (forward, dq; in bf16 dk/dv too), whose
dots use the tensor cores with 16-bit inputs and never with fp32 ones (exact fp32 products, no TF32).
The fused recurrent kernels of linear memories are tiled over V (BV < D) and DeltaNet's forward has a candidate
without spills (Sparse-Lp's spills on sm_80 in fp32 once the launch's alignment specialization is applied); a
memory too large for one program is refused with its reason. Every kernel is compiled with the specialization a
GPU's JIT gives its launch (tt.divisibility 16, integers equal to 1 as constants): the tests at the end check it
against Triton's own. The full table over every bundled spec is `benchmarks/kernel_table.py`
(benchmarks/RESULTS.md, "Kernels compiled ahead of time"). Titans' streamed mini-batch kernels
(MLP memory, D = 128, E = 512) fit and their forward does not spill."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

CHUNK_KERNELS = {"_chunk_state_fwd", "_chunk_output_fwd", "_chunk_du_local_bwd", "_chunk_state_bwd", "_chunk_grads_bwd"}
WY_KERNELS = {"_wy_fwd", "_wy_bwd"}  # the delta rule's chunk preparation
SCORES_KERNELS = {"_chunk_scores_fwd", "_chunk_scores_bwd"}  # a key-channel decay's scores
LOG_DECAY_KERNELS = {"_log_decay_fwd", "_log_decay_bwd"}  # a key-channel decay's cumulative log-decays (no product)
CASES = [
    # (spec, target, dk, dtype, algorithm, kernels that need a kept configuration without spills)
    # (bf16 inputs: every product of the per-head chunk kernels takes bf16 operands on the tensor cores, HGMMA on
    # sm_90 and HMMA on sm_80, and every kernel has a kept configuration without spills on both at D = 64 and 128)
    ("gated_deltanet", "sm_90", 128, "bfloat16", "chunked", CHUNK_KERNELS | WY_KERNELS),
    ("gated_deltanet", "sm_80", 128, "bfloat16", "chunked", CHUNK_KERNELS | WY_KERNELS),
    ("deltanet", "sm_80", 64, "bfloat16", "chunked", CHUNK_KERNELS | WY_KERNELS),
    ("mamba2", "sm_80", 128, "float32", "chunked", {"_chunk_state_fwd", "_chunk_output_fwd"}),
    # the variants with a decay over key channels (16-row sub-blocks, g per channel; KDA's scores kernels too)
    ("gla", "sm_80", 128, "float32", "chunked", {"_chunk_state_fwd", "_chunk_output_fwd"}),
    ("kda", "sm_90", 128, "bfloat16", "chunked", CHUNK_KERNELS | SCORES_KERNELS | WY_KERNELS),
    ("kda", "sm_80", 64, "bfloat16", "chunked", CHUNK_KERNELS | SCORES_KERNELS | WY_KERNELS),
    # the preconditioner's fp32 keys and per-channel rates in the key-channel preparation (64-wide key tiles spilled)
    ("precond_kda", "sm_80", 128, "bfloat16", "chunked", CHUNK_KERNELS | SCORES_KERNELS | WY_KERNELS),
    # the generalized delta transition (RWKV-7: two kernel rows per token, the scores of chunk // 2 tokens)
    ("rwkv7", "sm_80", 128, "bfloat16", "chunked", {"_chunk_state_fwd", "_chunk_output_fwd"}),
    # the momentum delta rule's own scans (state [W, S]; fp32 dots: the one spill-free configuration kept; bf16
    # operands on HMMA, the chunk's 16-row sub-blocks)
    ("momentum_deltanet", "sm_90", 128, "float32", "chunked", {"_mom_state_fwd", "_mom_state_bwd"}),
    ("momentum_deltanet", "sm_80", 128, "bfloat16", "chunked", {"_mom_state_fwd", "_mom_state_bwd"}),
    # a linear memory under a feature map and normaliser: bf16 features and [v, 1] (width D + 1), the fp32 state
    # and dO as two bf16 parts (HALF_DOTS = "input_split"); Hedgehog's 2D features: the scans' widest key, 256
    # padded columns in two K blocks of 128, on sm_80 (the reverse scan spill-free in 16-row sub-blocks; the
    # whole chunk spilled 40 B there, 0 B on sm_90)
    ("hedgehog", "sm_80", 128, "bfloat16", "chunked", CHUNK_KERNELS),
    # heads of 256 on sm_80: every kernel spill-free in 16 bits (the reverse scan's rows scaled after its product)
    ("gated_deltanet", "sm_80", 256, "bfloat16", "chunked", CHUNK_KERNELS | WY_KERNELS),
    ("transformer", "sm_90", 128, "bfloat16", None, set()),
    # the flash kernels' tiles pruned for sm_80 (fixed 64 x 64 tiles spilled in bf16 and did not fit in fp32)
    ("transformer", "sm_80", 128, "bfloat16", None, {"_flash_fwd", "_flash_bwd_dkdv", "_flash_bwd_dq"}),
    ("transformer", "sm_80", 128, "float32", None, {"_flash_fwd", "_flash_bwd_dq"}),
    # the same flash kernels with the Forgetting Transformer's decay bias and forget-gate gradient (the safest dq
    # configuration spills 8 B with the decay on sm_90, a spill-free dq is inside the space: benchmarks/RESULTS.md,
    # "Every bundled spec on sm_90 and sm_80")
    ("forgetting_transformer", "sm_90", 128, "bfloat16", None, {"_flash_fwd", "_flash_bwd_dkdv"}),
    # stick-breaking's own flash kernels (fixed tiles per dtype, head size and GPU): none spills in 16 bits, at
    # D = 128 on sm_90 (key tiles of 64 in the backward) and at D = 256 on sm_80 (dk/dv at 16 x 32)
    ("stickbreaking", "sm_90", 128, "bfloat16", None, {"_sb_fwd", "_sb_bwd_dq", "_sb_bwd_dkdv"}),
    ("stickbreaking", "sm_80", 256, "bfloat16", None, {"_sb_fwd", "_sb_bwd_dq", "_sb_bwd_dkdv"}),
    # the fused recurrent kernels, tiled over V (the resource model's candidates)
    ("deltanet", "sm_90", 128, "bfloat16", "recurrent", {"_fused_recurrent_fwd"}),
    # (sparse_lp's forward spilled nothing (128 registers) before the launch's specialization was applied; with
    # tt.divisibility on its pointers and T, Nk, Nv its one kept configuration, BV=16 8 warps, gets 32 registers and
    # a 2416 B stack (ptxas: 2500 B of spill stores), measured with the sm_80 ptxas of Triton 3.9)
    ("sparse_lp", "sm_80", 128, "float32", "recurrent", set()),
    # the streamed mini-batch (dual-form) kernels of an MLP memory at D = 128, E = 512, C = 64
    ("titans", "sm_90", 128, "bfloat16", "chunked", {"_minibatch_stream_fwd", "_minibatch_stream_fwd_end",
                                                      "_minibatch_stream_bwd_a", "_minibatch_stream_bwd_b"}),
]
KERNELS = {"chunked": CHUNK_KERNELS,
           "recurrent": {"_fused_recurrent_fwd", "_fused_recurrent_bwd"}}
# the specs whose chunk kernels take 16-bit operands for 16-bit inputs (the module's HALF_DOTS = "input")
BF16_OPERAND_SPECS = {"gated_deltanet", "deltanet", "mamba2", "gla", "kda", "precond_kda", "rwkv7",
                      "momentum_deltanet"}
# and those whose fp32 operands go to the tensor cores as two bf16 parts each (HALF_DOTS = "split": bf16x3;
# "input_split": bf16x2, the 16-bit ones as they are)
BF16_SPLIT_SPECS = {"titans", "hedgehog"}
# pointers each chunk kernel reads in every variant: 16-aligned at the traced launch, so specialized as on a GPU
SPECIALIZED = {"_chunk_state_fwd": {"K", "G"}, "_chunk_output_fwd": {"Q", "G"}, "_chunk_du_local_bwd": {"DO", "DU"},
               "_chunk_state_bwd": {"K", "G"}, "_chunk_grads_bwd": {"K", "G"}}
MOMENTUM_KERNELS = {"_mom_state_fwd", "_mom_state_bwd"}
DELTA_KERNEL = "_flash_bwd_delta"  # the flash backward's δ (softmax and stick-breaking)
MINIBATCH_KERNELS = {"_minibatch_stream_fwd", "_minibatch_stream_fwd_end", "_minibatch_stream_bwd_a",
                     "_minibatch_stream_bwd_b"}
# a key-channel decay also launches the kernels of its cumulative log-decays and of its chunk-local scores (the
# output's; the delta family's preparation's, and their backward)
EXTRA_KERNELS = {"kda": SCORES_KERNELS | WY_KERNELS | LOG_DECAY_KERNELS,
                 "precond_kda": SCORES_KERNELS | WY_KERNELS | LOG_DECAY_KERNELS,
                 "rwkv7": SCORES_KERNELS | LOG_DECAY_KERNELS, "gla": {"_chunk_scores_fwd"} | LOG_DECAY_KERNELS,
                 "gated_deltanet": WY_KERNELS, "deltanet": WY_KERNELS}  # (per-head decay: the preparation kernels)


def _nvidia_tools_present():
    import importlib.util

    spec = importlib.util.find_spec("triton")
    return spec and (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists()


def _kernels(tmp_path, *args):
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # empty: honest compile times
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "mirasc.cli", "kernels", *args, "--length", "128", "--extremes",
                           "--json", str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    return proc, (json.loads(out.read_text()) if out.exists() else [])


needs_tools = pytest.mark.skipif(not _nvidia_tools_present(), reason="triton without its NVIDIA backend tools")


@needs_tools
@pytest.mark.parametrize("spec,target,dk,dtype,algorithm,no_spill", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[3]}-{c[4]}" for c in CASES])
def test_kernels_fit_target(tmp_path, spec, target, dk, dtype, algorithm, no_spill):
    proc, rows = _kernels(tmp_path, str(ROOT / "specs" / f"{spec}.miras"), "--target", target, "--dk", str(dk),
                          "--dtype", dtype, *(["--algorithm", algorithm] if algorithm else []))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {r["kernel"] for r in rows}
    assert names, "no kernel was launched"
    if algorithm:
        extra = EXTRA_KERNELS.get(spec, set()) if algorithm == "chunked" else set()
        assert names == (MINIBATCH_KERNELS if spec == "titans" else MOMENTUM_KERNELS if spec == "momentum_deltanet"
                         else KERNELS[algorithm] | extra)
    for r in rows:
        if r["kept"] is False:
            continue
        where = f"{r['kernel']} {r['config']}"
        assert r["ok"], f"{where}: {r['error']}"
        assert r["fits"], f"{where}: {r['shared_bytes']} B of shared memory on {target}"
        assert r["compile_s"] < 60, f"{where}: {r['compile_s']} s to compile"
        if algorithm == "recurrent":
            assert r["config"]["BV"] < dk, f"{where}: not tiled over V"
    if spec in ("transformer", "forgetting_transformer", "stickbreaking"):
        # the flash kernels' dots: 16-bit operands on the tensor cores; fp32 exact (ieee) on FMA units, never TF32
        for r in rows:
            if r["kernel"] == DELTA_KERNEL:  # δ = rowsum(dO ∘ O): a reduction, no product, no spill
                assert not r["mma"] and r["spill_bytes"] == 0, f"{r['kernel']}: {r['mma']} {r['spill_bytes']} B"
                assert {"O", "DO", "T"} <= set(r["specialized"]["divisible_by_16"]), f"{r['kernel']}: {r}"
                continue
            assert r["tensor_cores"] == (dtype != "float32"), f"{r['kernel']} {r['config']}: tensor cores {dtype}"
            # compiled with the launch's specialization: 16-aligned tensors and T = 128 divisible, unit strides
            # constants (what a GPU's JIT compiles; without it the cubins differ: tests below)
            hints = r["specialized"]
            lengths = {"T", "TT"} if spec == "stickbreaking" else {"Tq", "Tk"}
            assert {"Q", "K", "V"} | lengths <= set(hints["divisible_by_16"]), f"{r['kernel']}: {hints}"
            assert {"sqd", "skd", "svd"} <= set(hints["equal_to_1"]), f"{r['kernel']}: {hints}"
    if spec in BF16_OPERAND_SPECS | BF16_SPLIT_SPECS and dtype != "float32" and algorithm == "chunked":
        # the matrix instructions in the SASS: 16-bit operands on the tensor cores in every kept configuration (on
        # sm_90 HGMMA where a dot has 64 rows per warpgroup, HMMA on the 16-row sub-blocks of a key-channel decay)
        for r in rows:
            if r["kernel"] in LOG_DECAY_KERNELS:  # a cumulative sum: no product, no spill
                assert not r["mma"] and r["spill_bytes"] == 0, f"{r['kernel']}: {r['mma']} {r['spill_bytes']} B"
            elif r["kept"] is not False:  # the five chunk kernels and the key-channel delta rule's scores kernels
                kinds = set(r["mma"])
                assert kinds and all(k.endswith(".BF16") for k in kinds), f"{r['kernel']} {r['config']}: {kinds}"
                assert target == "sm_90" or not any(k.startswith("HGMMA") for k in kinds)
    if algorithm == "chunked" and spec not in ("titans", "momentum_deltanet"):
        for r in rows:  # the five chunk kernels (T = 128); the scores kernels take other names
            if r["kernel"] in KERNELS["chunked"]:
                # (the normaliser's values [v, 1] are D + 1 wide)
                aligned = {"T"} | ({"Nv"} if spec != "hedgehog" else set()) | SPECIALIZED[r["kernel"]]
                assert aligned <= set(r["specialized"]["divisible_by_16"]), f"{r['kernel']}: {r['specialized']}"
    for name in no_spill:
        spills = [r["spill_bytes"] for r in rows if r["kernel"] == name and r["kept"] is not False]
        assert 0 in spills, f"{name}: every compiled configuration spills ({spills} B)"


@needs_tools
def test_a_memory_too_large_for_one_program_is_refused(tmp_path):
    """Moneta (MLP memory, whole-matrix lq norm) keeps a (batch, head)'s whole state in one program: at
    D = 128 that cannot fit, so the module refuses the size with the limit named and `kernels` exits 3."""
    proc, rows = _kernels(tmp_path, str(ROOT / "specs" / "moneta_token.miras"), "--dk", "128",
                          "--algorithm", "recurrent")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert [r["kernel"] for r in rows] == ["(recurrent fwd: refused)"]
    assert "registers" in rows[0]["error"] and "128" in rows[0]["error"]


@needs_tools
def test_chunk_kernels_without_a_fitting_configuration_are_refused(tmp_path):
    """Based's Taylor features widen the key to 1 + D + D(D+1)/2 = 2145 at D = 64: the chunk scans cannot hold a
    state row of 4096 padded key columns in sm_90's shared memory, so the module refuses the size (with the
    kernels, the sizes and backend='torch') before any launch, and `kernels` reports it and exits 3."""
    proc, rows = _kernels(tmp_path, str(ROOT / "specs" / "based.miras"), "--target", "sm_90", "--dk", "64",
                          "--dtype", "bfloat16", "--algorithm", "chunked")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert [r["kernel"] for r in rows] == ["(chunked fwd: refused)"]
    assert "_chunk_state_fwd" in rows[0]["error"] and "Dk=2145" in rows[0]["error"]
    assert "backend='torch'" in rows[0]["error"] and "backend='torch'" in proc.stderr


@needs_tools
def test_omega_window_tile_is_refused_as_on_a_gpu(tmp_path):
    """omega_yaad (minibatch(64), window 4) makes each mini-batch one 256-row tile of the mini-batch kernels, beyond
    the 64 rows they fit on a GPU: `kernels` refuses it as the GPU launch would (the module's FIT_SMEM_LIMIT), not
    compile a tile no GPU runs."""
    proc, rows = _kernels(tmp_path, str(ROOT / "specs" / "omega_yaad.miras"), "--target", "sm_90", "--dk", "64",
                          "--dtype", "bfloat16", "--algorithm", "chunked")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert [r["kernel"] for r in rows] == ["(chunked fwd: refused)"]
    assert "256" in rows[0]["error"] and "algorithm='recurrent'" in rows[0]["error"]


# A launch's specialization (what `JITFunction.run` compiles on a GPU): the probe's X is 16-byte aligned, Y one
# float past an aligned address, Z aligned but exempt from alignment specialization, n divisible by 16, odd not,
# one equal to 1, kept divisible but exempt from specialization altogether, f a float.
def _probe(X, Y, Z, n, odd, one, kept, f, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(X + i, mask=m) + tl.load(Z + i, mask=m) * f
    tl.store(Y + i * one, x + odd + kept, mask=m)


probe = JITFunction(_probe, do_not_specialize=["kept"], do_not_specialize_on_alignment=["Z"])


def _probe_args(aligned=True):
    import torch

    x = torch.zeros(2 * 1024 + 16)  # CPU allocations are 64-byte aligned, as CUDA's are (256 B)
    assert x.data_ptr() % 64 == 0
    return dict(X=x[:1024] if aligned else x[1:1025], Y=x[1025:2049], Z=x[1024:2048], n=1024 if aligned else 1023,
                odd=127, one=1, kept=32, f=0.5, BLOCK=512)


@needs_tools
def test_launch_specialization_marks_divisible_arguments_as_the_jit_does():
    """`mirasc kernels` compiles each intercepted launch with the specialization the JIT gives it on a GPU: the
    aligned pointer and the integer divisible by 16 get tt.divisibility 16, the integer 1 becomes a constant, and
    the misaligned pointer, the odd integer, the do_not_specialize(_on_alignment) arguments and the float do not.
    Checked against the installed Triton's own binder and argument packing (what `JITFunction.run` does)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime import jit

    from mirasc.lab.kernel_report import _signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    args = _probe_args()
    sig, const, attrs, hints = _signature(probe, args, backend)
    assert hints == {"divisible_by_16": ["X", "n"], "equal_to_1": ["one"]}
    assert sig == {"X": "*fp32", "Y": "*fp32", "Z": "*fp32", "n": "i32", "odd": "i32", "one": "constexpr",
                   "kept": "i32", "f": "fp32", "BLOCK": "constexpr"}
    assert const == {"one": 1, "BLOCK": 512}
    divisible = {i for i, a in attrs.items() if ["tt.divisibility", 16] in a}
    assert divisible == {(0,), (3,)}
    if not (hasattr(jit, "create_function_from_signature") and hasattr(JITFunction, "_pack_args")):
        pytest.skip("this Triton's JIT has no create_function_from_signature/_pack_args to compare with")
    bound, specialization, options = jit.create_function_from_signature(probe.signature, probe.params, backend)(
        **args)
    _, jit_sig, jit_const, jit_attrs = probe._pack_args(backend, {}, bound, specialization, options)
    assert (sig, attrs) == (jit_sig, jit_attrs)
    assert {(probe.arg_names.index(k),): v for k, v in const.items()} == jit_const


def test_specialization_rule_matches_triton_native():
    """The reimplemented rule (for a Triton without `native_specialize_impl`) gives what the native one does."""
    import torch
    from triton.backends.compiler import BaseBackend

    from mirasc.lab.kernel_report import _specialize_impl, _specialize_rule

    native = _specialize_impl()
    if native is None:
        pytest.skip("this Triton has no native_specialize_impl: the rule is the one in use")
    x = torch.zeros(64)
    values = [x, x[1:], x.to(torch.bfloat16)[8:], x.to(torch.int64)[2:], 0, 1, 2, 16, 127, 128, -16, 2**31 - 16,
              2**31, 2**40, 2**63, True, 0.5, None]
    for v in values:
        for flags in [(c, s, a) for c in (False, True) for s in (False, True) for a in (False, True)]:
            assert _specialize_rule(v, *flags) == native(BaseBackend, v, *flags), (v, flags)


@needs_tools
def test_specialization_changes_the_compiled_kernel(tmp_path):
    """The hints reach the compiled code: the aligned launch's TTIR carries tt.divisibility = 16 on X and n and
    its PTX loads X four floats at a time (ld.global.v4; Y, misaligned, is still stored one float at a time);
    the launch with X misaligned and an odd n compiles to scalar loads without the attribute on X (so the
    registers and spills read off the two cubins are those of different programs). In a subprocess: this
    one runs triton under the interpreter."""
    script = (
        "import json, sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(Path(__file__).resolve().parent)!r}]\n"
        "from test_kernel_fit import probe, _probe_args\n"
        "from mirasc.lab.kernel_report import compile_launch\n"
        "out = {}\n"
        "for aligned in (True, False):\n"
        "    k = compile_launch(probe, _probe_args(aligned), 'sm_90', {'num_warps': 4})\n"
        "    out[str(aligned)] = [k.asm['ttir'], k.asm['ptx']]\n"
        "print(json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    (ttir_a, ptx_a), (ttir_u, ptx_u) = out["True"], out["False"]
    head_a, head_u = (t[t.index("tt.func"):].split("\n", 1)[0] for t in (ttir_a, ttir_u))
    arg0 = re.compile(r"%(?:X|arg0): !tt.ptr<f32>( \{tt.divisibility = 16 : i32\})?")  # named from Triton 3.9 on
    assert arg0.search(head_a).group(1) and not arg0.search(head_u).group(1), (head_a, head_u)
    assert head_a.count("tt.divisibility = 16") == 2 and head_u.count("tt.divisibility = 16") == 0
    assert "ld.global.v4" in ptx_a and "ld.global.v4" not in ptx_u
    assert "st.global.v4" not in ptx_a + ptx_u  # Y is misaligned in both: its stores stay scalar
