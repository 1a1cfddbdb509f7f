"""Triton backend (issue 3, first part): a fused recurrent forward kernel for every parametric spec,
printed from the same IR graphs and derivation as the torch module.

Schedule (issue 10). Where every value row of a linear memory updates on its own (`v_tile_reason` is None:
l2/dot/lp/huber/custom biases, none/decay/elastic/bregman/kl retention — kl's softmax runs along each row —
gd/implicit/momentum learners), the grid is (cdiv(Dv, BV), B·H) like FLA's fused_recurrent: each program
owns BV rows of the weights (and of accumulators, momentum and anchor) with all of K, so the state held in
registers is [BV, BK] per tile; dq, dk and the gates' gradients, which sum over rows, are per-tile partial
sums the launcher adds up. BV and the warps come from a resource model (live tiles × BV × BK fp32 values per
thread, calibrated on sm_90 compiles) and, on a GPU, a timed pick among the configurations that fit.
Coupled specs (MLP memories, lq's whole-matrix norm, huber mixture's ‖e‖) keep one program per (batch, head)
with the whole state, and are refused on a GPU past the register limit.

Each program keeps its part of the memory weights (and accumulators, momentum buffers and the
mini-batch anchor) in registers as [rows, cols] tiles and walks the tokens: the gradient factors are
the `memory_grad` graph printed as matrix-vector code, the learner and retention are elementwise tile
updates (row softmax for kl, a whole-matrix q-norm for lq), the read is the `memory_forward` graph.
Padded lanes (dimensions rounded up to powers of two) are kept at zero by masks. For mini-batch specs
(C a power of two >= 16) the gradient factors of a whole mini-batch are computed at its start as one
tile computation (`memory_grad` printed on [C, n] tiles with tl.dot) into a scratch buffer, and the
backward runs the reverse of that graph on the whole mini-batch when its walk reaches the start.

Backward of the recurrent kernel (`_emit_bwd`): a generated reverse sweep with state checkpoints every
BWD_SEGMENT tokens. The reverse of the read and of the gradient factors comes from `ir.vjp` (reverse mode
on the IR graphs, SymPy derivatives printed by TritonPrinter); the learner, retention and anchor are
reversed once in the skeleton (incl. the whole-matrix lq and row-softmax kl readouts).

Chunked kernels (templates/triton_chunked.py.tmpl), forward and backward in Triton: linear memories whose
update is affine in the state — Hebbian (dot bias), the delta rule (l2 bias, gd or implicit step, exact)
and mini-batch l2 — with none/decay retention. One set of four kernels serves all three (a state scan
over chunks per Dv tile and an output kernel parallel over chunks; their reverse); the families differ
only in the chunk-local torch preparation (`chunk_family`), which autograd differentiates. A decay over
key channels (alpha=gate(k): GLA, HGRN2, KDA) selects a variant of the same five kernels with the
log-decay per key channel: the chunk-parallel ones take one 16-row sub-block per program and never
evaluate an exponent above 0; lr=gate(k) only scales the written key in the preparation.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import sympy as sp

from .. import ir
from .. import spec as S
from ..derive import Derivation
from .printers import TritonPrinter, print_triton_block


class Unsupported(Exception):
    pass


BWD_SEGMENT = 32  # schedule: tokens between state checkpoints in the recurrent backward (memory O(T/32 · state))


BLOCK = {"k": "BK", "v": "BV", "e": "BE"}  # the block (padded size) of each dimension name
SIZE = {"k": "Nk", "v": "Nv", "e": "Ne"}  # the runtime size of each dimension name


def batched_factors(spec: S.Spec) -> int:
    """The mini-batch C when the recurrent kernels compute each chunk's gradient factors as one tile
    computation (tl.dot needs C to be a power of two >= 16), else 0 (one token at a time)."""
    C = spec.parallel.C if spec.parallel.kind == "minibatch" else 0
    if spec.channel_gates:  # channel-wise coefficients are loaded per token (no [BC, n] coefficient tiles)
        return 0
    return C if C >= 16 and C & (C - 1) == 0 else 0


def tile_matmul(precision: str):
    """The `matmul` printer of `_graph_lines` for [BC, n] token tiles: layer/linear (h ↦ h Wᵀ) and
    linear_t (d ↦ d W) as tl.dot; `precision` is the Triton expression for its input_precision."""
    def matmul(op, i, w, h):
        rhs = f"tl.trans({w})" if op in ("layer", "linear") else w
        return f"tl.dot({h}, {rhs}, input_precision={precision})"
    return matmul


_tile_matmul = tile_matmul('"ieee"')  # the recurrent kernels' batched factors: full fp32 products


def _chunk_tiles(coef_order: list[str]) -> list[str]:
    """Load the tokens t .. t+BC-1 (a mini-batch starting at t) as [BC, n] tiles, rows past T zeroed."""
    lines = ["ctok = t + rc", "cm = ctok < T",
             "kc = tl.load(K + (bh * T + ctok[:, None]) * Nk + rk[None, :], mask=cm[:, None] & mk[None, :], "
             "other=0.0).to(tl.float32)",
             "vc = tl.load(V + (bh * T + ctok[:, None]) * Nv + rv[None, :], mask=cm[:, None] & mv[None, :], "
             "other=0.0).to(tl.float32)"]
    lines += [f"cc_{n} = tl.load(C + (bh * T + ctok) * NC + {j}, mask=cm, other=1.0)[:, None]"
              for j, n in enumerate(coef_order)]
    return lines


def _row(base: str, dim: str, tok: str = "t") -> str:
    """Pointer to row `tok` of a [B·H, T, N_dim] scratch buffer."""
    return f"{base} + (bh * T + {tok}) * {SIZE[dim]} + r{dim}"


def _rows(base: str, dim: str) -> str:
    """Pointers to rows ctok of a [B·H, T, N_dim] scratch buffer."""
    return f"{base} + (bh * T + ctok[:, None]) * {SIZE[dim]} + r{dim}[None, :]"


def _part_row(base: str, dim: str, tok: str = "t") -> str:
    """Pointer to row `tok` of this program's slice of a [NV, B·H, T, N_dim] buffer of per-V-tile partial
    sums (program pid = iv·B·H + bh; the launcher sums over the NV tiles)."""
    return f"{base} + (pid * T + {tok}) * {SIZE[dim]} + r{dim}"


def _part_rows(base: str, dim: str) -> str:
    """Pointers to rows ctok of this program's slice of a [NV, B·H, T, N_dim] partial-sum buffer."""
    return f"{base} + (pid * T + ctok[:, None]) * {SIZE[dim]} + r{dim}[None, :]"


def _ring_row(base: str, dim: str) -> str:
    """Pointer to token t's row of this program's ring of BC rows in a [NV·B·H, BC, N_dim] buffer (the
    factor cotangents of the mini-batch the reverse walk is in; read back at the mini-batch start)."""
    return f"{base} + (pid * BC + t % BC) * {SIZE[dim]} + r{dim}"


def _ring_rows(base: str, dim: str) -> str:
    """All BC rows of this program's ring (at a mini-batch start t % BC == 0, row j is token t + j)."""
    return f"{base} + (pid * BC + rc[:, None]) * {SIZE[dim]} + r{dim}[None, :]"


# ---- V tiles: which specs' recurrent kernels split the rows of the memory over programs

_REDUCTIONS = ("rownorm", "rowsumsq", "rowsum", "layernorm", "layernorm_bwd", "layernorm_bwd2")


def v_tile_reason(spec: S.Spec, forward: ir.Graph, grad: ir.Graph) -> str | None:
    """None when the recurrent kernels may split the value rows of the memory over programs (grid
    (cdiv(Dv, BV), B·H), each program owning BV rows of W and of its accumulator, momentum and anchor):
    every row's update and read depend only on that row and the token. Else the coupling, as a reason."""
    m, b, r = spec.memory, spec.bias, spec.retention
    if m.kind != "linear":
        return "an MLP memory couples every weight (LayerNorm, hidden layer)"
    if r.kind == "lq":
        return "lq retention normalises by the q-norm of the whole matrix"
    if b.kind == "huber" and b.mode == "mixture":
        return "huber(mode=mixture) switches on the norm of the whole error vector"
    for gr in (forward, grad):  # a reduction over the rows (dimension v) that feeds a computation couples them
        dims = _dims(gr, spec.weight_dims())
        for nid in gr.order():
            op = gr.node(nid)
            if op.op in _REDUCTIONS and dims[gr.srcs(nid)[0]] == "v" and \
                    any(gr.node(c).op != "output" for c in gr.consumers(nid)):
                return f"the {gr.title} graph reduces over the value rows ({op.op})"
    return None


def _dims(gr: ir.Graph, wdims) -> dict[int, str]:
    """The dimension name (k, v, e; s for a per-token scalar, w for a weight) of each node of a graph."""
    dims: dict[int, str] = {}
    for nid in gr.order():
        op, srcs = gr.node(nid), gr.srcs(nid)
        if op.op == "input":
            dims[nid] = {"k": "k", "x": "k", "v": "v", **S.EXTRA_INPUTS}.get(op.arg, "s")
        elif op.op == "weight":
            dims[nid] = "w"
        elif op.op in ("linear", "layer"):
            dims[nid] = wdims[op.arg][0]
        elif op.op == "linear_t":
            dims[nid] = wdims[op.arg][1]
        elif op.op in ("rownorm", "rowsumsq", "rowsum"):
            dims[nid] = "s"
        else:
            dims[nid] = next((dims[x] for x in srcs if dims[x] not in ("s", "w")), "s")
    return dims


