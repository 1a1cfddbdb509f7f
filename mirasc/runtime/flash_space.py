"""The flash kernels' GPU autotuning spaces and the resource model that prunes them (a runtime piece: its body is copied
into every emitted module with softmax flash kernels, by mirasc.codegen.standalone). A schedule, never what is
computed: the tiles (rows of queries BM, rows of keys BN), warps and stages a GPU may launch for the forward and the
two backward kernels, kept where a register model and a shared-memory model (upper bounds of what ptxas reported)
admit them; checked by `mirasc kernels` (tests/triton_backend/test_kernel_fit.py)."""

import triton

# The configurations a GPU may try, per kernel: (rows of queries BM, rows of keys BN, warps). The program's own
# rows are BM (forward, dq) or BN (dk/dv); 8 warps only where they are enough rows for the warps' dot fragments.
_FLASH_TILES = {"_flash_fwd": ((32, 32, 4), (32, 64, 4), (64, 32, 8), (64, 64, 8), (64, 64, 4), (128, 64, 8)),
                "_flash_bwd_dq": ((32, 32, 4), (32, 64, 4), (64, 32, 8), (64, 64, 8), (64, 64, 4), (128, 64, 8)),
                "_flash_bwd_dkdv": ((16, 16, 4), (32, 16, 4), (32, 32, 8), (64, 32, 8), (64, 64, 8), (64, 64, 4))}
# fp32 inputs multiply exactly (input_precision="ieee"): on the CUDA cores (FMA), not the tensor cores, where a
# thread holds its share of the [BM, BN] score tile with D operand values each. Measured at D = 128 (sm_80, sm_90,
# with and without the launch's alignment specialization): BM = BN = 32 and larger spill 600 B to 7.8 KB, 16 x 16,
# 16 x 32 and 32 x 16 with 4 warps spill at most 16 B (forward, dq); dk/dv spills 3.8-4.3 KB at 16 x 16 (its
# smallest). These are the tiles fp32 inputs may launch.
_FLASH_TILES_FP32 = {"_flash_fwd": ((16, 16, 4), (16, 32, 4), (32, 16, 4)),
                     "_flash_bwd_dq": ((16, 16, 4), (16, 32, 4), (32, 16, 4)),
                     "_flash_bwd_dkdv": ((16, 16, 4),)}
# fp32 values per thread the live tiles of a program may take (_flash_live_values / (32 · warps)), per kernel.
# Calibrated on sm_80 compiles at D = 128, bf16 (`mirasc kernels --all`): the forward spilled from 144 values
# on (BM = 64, BN = 64, 4 warps: 8 B; BM = 128, 8 warps: 8-56 B), not at 80 or below; dq from 224 (160 B),
# not at 128; dk/dv, which keeps four [BN, D] tiles, already at 72 (BN = 32, 8 warps: 184 B) and 80 (2.4 KB),
# not at 68 (BM = BN = 16, 4 warps).
# With 16-bit operands (q counted at half) the forward's 128 admits BM = 128, BN = 64, 8 warps and 64 x 64 with 4
# warps: as a GPU launch compiles them (aligned, unit strides; Triton 3.6, D = 128, bf16) 166 (sm_90) and 218
# (sm_80) registers and 242 (64 x 64, sm_80), no spill; without that specialization they spill 72-1672 B.
_FLASH_REG_BUDGET = {"_flash_fwd": 128, "_flash_bwd_dq": 128, "_flash_bwd_dkdv": 72}
_FLASH_KERNELS = tuple(_FLASH_TILES)


def _flash_live_values(name, BM, BN, bdk, bdv, elt=4):
    """fp32 values a program of kernel `name` keeps live: its resident operand tiles (q; k and v; q and dO), in
    the inputs' dtype (elt bytes: a bf16 tile is half an fp32 one), its fp32 accumulators (the output; dk and dv;
    dq) and the [BM, BN] fp32 score tiles."""
    if name == "_flash_fwd":
        return BM * bdk * elt // 4 + BM * bdv + BM * BN
    if name == "_flash_bwd_dkdv":
        return BN * (bdk + bdv) * elt // 4 + BN * (bdk + bdv) + 2 * BM * BN
    return BM * (bdk + bdv) * elt // 4 + BM * bdk + 2 * BM * BN


def _flash_smem_estimate(name, BM, BN, bdk, bdv, stages, elt=4):
    """Bytes of shared memory a configuration needs: a model, every tile counted at elt bytes per value (the
    dots' operands are in the inputs' dtype, P and dS rounded to it). The forward streams the k and v tiles once
    per pipeline stage and keeps the q tile; dq keeps q and dO and stages one key tile more than it has stages;
    dk/dv stages q and dO per stage and keeps its own k and v; each passes [BM, BN] score tiles into a second
    dot (dq on sm_90: up to four). Fitted to, and above, what ptxas reported for every configuration at D = 128
    on sm_80 and sm_90, bf16 and fp32, both as `mirasc kernels --all` compiles them and with the alignment and
    unit-stride specialization a GPU's launch compiles with (which pipelines the loads: more shared memory per
    stage). A decaying memory's log-decay rows and columns (and the gate gradient's sums) add 64-512 B: the
    1 KB added covers them."""
    if name == "_flash_fwd":
        return elt * (stages * BN * (bdk + bdv) + BM * bdk + BM * BN) + 1024
    if name == "_flash_bwd_dq":
        return elt * (BM * (bdk + bdv) + (stages + 1) * BN * max(bdk, bdv) + 4 * BM * BN) + 1024
    return elt * (stages * BM * (bdk + bdv) + BN * (bdk + bdv) + BM * BN) + 1024


def _flash_configs(name, DK, DV, smem_limit, elt=4):
    """The GPU autotuning space of one flash kernel at these head sizes and operand bytes (elt: 2 for fp16/bf16
    inputs, 4 for fp32): its tile menu (_FLASH_TILES; _FLASH_TILES_FP32 for fp32 inputs, whose exact dots run on
    FMA units) with 2 or 3 pipeline stages, kept where the live tiles fit
    the kernel's register budget (fixed 64 x 64 tiles with 4 warps spill at D = 128) and, unless smem_limit is
    None (the whole space), the shared-memory model fits the limit. Ordered from the safest (fewest values per
    thread, least shared memory) to the largest; `mirasc kernels --extremes` compiles both ends."""
    bdk = max(16, triton.next_power_of_2(DK))
    bdv = max(16, triton.next_power_of_2(DV))
    space = []
    for BM, BN, warps in (_FLASH_TILES_FP32 if elt == 4 else _FLASH_TILES)[name]:
        per_thread = _flash_live_values(name, BM, BN, bdk, bdv, elt) / (32 * warps)
        if per_thread > _FLASH_REG_BUDGET[name]:
            continue
        for stages in (2, 3):
            smem = _flash_smem_estimate(name, BM, BN, bdk, bdv, stages, elt)
            if smem_limit is None or smem <= smem_limit:
                space.append((per_thread, smem, BM, BN, warps, stages))
    space.sort()
    return [triton.Config({"BM": BM, "BN": BN}, num_warps=w, num_stages=st) for _, _, BM, BN, w, st in space]

