"""The chunk kernels' GPU autotuning spaces and the resource model that prunes them (a runtime piece: its body is copied
into every emitted module with chunk kernels, by mirasc.codegen.standalone). A schedule, never what is computed: which
tiles, warps and stages a GPU may launch for each chunk kernel (docs/kernels.md), and a model of the shared memory each
configuration needs, an upper bound of what ptxas reports (checked by `mirasc kernels`: every kept configuration must
fit, tests/triton_backend/test_kernel_fit.py).
`ch` is the module's decay layout: a log-decay per key channel (True) or per head."""

import triton

SUB = 16  # rows of a sub-block (key-channel decay): the scores and gradients kernels take one per program
# The scans hold the state's rows over every padded key column in registers, as at most two K blocks: up to 256
# columns (blocks of 128) with 16-bit products. Wider (blocks of 256) the reverse scan spills 0.9-4 KB in every
# configuration on sm_90 (Hedgehog at D = 256, Dk = 512); with exact fp32 products (FMA units, operands in
# registers) already 256 columns spill 2-2.4 KB in the reverse scan on sm_80 and sm_90 (Gated DeltaNet, D = 256).
# Beyond these the scans have no configuration and such sizes are refused.
_SCANS = ("_chunk_state_fwd", "_chunk_state_bwd")


def _scan_max_k(prec):
    """The widest padded key the scans hold with `prec` dots."""
    return 128 if prec == "ieee" else 256


def _chunk_smem_estimate(name, meta, ch):
    """Bytes of shared memory a configuration needs: a model, an upper bound of what ptxas reports. The chunk-parallel
    kernels: every tile a loop iteration loads, fp32, once per pipeline stage, plus the [BT, BT] intermediates (at
    Dk = Dv = 128, BT = 64, bf16, sm_90 above ptxas for every configuration, by ~20% for the largest). The scans
    (`_scan_smem_estimate`) stage their loop's tiles only when pipelined."""
    BT, BV, BK = meta["BT"], meta["BV"], meta["BK"]
    stages = meta.get("num_stages", 1)
    if name in _SCANS:
        return _scan_smem_estimate(name, BT, BV, meta["K_BLOCK"], BK, stages, meta["BC"], ch)
    if name in ("_wy_fwd", "_wy_bwd"):  # K, W (or Wk, dWk) and V (or U, dU) tiles; S, A and their kin [BT, BT]
        return 4 * (stages * (2 * BT * BK + 2 * BT * BV) + 4 * BT * BT)
    if ch:  # the gradients' sub-blocks hold chunk tiles and a [BC, BC, BK] factor
        BC = SUB
        if name == "_chunk_du_local_bwd":  # A and dA [BT, BT]; dO and u tiles
            return 4 * (stages * 2 * BT * BV + 2 * BT * BT)
        if name == "_chunk_grads_bwd":
            return 4 * (stages * (2 * BV * BK + 2 * BC * BV) + 3 * BT * BK + 2 * BC * BT + 2 * BC * BC * BK)
    if name in ("_chunk_output_fwd", "_chunk_du_local_bwd"):
        return 4 * (stages * (2 * BT * BK + BV * BK) + BT * BT + BT * BV)
    return 4 * (stages * (2 * BV * BK + 3 * BT * BV) + 2 * BT * BK + BT * BT)  # _chunk_grads_bwd


def _scan_smem_estimate(name, BT, BV, BKb, full_k, stages, BC, ch):
    """The scans' shared memory (bytes), an upper bound of ptxas: the operands of their products staged once, fp32
    ([BT, BKb] and [BV, BKb] for a K block of BKb columns, [BT, BV]), and, pipelined (stages > 1), stages - 1
    copies of a sub-block's loaded tiles over all full_k key columns, fp32: k and Wk (and q in the reverse scan; g
    with a key-channel decay, whose sub-blocks are always SUB rows), and [BC, BV] of u or dO, for sub-blocks of BC
    rows. Measured with ptxas for sm_90 and sm_80 on the whole space at key widths 128 to 256 (per-head and
    key-channel decays, a feature map's bf16x2 dots): at most 90% of this (the per-head decay's 16-row sub-blocks
    at BV = 64; 80% for every whole-chunk configuration); the old model, every tile staged per stage, was up to
    14x above (228 KB modelled against 16 KB at 256 key columns)."""
    tiles = (2 if name == "_chunk_state_fwd" else 3) + int(ch)
    return 4 * ((stages - 1) * (tiles * BC * full_k + BC * BV) + BT * BKb + BV * BKb + BT * BV)


