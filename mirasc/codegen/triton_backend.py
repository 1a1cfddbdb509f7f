"""Triton backend: the entry point for a parametric memory's Triton section, and a map of the modules that
print it (one per kernel family; see docs/kernels.md, "How to add a kernel family").

  triton_printing.py       helpers every family shares: dimension names, scratch pointers, the kernel header,
                           `graph_lines` (an IR graph as straight-line Triton code, one token or a block)
  triton_recurrent.py      pieces shared by the fused recurrent kernels (V tiles, state and token loads, the
                           gradient factors, readouts, the resource model's live-tile count)
  triton_recurrent_fwd.py  `_fused_recurrent_fwd`
  triton_recurrent_bwd.py  `_fused_recurrent_bwd`, the generated reverse sweep
  templates/triton_recurrent.py.tmpl  the spec's choices their host side reads (mirasc/runtime/recurrent_host.py:
                           launches, the op; recurrent_space.py: resource model, autotuning)
  triton_chunked.py        the chunked families (Hebbian, delta rule, mini-batch l2; fixed kernels and host side
                           under mirasc/runtime/)
  triton_minibatch.py      the mini-batch (dual-form) kernels of MLP and linear memories, one register tile (host
                           side: mirasc/runtime/minibatch_host.py)
  triton_stream_printer.py / triton_minibatch_stream.py  the same dual form streamed over weight tiles

Fused recurrent kernels, for every parametric spec, printed from the same IR graphs
and derivation as the torch module. Where every value row of a linear memory updates on its own
(the Plan's `v_tiles`, mirasc/plan.py: l2/dot/lp/huber/custom biases, none/decay/elastic/bregman/kl retention — kl's
softmax runs along each row — gd/implicit/momentum learners), the grid is (cdiv(Dv, BV), B·H) like FLA's
fused_recurrent: each program owns BV rows of the weights (and of accumulators, momentum and anchor) with
all of K, so the state held in registers is [BV, BK] per tile; dq, dk and the gates' gradients, which sum
over rows, are per-tile partial sums the launcher adds up. BV and the warps come from a resource model
(live tiles × BV × BK fp32 values per thread, calibrated on sm_90 compiles) and, on a GPU, a timed pick
among the configurations that fit. Coupled specs (MLP memories, lq's whole-matrix norm, huber mixture's
‖e‖) keep one program per (batch, head) with the whole state, and are refused on a GPU past the register
limit.

Each program keeps its part of the memory weights (and accumulators, momentum buffers and the
mini-batch anchor) in registers as [rows, cols] tiles and walks the tokens: the gradient factors are
the `memory_grad` graph printed as matrix-vector code, the learner and retention are elementwise tile
updates (row softmax for kl, a whole-matrix q-norm for lq), the read is the `memory_forward` graph.
Padded lanes (dimensions rounded up to powers of two) are kept at zero by masks. For mini-batch specs
(C a power of two >= 16) the gradient factors of a whole mini-batch are computed at its start as one
tile computation (`memory_grad` printed on [C, n] tiles with tl.dot) into a scratch buffer, and the
backward runs the reverse of that graph on the whole mini-batch when its walk reaches the start.

The backward is a generated reverse sweep with state checkpoints every BWD_SEGMENT tokens. The reverse of
the read and of the gradient factors comes from `ir.vjp` (reverse mode on the IR graphs, SymPy derivatives
printed by TritonPrinter); the learner, retention and anchor are reversed once in the skeleton (incl. the
whole-matrix lq and row-softmax kl readouts). Where a piece has no reverse, the backward recomputes the
torch recurrence instead.
"""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

from .. import ir
from ..derive import Derivation
from ..language import spec as S
from ..plan import window_coefficients
from .slots import fill_lines
from .standalone import quoted, runtime_constants, runtime_source
from .triton_chunked import emit_chunked  # noqa: F401 (the chunked families' entry point)
from .triton_printing import Unsupported
from .triton_recurrent import (
    BWD_SEGMENT,
    batched_factors,
    live_tiles,
    vector_coefficients,
    widx,
)
from .triton_recurrent_bwd import emit_backward
from .triton_recurrent_fwd import emit_forward

SECTION = (Path(__file__).parent / "templates" / "triton_recurrent.py.tmpl").read_text()


