"""The fused recurrent kernels' launch configurations and resource model (mirasc.runtime.recurrent_space) as a unit,
and the emitted modules that carry it (docs/kernels.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")
from mirasc.codegen.standalone import runtime_source  # noqa: E402
from mirasc.compiler import compile_text  # noqa: E402
from mirasc.runtime import recurrent_space as rs  # noqa: E402

SPECS = Path(__file__).resolve().parents[2] / "specs"

ROWS = rs._RecurrentLayout(True, "", 0, (("v", "k"),), False)  # a linear memory whose value rows update alone
FACTORS = rs._RecurrentLayout(True, "", 16, (("v", "k"),), False)  # the same with batched mini-batch factors
MLP = rs._RecurrentLayout(False, "an MLP memory", 0, (("e", "k"), ("v", "e")), False)  # rows coupled


@pytest.fixture
def gpu(monkeypatch):
    """The model as a GPU launch (or an ahead-of-time compile) sees it, not the interpreter's small tiles."""
    monkeypatch.setattr(rs, "_interpreted", lambda: False)
    monkeypatch.setattr(rs, "_TILE_OVERRIDE", None)


@pytest.mark.parametrize("layout", [ROWS, FACTORS], ids=["rows", "factors"])
@pytest.mark.parametrize("D", [16, 64, 128, 256])
@pytest.mark.parametrize("tiles", [1, 3, 6])
def test_v_tiled_candidates_fit_the_budget_safest_first(gpu, layout, D, tiles):
    """Every candidate's live [BV, BK] tiles (and two [C, BK] token tiles with batched factors) fit the budget of
    fp32 values per thread, or it is the one fallback (the least BV at 8 warps); 4 warps before 8, widest BV first
    within each; no BV wider than the padded Dv; and the tuned launch tries the model's first choice."""
    cands = rs._tile_candidates(layout, D, D, 1, tiles)
    assert cands and len(set(cands)) == len(cands)
    fitting = [(bv, w) for bv, w in cands
               if (tiles * bv + 2 * layout.factor_block) * D <= rs._REG_BUDGET * 32 * w]
    assert fitting == cands or cands == [(layout.low(), 8)]
    assert all(layout.low() <= bv <= max(layout.low(), D) for bv, _ in cands)
    warps = [w for _, w in cands]
    assert warps == sorted(warps)
    for w in set(warps):
        widths = [bv for bv, ww in cands if ww == w]
        assert widths == sorted(widths, reverse=True)
    bv, w, n_v = rs._tile_config(layout, D, D, 1, tiles)
    assert (bv, w) == cands[0] and n_v == -(-D // bv)
    space = rs._recurrent_space(layout, tiles)({"Nk": D, "Nv": D, "Ne": 1}, None)
    assert [(c.kwargs["BV"], c.num_warps) for c in space] == cands[:rs._TUNE_MAX]


def test_the_interpreter_crosses_v_tiles_and_an_override_wins(monkeypatch):
    """Under the interpreter BV is 4 (16 where tl.dot needs it), so small tests cover several V tiles; a
    measured override replaces the model (on V tiles: BV and warps; coupled: the warps only)."""
    monkeypatch.setattr(rs, "_interpreted", lambda: True)
    assert rs._tile_config(ROWS, 6, 20, 1, 3) == (4, 4, 5)
    assert rs._tile_config(FACTORS, 6, 20, 1, 3) == (16, 4, 2)
    monkeypatch.setattr(rs, "_TILE_OVERRIDE", (8, 8))
    assert rs._tile_config(ROWS, 6, 20, 1, 3) == (8, 8, 3)
    assert rs._tile_config(MLP, 6, 20, 8, 3) == (32, 8, 1)


def test_coupled_state_is_held_whole_and_refused_past_the_limit(gpu):
    """A coupled memory keeps every weight of a (batch, head) in one program: BV = Dv padded, 8 warps where 4
    would exceed the budget; past 255 registers per thread at 8 warps it is refused before any launch, naming
    why the rows are coupled and what to use instead."""
    assert rs._tile_config(MLP, 8, 8, 32, 2) == (8, 4, 1)
    assert rs._whole_state_values(MLP, 8, 8, 32, 2) == 2 * (32 * 8 + 8 * 32)
    assert rs._tile_config(MLP, 32, 32, 128, 2)[1] == 8
    rs._check_fits(MLP, 8, 8, 32, 2, False)
    assert not rs._state_fits(MLP, 128, 128, 512, 4)
    why = r"backward kernel .* whole memory .* \(an MLP memory\).* Use backend='torch'"
    with pytest.raises(RuntimeError, match=why):
        rs._check_fits(MLP, 128, 128, 512, 4, True)


def test_v_tiled_state_is_refused_only_where_one_row_does_not_fit(gpu):
    """With V tiles the narrowest program holds one row of each live tile over all key columns: every head size a
    model uses fits; a φ_p feature width past the limit is refused, and the message says the width is φ_p's."""
    assert rs._state_fits(ROWS, 256, 256, 1, 6)
    poly = rs._RecurrentLayout(True, "", 0, (("v", "k"),), True)
    rs._check_fits(poly, 4096, 64, 1, 6, False)
    with pytest.raises(RuntimeError, match=r"even at BV = 1 \(feature=poly: the kernels' key width is φ_p's"):
        rs._check_fits(poly, 16384, 64, 1, 6, False)


def test_autotuning_times_each_candidate_once_and_keeps_the_fastest(monkeypatch):
    monkeypatch.setattr(rs, "_TUNED", {})
    cands = [(32, 4), (16, 4), (8, 4), (4, 4), (2, 4)]
    cost = {c: 1.0 + i for i, c in enumerate(cands)}
    cost[(8, 4)] = 0.5
    launched = []

    def timer(fn):
        fn()
        return cost[launched[-1]]

    assert rs._pick_config("k", cands, launched.append, timer=timer) == (8, 4)
    assert sorted(set(launched)) == sorted(cands[:rs._TUNE_MAX])  # at most _TUNE_MAX tried
    n = len(launched)
    assert rs._pick_config("k", cands, launched.append, timer=timer) == (8, 4) and len(launched) == n  # cached


def test_recurrent_modules_carry_this_module_once():
    """Every module with recurrent kernels carries the body once (with chunk or mini-batch kernels beside them
    too); a module with no recurrent kernels (softmax attention) does not."""
    for name in ("gated_deltanet", "titans", "moneta"):
        src = compile_text((SPECS / f"{name}.miras").read_text()).source
        assert src.count(runtime_source("recurrent_space")) == 1, name
    assert "_RecurrentLayout" not in compile_text((SPECS / "transformer.miras").read_text()).source
