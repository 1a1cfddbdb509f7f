"""The fused recurrent kernels' launch configurations and the resource model that chooses them (a runtime piece: its
body is copied into every emitted module with recurrent kernels, by mirasc.codegen.standalone). A schedule, never what
is computed: how many value rows of the state a program owns (BV) and with how many warps, from a count of the fp32
tiles each kernel keeps live in registers; the first launch on a GPU times the fitting ones (docs/kernels.md). What
the model reads of a spec comes in as one `_RecurrentLayout`, built once by the module that carries this body."""

import torch
import triton


class _RecurrentLayout:
    """What the resource model reads of a spec's recurrent kernels: whether every value row of the memory updates on
    its own (`v_tiles`; else `v_tile_reason` says why the rows are coupled and one program holds the whole state),
    the mini-batch C of batched gradient factors (`factor_block`, 0: one token at a time; tl.dot then needs every
    dimension ≥ 16), each weight's (rows, cols) dimension names (`factor_dims`, "k", "v" or "e"), and whether the
    kernels run on φ_p features (`features`, named in the refusal)."""

    __slots__ = ("v_tiles", "v_tile_reason", "factor_block", "factor_dims", "features")

    def __init__(self, v_tiles, v_tile_reason, factor_block, factor_dims, features):
        self.v_tiles, self.v_tile_reason = v_tiles, v_tile_reason
        self.factor_block, self.factor_dims, self.features = factor_block, factor_dims, features

    def low(self):
        """The least tile width: 16 where the batched factors use tl.dot, else 1."""
        return 16 if self.factor_block else 1


# fp32 values per thread the live tiles may take. Calibrated on sm_90/sm_80 compiles at D = 128 (fp32, bf16):
# ptxas allocates ~2-3.5x this count (the token's vectors, products before reductions, addresses), and with
# 8 warps it may cap a thread at 128 registers; at 48 the forward spilled a few bytes on sm_80, at 24 none.
_REG_BUDGET = 40
_WHOLE_STATE_LIMIT = 255 * 32 * 8  # fp32 values: 255 registers per thread at 8 warps

_TILE_OVERRIDE = None  # (BV, num_warps) for every V-tiled launch: set by measurements (resource reports)


def _interpreted():
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    return bool(getattr(knobs, "interpret", False))


def _tile_candidates(layout, Dk, Dv, Ne, tiles, gpu=False):
    """The (BV, num_warps) configurations the resource model allows, best guess first.

    Under the interpreter (unless `gpu`: a GPU's candidates whatever runs here): BV = 4 (16 where the batched
    factors need tl.dot), so small tests cross V tiles.
    On a GPU (and for ahead-of-time compiles): every BV in 32 .. 1 with 4 or 8 warps whose live state tiles
    (`tiles` [BV, BK] fp32 tiles, counted at code generation, plus two [C, BK] token tiles where the
    mini-batch factors are batched) fit _REG_BUDGET values per thread, 4 warps before 8, then widest BV
    first (ptxas capped an 8-warp kernel at 64 registers and spilled 4 B where 4 warps at the same budget
    did not); if none does, the smallest BV at 8 warps. _TILE_OVERRIDE = (BV, warps) replaces it (measurements).
    Coupled specs (no V tiles) keep every row in one program: BV = Dv rounded up, 8 warps where the whole
    state exceeds the 4-warp budget (else 4), checked by _check_fits."""
    low = layout.low()
    bk = max(low, triton.next_power_of_2(Dk))
    full = max(low, triton.next_power_of_2(Dv))
    if not layout.v_tiles:  # one program holds every weight: 8 warps where 4 would exceed the budget
        big = _whole_state_values(layout, Dk, Dv, Ne, tiles) > _REG_BUDGET * 32 * 4
        if _TILE_OVERRIDE:
            return [(full, _TILE_OVERRIDE[1])]
        return [(full, 8 if big else 4)]  # not tuned: these compile slowly
    if _TILE_OVERRIDE:
        out = [tuple(_TILE_OVERRIDE)]
    elif _interpreted() and not gpu:
        out = [(max(low, 4), 4)]
    else:
        out = [(bv, w) for w in (4, 8) for bv in (32, 16, 8, 4, 2, 1)
               if bv >= low and (tiles * bv + 2 * layout.factor_block) * bk <= _REG_BUDGET * 32 * w] or [(low, 8)]
    seen, res = set(), []
    for bv, w in out:  # BV beyond the padded Dv is the same kernel as BV = padded Dv
        cfg = (max(low, min(bv, full)), w)
        if cfg not in seen:
            seen.add(cfg)
            res.append(cfg)
    return res


def _tile_config(layout, Dk, Dv, Ne, tiles):
    """(BV, num_warps, n_v) of the resource model's first choice; n_v = cdiv(Dv, BV) V tiles."""
    bv, warps = _tile_candidates(layout, Dk, Dv, Ne, tiles)[0]
    return bv, warps, triton.cdiv(Dv, bv) if layout.v_tiles else 1