def _chunk_space(name, Dk, Dv, BT, prec, ch):
    """(configuration, modelled shared-memory bytes) of one chunk kernel's whole GPU autotuning space at this
    shape, ordered as `_chunk_configs` keeps them. The scans hold a [BV, Dk] state tile as one block or, above
    Dk = 64, as two [BV, Dk/2] blocks (TWO_K; no configuration above _scan_max_k); the chunk-parallel kernels tile
    Dk in BK blocks. A tile wider than the padded dimension is that dimension (at Dk or Dv <= 16: 16-wide tiles, the
    interpreter's)."""
    full_k = max(16, triton.next_power_of_2(Dk))
    full_v = max(16, triton.next_power_of_2(Dv))
    scan = name in _SCANS
    if scan and full_k > _scan_max_k(prec):
        return []
    fma = prec == "ieee"
    out, seen = [], set()
    grads = name == "_chunk_grads_bwd"
    bvs = ((16, 32) if fma else (16, 32, 64)) if scan else ((32,) if fma else (32, 64))
    # (the gradients kernel with 16-bit operands: BK = 32 spills 280+ B on sm_80 at D = 128, BK = 16 none)
    bks = (32,) if fma else (16, 32) if grads and prec in ("bf16", "fp16", "bf16x2") else (32, 64)
    if name == "_wy_bwd" and not fma:  # (sm_80 at D = 128: 32-wide tiles spill)
        bvs, bks = (16, 32), (16, 32)
    if name == "_wy_fwd" and ch and not fma:
        # the key-channel preparation's key loop (e^x, the split inverse, a [BT, BK] tile): 64-wide spills on sm_80
        # at D = 128 (KDA 40-208 B; after the preconditioner's fp32 keys 592-776 B), 16-wide nothing
        bks = (16, 32)
    if ch and grads:  # (one 16-row sub-block per program)
        bvs, bks = (16, 32), (16, 32)
    if ch and name == "_chunk_du_local_bwd":  # (reads no key: one BK)
        bks = bks[:1]
    for bv in bvs:
        for bk in (((full_k // 2 if full_k > 64 else full_k),) if scan else bks):
            bv, bk = min(bv, full_v), min(bk, full_k)
            if (bv, bk) in seen:
                continue
            seen.add((bv, bk))
            two_k = 2 * bk == full_k
            for rows in (_scan_rows(BT, two_k, ch, prec) if scan else (None,)):
                extra = {"TWO_K": two_k, "BC": rows} if scan else {}
                # the gradients' sub-blocks with a channel decay and the preparation's backward (five [BT, BT]
                # tiles): 4 warps spill
                for warps in ((8,) if fma or (ch and grads) or name == "_wy_bwd" else (8, 4)):
                    for stages in (1, 2):
                        meta = dict(BT=BT, BV=bv, BK=full_k if scan else bk, K_BLOCK=bk, BC=rows, num_stages=stages)
                        out.append((triton.Config({"BV": bv, "BK": bk, **extra}, num_warps=warps,
                                                  num_stages=stages), _chunk_smem_estimate(name, meta, ch)))
    return out


def _scan_rows(BT, two_k, ch, prec):
    """The rows a scan takes at once (BC, its sub-blocks), safest first. A decay per key channel: 16 (no [BT, BK]
    fp32 tile live). One per head: the whole chunk (a 64-row tile feeds a warpgroup's HGMMA on sm_90) and, where
    the state is two K blocks and the products run on tensor cores, also 16-row sub-blocks, which hold a quarter
    of the chunk's key and query tiles: on sm_80 at 256 padded key columns they hold the reverse scan's BV = 64
    at 255 registers without spills (the whole chunk: 4856 B, Gated DeltaNet). Sub-blocks come first under split
    products (bf16x2: the state's two bf16 parts are operands; Hedgehog at D = 128 and Based on sm_80, BV = 16:
    the whole chunk spills 40 B at 255 registers, sub-blocks none at 166), the whole chunk first otherwise (Gated
    DeltaNet at D = 256 on sm_80, BV = 16: 0 B, sub-blocks 8 B)."""
    if ch:
        return (SUB,)
    if not two_k or BT <= SUB or prec == "ieee":
        return (BT,)
    return (SUB, BT) if prec == "bf16x2" else (BT, SUB)


def _chunk_configs(name, Dk, Dv, BT, smem_limit, prec, ch):
    """The GPU autotuning space of one chunk kernel at this shape (`_chunk_space`), pruned to what fits
    `smem_limit` (None: the whole space); empty where nothing fits (the module's `_chunk_fit_error` says why).
    Ordered from the safest (smallest tiles, 8 warps, 1 stage: no spills at D = 128) to the largest (nearest the
    shared-memory limit); `mirasc kernels --extremes` compiles both ends. Full-fp32 dots (prec "ieee", fp32
    inputs) run on the FMA units with their operands in registers: only the small tiles and 8 warps, which do
    not spill (ptxas spills 9-17 KB and takes over a minute on 64-wide tiles with 4 warps). With a key-channel
    decay the gradients kernel takes one 16-row sub-block per program with whole-chunk [BT, BK] tiles and a
    [16, 16, BK] factor: 16- and 32-wide tiles and 8 warps (4 warps spill at D = 128 on sm_90)."""
    return [c for c, smem in _chunk_space(name, Dk, Dv, BT, prec, ch) if smem_limit is None or smem <= smem_limit]


# the dots' precisions (`_dot_precision`) as a refusal names them
_PREC_NAMES = {"ieee": "fp32", "tf32": "tf32", "bf16": "bf16-operand", "fp16": "fp16-operand",
               "bf16x2": "split-bf16-operand"}
# the kernels `_chunk_space` sizes (the momentum delta rule's scans have spaces of their own)
_SPACE_KERNELS = ("_chunk_state_fwd", "_chunk_output_fwd", "_chunk_du_local_bwd", "_chunk_state_bwd",
                  "_chunk_grads_bwd", "_wy_fwd", "_wy_bwd")


def _chunk_refusal(Dk, Dv, BT, prec, smem_limit, ch, spaces, width=None, window=1):
    """None where every kernel in `spaces` (name -> its autotuning space, space(args, smem_limit) -> configs: the
    kernels a module launches) has a configuration at these sizes that fits `smem_limit` (bytes; None: no limit),
    else why not and the ways out (the refusal's message). Dk, Dv: the widths the kernels read (a feature map's φ
    width); BT: the rows of the chunk tile; prec: the dots' precision ("ieee" | "tf32" | "bf16" | "fp16" |
    "bf16x2"); width: (formula, D -> key width) where a feature map widens heads of width D, else None; window: the
    Omega window's kernel rows per token (chunk_size counts tokens, the chunk tile rows)."""
    def empty(dk, bt):
        args = {"Nk": dk, "Nv": Dv, "BT": bt, "PREC": prec}
        return [name for name, space in spaces.items() if not space(args, smem_limit)]

    names = empty(Dk, BT)
    if not names:
        return None
    full_k = max(16, triton.next_power_of_2(Dk))
    why = []
    for name in names:
        space = _chunk_space(name, Dk, Dv, BT, prec, ch) if name in _SPACE_KERNELS else []
        scan = name in _SCANS
        held = (f"holds state rows [BV, Dk] over all {full_k} padded key columns ("
                + (f"two K blocks of {full_k // 2})" if full_k > 64 else "one K block)")) if scan else "tiles Dk"
        if space:
            why.append(f"{name} {held} and needs {min(smem for _, smem in space) // 1024} KB at its smallest "
                       "configuration")
        elif scan and full_k > _scan_max_k(prec):
            most = _scan_max_k(prec)
            why.append(f"{name} holds state rows [BV, Dk] in registers over all {full_k} padded key columns, at "
                       f"most {most} with {_PREC_NAMES[prec]} dots (two K blocks of {most // 2}; wider ones spill "
                       "in every configuration)")
        else:
            why.append(f"{name} has no configuration at these sizes")
    formula, to_width = width or ("", None)
    fits_k = [dk for dk in (2 ** i for i in range(4, full_k.bit_length() - 1)) if not empty(dk, BT)]
    fits_t = [bt for bt in (2 ** i for i in range(4, BT.bit_length() - 1)) if not empty(Dk, bt)]
    ways = ["backend='torch' (what backend='auto' picks at these sizes)",
            "algorithm='recurrent' (the fused recurrent kernel, where its resource model admits the size)"]
    if fits_t and fits_t[-1] // window >= 1:
        ways.append(f"chunk_size <= {fits_t[-1] // window} (a chunk tile of {fits_t[-1]} rows fits)")
    heads = "smaller heads"
    if fits_k:
        heads += f" (key widths up to {fits_k[-1]} fit here"
        if to_width is not None and to_width(1) <= fits_k[-1]:
            heads += f": D <= {max(d for d in range(1, fits_k[-1] + 1) if to_width(d) <= fits_k[-1])}"
        heads += ")"
    ways.append(heads)
    return (f"the chunked Triton kernels have no configuration that fits at Dk={Dk}"
            + (f" (the feature map's width, {formula} for heads of width D)" if to_width is not None else "")
            + f", Dv={Dv}, a chunk tile of {BT} rows, {_PREC_NAMES[prec]} dots, in "
            + ("any shared memory" if smem_limit is None else f"{smem_limit // 1024} KB of shared memory per block")
            + ": " + "; ".join(why) + ". Use " + ", ".join(ways[:-1]) + " or " + ways[-1])
