"""The fused recurrent forward kernel `_fused_recurrent_fwd`: one program per (V tile, batch·head) (per
(batch, head) where the rows are coupled) holds its rows of the memory in registers and walks the tokens.

Per token: load q, k, v and the coefficients; take the gradient factors (δ_i, x_i) of the memory's
gradient at the anchor (`memory_grad` printed as matrix-vector code, or read from the scratch a
mini-batch start fills); apply the learner (gd or momentum) and the retention (decay, or an accumulator
and its readout); read y = M(q) (`memory_forward`) and store it. The final state is stored at the end.
"""

from __future__ import annotations

from .. import ir
from ..derive import Derivation
from ..language import spec as S
from . import triton_retention
from .triton_printing import graph_lines, indent, jit_kernel
from .triton_recurrent import (
    factor_lines,
    forward_reads_state_as_anchor,
    load_state,
    load_token,
    program_ids,
    state_tile,
    vector_coefficients,
    window_factor_lines,
)


def emit_forward(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str]) -> str:
    """Source of `_fused_recurrent_fwd`."""
    n_w = len(spec.weight_dims())
    mb = spec.parallel.size
    # the anchor tile: with batched factors (computed at the mini-batch start, from the state as it is then)
    # the forward needs none, unless an order=pre decay changes the state before the factors are taken
    keep_anchor = bool(mb) and not forward_reads_state_as_anchor(spec)
    body = program_ids()
    if spec.window > 1:  # the window sequences: the carried c − 1 tokens, then the T given ones
        body.append(f"TW = T + {spec.window - 1}")
    for i in range(n_w):
        body += load_state(spec, d, i, keep_anchor)
    body.append("for t in range(T):")
    body += indent(_token_step(spec, d, forward, grad, coef_order, keep_anchor))
    body += _store_final_state(spec)
    return jit_kernel("_fused_recurrent_fwd", _signature(spec, coef_order), body)


def _signature(spec: S.Spec, coef_order: list[str]) -> str:
    """Inputs, the output, each state tensor in and out (in the order of the state keys), the factor scratch."""
    vectors = vector_coefficients(spec)
    ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in vectors], "O"]
    if spec.window > 1:  # the Omega window's keys, values and coefficients [B·H, T + c − 1, ·]
        ptrs += ["KW", "VW", "CW", "NW"]
    for i in range(len(spec.weight_dims())):
        ptrs += [f"W{i}_in", f"W{i}_out"]
        if spec.retention.keeps_accumulator:
            ptrs += [f"Y{i}_in", f"Y{i}_out"]
        if spec.learner.kind == "momentum":
            ptrs += [f"S{i}_in", f"S{i}_out"]
    ptrs += [f"F{n}{i}" for i in range(len(spec.weight_dims())) for n in ("DL", "X")]  # factor scratch
    return (", ".join(ptrs) + ", T, Nk, Nv, Ne, NC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, "
            "BE: tl.constexpr, BC: tl.constexpr")


def _token_step(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str],
                keep_anchor: bool) -> list[str]:
    """The loop body for token t: load it, update the state, read and store the output."""
    r = spec.retention
    n_w = len(spec.weight_dims())
    mb = spec.parallel.size
    vectors = vector_coefficients(spec)
    loop = load_token([n for n in coef_order if n not in vectors], vectors)
    if mb:
        loop.append(f"new_chunk = (t % {mb}) == 0")
        for i in range(n_w if keep_anchor else 0):
            loop.append(f"anchor{i} = tl.where(new_chunk, w{i}, anchor{i})")
    if r.decays_first:
        for i in range(n_w):
            loop.append(f"w{i} = c_alpha * w{i}")
    at = [f"anchor{i}" if keep_anchor else f"w{i}" for i in range(n_w)]
    if spec.window > 1:  # the Omega rule: grad<i> = Σ_j γ_j δ_ij x_ijᵀ over the window
        loop += window_factor_lines(spec, grad, coef_order, at)
        for i in range(n_w):
            loop += _update(spec, d, i, None, None)
    else:
        g_lines, g_out = factor_lines(spec, grad, coef_order, at)
        loop += g_lines
        for i in range(n_w):
            loop += _update(spec, d, i, g_out[f"delta{i + 1}"], g_out[f"input{i + 1}"])
    f_lines, f_out, _ = graph_lines(forward, "f_", [f"w{i}" for i in range(n_w)], {n: f"c_{n}" for n in coef_order},
                                    {"x": ("q", "k")}, spec.weight_dims())
    loop += f_lines
    loop.append(f"tl.store(O + (bh * T + t) * Nv + rv, {f_out['y']}.to(O.dtype.element_ty), mask=mv)")
    return loop


def _update(spec: S.Spec, d: Derivation, i: int, delta: str | None, inp: str | None) -> list[str]:
    """Weight i's step: the gradient δ xᵀ (None: grad<i> is already there), the learner's update, the retention
    (and readout)."""
    r = spec.retention
    lines = [] if delta is None else [f"grad{i} = {delta}[:, None] * {inp}[None, :]"]
    if spec.learner.kind == "momentum":
        lines += [f"s{i} = c_theta * s{i} - c_eta * grad{i}", f"upd{i} = s{i}"]
    else:
        lines.append(f"upd{i} = -c_eta * grad{i}")
    if spec.generalized_delta == "erase":  # the write v kᵀ at unit rate (the gradient factors are the erase)
        lines.append(f"upd{i} = upd{i} + v[:, None] * k[None, :]")
    if r.kind == "none" or r.decays_first:
        lines.append(f"w{i} = w{i} + upd{i}")
    elif r.kind == "decay":
        lines.append(f"w{i} = c_alpha * w{i} + upd{i}")
    else:
        lines.append(f"y{i} = {'c_alpha * y' + str(i) if r.gated else 'y' + str(i)} + upd{i}")
        lines += triton_retention.for_spec(spec, d).readout(i)
    return lines


def _store_final_state(spec: S.Spec) -> list[str]:
    wdims = spec.weight_dims()
    lines = []
    for i in range(len(wdims)):
        lines.append(f"tl.store({state_tile(wdims, f'W{i}_out', i)}, w{i}, mask=mask{i})")
        if spec.retention.keeps_accumulator:
            lines.append(f"tl.store({state_tile(wdims, f'Y{i}_out', i)}, y{i}, mask=mask{i})")
        if spec.learner.kind == "momentum":
            lines.append(f"tl.store({state_tile(wdims, f'S{i}_out', i)}, s{i}, mask=mask{i})")
    return lines