# Autotuning on a GPU: the first launch of each kernel for a (head sizes, dtype, device) times the fitting
# configurations (at most _TUNE_MAX of them, the resource model's order) and keeps the fastest. The kernels
# are pure functions of their inputs (outputs and scratch are fresh buffers), so rerunning them is safe.
_TUNED = {}
_TUNE_MAX = 4


def _pick_config(key, candidates, launch, timer=None):
    """The configuration for `key`: cached, or the fastest of `candidates` by timing `launch(cfg)` (after one
    warm-up launch each, which compiles). `timer(fn) -> seconds` defaults to CUDA events."""
    if key in _TUNED:
        return _TUNED[key]
    candidates = candidates[:_TUNE_MAX]
    if len(candidates) > 1:
        if timer is None:
            def timer(fn):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                torch.cuda.synchronize()
                return start.elapsed_time(stop)
        times = []
        for cfg in candidates:
            launch(cfg)  # compile and warm up
            times.append(timer(lambda cfg=cfg: launch(cfg)))  # (timed at once)
        candidates = [candidates[times.index(min(times))]]
    _TUNED[key] = candidates[0]
    return candidates[0]


def _config_for(layout, name, q, Dk, Dv, Ne, tiles, launch):
    """The launch configuration of kernel `name`: the model's first choice, or on a GPU the tuned one."""
    candidates = _tile_candidates(layout, Dk, Dv, Ne, tiles)
    if not q.is_cuda or len(candidates) == 1 or _TILE_OVERRIDE:
        return candidates[0]
    return _pick_config((name, Dk, Dv, q.dtype, q.device.index), candidates, launch)


def _recurrent_space(layout, tiles):
    """The configurations a GPU may try for a recurrent kernel (what `mirasc kernels` compiles): the resource
    model's candidates at the launch's sizes, as many as the first launch times. The model bounds registers,
    not shared memory (these kernels use almost none), so smem_limit does not prune it."""
    def space(args, smem_limit):
        cands = _tile_candidates(layout, args["Nk"], args["Nv"], args["Ne"], tiles, gpu=True)[:_TUNE_MAX]
        return [triton.Config({"BV": bv}, num_warps=w) for bv, w in cands]  # default stages, as launched
    return space


def _whole_state_values(layout, Dk, Dv, Ne, tiles):
    """fp32 values a coupled spec's kernel keeps live: `tiles` copies of every (padded) weight."""
    low = layout.low()
    pad = {"k": max(low, triton.next_power_of_2(Dk)), "v": max(low, triton.next_power_of_2(Dv)),
           "e": max(low, triton.next_power_of_2(Ne))}
    return tiles * sum(pad[r] * pad[c] for r, c in layout.factor_dims)


def _state_fits(layout, Dk, Dv, Ne, tiles):
    """Whether a kernel keeping `tiles` live tiles has a configuration at these sizes on a GPU: with V tiles the
    narrowest one (one row of every live tile, all of K), else the whole state of a (batch, head)."""
    if layout.v_tiles:
        return tiles * triton.next_power_of_2(Dk) <= _WHOLE_STATE_LIMIT
    return _whole_state_values(layout, Dk, Dv, Ne, tiles) <= _WHOLE_STATE_LIMIT


def _fit_error(layout, Dk, Dv, Ne, tiles, backward):
    """None where a kernel keeping `tiles` live tiles has a configuration at these sizes on a GPU, else why not.
    Coupled specs keep the whole state of a (batch, head) in one program; measured on sm_90 (Moneta): the limit's
    edge (D = 16 backward, D = 32 forward) already spills 8 KB and compiles in 25-60 s; beyond it ptxas runs for
    many minutes (D = 128, E = 512: over 7)."""
    if _state_fits(layout, Dk, Dv, Ne, tiles):
        return None
    kernel = f"the fused recurrent Triton {'backward' if backward else 'forward'} kernel of this spec"
    if layout.v_tiles:
        return (f"{kernel} keeps one row of {tiles} state tiles over all {Dk} key columns even at BV = 1"
                + (" (feature=poly: the kernels' key width is φ_p's, 1 + Dk + … + Dk^p)" if layout.features else "")
                + f": about {tiles * triton.next_power_of_2(Dk)} fp32 values, over the {_WHOLE_STATE_LIMIT} that fit "
                "in registers (255 per thread, 8 warps). Use backend='torch', or smaller heads or a lower degree")
    return (f"{kernel} keeps the whole memory of a (batch, head) in one program ({layout.v_tile_reason}): about "
            f"{_whole_state_values(layout, Dk, Dv, Ne, tiles)} fp32 values at Dk={Dk}, Dv={Dv}, hidden {Ne}, over the "
            f"{_WHOLE_STATE_LIMIT} that fit in registers (255 per thread, 8 warps). "
            "Use backend='torch', algorithm='chunked' where the spec has it, or smaller heads")


def _check_fits(layout, Dk, Dv, Ne, tiles, backward):
    """Refuse, before a GPU launch, a size whose live tiles cannot stay on chip (_fit_error); the interpreter has no
    such limit."""
    msg = None if _interpreted() else _fit_error(layout, Dk, Dv, Ne, tiles, backward)
    if msg is not None:
        raise RuntimeError(msg)