def _chunk_factor_lines(grad: ir.Graph, wdims, coef_order: list[str], at: list[str]) -> list[str]:
    """At a mini-batch start: the gradient factors (δ_i, x_i) of all its tokens at the anchor, as one tile
    computation (`memory_grad` on [BC, n] tiles), written to the factor scratch FDL_i / FX_i."""
    lines = _chunk_tiles(coef_order)
    scal = {n: f"cc_{n}" for n in coef_order}
    g_lines, g_out, _ = _graph_lines(grad, "gc_", at, scal, {"k": ("kc", "k"), "v": ("vc", "v")}, wdims,
                                     matmul=_tile_matmul)
    lines += g_lines
    for i, (rows, cols) in enumerate(wdims):
        lines += [f"tl.store({_rows(f'FDL{i}', rows)}, {g_out[f'delta{i + 1}']}, mask=cm[:, None] & m{rows}[None, :])",
                  f"tl.store({_rows(f'FX{i}', cols)}, {g_out[f'input{i + 1}']}, mask=cm[:, None] & m{cols}[None, :])"]
    return lines + ["tl.debug_barrier()"]


def _load_factors(wdims) -> list[str]:
    lines = []
    for i, (rows, cols) in enumerate(wdims):
        lines += [f"delta{i} = tl.load({_row(f'FDL{i}', rows)}, mask=m{rows}, other=0.0)",
                  f"input{i} = tl.load({_row(f'FX{i}', cols)}, mask=m{cols}, other=0.0)"]
    return lines


def vector_coefficients(spec: S.Spec) -> dict[str, str]:
    """The coefficients the module passes as vectors ([B, H, T, D]): name in the module's coefficient dict
    -> the side ("k" or "v") they run over. A channel-wise η is `eta_ch` (read by the gradient graph); the
    regression key κ of l2(read|erase=kappa) is a key-sized input the gradient graph reads like it."""
    out = {("eta_ch" if g == "eta" else g): side for g, side in spec.gate_channels().items() if side}
    out.update({n: S.EXTRA_INPUTS[n] for n in spec.extras})
    return out


def _vector_loads(vectors: dict[str, str]) -> list[str]:
    """Token t's channel-wise coefficients: α and θ as factors on a weight tile (key channels scale its columns,
    value channels its rows: CONTRACT §6), η and δ as vectors the gradient graph reads."""
    lines = []
    for n, side in vectors.items():
        bcast = "" if n not in ("alpha", "theta") else "[None, :]" if side == "k" else "[:, None]"
        pad = "0.0" if n in S.EXTRA_INPUTS else "1.0"  # a key's padded lanes are 0, like k's
        lines.append(f"c_{n} = tl.load(G_{n} + (bh * T + t) * N{side} + r{side}, mask=m{side}, other={pad}){bcast}")
    return lines


def _graph_vector_inputs(spec: S.Spec) -> dict[str, tuple[str, str]]:
    """Graph inputs that are per-token vectors in the recurrent kernel: k, v and the channel-wise η, δ."""
    out = {"k": ("k", "k"), "v": ("v", "v")}
    out.update({n: (f"c_{n}", side) for n, side in vector_coefficients(spec).items()
                if n in ("eta_ch", "delta", *S.EXTRA_INPUTS)})
    return out


def _factor_lines(spec: S.Spec, grad: ir.Graph, coef_order: list[str], at: list[str],
                  compute: bool = True) -> tuple[list[str], dict[str, str]]:
    """The token's gradient factors at weights `at`: (lines, outputs of `memory_grad`). One token at a time,
    or, with batched factors, read from the scratch a mini-batch start fills (`compute`: emit that fill)."""
    wdims = spec.weight_dims()
    if not batched_factors(spec):
        g_lines, g_out, _ = _graph_lines(grad, "g_", at, {n: f"c_{n}" for n in coef_order},
                                         _graph_vector_inputs(spec), wdims)
        return g_lines, g_out
    lines = []
    if compute:  # the factors of a whole mini-batch at once, at its start (its anchor is the current state)
        lines.append("if new_chunk:")
        lines += ["    " + ln for ln in _chunk_factor_lines(grad, wdims, coef_order, at)]
    g_out = {f"{n}{i + 1}": f"{n}{i}" for i in range(len(wdims)) for n in ("delta", "input")}
    return lines + _load_factors(wdims), g_out


