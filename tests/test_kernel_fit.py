"""Generated Triton kernels fit a real GPU (issue 10): compiled ahead of time for sm_90 on the CPU (no GPU
needed) through `mirasc kernels`' machinery, in a subprocess because the rest of the suite imports triton
under the interpreter. A representative set at the head size models train with (D = 128): the chunked
linear-memory kernels at the first (safest) and last (nearest the limits) configuration the resource
model keeps, for bf16 and fp32 inputs, and the flash attention kernels. Each compiled configuration must
fit the target's shared memory and compile in under 60 s; each chunked forward kernel must have a kept
configuration that does not spill; so must the flash kernels on sm_80 (forward, dq; in bf16 dk/dv too), whose
dots use the tensor cores with 16-bit inputs and never with fp32 ones (exact fp32 products, no TF32).
The fused recurrent kernels of linear memories are tiled over V (BV < D) and their forward has a candidate
without spills; a memory too large for one program is refused with its reason. The full table over every
bundled spec is `benchmarks/kernel_table.py` (benchmarks/RESULTS.md). Titans' streamed mini-batch kernels
(MLP memory, D = 128, E = 512) fit and their forward does not spill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("triton")

CASES = [
    # (spec, target, dk, dtype, algorithm, kernels that need a kept configuration without spills)
    # (bf16 inputs run exact fp32 dots in the per-head chunk kernels since the H200 run of 2026-12-04, where their
    # TF32 build faulted: the FMA scan's safest configuration spills 128 B at D = 128 on sm_90, the output kernel none)
    ("gated_deltanet", "sm_90", 128, "bfloat16", "chunked", {"_chunk_output_fwd"}),
    ("mamba2", "sm_80", 128, "float32", "chunked", {"_chunk_state_fwd", "_chunk_output_fwd"}),
    # the variants with a decay over key channels (16-row sub-blocks, g per channel)
    ("gla", "sm_80", 128, "float32", "chunked", {"_chunk_state_fwd", "_chunk_output_fwd"}),
    ("kda", "sm_90", 128, "bfloat16", "chunked", {"_chunk_state_fwd", "_chunk_output_fwd"}),
    # the generalized delta transition (RWKV-7: two kernel rows per token, the scores of chunk // 2 tokens)
    ("rwkv7", "sm_80", 128, "bfloat16", "chunked", {"_chunk_state_fwd", "_chunk_output_fwd"}),
    # the momentum delta rule's own scans (state [W, S]; fp32 dots: the one spill-free configuration kept)
    ("momentum_deltanet", "sm_90", 128, "float32", "chunked", {"_mom_state_fwd", "_mom_state_bwd"}),
    ("transformer", "sm_90", 128, "bfloat16", None, set()),
    # the flash kernels' tiles pruned for sm_80 (fixed 64 x 64 tiles spilled in bf16 and did not fit in fp32)
    ("transformer", "sm_80", 128, "bfloat16", None, {"_flash_fwd", "_flash_bwd_dkdv", "_flash_bwd_dq"}),
    ("transformer", "sm_80", 128, "float32", None, {"_flash_fwd", "_flash_bwd_dq"}),
    # the same flash kernels with the Forgetting Transformer's decay bias and forget-gate gradient (the safest dq
    # configuration spills 8 B with the decay on sm_90, a spill-free dq is inside the space: benchmarks/RESULTS.md)
    ("forgetting_transformer", "sm_90", 128, "bfloat16", None, {"_flash_fwd", "_flash_bwd_dkdv"}),
    # stick-breaking's own flash kernels (fixed tiles per dtype, head size and GPU): none spills in 16 bits, at
    # D = 128 on sm_90 (key tiles of 64 in the backward) and at D = 256 on sm_80 (32 x 32 tiles)
    ("stickbreaking", "sm_90", 128, "bfloat16", None, {"_sb_fwd", "_sb_bwd_dq", "_sb_bwd_dkdv"}),
    ("stickbreaking", "sm_80", 256, "bfloat16", None, {"_sb_fwd", "_sb_bwd_dq", "_sb_bwd_dkdv"}),
    # the fused recurrent kernels, tiled over V (the resource model's candidates)
    ("deltanet", "sm_90", 128, "bfloat16", "recurrent", {"_fused_recurrent_fwd"}),
    ("sparse_lp", "sm_80", 128, "float32", "recurrent", {"_fused_recurrent_fwd"}),
    # the streamed mini-batch (dual-form) kernels of an MLP memory at D = 128, E = 512, C = 64
    ("titans", "sm_90", 128, "bfloat16", "chunked", {"_minibatch_stream_fwd"}),
]
KERNELS = {"chunked": {"_chunk_state_fwd", "_chunk_output_fwd", "_chunk_du_local_bwd", "_chunk_state_bwd",
                       "_chunk_grads_bwd"},
           "recurrent": {"_fused_recurrent_fwd", "_fused_recurrent_bwd"}}
MOMENTUM_KERNELS = {"_mom_state_fwd", "_mom_state_bwd"}
MINIBATCH_KERNELS = {"_minibatch_stream_fwd", "_minibatch_stream_bwd_a", "_minibatch_stream_bwd_b"}
# the delta family with a key-channel decay also launches the kernels of its chunk-local scores
EXTRA_KERNELS = {"kda": {"_chunk_scores_fwd", "_chunk_scores_bwd"}, "rwkv7": {"_chunk_scores_fwd", "_chunk_scores_bwd"}}


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
        assert names == (MINIBATCH_KERNELS if spec == "titans" else MOMENTUM_KERNELS if spec == "momentum_deltanet"
                         else KERNELS[algorithm] | EXTRA_KERNELS.get(spec, set()))
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
            assert r["tensor_cores"] == (dtype != "float32"), f"{r['kernel']} {r['config']}: tensor cores {dtype}"
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
