"""The chunk kernels' resource model (mirasc.runtime.chunk_space), as a unit: its scans' shared memory stays an upper
bound of what ptxas reported for the configurations nearest it (Triton 3.9, bf16 inputs, chunk tile 64, T = 128:
`mirasc kernels --all` with the model off, per family, kernel, stages and target the configuration with the highest
ratio of ptxas to model), wider key widths than the scans hold have no configuration, and each space is ordered from
the safest configuration to the largest. The emitted modules carry this module's body (docs/kernels.md)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
from mirasc.runtime import chunk_space as cs  # noqa: E402

# (kernel, key-channel decay, padded key columns, BV, rows per sub-block, warps, stages, ptxas shared bytes on sm_90,
# on sm_80)
MEASURED = [
    ("_chunk_state_fwd", False, 256, 16, 64, 8, 1, 20480, 20480),     # Gated DeltaNet, D = 256
    ("_chunk_state_fwd", False, 256, 64, 64, 8, 2, 147716, 82180),
    ("_chunk_state_fwd", False, 128, 16, 64, 8, 2, 53508, 37124),     # D = 128
    ("_chunk_state_bwd", False, 256, 64, 64, 8, 1, 32768, 32768),
    ("_chunk_state_bwd", False, 256, 16, 64, 8, 1, 20480, 20480),
    ("_chunk_state_bwd", False, 128, 64, 64, 8, 2, 131588, 82436),
    ("_chunk_state_bwd", False, 256, 64, 16, 8, 1, 73728, 69696),     # Hedgehog, D = 128: 16-row sub-blocks
    ("_chunk_state_bwd", False, 256, 64, 16, 8, 2, 98368, 90176),
    ("_chunk_state_fwd", True, 256, 64, 16, 8, 1, 38912, 40960),      # KDA, D = 256
    ("_chunk_state_fwd", True, 256, 64, 16, 8, 2, 71680, 71680),
    ("_chunk_state_bwd", True, 256, 64, 16, 8, 1, 43008, 40960),
    ("_chunk_state_bwd", True, 256, 64, 16, 8, 2, 98304, 81920),
]


@pytest.mark.parametrize("kernel,ch,full_k,BV,BC,warps,stages,sm90,sm80", MEASURED)
def test_scan_model_bounds_ptxas(kernel, ch, full_k, BV, BC, warps, stages, sm90, sm80):
    space = {(c.kwargs["BV"], c.kwargs["BC"], c.num_warps, c.num_stages): smem
             for c, smem in cs._chunk_space(kernel, full_k, full_k, 64, "bf16", ch)}
    modelled = space[(BV, BC, warps, stages)]
    assert max(sm90, sm80) <= modelled
    # and not the old model's margin (every loop tile fp32 in every stage, up to 14x above ptxas)
    assert modelled <= 3 * max(sm90, sm80)


def test_scans_hold_at_most_256_key_columns_128_in_fp32():
    for kernel in cs._SCANS:
        for ch in (False, True):
            for prec in ("bf16", "bf16x2", "tf32"):
                assert cs._chunk_space(kernel, 256, 64, 64, prec, ch)
                assert cs._chunk_space(kernel, 257, 64, 64, prec, ch) == []
            # exact fp32 products (operands in registers): at most 128
            assert cs._chunk_space(kernel, 128, 64, 64, "ieee", ch)
            assert cs._chunk_space(kernel, 129, 64, 64, "ieee", ch) == []
    # the chunk-parallel kernels tile Dk: no such limit
    assert cs._chunk_space("_chunk_output_fwd", 512, 64, 64, "bf16", False)


def _key(c):
    return tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages


def test_spaces_are_ordered_safest_first_and_pruned_by_the_limit():
    limit = 64 * 1024
    for kernel in ("_chunk_state_fwd", "_chunk_state_bwd", "_chunk_output_fwd", "_chunk_grads_bwd", "_wy_fwd"):
        space = cs._chunk_space(kernel, 128, 128, 64, "bf16", False)
        first = space[0][0]
        assert (first.kwargs["BV"], first.num_warps, first.num_stages) == (16 if "state" in kernel else 32, 8, 1)
        kept = cs._chunk_configs(kernel, 128, 128, 64, limit, "bf16", False)
        assert [_key(c) for c in kept] == [_key(c) for c, smem in space if smem <= limit]
        assert [_key(c) for c in cs._chunk_configs(kernel, 128, 128, 64, None, "bf16", False)] == \
            [_key(c) for c, _ in space]


def test_scans_offer_sub_blocks_where_the_state_is_two_k_blocks():
    """Per head, two K blocks and tensor-core products: 16-row sub-blocks and the whole chunk, sub-blocks first
    under split products (bf16x2); one K block or exact fp32 products: the whole chunk; a key-channel decay: 16
    rows always."""
    def rows(kernel, full_k, ch, prec="bf16", bt=64):
        return list(dict.fromkeys(c.kwargs["BC"] for c, _ in cs._chunk_space(kernel, full_k, 64, bt, prec, ch)))
    for kernel in cs._SCANS:
        assert rows(kernel, 256, False) == [64, 16] and rows(kernel, 128, False) == [64, 16]
        assert rows(kernel, 256, False, "bf16x2") == [16, 64]
        assert rows(kernel, 64, False) == [64] and rows(kernel, 128, False, "ieee") == [64]
        assert rows(kernel, 256, True) == [16] and rows(kernel, 128, False, bt=16) == [16]
        first = cs._chunk_space(kernel, 256, 64, 64, "bf16x2", False)[0][0]
        assert (first.kwargs["BV"], first.kwargs["BC"], first.num_warps, first.num_stages) == (16, 16, 8, 1)


def test_emitted_chunk_modules_carry_this_module():
    """Every module with chunk kernels carries the body of mirasc.runtime.chunk_space as written, once, and binds its
    decay layout where it calls it (per head: Gated DeltaNet; per key channel: KDA)."""
    from pathlib import Path

    from mirasc.codegen.standalone import runtime_source
    from mirasc.compiler import compile_text

    specs = Path(__file__).resolve().parents[2] / "specs"
    for name, ch in (("gated_deltanet", False), ("kda", True)):
        source = compile_text((specs / f"{name}.miras").read_text()).source
        assert source.count(runtime_source("chunk_space")) == 1
        assert f"CH_DECAY = {ch}" in source and "_chunk_configs(name, Dk, Dv, BT, limit, prec, CH_DECAY)" in source


def _spaces(ch, names=cs._SPACE_KERNELS[:5]):
    """A module's autotuning table, as the chunk template builds it from this module."""
    return {name: (lambda args, smem_limit, name=name: cs._chunk_configs(name, args["Nk"], args["Nv"], args["BT"],
                                                                          smem_limit, args["PREC"], ch))
            for name in names}