def _graph_lines(gr: ir.Graph, prefix: str, weights: list[str], scalars: dict[str, str], inputs: dict[str, str],
                 dims_of_weight: list[tuple[str, str]],
                 matmul=None) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Print an IR graph as straight-line Triton code. Returns (lines, outputs, dims).

    Without `matmul`: one token, vectors are 1-D tiles and per-token scalars are scalars. With
    `matmul(op, i, weight, h)` (a Triton expression for layer/linear/linear_t on weight i): a block of
    BC tokens, vectors are [BC, n] tiles, per-token scalars [BC, 1], reductions run along axis 1."""
    tile = matmul is not None
    names, dims, lines, outputs = {}, {}, [], {}

    def red(x):  # a reduction over a vector's lanes
        return f"tl.sum({x}, axis=1)[:, None]" if tile else f"tl.sum({x}, axis=0)"

    def lanes(n):  # the mask of a dimension's real (unpadded) lanes
        return f"m{n}[None, :]" if tile else f"m{n}"

    for nid in gr.order():
        op, srcs = gr.node(nid), gr.srcs(nid)
        a = [names[s] for s in srcs]
        da = [dims[s] for s in srcs]
        var = f"{prefix}{op.name}"
        if op.op == "input":
            if op.arg in inputs:
                names[nid], dims[nid] = inputs[op.arg]
            else:
                names[nid], dims[nid] = scalars[op.arg], "s"
            continue
        if op.op == "weight":
            names[nid], dims[nid] = weights[op.arg], "w"
            continue
        if op.op == "output":
            outputs[op.arg] = a[0]
            continue
        if op.op in ("linear", "layer"):
            w, h = (weights[op.arg], a[0]) if op.op == "layer" else (a[0], a[1])
            lines.append(f"{var} = {matmul(op.op, op.arg, w, h)}" if tile else
                         f"{var} = tl.sum({w} * {h}[None, :], axis=1)")
            dims[nid] = dims_of_weight[op.arg][0]
        elif op.op == "linear_t":
            lines.append(f"{var} = {matmul(op.op, op.arg, a[0], a[1])}" if tile else
                         f"{var} = tl.sum({a[0]} * {a[1]}[:, None], axis=0)")
            dims[nid] = dims_of_weight[op.arg][1]
        elif op.op == "ew":
            expr, syms = op.arg
            tensor_dims = [d for d in da if d != "s"]
            dim = tensor_dims[0] if tensor_dims else "v"
            if not srcs:
                full = f"tl.full([BC, {BLOCK[dim]}], {float(expr)!r}, tl.float32)" if tile else repr(float(expr))
                lines.append(f"{var} = tl.where({lanes(dim)}, {full}, 0.0)")
            else:
                lines += print_triton_block({var: expr}, dict(zip(syms, a)), prefix=f"_{var}_")
                if tensor_dims:  # keep padded lanes at zero
                    lines.append(f"{var} = tl.where({lanes(dim)}, {var}, 0.0)")
            dims[nid] = dim
        elif op.op == "rownorm":
            lines.append(f"{var} = tl.sqrt({red(f'{a[0]} * {a[0]}')})")
            dims[nid] = "s"
        elif op.op == "rowsumsq":
            lines.append(f"{var} = {red(f'{a[0]} * {a[0]}')}")
            dims[nid] = "s"
        elif op.op == "rowsum":
            lines.append(f"{var} = {red(a[0])}")
            dims[nid] = "s"
        elif op.op == "layernorm":
            n = da[0]
            lines += [f"{var}_c = tl.where({lanes(n)}, {a[0]} - {red(a[0])} / N{n}, 0.0)",
                      f"{var} = {var}_c * tl.rsqrt({red(f'{var}_c * {var}_c')} / N{n} + 1e-5)"]
            dims[nid] = n
        elif op.op == "layernorm_bwd2":  # ∂/∂z ⟨g, LN'(z)ᵀ dy⟩, with c = z - mean z, r = rstd, a = dy - mean dy
            n = da[0]
            z, dy, g = a
            lines += [f"{var}_c = tl.where({lanes(n)}, {z} - {red(z)} / N{n}, 0.0)",
                      f"{var}_r = tl.rsqrt({red(f'{var}_c * {var}_c')} / N{n} + 1e-5)",
                      f"{var}_a = tl.where({lanes(n)}, {dy} - {red(dy)} / N{n}, 0.0)",
                      f"{var}_mac = {red(f'{var}_a * {var}_c')} / N{n}",
                      f"{var}_ga = {red(f'{g} * {var}_a')}",
                      f"{var}_gc = {red(f'{g} * {var}_c')}",
                      f"{var}_r3 = {var}_r * {var}_r * {var}_r",
                      f"{var}_x = {var}_r3 * ((3.0 * {var}_r * {var}_r * {var}_mac * {var}_gc - {var}_ga) * {var}_c "
                      f"/ N{n} - {var}_gc * {var}_a / N{n} - {var}_mac * {g})",
                      f"{var}_x = tl.where({lanes(n)}, {var}_x, 0.0)",
                      f"{var} = tl.where({lanes(n)}, {var}_x - {red(f'{var}_x')} / N{n}, 0.0)"]
            dims[nid] = n
        elif op.op == "layernorm_bwd":
            n = da[0]
            lines += [f"{var}_c = tl.where({lanes(n)}, {a[0]} - {red(a[0])} / N{n}, 0.0)",
                      f"{var}_r = tl.rsqrt({red(f'{var}_c * {var}_c')} / N{n} + 1e-5)",
                      f"{var}_h = {var}_c * {var}_r",
                      f"{var} = tl.where({lanes(n)}, {var}_r * ({a[1]} - {red(a[1])} / N{n} - {var}_h * "
                      f"{red(f'{a[1]} * {var}_h')} / N{n}), 0.0)"]
            dims[nid] = n
        else:
            raise Unsupported(f"no Triton printer for IR op {op.op}")
        names[nid] = var
    return lines, outputs, dims


CHUNK_TEMPLATE = (Path(__file__).parent / "templates" / "triton_chunked.py.tmpl").read_text()


def chunk_family(spec: S.Spec, chunk_kind: str | None) -> str | None:
    """Which chunked Triton kernel family computes this spec exactly (None: only the recurrent kernel).

    All three share one kernel pair (W_t = e^{g_t} W_0 - Σ e^{g_t - g_s} u_s k_sᵀ, u = Wk W_0ᵀ - U) and
    differ in the chunk-local preparation of Wk and U: "hebbian" (dot bias), "delta" (l2 bias, exact,
    one triangular solve per chunk), "minibatch" (l2 bias, gradients at the chunk's anchor).
    Channel-wise gates (CONTRACT §6): a decay over key channels (alpha=gate(k)) selects the kernels that
    take g per key channel, and lr=gate(k) only scales the written key (folded into the preparation), for
    the hebbian and delta families. Value-side gates (alpha=gate(v), lr=gate(v)), channel-wise θ and the
    mini-batch family with channel gates run on the recurrent kernel only."""
    m, b, r, l = spec.memory, spec.bias, spec.retention, spec.learner
    if m.kind != "linear" or r.kind not in ("none", "decay"):
        return None
    if any(side and (name, side) not in (("alpha", "k"), ("eta", "k")) for name, side in spec.gate_channels().items()):
        return None  # value-side gates: the recurrent kernel only
    if b.kind == "dot" and l.kind == "gd":
        return "hebbian"
    if b.kind == "l2" and chunk_kind == "delta":
        return "delta"
    if b.kind == "l2" and spec.parallel.kind == "minibatch" and l.kind == "gd" and not spec.channel_gates:
        return "minibatch"
    return None


def emit_chunked(spec: S.Spec, family: str, preprocess) -> str:
    """Source of the chunked Triton section (kernels and the torch preparation) for a chunk family."""
    r = spec.retention
    sides = spec.gate_channels()
    flags = {"chunk_hebbian": family == "hebbian", "chunk_delta": family == "delta",
             "implicit": spec.learner.kind == "implicit", "has_alpha": r.kind == "decay",
             "pre_decay": r.kind == "decay" and r.order == "pre", "minibatch": spec.parallel.kind == "minibatch",
             "ch_alpha": sides.get("alpha") == "k", "ch_eta": sides.get("eta") == "k"}
    op_id = hashlib.sha256(spec.canonical().encode()).hexdigest()[:12]
    return preprocess(CHUNK_TEMPLATE, flags).replace("{{OP_ID}}", op_id)


def emit(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str]) -> str:
    """Source of the Triton section of an emitted module (raises Unsupported with the reason)."""
    par = spec.parallel
    if par.kind == "minibatch" and par.readout == "chunk":
        raise Unsupported(f"readout=chunk (CONTRACT §7, {spec.retention.kind} retention) has no Triton kernel yet: the "
                          "fused recurrent kernel implements per-token readouts and the mini-batch kernels no chunk "
                          "readout")
    try:
        return _emit(spec, d, forward, grad, coef_order)
    except NotImplementedError as err:
        raise Unsupported(f"{err}") from None


def _program_ids() -> list[str]:
    """The program's (V tile, batch·head) and its index ranges: rows iv·BV .. iv·BV + BV - 1 of the memory
    (value rows; the whole of them, iv = 0, where the rows are coupled), all of K and of the hidden width."""
    return ["iv = tl.program_id(0)", "bh = tl.program_id(1)", "pid = iv * tl.num_programs(1) + bh",
            "rc = tl.arange(0, BC)", "rk = tl.arange(0, BK)", "rv = iv * BV + tl.arange(0, BV)",
            "re = tl.arange(0, BE)", "mk = rk < Nk", "mv = rv < Nv", "me = re < Ne"]


def _emit(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str]) -> str:
    r, l = spec.retention, spec.learner
    wdims = spec.weight_dims()
    n_w = len(wdims)
    store_acc = r.kind in ("lq", "elastic")
    mom = l.kind == "momentum"
    mb = spec.parallel.C if spec.parallel.kind == "minibatch" else 0
    p = TritonPrinter()
    scal = {n: f"c_{n}" for n in coef_order}
    W = [f"w{i}" for i in range(n_w)]
    # the anchor tile: with batched factors (computed at the mini-batch start, from the state as it is then)
    # the forward needs none, unless an order=pre decay changes the state before the factors are taken
    keep_anchor = mb and not _forward_reads_state_as_anchor(spec)
    A = [f"anchor{i}" for i in range(n_w)] if keep_anchor else W

    # ---- kernel signature
    vectors = vector_coefficients(spec)
    scalars = [n for n in coef_order if n not in vectors]
    ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in vectors], "O"]
    for i in range(n_w):
        ptrs += [f"W{i}_in", f"W{i}_out"]
        if store_acc:
            ptrs += [f"Y{i}_in", f"Y{i}_out"]
        if mom:
            ptrs += [f"S{i}_in", f"S{i}_out"]
    ptrs += [f"F{n}{i}" for i in range(n_w) for n in ("DL", "X")]  # factor scratch (used with batched factors)
    sig = (", ".join(ptrs) + ", T, Nk, Nv, Ne, NC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, "
           "BE: tl.constexpr, BC: tl.constexpr")
    body: list[str] = _program_ids()
    size = {"k": "Nk", "v": "Nv", "e": "Ne"}

    def tile_ptr(base, i):
        rows, cols = wdims[i]
        return f"{base} + bh * {size[rows]} * {size[cols]} + r{rows}[:, None] * {size[cols]} + r{cols}[None, :]"

    def tile_mask(i):
        rows, cols = wdims[i]
        return f"m{rows}[:, None] & m{cols}[None, :]"

    for i in range(n_w):
        body.append(f"mask{i} = {tile_mask(i)}")
        body.append(f"w{i} = tl.load({tile_ptr(f'W{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        if store_acc:
            body.append(f"y{i} = tl.load({tile_ptr(f'Y{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        elif r.kind == "kl":
            body.append(f"y{i} = tl.where(mask{i}, tl.log(tl.where(mask{i}, w{i}, 1.0) / {float(r.c)!r}), 0.0)")
        elif r.kind == "bregman":
            lines = print_triton_block({f"y{i}": d.phi_prime}, {sp.Symbol("w", real=True): f"w{i}"}, prefix=f"_y{i}_")
            body += lines + [f"y{i} = tl.where(mask{i}, y{i}, 0.0)"]
        if mom:
            body.append(f"s{i} = tl.load({tile_ptr(f'S{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        if keep_anchor:
            body.append(f"anchor{i} = w{i}")

    loop: list[str] = [
        "q = tl.load(Q + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
        "k = tl.load(K + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
        "v = tl.load(V + (bh * T + t) * Nv + rv, mask=mv, other=0.0).to(tl.float32)",
    ]
    for j, n in enumerate(scalars):
        loop.append(f"c_{n} = tl.load(C + (bh * T + t) * NC + {j})")
    loop += _vector_loads(vectors)
    if mb:
        loop.append(f"new_chunk = (t % {mb}) == 0")
        for i in range(n_w if keep_anchor else 0):
            loop.append(f"anchor{i} = tl.where(new_chunk, w{i}, anchor{i})")
    if r.kind == "decay" and r.order == "pre":
        for i in range(n_w):
            loop.append(f"w{i} = c_alpha * w{i}")
    g_lines, g_out = _factor_lines(spec, grad, coef_order, A)
    loop += g_lines
    for i in range(n_w):
        delta, inp = g_out[f"delta{i + 1}"], g_out[f"input{i + 1}"]
        loop.append(f"grad{i} = {delta}[:, None] * {inp}[None, :]")
        if mom:
            loop.append(f"s{i} = c_theta * s{i} - c_eta * grad{i}")
            loop.append(f"upd{i} = s{i}")
        else:
            loop.append(f"upd{i} = -c_eta * grad{i}")
        if spec.generalized_delta == "erase":  # the write v kᵀ at unit rate (the gradient factors are the erase)
            loop.append(f"upd{i} = upd{i} + v[:, None] * k[None, :]")
        if r.kind == "none" or (r.kind == "decay" and r.order == "pre"):
            loop.append(f"w{i} = w{i} + upd{i}")
        elif r.kind == "decay":
            loop.append(f"w{i} = c_alpha * w{i} + upd{i}")
        else:
            loop.append(f"y{i} = {'y' + str(i) if r.kind == 'bregman' else 'c_alpha * y' + str(i)} + upd{i}")
            loop += _readout(spec, d, i, p)
    f_lines, f_out, _ = _graph_lines(forward, "f_", W, scal, {"x": ("q", "k")}, wdims)
    loop += f_lines
    loop.append(f"tl.store(O + (bh * T + t) * Nv + rv, {f_out['y']}.to(O.dtype.element_ty), mask=mv)")
    body.append("for t in range(T):")
    body += ["    " + line for line in loop]
    for i in range(n_w):
        body.append(f"tl.store({tile_ptr(f'W{i}_out', i)}, w{i}, mask=mask{i})")
        if store_acc:
            body.append(f"tl.store({tile_ptr(f'Y{i}_out', i)}, y{i}, mask=mask{i})")
        if mom:
            body.append(f"tl.store({tile_ptr(f'S{i}_out', i)}, s{i}, mask=mask{i})")
    kernel = ("    @triton.jit\n    def _fused_recurrent_fwd(" + sig + "):  # noqa: C901\n"
              + "\n".join("        " + line for line in body) + "\n")
    op_id = hashlib.sha256(spec.canonical().encode()).hexdigest()[:12]
    v_reason = v_tile_reason(spec, forward, grad)
    bwd_state: list[str] = []
    why_not = ""
    try:
        bwd_kernel, bwd_state = _emit_bwd(spec, d, forward, grad, coef_order, BWD_SEGMENT)
        kernel += "\n" + bwd_kernel
    except (ir.NoVJP, NotImplementedError) as err:  # the forward kernel stands; the backward recomputes
        why_not = str(err)
    return SECTION.replace("{{KERNEL}}", kernel).replace("{{COEF_ORDER}}", repr(tuple(coef_order))) \
        .replace("{{VECTOR_COEFS}}", repr(vectors)) \
        .replace("{{STORE_ACC}}", repr(store_acc)).replace("{{MOMENTUM}}", repr(mom)).replace("{{OP_ID}}", op_id) \
        .replace("{{BWD_STATE}}", repr(tuple(bwd_state))) \
        .replace("{{BWD_STATE_WEIGHT}}", repr(tuple(_widx(n) for n in bwd_state))) \
        .replace("{{BWD_SEGMENT}}", str(BWD_SEGMENT)) \
        .replace("{{FACTOR_BLOCK}}", str(batched_factors(spec))).replace("{{FACTOR_DIMS}}", repr(tuple(wdims))) \
        .replace("{{BWD_REASON}}", why_not) \
        .replace("{{V_TILES}}", repr(v_reason is None)).replace("{{V_TILE_REASON}}", v_reason or "") \
        .replace("{{TILES_FWD}}", str(_live_tiles(spec, False))).replace("{{TILES_BWD}}", str(_live_tiles(spec, True)))


def _forward_reads_state_as_anchor(spec: S.Spec) -> bool:
    """The forward kernel takes a mini-batch's batched factors at its start straight from the state (no
    anchor tile): the state then is the anchor, unless an order=pre decay scales it first."""
    r = spec.retention
    return bool(batched_factors(spec)) and not (r.kind == "decay" and r.order == "pre")


def _live_tiles(spec: S.Spec, backward: bool) -> int:
    """The resource model's count of [rows, cols] fp32 tiles per weight a recurrent kernel keeps live: the
    state (weights; accumulator or log-space/φ' image; momentum; mini-batch anchor) and the step's temporaries
    (gradient, update); the backward also carries their cotangents and the state before the token."""
    r, mb = spec.retention, spec.parallel.kind == "minibatch"
    state = 1 + (r.kind in ("lq", "elastic", "kl", "bregman")) + (spec.learner.kind == "momentum") + mb
    if not backward:
        return state + 2 - _forward_reads_state_as_anchor(spec)
    return 3 * state + 4


def _readout_derivative(spec: S.Spec, d: Derivation) -> tuple[sp.Expr, sp.Symbol]:
    """R'(y) of an elementwise readout w = R(y) (elastic shrink, Bregman (φ')⁻¹)."""
    if spec.retention.kind == "elastic":
        sym = sp.Symbol("a", real=True)
        return ir._clean_derivative(sp.diff(d.elastic, sym)), sym
    sym = sp.Symbol("u", real=True)
    return ir._clean_derivative(sp.diff(d.phi_prime_inv, sym)), sym


def _widx(var: str) -> int:
    """The weight index a state variable name ends with (w0, anchor12, ...)."""
    return int(re.search(r"\d+$", var).group())


def _outer_sum(v_out: dict[str, str], i: int) -> str | None:
    """Σ_j l_j r_jᵀ over the outer-product pairs a reverse-mode graph gives for weight i."""
    terms, j = [], 0
    while f"outer{i}_{j}_l" in v_out:
        terms.append(f"{v_out[f'outer{i}_{j}_l']}[:, None] * {v_out[f'outer{i}_{j}_r']}[None, :]")
        j += 1
    return " + ".join(terms) or None


def _emit_bwd(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str],
              seg: int) -> tuple[str, list[str]]:
    """The recurrent backward kernel: a reverse sweep over segments of `seg` tokens.

    Pass 1 walks the tokens forward and checkpoints the state at each segment start; pass 2 visits the
    segments in reverse, replays the segment forward into a scratch buffer (the state before each
    token), then walks it backward: per token it recomputes the step from the saved state and applies
    the reverse of each piece — the read y = M(q) and the gradient factors (δ_i, x_i) through the
    reverse-mode graphs `ir.vjp(memory_forward)` and `ir.vjp(memory_grad)` (bias derivative, activations,
    LayerNorm, residual), then the learner (gd or momentum), the retention (decay, or an accumulator and
    its elementwise readout) and the mini-batch anchor, written once here for every spec."""
    r, l = spec.retention, spec.learner
    mom, mb = l.kind == "momentum", (spec.parallel.C if spec.parallel.kind == "minibatch" else 0)
    readout = r.kind in ("elastic", "bregman", "lq", "kl")
    store_acc = r.kind in ("elastic", "lq")
    write = spec.generalized_delta == "erase"  # l2(erase=kappa): the update adds v kᵀ outside the factors
    wdims = spec.weight_dims()
    n_w = len(wdims)
    size = {"k": "Nk", "v": "Nv", "e": "Ne"}
    bc = batched_factors(spec)
    scal = {n: f"c_{n}" for n in coef_order}
    vectors = vector_coefficients(spec)  # channel-wise (CONTRACT §6): their cotangents are vectors too
    scalars = [n for n in coef_order if n not in vectors]
    seeds = {}
    for i in range(n_w):
        seeds[f"delta{i + 1}"] = f"ct_delta{i + 1}"
        seeds[f"input{i + 1}"] = f"ct_input{i + 1}"
    gvjp = ir.vjp(grad, seeds, "memory_grad_vjp", ir.VECTOR_INPUTS + tuple(vectors))
    fvjp = ir.vjp(forward, {"y": "ct_y"}, "memory_forward_vjp")
    names = ["w"] + (["y"] if readout else []) + (["s"] if mom else []) + (["anchor"] if mb else [])
    state = [f"{n}{i}" for i in range(n_w) for n in names]

    def tile(base, i):
        rows, cols = wdims[i]
        return f"{base} + bh * {size[rows]} * {size[cols]} + r{rows}[:, None] * {size[cols]} + r{cols}[None, :]"

    def scratch(var, slot):  # buffer BUF_<var>: per program NSLOT tiles (NCK checkpoints, then a segment)
        rows, cols = wdims[_widx(var)]
        return (f"BUF_{var} + (bh * NSLOT + {slot}) * {size[rows]} * {size[cols]} + r{rows}[:, None] * "
                f"{size[cols]} + r{cols}[None, :]")

    def load_token():
        lines = ["q = tl.load(Q + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
                 "k = tl.load(K + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
                 "v = tl.load(V + (bh * T + t) * Nv + rv, mask=mv, other=0.0).to(tl.float32)"]
        lines += [f"c_{n} = tl.load(C + (bh * T + t) * NC + {j})" for j, n in enumerate(scalars)]
        return lines + _vector_loads(vectors)

    def dcoef(name, prod):
        """dc_<name> += the reduction of a weight-shaped product: to a scalar, or over the rows (a gate over key
        channels) or the columns (value channels)."""
        side = vectors.get(name)
        red = f"tl.sum(tl.sum({prod}, axis=1), axis=0)" if side is None else \
            f"tl.sum({prod}, axis={0 if side == 'k' else 1})"
        return f"dc_{name} = dc_{name} + {red}"

    def step(compute_factors=True):
        """One token forward from the state variables (updated in place); keeps the intermediates.
        With batched factors, pass 1 computes each mini-batch's factors at its start into the factor
        scratch (compute_factors) and every later replay reads them from there."""
        lines = [f"new_chunk = (t % {mb}) == 0"] if mb else []
        for i in range(n_w):
            if mb:
                lines.append(f"anchor{i} = tl.where(new_chunk, w{i}, anchor{i})")
            lines.append(f"w_prev{i} = w{i}")
            lines.append(f"w_dec{i} = c_alpha * w{i}" if r.kind == "decay" and r.order == "pre" else f"w_dec{i} = w{i}")
        at = [f"anchor{i}" if mb else f"w_dec{i}" for i in range(n_w)]
        g_lines, g_out = _factor_lines(spec, grad, coef_order, at, compute_factors)
        lines += g_lines
        for i in range(n_w):
            lines += [f"delta{i} = {g_out[f'delta{i + 1}']}", f"input{i} = {g_out[f'input{i + 1}']}",
                      f"grad{i} = delta{i}[:, None] * input{i}[None, :]"]
            if mom:
                lines += [f"s_prev{i} = s{i}", f"s{i} = c_theta * s{i} - c_eta * grad{i}", f"upd{i} = s{i}"]
            else:
                lines.append(f"upd{i} = -c_eta * grad{i}")
            if write:
                lines.append(f"upd{i} = upd{i} + v[:, None] * k[None, :]")
            if readout:
                lines.append(f"y_prev{i} = y{i}")
                lines.append(f"y{i} = y{i} + upd{i}" if r.kind == "bregman" else f"y{i} = c_alpha * y{i} + upd{i}")
                lines += _readout(spec, d, i, TritonPrinter())
            elif r.kind == "decay" and r.order == "post":
                lines.append(f"w{i} = c_alpha * w{i} + upd{i}")
            else:
                lines.append(f"w{i} = w_dec{i} + upd{i}")
        return lines

    def reverse():
        """The reverse of step(): carried cotangents dw, dy, ds, da (after the token) -> before it."""
        lines = ["do = tl.load(DO + (bh * T + t) * Nv + rv, mask=mv, other=0.0).to(tl.float32)"]
        lines += [f"dc_{n} = " + ("0.0" if n not in vectors else f"tl.zeros([B{vectors[n].upper()}], tl.float32)")
                  for n in coef_order]
        f_lines, f_out, _ = _graph_lines(fvjp, "fb_", [f"w{i}" for i in range(n_w)], scal,
                                         {"x": ("q", "k"), "ct_y": ("do", "v")}, wdims)
        lines += f_lines
        lines.append(f"dq = {f_out['d_x']}")
        for i in range(n_w):
            read = _outer_sum(f_out, i)
            if read:
                lines.append(f"dw{i} = dw{i} + {read}")  # y_t = M_{W_t}(q_t)
            if readout:
                if r.kind == "lq":
                    # W = c Y with c = ‖Y‖_q^{-(q-2)}: dY = c dW - (q-2) c ‖Y‖_q^{-q} ⟨dW, Y⟩ sign(Y)|Y|^{q-1}
                    qq = float(r.q)
                    lines += [f"cq{i} = tl.exp(-{qq - 2!r} * tl.log(nrm{i}))",
                              f"ip{i} = tl.sum(tl.sum(dw{i} * y{i}, axis=1), axis=0)",
                              f"sp{i} = tl.where(mask{i}, tl.where(y{i} < 0, -1.0, 1.0) * "
                              f"tl.exp({qq - 1!r} * tl.log(tl.where(mask{i}, tl.abs(y{i}), 1.0))), 0.0)",
                              f"dyv{i} = dy{i} + cq{i} * dw{i} - {qq - 2!r} * cq{i} * tl.exp(-{qq!r} * tl.log(nrm{i})) "
                              f"* ip{i} * sp{i}"]
                elif r.kind == "kl":  # W = c softmax_row(Y): dY = c S ∘ (dW - rowsum(dW ∘ S))
                    cc = float(r.c)
                    lines += [f"sm{i} = tl.where(mask{i}, w{i} / {cc!r}, 0.0)",
                              f"rs{i} = tl.sum(dw{i} * sm{i}, axis=1)",
                              f"dyv{i} = dy{i} + {cc!r} * sm{i} * (dw{i} - rs{i}[:, None])"]
                else:  # elementwise readouts: R'(y)
                    dexpr, sym = _readout_derivative(spec, d)
                    lines += print_triton_block({f"rprime{i}": dexpr}, {sym: f"y{i}"}, prefix=f"_rp{i}_")
                    lines.append(f"dyv{i} = dy{i} + rprime{i} * dw{i}")
                lines += [f"dupd{i} = dyv{i}", f"dw_dec{i} = tl.zeros_like(dw{i})"]
                if r.kind != "bregman":
                    lines += [dcoef("alpha", f"dyv{i} * y_prev{i}"), f"dy{i} = c_alpha * dyv{i}"]
                else:
                    lines.append(f"dy{i} = dyv{i}")
            elif r.kind == "decay" and r.order == "post":
                lines += [f"dupd{i} = dw{i}", dcoef("alpha", f"dw{i} * w_prev{i}"),
                          f"dw_dec{i} = c_alpha * dw{i}"]  # W_t = α W_{t-1} + upd; the gradient read W_{t-1}
            else:
                lines += [f"dupd{i} = dw{i}", f"dw_dec{i} = dw{i}"]
            if mom:
                lines += [f"dst{i} = ds{i} + dupd{i}", dcoef("theta", f"dst{i} * s_prev{i}"),
                          f"dc_eta = dc_eta - tl.sum(tl.sum(dst{i} * grad{i}, axis=1), axis=0)",
                          f"dgrad{i} = -c_eta * dst{i}", f"ds{i} = c_theta * dst{i}"]
            else:
                lines += [f"dc_eta = dc_eta - tl.sum(tl.sum(dupd{i} * grad{i}, axis=1), axis=0)",
                          f"dgrad{i} = -c_eta * dupd{i}"]
            lines += [f"ct_delta{i + 1} = tl.sum(dgrad{i} * input{i}[None, :], axis=1)",
                      f"ct_input{i + 1} = tl.sum(dgrad{i} * delta{i}[:, None], axis=0)"]
        if bc:
            return lines + batched_factor_reverse()
        at = [f"anchor{i}" if mb else f"w_dec{i}" for i in range(n_w)]
        cts = {"k": ("k", "k"), "v": ("v", "v")}
        for i, (rows, cols) in enumerate(wdims):
            cts[f"ct_delta{i + 1}"] = (f"ct_delta{i + 1}", rows)
            cts[f"ct_input{i + 1}"] = (f"ct_input{i + 1}", cols)
        v_lines, v_out, _ = _graph_lines(gvjp, "b_", at, scal, cts, wdims)
        lines += v_lines
        lines.append(f"dk = {v_out['d_k']}" if "d_k" in v_out else "dk = tl.zeros_like(k)")
        lines.append(f"dv = {v_out['d_v']}" if "d_v" in v_out else "dv = tl.zeros_like(v)")
        if write:  # the write v kᵀ (linear memory: weight 0): dv += dU k, dk += dUᵀ v (a partial sum over V tiles)
            lines += ["dk = dk + tl.sum(dupd0 * v[:, None], axis=0)", "dv = dv + tl.sum(dupd0 * k[None, :], axis=1)"]
        for n in coef_order:
            if f"d_{n}" in v_out:
                lines.append(f"dc_{n} = dc_{n} + {v_out['d_' + n]}")  # already a per-token scalar (rowsum)
        for i in range(n_w):
            at_grad = _outer_sum(v_out, i)
            if at_grad:
                lines.append(f"da{i} = da{i} + {at_grad}" if mb else f"dw_dec{i} = dw_dec{i} + {at_grad}")
            if r.kind == "decay" and r.order == "pre":
                lines += [dcoef("alpha", f"dw_dec{i} * w_prev{i}"), f"dw{i} = c_alpha * dw_dec{i}"]
            else:  # post decay: already scaled; readouts: the read of R(y_{t-1}) reaches y at token t-1
                lines.append(f"dw{i} = dw_dec{i}")
            if mb:
                lines += [f"dw{i} = tl.where(new_chunk, dw{i} + da{i}, dw{i})",
                          f"da{i} = tl.where(new_chunk, tl.zeros_like(da{i}), da{i})"]
        lines += [f"tl.store({_part_row('DQ', 'k')}, dq, mask=mk)", f"tl.store({_part_row('DK', 'k')}, dk, mask=mk)",
                  "tl.store(DV + (bh * T + t) * Nv + rv, dv, mask=mv)"]
        lines += [f"tl.store(DC + (pid * T + t) * NC + {j}, dc_{n})" for j, n in enumerate(scalars)]
        for n, side in vectors.items():  # key channels: per-V-tile partial sums; value channels: this tile's rows
            lines.append(f"tl.store({_part_row(f'DG_{n}', 'k')}, dc_{n}, mask=mk)" if side == "k" else
                         f"tl.store(DG_{n} + (bh * T + t) * Nv + rv, dc_{n}, mask=mv)")
        return lines

    def batched_factor_reverse():
        """The rest of the token's reverse with batched factors: the factors' cotangents go to scratch;
        at a mini-batch start (the last of its tokens the reverse walk meets) the reverse-mode graph of
        `memory_grad` runs on the whole mini-batch as one tile computation: dk, dv, the bias's gates and
        the anchor's cotangent, which joins dW (the anchor is the state before this token)."""
        lines = []
        for i, (rows, cols) in enumerate(wdims):
            if r.kind == "decay" and r.order == "pre":
                lines += [f"dc_alpha = dc_alpha + tl.sum(tl.sum(dw_dec{i} * w_prev{i}, axis=1), axis=0)",
                          f"dw{i} = c_alpha * dw_dec{i}"]
            else:
                lines.append(f"dw{i} = dw_dec{i}")
            lines += [f"tl.store({_ring_row(f'CTD{i}', rows)}, ct_delta{i + 1}, mask=m{rows})",
                      f"tl.store({_ring_row(f'CTX{i}', cols)}, ct_input{i + 1}, mask=m{cols})"]
        lines += [f"tl.store({_part_row('DQ', 'k')}, dq, mask=mk)"]
        lines += [f"tl.store(DC + (pid * T + t) * NC + {j}, dc_{n})" for j, n in enumerate(coef_order)]
        block = ["tl.debug_barrier()"] + _chunk_tiles(coef_order)
        cts = {"k": ("kc", "k"), "v": ("vc", "v")}
        for i, (rows, cols) in enumerate(wdims):
            block += [f"ctd{i} = tl.load({_ring_rows(f'CTD{i}', rows)}, mask=cm[:, None] & m{rows}[None, :], "
                      "other=0.0)",
                      f"ctx{i} = tl.load({_ring_rows(f'CTX{i}', cols)}, mask=cm[:, None] & m{cols}[None, :], "
                      "other=0.0)"]
            cts[f"ct_delta{i + 1}"] = (f"ctd{i}", rows)
            cts[f"ct_input{i + 1}"] = (f"ctx{i}", cols)
        v_lines, v_out, _ = _graph_lines(gvjp, "gb_", [f"anchor{i}" for i in range(n_w)],
                                         {n: f"cc_{n}" for n in coef_order}, cts, wdims, matmul=_tile_matmul)
        block += v_lines
        for x, ptr in (("k", _part_rows("DK", "k")), ("v", _rows("DV", "v"))):
            val = v_out.get(f"d_{x}", f"tl.zeros([BC, B{x.upper()}], tl.float32)")
            block.append(f"tl.store({ptr}, {val}, mask=cm[:, None] & m{x}[None, :])")
        for j, n in enumerate(coef_order):
            if f"d_{n}" in v_out:  # a gate inside the bias: add its part to what the token's reverse stored
                block += [f"dcc = tl.load(DC + (pid * T + ctok) * NC + {j}, mask=cm, other=0.0)",
                          f"tl.store(DC + (pid * T + ctok) * NC + {j}, dcc + tl.sum({v_out[f'd_{n}']} "
                          "+ tl.zeros([BC, 1], tl.float32), axis=1), mask=cm)"]
        for i in range(n_w):
            terms, j = [], 0
            while f"outer{i}_{j}_l" in v_out:
                terms.append(f"tl.dot(tl.trans({v_out[f'outer{i}_{j}_l']}), {v_out[f'outer{i}_{j}_r']}, "
                             "input_precision=\"ieee\")")
                j += 1
            if terms:
                block.append(f"dw{i} = dw{i} + " + " + ".join(terms))
        return lines + ["if new_chunk:"] + ["    " + ln for ln in block]

    init = _program_ids()
    for i, (rows, cols) in enumerate(wdims):
        init.append(f"mask{i} = m{rows}[:, None] & m{cols}[None, :]")
        init.append(f"w{i} = tl.load({tile('W' + str(i) + '_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        if store_acc:
            init.append(f"y{i} = tl.load({tile('Y' + str(i) + '_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        elif r.kind == "bregman":
            init += print_triton_block({f"y{i}": d.phi_prime}, {sp.Symbol("w", real=True): f"w{i}"}, prefix=f"_y{i}_")
            init.append(f"y{i} = tl.where(mask{i}, y{i}, 0.0)")
        elif r.kind == "kl":
            init.append(f"y{i} = tl.where(mask{i}, tl.log(tl.where(mask{i}, w{i}, 1.0) / {float(r.c)!r}), 0.0)")
        if mom:
            init.append(f"s{i} = tl.load({tile('S' + str(i) + '_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        if mb:
            init.append(f"anchor{i} = w{i}")
    body = list(init)
    # pass 1: forward, checkpointing the state at each segment start
    body.append("for t in range(T):")
    body.append(f"    if t % {seg} == 0:")
    body += [f"        tl.store({scratch(n, f't // {seg}')}, {n}, mask=mask{_widx(n)})" for n in state]
    body += ["    " + ln for ln in load_token() + step()]
    # pass 2: segments in reverse
    for i in range(n_w):
        body.append(f"dw{i} = tl.load({tile(f'DW{i}_fin', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        if readout:
            body.append(f"dy{i} = tl.load({tile(f'DY{i}_fin', i)}, mask=mask{i}, other=0.0).to(tl.float32)"
                        if store_acc else f"dy{i} = tl.zeros_like(dw{i})")
        if mom:
            body.append(f"ds{i} = tl.load({tile(f'DS{i}_fin', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        if mb:
            if not bc:
                body.append(f"da{i} = tl.zeros_like(dw{i})")
    body += [f"for sg in range(0, tl.cdiv(T, {seg})):",
             f"    g0 = (tl.cdiv(T, {seg}) - 1 - sg) * {seg}",
             f"    n_tok = tl.minimum({seg}, T - g0)"]
    body += [f"    {n} = tl.load({scratch(n, f'g0 // {seg}')}, mask=mask{_widx(n)}, other=0.0)" for n in state]
    body += ["    for j in range(0, n_tok):", "        t = g0 + j"]
    body += [f"        tl.store({scratch(n, 'NCK + j')}, {n}, mask=mask{_widx(n)})" for n in state]
    body += ["        " + ln for ln in load_token() + step(compute_factors=False)]
    body += ["    tl.debug_barrier()", "    for jj in range(0, n_tok):", "        j = n_tok - 1 - jj",
             "        t = g0 + j"]
    body += [f"        {n} = tl.load({scratch(n, 'NCK + j')}, mask=mask{_widx(n)}, other=0.0)" for n in state]
    body += ["        " + ln for ln in load_token() + step(compute_factors=False) + reverse()]
    # cotangents of the initial state
    for i in range(n_w):
        if r.kind == "bregman":
            wsym = sp.Symbol("w", real=True)
            body.append(f"w_init{i} = tl.load({tile(f'W{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
            body += print_triton_block({f"phi2_{i}": ir._clean_derivative(sp.diff(d.phi_prime, wsym))},
                                       {wsym: f"w_init{i}"}, prefix=f"_p2{i}_")
            body.append(f"dw{i} = dw{i} + tl.where(mask{i}, phi2_{i} * dy{i}, 0.0)")
        elif r.kind == "kl":  # y_0 = log(W_0 / c)
            body.append(f"w_init{i} = tl.load({tile(f'W{i}_in', i)}, mask=mask{i}, other=1.0).to(tl.float32)")
            body.append(f"dw{i} = dw{i} + tl.where(mask{i}, dy{i} / w_init{i}, 0.0)")
        body.append(f"tl.store({tile(f'DW{i}_in', i)}, dw{i}, mask=mask{i})")
        if store_acc:
            body.append(f"tl.store({tile(f'DY{i}_in', i)}, dy{i}, mask=mask{i})")
        if mom:
            body.append(f"tl.store({tile(f'DS{i}_in', i)}, ds{i}, mask=mask{i})")
    ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in vectors], "DO"]
    for i in range(n_w):  # in the order of the state keys: W, A_W, S_W per weight
        ptrs += [f"W{i}_in", f"DW{i}_fin", f"DW{i}_in"]
        if store_acc:
            ptrs += [f"Y{i}_in", f"DY{i}_fin", f"DY{i}_in"]
        if mom:
            ptrs += [f"S{i}_in", f"DS{i}_fin", f"DS{i}_in"]
    ptrs += [f"BUF_{n}" for n in state] + ["DQ", "DK", "DV", "DC", *[f"DG_{n}" for n in vectors]]
    ptrs += [f"{b}{i}" for i in range(n_w) for b in ("FDL", "FX", "CTD", "CTX")]  # factor scratch (batched factors)
    sig = (", ".join(ptrs) + ", T, Nk, Nv, Ne, NCK, NSLOT, NC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, "
           "BE: tl.constexpr, BC: tl.constexpr")
    return ("    @triton.jit\n    def _fused_recurrent_bwd(" + sig + "):  # noqa: C901\n"
            + "\n".join("        " + line for line in body) + "\n"), state


def _readout(spec: S.Spec, d: Derivation, i: int, p: TritonPrinter) -> list[str]:
    r = spec.retention
    y, w = f"y{i}", f"w{i}"
    if r.kind == "lq":
        q = float(r.q)
        return [f"nrm{i} = tl.sum(tl.sum(tl.where(mask{i}, tl.exp({q!r} * tl.log(tl.abs({y}))), 0.0), axis=1), axis=0)",
                f"nrm{i} = tl.maximum(tl.exp(tl.log(nrm{i}) / {q!r}), 1e-30)",
                f"{w} = {y} * tl.exp(-{q - 2!r} * tl.log(nrm{i}))"]
    if r.kind == "kl":
        return [f"ym{i} = tl.where(mask{i}, {y}, -float('inf'))",
                f"ex{i} = tl.exp(ym{i} - tl.max(ym{i}, axis=1)[:, None])",
                f"{w} = tl.where(mask{i}, {float(r.c)!r} * ex{i} / tl.sum(ex{i}, axis=1)[:, None], 0.0)"]
    expr, sym = (d.elastic, sp.Symbol("a", real=True)) if r.kind == "elastic" else (d.phi_prime_inv,
                                                                                    sp.Symbol("u", real=True))
    return print_triton_block({w: expr}, {sym: y}, prefix=f"_{w}_") + [f"{w} = tl.where(mask{i}, {w}, 0.0)"]


SECTION = '''

# ----------------------------------------------------------------------------------------------
# Triton: fused recurrent kernels, printed from the IR (one program per (V tile, batch·head) where the
# value rows update independently, else per (batch, head); the program's rows of the memory live in
# registers; tokens are walked in order). The backward is a generated reverse sweep over
# checkpointed segments (_fused_recurrent_bwd) where _BWD_STATE is non-empty, else it recomputes the
# torch recurrence. Registered custom ops, so torch.compile keeps them in one graph. Runs on the CPU
# under TRITON_INTERPRET=1 (set before triton is imported).
# ----------------------------------------------------------------------------------------------
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

_COEF_ORDER = {{COEF_ORDER}}
_VECTOR_COEFS = {{VECTOR_COEFS}}  # channel-wise coefficients (name -> side), passed to the kernel as vectors
_STORE_ACC = {{STORE_ACC}}
_MOMENTUM = {{MOMENTUM}}
# The backward kernel's per-token state (empty: the backward recomputes the torch recurrence, because
# {{BWD_REASON}}) and its checkpoint interval (a schedule choice).
_BWD_STATE = {{BWD_STATE}}
_BWD_STATE_WEIGHT = {{BWD_STATE_WEIGHT}}  # which weight each of those tiles belongs to
_BWD_SEGMENT = {{BWD_SEGMENT}}
# Mini-batch C when each mini-batch's gradient factors are one tile computation (tl.dot) at its start,
# kept in scratch (0: one token at a time), and the (rows, cols) dimension names of each weight.
_FACTOR_BLOCK = {{FACTOR_BLOCK}}
_FACTOR_DIMS = {{FACTOR_DIMS}}
# V tiles: True when every value row of the memory updates on its own, so the kernels run on a grid
# (cdiv(Dv, BV), B·H) of programs that each own BV rows of the state; else why the rows are coupled
# (one program per (batch, head)). _TILES_*: the [rows, cols] fp32 tiles each kernel keeps live per weight
# (state and temporaries; the resource model of _tile_config).
_V_TILES = {{V_TILES}}
_V_TILE_REASON = "{{V_TILE_REASON}}"
_TILES_FWD = {{TILES_FWD}}
_TILES_BWD = {{TILES_BWD}}


def _factor_scratch(q, v, Ne, names, n_v=1):
    """Float32 scratch per weight for each of `names` (rows- or cols-sized), or placeholders: the factors
    FDL, FX of every token, [B·H, T, n]; their cotangents CTD, CTX as a ring of one mini-batch per program,
    [n_v·B·H, C, n] (each V tile holds its own partial sums)."""
    B, H, T, Dk = q.shape
    size = {"k": Dk, "v": v.shape[-1], "e": Ne}
    out = []
    for rows, cols in _FACTOR_DIMS:
        for name in names:
            n = size[rows] if name in ("FDL", "CTD") else size[cols]
            shape = (B * H, T, n) if name in ("FDL", "FX") else (n_v * B * H, _FACTOR_BLOCK, n)
            out.append(torch.empty(*shape, dtype=torch.float32, device=q.device) if _FACTOR_BLOCK else q)
    return out


# ---- launch configuration: a small resource model (registers per thread from the tiles the kernel keeps)
# fp32 values per thread the live tiles may take. Calibrated on sm_90/sm_80 compiles at D = 128 (fp32, bf16):
# ptxas allocates ~2-3.5x this count (the token's vectors, products before reductions, addresses), and with
# 8 warps it may cap a thread at 128 registers; at 48 the forward spilled a few bytes on sm_80, at 24 none.
_REG_BUDGET = 40


_TILE_OVERRIDE = None  # (BV, num_warps) for every V-tiled launch: set by measurements (resource reports)


def _interpreted():
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    return bool(getattr(knobs, "interpret", False))


def _tile_candidates(Dk, Dv, Ne, tiles):
    """The (BV, num_warps) configurations the resource model allows, best guess first.

    Under the interpreter: BV = 4 (16 where the batched factors need tl.dot), so small tests cross V tiles.
    On a GPU (and for ahead-of-time compiles): every BV in 32 .. 1 with 4 or 8 warps whose live state tiles
    (`tiles` [BV, BK] fp32 tiles, counted at code generation, plus two [C, BK] token tiles where the
    mini-batch factors are batched) fit _REG_BUDGET values per thread, 4 warps before 8, then widest BV
    first (ptxas capped an 8-warp kernel at 64 registers and spilled 4 B where 4 warps at the same budget
    did not); if
    none does, the smallest BV at 8 warps. _TILE_OVERRIDE = (BV, warps) replaces it (measurements). Coupled
    specs (_V_TILES False) keep every row in one program: BV = Dv rounded up, 8 warps where the whole
    state exceeds the 4-warp budget (else 4), checked by _check_fits."""
    low = 16 if _FACTOR_BLOCK else 1
    bk = max(low, triton.next_power_of_2(Dk))
    full = max(low, triton.next_power_of_2(Dv))
    if not _V_TILES:  # one program holds every weight: 8 warps where 4 would exceed the budget
        big = _whole_state_values(Dk, Dv, Ne, tiles) > _REG_BUDGET * 32 * 4
        if _TILE_OVERRIDE:
            return [(full, _TILE_OVERRIDE[1])]
        return [(full, 8 if big else 4)]  # not tuned: these compile slowly
    if _TILE_OVERRIDE:
        out = [tuple(_TILE_OVERRIDE)]
    elif _interpreted():
        out = [(max(low, 4), 4)]
    else:
        out = [(bv, w) for w in (4, 8) for bv in (32, 16, 8, 4, 2, 1)
               if bv >= low and (tiles * bv + 2 * _FACTOR_BLOCK) * bk <= _REG_BUDGET * 32 * w] or [(low, 8)]
    seen, res = set(), []
    for bv, w in out:  # BV beyond the padded Dv is the same kernel as BV = padded Dv
        cfg = (max(low, min(bv, full)), w)
        if cfg not in seen:
            seen.add(cfg)
            res.append(cfg)
    return res


def _tile_config(Dk, Dv, Ne, tiles, backward):
    """(BV, num_warps, n_v) of the resource model's first choice; n_v = cdiv(Dv, BV) V tiles."""
    bv, warps = _tile_candidates(Dk, Dv, Ne, tiles)[0]
    return bv, warps, triton.cdiv(Dv, bv) if _V_TILES else 1


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
            times.append(timer(lambda: launch(cfg)))
        candidates = [candidates[times.index(min(times))]]
    _TUNED[key] = candidates[0]
    return candidates[0]


def _config_for(name, q, Dk, Dv, Ne, tiles, launch):
    """The launch configuration of kernel `name`: the model's first choice, or on a GPU the tuned one."""
    candidates = _tile_candidates(Dk, Dv, Ne, tiles)
    if not q.is_cuda or len(candidates) == 1 or _TILE_OVERRIDE:
        return candidates[0]
    return _pick_config((name, Dk, Dv, q.dtype, q.device.index), candidates, launch)


def _recurrent_space(tiles):
    """The configurations a GPU may try for a recurrent kernel (what `mirasc kernels` compiles): the resource
    model's candidates at the launch's sizes, as many as the first launch times. The model bounds registers,
    not shared memory (these kernels use almost none), so smem_limit does not prune it."""
    def space(args, smem_limit):
        cands = _tile_candidates(args["Nk"], args["Nv"], args["Ne"], tiles)[:_TUNE_MAX]
        return [triton.Config({"BV": bv}, num_warps=w) for bv, w in cands]  # default stages, as launched
    return space


# kernel name -> its autotuning space at a launch's arguments (read by `mirasc kernels`)
_RECURRENT_AUTOTUNE = {"_fused_recurrent_fwd": _recurrent_space(_TILES_FWD),
                       "_fused_recurrent_bwd": _recurrent_space(_TILES_BWD)}


_WHOLE_STATE_LIMIT = 255 * 32 * 8  # fp32 values: 255 registers per thread at 8 warps


def _whole_state_values(Dk, Dv, Ne, tiles):
    """fp32 values a coupled spec's kernel keeps live: `tiles` copies of every (padded) weight."""
    low = 16 if _FACTOR_BLOCK else 1
    pad = {"k": max(low, triton.next_power_of_2(Dk)), "v": max(low, triton.next_power_of_2(Dv)),
           "e": max(low, triton.next_power_of_2(Ne))}
    return tiles * sum(pad[r] * pad[c] for r, c in _FACTOR_DIMS)


def _recurrent_fits(Dk, Dv):
    """Whether both recurrent kernels have a configuration for these head sizes on a GPU (what
    backend='auto' checks before it hands a size to them)."""
    if triton is None or _V_TILES:
        return triton is not None
    Ne = _weight_shapes(Dk, Dv)[0][0] if len(WEIGHTS) > 1 else 1
    return _whole_state_values(Dk, Dv, Ne, _TILES_BWD) <= _WHOLE_STATE_LIMIT


def _check_fits(Dk, Dv, Ne, tiles, backward):
    """Coupled specs keep the whole state of a (batch, head) in one program: refuse, with the limit, a size
    whose live tiles cannot stay on chip. Measured on sm_90 (Moneta): the limit's edge (D = 16 backward,
    D = 32 forward) already spills 8 KB and compiles in 25-60 s; beyond it ptxas runs for many minutes
    (D = 128, E = 512: over 7). The interpreter has no such limit."""
    if _V_TILES or _interpreted():
        return
    values = _whole_state_values(Dk, Dv, Ne, tiles)
    if values > _WHOLE_STATE_LIMIT:
        raise RuntimeError(
            f"the fused recurrent Triton {'backward' if backward else 'forward'} kernel of this spec keeps the whole "
            f"memory of a (batch, head) in one program ({_V_TILE_REASON}): about {values} fp32 values at Dk={Dk}, "
            f"Dv={Dv}, hidden {Ne}, over the {_WHOLE_STATE_LIMIT} that fit in registers (255 per thread, 8 warps). "
            f"Use backend='torch', algorithm='chunked' where the spec has it, or smaller heads")


if triton is not None:
{{KERNEL}}

def _state_keys():
    keys = []
    for n in WEIGHTS:
        keys.append(n)
        if _STORE_ACC:
            keys.append("A_" + n)
        if _MOMENTUM:
            keys.append("S_" + n)
    return keys


def _launch_recurrent(q, k, v, c, state):
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    Ne = _weight_shapes(Dk, Dv)[0][0] if len(WEIGHTS) > 1 else 1  # the hidden width of an MLP memory
    scalars = [n for n in _COEF_ORDER if n not in _VECTOR_COEFS]
    coefs = torch.stack([c[n].float() for n in scalars], dim=-1).contiguous() if scalars else \\
        torch.zeros(B, H, T, 1, device=q.device)
    o = torch.empty(B, H, T, Dv, dtype=q.dtype, device=q.device)
    args = [q.contiguous(), k.contiguous(), v.contiguous(), coefs,
            *[c[n].float().contiguous() for n in _VECTOR_COEFS], o]  # channel-wise: [B, H, T, D] each
    final = {}
    for key in _state_keys():
        src = state[key].float().contiguous()
        final[key] = torch.empty_like(src)
        args += [src, final[key]]
    args += _factor_scratch(q, v, Ne, ("FDL", "FX"))
    _check_fits(Dk, Dv, Ne, _TILES_FWD, False)
    # tl.dot (batched factors) needs every dimension >= 16; padded lanes are masked to zero
    low = 16 if _FACTOR_BLOCK else 1

    def launch(cfg):
        bv, warps = cfg
        _fused_recurrent_fwd[(triton.cdiv(Dv, bv) if _V_TILES else 1, B * H)](
            *args, T, Dk, Dv, Ne, NC=max(1, len(scalars)), BK=max(low, triton.next_power_of_2(Dk)), BV=bv,
            BE=max(low, triton.next_power_of_2(Ne)), BC=_FACTOR_BLOCK or 16, num_warps=warps)

    launch(_config_for("fwd", q, Dk, Dv, Ne, _TILES_FWD, launch))
    return o, final


def _launch_recurrent_bwd(q, k, v, coefs, state, grads_out):
    """The generated reverse sweep: gradients of q, k, v, every coefficient and the initial state."""
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    Ne = _weight_shapes(Dk, Dv)[0][0] if len(WEIGHTS) > 1 else 1
    f32 = dict(dtype=torch.float32, device=q.device)
    do = grads_out[0]
    named = dict(zip(_COEF_ORDER, coefs))
    scalars = [n for n in _COEF_ORDER if n not in _VECTOR_COEFS]
    coef = torch.stack([named[n].float() for n in scalars], dim=-1).contiguous() if scalars else \\
        torch.zeros(B, H, T, 1, **f32)
    args = [q.float().contiguous(), k.float().contiguous(), v.float().contiguous(), coef,
            *[named[n].float().contiguous() for n in _VECTOR_COEFS], do.float().contiguous()]
    d_init = [torch.empty(s.shape, **f32) for s in state]
    for s, g, out in zip(state, grads_out[1:], d_init):
        args += [s.float().contiguous(), g.float().contiguous(), out]
    n_ck = triton.cdiv(T, _BWD_SEGMENT)
    shapes = _weight_shapes(Dk, Dv)
    args += [torch.empty(B * H, n_ck + _BWD_SEGMENT, *shapes[i], **f32) for i in _BWD_STATE_WEIGHT]
    _check_fits(Dk, Dv, Ne, _TILES_BWD, True)
    low = 16 if _FACTOR_BLOCK else 1
    dv = torch.empty(B, H, T, Dv, **f32)

    def launch(cfg):
        bv, warps = cfg
        n_v = triton.cdiv(Dv, bv) if _V_TILES else 1
        # dq, dk and the coefficients' gradients sum over the value rows: each V tile writes its partial sums
        dq, dk = torch.empty(n_v, B, H, T, Dk, **f32), torch.empty(n_v, B, H, T, Dk, **f32)
        dc = torch.empty(n_v, B, H, T, max(1, len(scalars)), **f32)
        # channel-wise: over key channels per-V-tile partial sums like dq; over value channels each tile's rows
        dg = {n: torch.empty(n_v, B, H, T, Dk, **f32) if side == "k" else torch.empty(B, H, T, Dv, **f32)
              for n, side in _VECTOR_COEFS.items()}
        _fused_recurrent_bwd[(n_v, B * H)](*args, dq, dk, dv, dc, *dg.values(),
                                           *_factor_scratch(q, v, Ne, ("FDL", "FX", "CTD", "CTX"), n_v),
                                           T, Dk, Dv, Ne, n_ck, n_ck + _BWD_SEGMENT, NC=max(1, len(scalars)),
                                           BK=max(low, triton.next_power_of_2(Dk)), BV=bv,
                                           BE=max(low, triton.next_power_of_2(Ne)), BC=_FACTOR_BLOCK or 16,
                                           num_warps=warps)
        return dq, dk, dc, dg

    dq, dk, dc, dg = launch(_config_for("bwd", q, Dk, Dv, Ne, _TILES_BWD, launch))
    dq, dk, dc = dq.sum(0), dk.sum(0), dc.sum(0)
    grads = {n: dc[..., j] for j, n in enumerate(scalars)}
    grads.update({n: g.sum(0) if _VECTOR_COEFS[n] == "k" else g for n, g in dg.items()})
    dcoefs = [grads[n].to(named[n].dtype, copy=True) for n in _COEF_ORDER]  # copies: outputs may not alias
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dcoefs, [g.to(s.dtype) for g, s in zip(d_init, state)]


def _recompute_grads(q, k, v, coefs, state, grads_out):
    """The backward: rerun the torch recurrence on the saved inputs and differentiate it."""
    with torch.enable_grad():
        inputs = [t.detach().requires_grad_() for t in (q, k, v, *coefs, *state)]
        c = dict(zip(_COEF_ORDER, inputs[3:3 + len(coefs)]))
        c.update({n: torch.full_like(inputs[0][..., 0], val) for n, val in CONSTANTS.items() if n not in c})
        o, final = _recurrent(inputs[0], inputs[1], inputs[2], c, dict(zip(_state_keys(), inputs[3 + len(coefs):])))
        outs = [o] + [final[key] for key in _state_keys()]
        pairs = [(a, g) for a, g in zip(outs, grads_out) if g is not None]
        grads = torch.autograd.grad([a for a, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
    return grads[0], grads[1], grads[2], list(grads[3:3 + len(coefs)]), list(grads[3 + len(coefs):])


def _register_bwd_op():
    """The generated backward as an op of its own (a fake implementation lets torch.compile trace it)."""
    if triton is None or not _BWD_STATE or not hasattr(torch.library, "custom_op"):
        return None
    existing = getattr(getattr(torch.ops, "mirasc", None), "recurrent_bwd_{{OP_ID}}", None)
    if existing is not None:
        return existing

    @torch.library.custom_op("mirasc::recurrent_bwd_{{OP_ID}}", mutates_args=())
    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, coefs: list[torch.Tensor], state: list[torch.Tensor],
           grads_out: list[torch.Tensor]) -> list[torch.Tensor]:
        dq, dk, dv, dc, ds = _launch_recurrent_bwd(q, k, v, coefs, state, grads_out)
        return [dq, dk, dv, *dc, *ds]

    @op.register_fake
    def _(q, k, v, coefs, state, grads_out):
        return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), *[torch.empty_like(c) for c in coefs],
                *[torch.empty_like(s) for s in state]]

    return op


_BWD_OP_RAW = _register_bwd_op()


def _BWD_OP(q, k, v, coefs, state, grads_out):
    o_like = q.new_zeros(*q.shape[:3], v.shape[-1])
    grads_out = [o_like if grads_out[0] is None else grads_out[0]] + \
        [torch.zeros_like(s) if g is None else g for g, s in zip(grads_out[1:], state)]
    outs = _BWD_OP_RAW(q, k, v, coefs, state, grads_out)
    n = len(coefs)
    return outs[0], outs[1], outs[2], list(outs[3:3 + n]), list(outs[3 + n:])


# torch.compile: a registered custom op with a fake (shape-only) implementation and an autograd
# formula, so compiled graphs hold it without a graph break. The name is derived from the spec text.
def _register_recurrent_op():
    if triton is None or not hasattr(torch.library, "custom_op"):
        return None
    existing = getattr(getattr(torch.ops, "mirasc", None), "recurrent_{{OP_ID}}", None)
    if existing is not None:
        return existing

    @torch.library.custom_op("mirasc::recurrent_{{OP_ID}}", mutates_args=())
    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, coefs: list[torch.Tensor],
           state: list[torch.Tensor]) -> list[torch.Tensor]:
        o, final = _launch_recurrent(q, k, v, dict(zip(_COEF_ORDER, coefs)), dict(zip(_state_keys(), state)))
        return [o] + [final[key].to(s.dtype) for key, s in zip(_state_keys(), state)]

    @op.register_fake
    def _(q, k, v, coefs, state):
        return [q.new_empty(*q.shape[:3], v.shape[-1])] + [torch.empty_like(s) for s in state]

    def setup_context(ctx, inputs, output):
        q, k, v, coefs, state = inputs
        ctx.save_for_backward(q, k, v, *coefs, *state)
        ctx.n_coef = len(coefs)

    def backward(ctx, grads_out):
        saved = ctx.saved_tensors
        n = ctx.n_coef
        if _BWD_STATE:
            return _BWD_OP(saved[0], saved[1], saved[2], list(saved[3:3 + n]), list(saved[3 + n:]), list(grads_out))
        return _recompute_grads(saved[0], saved[1], saved[2], saved[3:3 + n], saved[3 + n:], grads_out)

    op.register_autograd(backward, setup_context=setup_context)
    return op


_RECURRENT_OP = _register_recurrent_op()


def _recurrent_triton(q, k, v, c, state):
    if _RECURRENT_OP is None:
        raise RuntimeError("backend='triton' needs the triton package (and torch.library.custom_op)")
    outs = _RECURRENT_OP(q, k, v, [c[n] for n in _COEF_ORDER], [state[key] for key in _state_keys()])
    return outs[0], dict(zip(_state_keys(), outs[1:]))
'''
