"""Pieces shared by the fused recurrent kernels (triton_recurrent_fwd.py, triton_recurrent_bwd.py): which
specs split the memory's rows over programs (V tiles), the program's index ranges, loading the state and a
token, the gradient factors (one token at a time, or a mini-batch's as one tile computation), the
retention's readouts, and the resource model's count of live tiles.

Both kernels keep their rows of every weight (and of the accumulator, momentum and anchor) in registers as
[rows, cols] tiles named w<i>, y<i>, s<i>, anchor<i>, with mask<i> the mask of their real lanes.
"""

from __future__ import annotations

import re

from .. import ir
from ..derive import Derivation
from ..language import spec as S
from ..plan import window_coefficients
from . import triton_retention
from .triton_printing import graph_lines, indent, row, rows, state_tile, tile_matmul

BWD_SEGMENT = 32  # schedule: tokens between state checkpoints in the recurrent backward (memory O(T/32 · state))

tile_matmul_ieee = tile_matmul(lambda a, b: f'tl.dot({a}, {b}, input_precision="ieee")')  # full fp32 products


def batched_factors(spec: S.Spec) -> int:
    """The mini-batch C when the recurrent kernels compute each chunk's gradient factors as one tile
    computation (tl.dot needs C to be a power of two >= 16), else 0 (one token at a time)."""
    C = spec.parallel.size
    # channel-wise coefficients are loaded per token (no [BC, n] coefficient tiles); the Omega window takes c
    # factor evaluations per token, one at a time
    if spec.channel_gates or spec.window > 1:
        return 0
    return C if C >= 16 and C & (C - 1) == 0 else 0


def vector_coefficients(spec: S.Spec) -> dict[str, str]:
    """The coefficients the module passes as vectors ([B, H, T, D]): name in the module's coefficient dict
    -> the side ("k" or "v") they run over. A channel-wise η is `eta_ch` (read by the gradient graph); the
    regression key κ of l2(read|erase=kappa) is a key-sized input the gradient graph reads like it."""
    out = {("eta_ch" if g == "eta" else g): side for g, side in spec.gate_channels().items() if side}
    out.update({n: S.EXTRA_INPUTS[n] for n in spec.extras})
    return out


# ---- the program, its state and its token

def program_ids() -> list[str]:
    """The program's (V tile, batch·head) and its index ranges: rows iv·BV .. iv·BV + BV - 1 of the memory
    (value rows; the whole of them, iv = 0, where the rows are coupled), all of K and of the hidden width."""
    return ["iv = tl.program_id(0)", "bh = tl.program_id(1)", "pid = iv * tl.num_programs(1) + bh",
            "rc = tl.arange(0, BC)", "rk = tl.arange(0, BK)", "rv = iv * BV + tl.arange(0, BV)",
            "re = tl.arange(0, BE)", "mk = rk < Nk", "mv = rv < Nv", "me = re < Ne"]