def test_refusal_names_the_kernels_the_limit_and_the_ways_out():
    """A size with a configuration for every kernel is not refused; a key wider than the scans hold is, naming both
    scans, their register limit for the dots' precision, and the widest key (and head, through a feature map's
    width) that fits; on a small shared memory the smallest configuration's need and a smaller chunk tile."""
    taylor = ("1 + D + D(D+1)/2", lambda d: 1 + d + d * (d + 1) // 2)
    assert cs._chunk_refusal(128, 128, 64, "bf16", 232448, False, _spaces(False)) is None
    msg = cs._chunk_refusal(2145, 64, 64, "bf16", 232448, False, _spaces(False), taylor)
    assert msg.startswith("the chunked Triton kernels have no configuration that fits at Dk=2145 (the feature map's "
                          "width, 1 + D + D(D+1)/2 for heads of width D), Dv=64, a chunk tile of 64 rows, bf16-operand")
    for scan in ("_chunk_state_fwd", "_chunk_state_bwd"):
        assert f"{scan} holds state rows [BV, Dk] in registers over all 4096 padded key columns, at most 256" in msg
    assert "_chunk_output_fwd" not in msg  # (tiles Dk: it has configurations)
    assert msg.endswith("or smaller heads (key widths up to 256 fit here: D <= 21)")  # 1 + 21 + 231 = 253
    assert "at most 128 with fp32 dots" in cs._chunk_refusal(256, 64, 64, "ieee", None, False, _spaces(False))
    small = cs._chunk_refusal(128, 128, 64, "bf16", 16 * 1024, True, _spaces(True), window=2)
    assert "16 KB of shared memory per block" in small and "KB at its smallest configuration" in small
    assert "algorithm='recurrent'" in small and "backend='torch'" in small
    # (an Omega window of 2 rows per token: a chunk tile of 32 rows is chunk_size 16)
    tile = cs._chunk_refusal(128, 128, 64, "bf16", 40 * 1024, False, _spaces(False), window=2)
    assert "chunk_size <= 16 (a chunk tile of 32 rows fits) or smaller heads" in tile