def emit(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str],
         no_v_tiles: str, features: bool = False) -> str:
    """Source of the Triton section of an emitted module, for a spec the Plan gives the kernels (mirasc.plan); raises
    Unsupported with the reason where a function has no Triton equivalent. `no_v_tiles`: the Plan's reason the
    kernels keep one program per (batch, head), "" where they split the value rows. `features`: `spec` is a
    feature=poly linear memory's plain copy, run on φ_p(q), φ_p(k) (mirasc.plan.feature_spec)."""
    try:
        return _emit(spec, d, forward, grad, coef_order, no_v_tiles, features)
    except NotImplementedError as err:
        raise Unsupported(f"{err}") from None


def op_id(spec: S.Spec) -> str:
    """The name of a module's Triton ops, mirasc::<kind>_<op_id>: the hash of its spec's canonical text."""
    return hashlib.sha256(spec.canonical().encode()).hexdigest()[:12]


def _bwd_note(why_not: str) -> list[str]:
    """The comment over _BWD_STATE in the emitted file: which backward the spec has, and why."""
    if not why_not:
        text = ("The backward is the generated reverse sweep over checkpointed segments, keeping the tiles "
                "below per token.")
    else:
        text = ("_BWD_STATE is empty: the backward recomputes the torch recurrence, because "
                + " ".join(why_not.split()).rstrip(".") + ".")
    return ["# " + line for line in textwrap.wrap(text, 110)]


def _emit(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str], no_v_tiles: str,
          features: bool = False) -> str:
    """The recurrent kernels (the backward where every piece has a reverse) in the host-side template."""
    kernel = emit_forward(spec, d, forward, grad, coef_order)
    bwd_state: list[str] = []
    why_not = ""
    try:
        bwd_kernel, bwd_state = emit_backward(spec, d, forward, grad, coef_order, BWD_SEGMENT)
        kernel += "\n" + bwd_kernel
    except (ir.NoVJP, NotImplementedError) as err:  # the forward kernel stands; the backward recomputes
        if spec.window > 1:  # (the recomputing backward does not take the window sequences)
            raise Unsupported(f"the Omega rule needs the generated backward, and it has none here: {err}") from None
        why_not = str(err)
    header = {  # (what each means: mirasc.runtime.recurrent_spec)
        "OP_ID": quoted(op_id(spec)),
        "_COEF_ORDER": repr(tuple(coef_order)), "_VECTOR_COEFS": repr(vector_coefficients(spec)),
        "_STORE_ACC": repr(spec.retention.keeps_accumulator), "_MOMENTUM": repr(spec.learner.kind == "momentum"),
        "_BWD_STATE": repr(tuple(bwd_state)), "_BWD_STATE_WEIGHT": repr(tuple(widx(n) for n in bwd_state)),
        "_BWD_SEGMENT": str(BWD_SEGMENT), "_FACTOR_BLOCK": str(batched_factors(spec)),
        "_FACTOR_DIMS": repr(tuple(spec.weight_dims())), "_V_TILES": repr(not no_v_tiles),
        "_V_TILE_REASON": quoted(no_v_tiles), "_TILES_FWD": str(live_tiles(spec, False)),
        "_TILES_BWD": str(live_tiles(spec, True)), "_WINDOW": str(spec.window),
        "_WINDOW_COEFS": repr(window_coefficients(spec, grad)), "_FEATURES": repr(features)}
    subs = {
        "KERNEL": kernel,
        "FEATURE_INPUTS": "_poly_features(q), _poly_features(k)" if features else "q, k",
        "FEATURE_KEY_WIDTH": "_feature_width(Dk)" if features else "Dk",
        "RECURRENT_SPACE": runtime_source("recurrent_space"),
        "CUSTOM_OPS": runtime_source("custom_ops"),  # (this section comes first: the later ones use it too)
        "RECURRENT_HOST": runtime_source("recurrent_host"),
    }
    notes = {"_BWD_STATE": _bwd_note(why_not)}
    return fill(fill_lines(SECTION, {"HEADER": runtime_constants("recurrent_spec", header, notes)}), subs)


def fill(template: str, subs: dict[str, str]) -> str:
    """Replace each {{KEY}} of a template by its text, in the order of `subs`."""
    for key, val in subs.items():
        template = template.replace("{{" + key + "}}", val)
    return template