def load_state(spec: S.Spec, d: Derivation, i: int, anchor: bool) -> list[str]:
    """Load weight i's state tiles: the weights, the accumulator (stored, or the image of the weights for kl
    and Bregman), the momentum, and the mini-batch anchor (`anchor`: a copy of the weights)."""
    r, wdims = spec.retention, spec.weight_dims()
    rows_, cols = wdims[i]
    lines = [f"mask{i} = m{rows_}[:, None] & m{cols}[None, :]",
             f"w{i} = tl.load({state_tile(wdims, f'W{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)"]
    if r.mapped:
        lines += triton_retention.for_spec(spec, d).image(i)
    if spec.learner.kind == "momentum":
        lines.append(f"s{i} = tl.load({state_tile(wdims, f'S{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
    if anchor:
        lines.append(f"anchor{i} = w{i}")
    return lines


def load_token(scalars: list[str], vectors: dict[str, str]) -> list[str]:
    """Token t's q, k, v and coefficients (scalars from the stacked C, channel-wise ones as vectors)."""
    lines = ["q = tl.load(Q + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
             "k = tl.load(K + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
             "v = tl.load(V + (bh * T + t) * Nv + rv, mask=mv, other=0.0).to(tl.float32)"]
    lines += [f"c_{n} = tl.load(C + (bh * T + t) * NC + {j})" for j, n in enumerate(scalars)]
    return lines + vector_loads(vectors)


def vector_loads(vectors: dict[str, str]) -> list[str]:
    """Token t's channel-wise coefficients: α and θ as factors on a weight tile (key channels scale its columns,
    value channels its rows: docs/semantics.md: channel-wise gates), η and δ as vectors the gradient graph reads."""
    lines = []
    for n, side in vectors.items():
        bcast = "" if n not in ("alpha", "theta") else "[None, :]" if side == "k" else "[:, None]"
        pad = "0.0" if n in S.EXTRA_INPUTS else "1.0"  # a key's padded lanes are 0, like k's
        lines.append(f"c_{n} = tl.load(G_{n} + (bh * T + t) * N{side} + r{side}, mask=m{side}, other={pad}){bcast}")
    return lines


def chunk_tiles(coef_order: list[str]) -> list[str]:
    """Load the tokens t .. t+BC-1 (a mini-batch starting at t) as [BC, n] tiles, rows past T zeroed."""
    lines = ["ctok = t + rc", "cm = ctok < T",
             "kc = tl.load(K + (bh * T + ctok[:, None]) * Nk + rk[None, :], mask=cm[:, None] & mk[None, :], "
             "other=0.0).to(tl.float32)",
             "vc = tl.load(V + (bh * T + ctok[:, None]) * Nv + rv[None, :], mask=cm[:, None] & mv[None, :], "
             "other=0.0).to(tl.float32)"]
    lines += [f"cc_{n} = tl.load(C + (bh * T + ctok) * NC + {j}, mask=cm, other=1.0)[:, None]"
              for j, n in enumerate(coef_order)]
    return lines


# ---- the gradient factors (δ_i, x_i) of the memory's gradient δ_i x_iᵀ

def graph_vector_inputs(spec: S.Spec) -> dict[str, tuple[str, str]]:
    """Graph inputs that are per-token vectors in the recurrent kernel: k, v and the channel-wise η, δ."""
    out = {"k": ("k", "k"), "v": ("v", "v")}
    out.update({n: (f"c_{n}", side) for n, side in vector_coefficients(spec).items()
                if n in ("eta_ch", "delta", *S.EXTRA_INPUTS)})
    return out


def factor_lines(spec: S.Spec, grad: ir.Graph, coef_order: list[str], at: list[str],
                 compute: bool = True) -> tuple[list[str], dict[str, str]]:
    """The token's gradient factors at weights `at`: (lines, outputs of `memory_grad`). One token at a time,
    or, with batched factors, read from the scratch a mini-batch start fills (`compute`: emit that fill)."""
    wdims = spec.weight_dims()
    if not batched_factors(spec):
        g_lines, g_out, _ = graph_lines(grad, "g_", at, {n: f"c_{n}" for n in coef_order},
                                        graph_vector_inputs(spec), wdims)
        return g_lines, g_out
    lines = []
    if compute:  # the factors of a whole mini-batch at once, at its start (its anchor is the current state)
        lines.append("if new_chunk:")
        lines += indent(_chunk_factor_lines(grad, wdims, coef_order, at))
    g_out = {f"{n}{i + 1}": f"{n}{i}" for i in range(len(wdims)) for n in ("delta", "input")}
    return lines + _load_factors(wdims), g_out


# ---- the Omega rule: the window's gradient factors, c per token

def window_factor_lines(spec: S.Spec, grad: ir.Graph, coef_order: list[str], at: list[str]) -> list[str]:
    """The Omega rule's step t: for each window slot j = 0..c−1 (token t − c + 1 + j, row t + j of the window
    sequences KW, VW, CW [B·H, T + c − 1, ·], whose first c − 1 rows are the carried window), load the token
    and its window coefficients cw<j>_<name>, take its gradient factors delta<i>_<j>, input<i>_<j> at `at`
    (with its own coefficients), and sum them weighted by γ: grad<i> = Σ_j γ_j δ_ij x_ijᵀ."""
    wdims, c = spec.weight_dims(), spec.window
    wcoefs = window_coefficients(spec, grad)
    lines = []
    for j in range(c):
        lines += [f"kw{j} = tl.load(KW + (bh * TW + t + {j}) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
                  f"vw{j} = tl.load(VW + (bh * TW + t + {j}) * Nv + rv, mask=mv, other=0.0).to(tl.float32)"]
        lines += [f"cw{j}_{n} = tl.load(CW + (bh * TW + t + {j}) * NW + {m})" for m, n in enumerate(wcoefs)]
        scal = {n: (f"cw{j}_{n}" if n in wcoefs else f"c_{n}") for n in coef_order}
        g_lines, g_out, _ = graph_lines(grad, f"g{j}_", at, scal, {"k": (f"kw{j}", "k"), "v": (f"vw{j}", "v")},
                                        wdims)
        lines += g_lines
        for i in range(len(wdims)):
            lines += [f"delta{i}_{j} = {g_out[f'delta{i + 1}']}", f"input{i}_{j} = {g_out[f'input{i + 1}']}"]
    for i in range(len(wdims)):
        lines.append(f"grad{i} = " + " + ".join(f"cw{j}_gamma * delta{i}_{j}[:, None] * input{i}_{j}[None, :]"
                                                for j in range(c)))
    return lines


def _chunk_factor_lines(grad: ir.Graph, wdims, coef_order: list[str], at: list[str]) -> list[str]:
    """At a mini-batch start: the gradient factors (δ_i, x_i) of all its tokens at the anchor, as one tile
    computation (`memory_grad` on [BC, n] tiles), written to the factor scratch FDL_i / FX_i."""
    lines = chunk_tiles(coef_order)
    scal = {n: f"cc_{n}" for n in coef_order}
    g_lines, g_out, _ = graph_lines(grad, "gc_", at, scal, {"k": ("kc", "k"), "v": ("vc", "v")}, wdims,
                                    matmul=tile_matmul_ieee)
    lines += g_lines
    for i, (r, c) in enumerate(wdims):
        lines += [f"tl.store({rows(f'FDL{i}', r)}, {g_out[f'delta{i + 1}']}, mask=cm[:, None] & m{r}[None, :])",
                  f"tl.store({rows(f'FX{i}', c)}, {g_out[f'input{i + 1}']}, mask=cm[:, None] & m{c}[None, :])"]
    return lines + ["tl.debug_barrier()"]


def _load_factors(wdims) -> list[str]:
    lines = []
    for i, (r, c) in enumerate(wdims):
        lines += [f"delta{i} = tl.load({row(f'FDL{i}', r)}, mask=m{r}, other=0.0)",
                  f"input{i} = tl.load({row(f'FX{i}', c)}, mask=m{c}, other=0.0)"]
    return lines


def forward_reads_state_as_anchor(spec: S.Spec) -> bool:
    """The forward kernel takes a mini-batch's batched factors at its start straight from the state (no
    anchor tile): the state then is the anchor, unless an order=pre decay scales it first."""
    r = spec.retention
    return bool(batched_factors(spec)) and not (r.decays_first)


# ---- bookkeeping

def live_tiles(spec: S.Spec, backward: bool) -> int:
    """The resource model's count of [rows, cols] fp32 tiles per weight a recurrent kernel keeps live: the
    state (weights; accumulator or log-space/φ' image; momentum; mini-batch anchor) and the step's temporaries
    (gradient, update); the backward also carries their cotangents and the state before the token."""
    r, mb = spec.retention, spec.parallel.kind == "minibatch"
    state = 1 + r.mapped + (spec.learner.kind == "momentum") + mb
    if not backward:
        return state + 2 - forward_reads_state_as_anchor(spec)
    return 3 * state + 4


def widx(var: str) -> int:
    """The weight index a state variable name ends with (w0, anchor12, ...)."""
    return int(re.search(r"\d+$", var).group())


def outer_sum(v_out: dict[str, str], i: int) -> str | None:
    """Σ_j l_j r_jᵀ over the outer-product pairs a reverse-mode graph gives for weight i."""
    terms, j = [], 0
    while f"outer{i}_{j}_l" in v_out:
        terms.append(f"{v_out[f'outer{i}_{j}_l']}[:, None] * {v_out[f'outer{i}_{j}_r']}[None, :]")
        j += 1
    return " + ".join(terms) or None
