"""Triton backend (issue 3, first part): a fused recurrent forward kernel for every parametric spec,
printed from the same IR graphs and derivation as the torch module.

One program per (batch, head) keeps the memory weights (and accumulators, momentum buffers and the
mini-batch anchor) in registers as [rows, cols] tiles and walks the tokens: the gradient factors are
the `memory_grad` graph printed as matrix-vector code, the learner and retention are elementwise tile
updates (row softmax for kl, a whole-matrix q-norm for lq), the read is the `memory_forward` graph.
Padded lanes (dimensions rounded up to powers of two) are kept at zero by masks.

Backward of the recurrent kernel: not a Triton kernel yet. The autograd wrapper recomputes the torch
recurrence and differentiates it, so gradients are exact but the backward runs at torch speed.

Chunked kernels (templates/triton_chunked.py.tmpl), forward and backward in Triton: linear memories whose
update is affine in the state — Hebbian (dot bias), the delta rule (l2 bias, gd or implicit step, exact)
and mini-batch l2 — with none/decay retention. One kernel pair serves all three (a scan over chunks
with W_0 checkpoints, a reverse sweep for the backward); the families differ only in the chunk-local
torch preparation (`chunk_family`), which autograd differentiates.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import sympy as sp

from .. import ir
from .. import spec as S
from ..derive import Derivation
from .printers import TritonPrinter, print_triton_block


class Unsupported(Exception):
    pass


BWD_SEGMENT = 32  # schedule: tokens between state checkpoints in the recurrent backward (memory O(T/32 · state))


def _graph_lines(gr: ir.Graph, prefix: str, weights: list[str], scalars: dict[str, str], inputs: dict[str, str],
                 dims_of_weight: list[tuple[str, str]]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Print an IR graph as straight-line Triton code on 1-D tiles. Returns (lines, outputs, dims)."""
    names, dims, lines, outputs = {}, {}, [], {}
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
            lines.append(f"{var} = tl.sum({w} * {h}[None, :], axis=1)")
            dims[nid] = dims_of_weight[op.arg][0]
        elif op.op == "linear_t":
            lines.append(f"{var} = tl.sum({a[0]} * {a[1]}[:, None], axis=0)")
            dims[nid] = dims_of_weight[op.arg][1]
        elif op.op == "ew":
            expr, syms = op.arg
            tensor_dims = [d for d in da if d != "s"]
            dim = tensor_dims[0] if tensor_dims else "v"
            if not srcs:
                lines.append(f"{var} = tl.where(m{dim}, {float(expr)!r}, 0.0)")
            else:
                lines += print_triton_block({var: expr}, dict(zip(syms, a)), prefix=f"_{var}_")
                if tensor_dims:  # keep padded lanes at zero
                    lines.append(f"{var} = tl.where(m{dim}, {var}, 0.0)")
            dims[nid] = dim
        elif op.op == "rownorm":
            lines.append(f"{var} = tl.sqrt(tl.sum({a[0]} * {a[0]}, axis=0))")
            dims[nid] = "s"
        elif op.op == "rowsumsq":
            lines.append(f"{var} = tl.sum({a[0]} * {a[0]}, axis=0)")
            dims[nid] = "s"
        elif op.op == "rowsum":
            lines.append(f"{var} = tl.sum({a[0]}, axis=0)")
            dims[nid] = "s"
        elif op.op == "layernorm":
            n = da[0]
            lines += [f"{var}_c = tl.where(m{n}, {a[0]} - tl.sum({a[0]}, axis=0) / N{n}, 0.0)",
                      f"{var} = {var}_c * tl.rsqrt(tl.sum({var}_c * {var}_c, axis=0) / N{n} + 1e-5)"]
            dims[nid] = n
        elif op.op == "layernorm_bwd":
            n = da[0]
            lines += [f"{var}_c = tl.where(m{n}, {a[0]} - tl.sum({a[0]}, axis=0) / N{n}, 0.0)",
                      f"{var}_r = tl.rsqrt(tl.sum({var}_c * {var}_c, axis=0) / N{n} + 1e-5)",
                      f"{var}_h = {var}_c * {var}_r",
                      f"{var} = tl.where(m{n}, {var}_r * ({a[1]} - tl.sum({a[1]}, axis=0) / N{n} - {var}_h * "
                      f"tl.sum({a[1]} * {var}_h, axis=0) / N{n}), 0.0)"]
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
    one triangular solve per chunk), "minibatch" (l2 bias, gradients at the chunk's anchor)."""
    m, b, r, l = spec.memory, spec.bias, spec.retention, spec.learner
    if m.kind != "linear" or r.kind not in ("none", "decay"):
        return None
    if b.kind == "dot" and l.kind == "gd":
        return "hebbian"
    if b.kind == "l2" and chunk_kind == "delta":
        return "delta"
    if b.kind == "l2" and spec.parallel.kind == "minibatch" and l.kind == "gd":
        return "minibatch"
    return None


def emit_chunked(spec: S.Spec, family: str, preprocess) -> str:
    """Source of the chunked Triton section (kernels and the torch preparation) for a chunk family."""
    r = spec.retention
    flags = {"chunk_hebbian": family == "hebbian", "chunk_delta": family == "delta",
             "implicit": spec.learner.kind == "implicit", "has_alpha": r.kind == "decay",
             "pre_decay": r.kind == "decay" and r.order == "pre", "minibatch": spec.parallel.kind == "minibatch"}
    op_id = hashlib.sha256(spec.canonical().encode()).hexdigest()[:12]
    return preprocess(CHUNK_TEMPLATE, flags).replace("{{OP_ID}}", op_id)


def emit(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str]) -> str:
    """Source of the Triton section of an emitted module (raises Unsupported with the reason)."""
    try:
        return _emit(spec, d, forward, grad, coef_order)
    except NotImplementedError as err:
        raise Unsupported(f"{err}") from None


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
    A = [f"anchor{i}" for i in range(n_w)] if mb else W

    # ---- kernel signature
    ptrs = ["Q", "K", "V", "C", "O"]
    for i in range(n_w):
        ptrs += [f"W{i}_in", f"W{i}_out"]
        if store_acc:
            ptrs += [f"Y{i}_in", f"Y{i}_out"]
        if mom:
            ptrs += [f"S{i}_in", f"S{i}_out"]
    sig = ", ".join(ptrs) + ", T, Nk, Nv, Ne, NC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BE: tl.constexpr"
    body: list[str] = [
        "bh = tl.program_id(0)",
        "rk = tl.arange(0, BK)", "rv = tl.arange(0, BV)", "re = tl.arange(0, BE)",
        "mk = rk < Nk", "mv = rv < Nv", "me = re < Ne",
    ]
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
        if mb:
            body.append(f"anchor{i} = w{i}")

    loop: list[str] = [
        "q = tl.load(Q + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
        "k = tl.load(K + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
        "v = tl.load(V + (bh * T + t) * Nv + rv, mask=mv, other=0.0).to(tl.float32)",
    ]
    for j, n in enumerate(coef_order):
        loop.append(f"c_{n} = tl.load(C + (bh * T + t) * NC + {j})")
    if mb:
        loop.append(f"new_chunk = (t % {mb}) == 0")
        for i in range(n_w):
            loop.append(f"anchor{i} = tl.where(new_chunk, w{i}, anchor{i})")
    if r.kind == "decay" and r.order == "pre":
        for i in range(n_w):
            loop.append(f"w{i} = c_alpha * w{i}")
    g_lines, g_out, _ = _graph_lines(grad, "g_", A, scal, {"k": ("k", "k"), "v": ("v", "v")}, wdims)
    loop += g_lines
    for i in range(n_w):
        delta, inp = g_out[f"delta{i + 1}"], g_out[f"input{i + 1}"]
        loop.append(f"grad{i} = {delta}[:, None] * {inp}[None, :]")
        if mom:
            loop.append(f"s{i} = c_theta * s{i} - c_eta * grad{i}")
            loop.append(f"upd{i} = s{i}")
        else:
            loop.append(f"upd{i} = -c_eta * grad{i}")
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
    bwd_state: list[str] = []
    why_not = backward_unsupported(spec)
    if why_not is None:
        try:
            bwd_kernel, bwd_state = _emit_bwd(spec, d, grad, coef_order, BWD_SEGMENT)
            kernel += "\n" + bwd_kernel
        except (ir.NoVJP, NotImplementedError) as err:  # the forward kernel stands; the backward recomputes
            why_not = str(err)
    return SECTION.replace("{{KERNEL}}", kernel).replace("{{COEF_ORDER}}", repr(tuple(coef_order))) \
        .replace("{{STORE_ACC}}", repr(store_acc)).replace("{{MOMENTUM}}", repr(mom)).replace("{{OP_ID}}", op_id) \
        .replace("{{BWD_STATE}}", repr(tuple(bwd_state))).replace("{{BWD_SEGMENT}}", str(BWD_SEGMENT)) \
        .replace("{{BWD_REASON}}", why_not or "")


def backward_unsupported(spec: S.Spec) -> str | None:
    """Why the recurrent kernel's backward is not a Triton kernel for this spec (None: it is)."""
    if spec.memory.kind != "linear":
        return "MLP memories (the reverse sweep needs second derivatives through LayerNorm and matmul tiles)"
    if spec.retention.kind in ("lq", "kl"):
        return f"{spec.retention.kind} retention (its readout couples the whole matrix)"
    return None


def _readout_derivative(spec: S.Spec, d: Derivation) -> tuple[sp.Expr, sp.Symbol]:
    """R'(y) of an elementwise readout w = R(y) (elastic shrink, Bregman (φ')⁻¹)."""
    if spec.retention.kind == "elastic":
        sym = sp.Symbol("a", real=True)
        return ir._clean_derivative(sp.diff(d.elastic, sym)), sym
    sym = sp.Symbol("u", real=True)
    return ir._clean_derivative(sp.diff(d.phi_prime_inv, sym)), sym


def _emit_bwd(spec: S.Spec, d: Derivation, grad: ir.Graph, coef_order: list[str], seg: int) -> str:
    """The recurrent backward kernel for linear memories: a reverse sweep over segments of `seg` tokens.

    Pass 1 walks the tokens forward and checkpoints the state at each segment start; pass 2 visits the
    segments in reverse, replays the segment forward into a scratch buffer (the state before each
    token), then walks it backward: per token it recomputes the step from the saved state and applies
    the reverse of each piece — the read y = W q, the retention (decay, or the accumulator and its
    elementwise readout), the learner (gd or momentum), the rank-1 gradient δ kᵀ and, through the
    reverse-mode graph `ir.vjp(memory_grad)`, the bias derivative dℓ/dy."""
    r, l = spec.retention, spec.learner
    mom, mb = l.kind == "momentum", (spec.parallel.C if spec.parallel.kind == "minibatch" else 0)
    readout = r.kind in ("elastic", "bregman")
    store_acc = r.kind == "elastic"
    wdims = spec.weight_dims()
    scal = {n: f"c_{n}" for n in coef_order}
    vjp = ir.vjp(grad, {"delta1": "ct_delta1", "input1": "ct_input1"}, "memory_grad_vjp")
    vjp_outputs = {gr_op.arg for gr_op in (vjp.node(n) for n in vjp.outputs())}
    state = ["w"] + (["y"] if readout else []) + (["s"] if mom else []) + (["anchor"] if mb else [])
    tile = "bh * Nv * Nk + rv[:, None] * Nk + rk[None, :]"

    def scratch(n, slot):  # buffer BUF_n: per program NSLOT [Dv, Dk] tiles (NCK checkpoints, then a segment)
        return f"BUF_{n} + (bh * NSLOT + {slot}) * Nv * Nk + rv[:, None] * Nk + rk[None, :]"

    def load_token():
        lines = ["q = tl.load(Q + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
                 "k = tl.load(K + (bh * T + t) * Nk + rk, mask=mk, other=0.0).to(tl.float32)",
                 "v = tl.load(V + (bh * T + t) * Nv + rv, mask=mv, other=0.0).to(tl.float32)"]
        lines += [f"c_{n} = tl.load(C + (bh * T + t) * NC + {j})" for j, n in enumerate(coef_order)]
        return lines

    def step():
        """One token forward from the state variables (updated in place); keeps the intermediates."""
        lines = []
        if mb:
            lines += [f"new_chunk = (t % {mb}) == 0", "anchor = tl.where(new_chunk, w, anchor)"]
        lines.append("w_prev = w")
        lines.append("w_dec = c_alpha * w" if r.kind == "decay" and r.order == "pre" else "w_dec = w")
        g_lines, g_out, _ = _graph_lines(grad, "g_", ["anchor" if mb else "w_dec"], scal,
                                         {"k": ("k", "k"), "v": ("v", "v")}, wdims)
        lines += g_lines
        lines += [f"delta1 = {g_out['delta1']}", f"input1 = {g_out['input1']}",
                  "grad = delta1[:, None] * input1[None, :]"]
        if mom:
            lines += ["s_prev = s", "s = c_theta * s - c_eta * grad", "upd = s"]
        else:
            lines.append("upd = -c_eta * grad")
        if readout:
            lines.append("y_prev = y")
            lines.append("y = c_alpha * y + upd" if r.kind == "elastic" else "y = y + upd")
            lines += [ln.replace("y0", "y").replace("w0", "w").replace("mask0", "wmask")
                      for ln in _readout(spec, d, 0, TritonPrinter())]
        elif r.kind == "decay" and r.order == "post":
            lines.append("w = c_alpha * w + upd")
        else:
            lines.append("w = w_dec + upd")
        return lines

    def reverse():
        """The reverse of step(): carried cotangents dw, dy, ds, da (after the token) -> before it."""
        lines = ["do = tl.load(DO + (bh * T + t) * Nv + rv, mask=mv, other=0.0).to(tl.float32)",
                 "dq = tl.sum(w * do[:, None], axis=0)",  # y_t = W_t q_t
                 "dw = dw + do[:, None] * q[None, :]"]
        lines += [f"dc_{n} = 0.0" for n in coef_order]
        if readout:
            dexpr, sym = _readout_derivative(spec, d)
            lines += print_triton_block({"rprime": dexpr}, {sym: "y"}, prefix="_rp_")
            lines += ["dyv = dy + rprime * dw", "dupd = dyv", "dw_dec = tl.zeros_like(dw)"]
            if r.kind == "elastic":
                lines += ["dc_alpha = dc_alpha + tl.sum(tl.sum(dyv * y_prev, axis=1), axis=0)", "dy = c_alpha * dyv"]
            else:
                lines.append("dy = dyv")
        elif r.kind == "decay" and r.order == "post":
            lines += ["dupd = dw", "dc_alpha = dc_alpha + tl.sum(tl.sum(dw * w_prev, axis=1), axis=0)",
                      "dw_dec = c_alpha * dw"]  # W_t = α W_{t-1} + upd: the gradient read W_{t-1} = w_dec
        else:
            lines += ["dupd = dw", "dw_dec = dw"]
        if mom:
            lines += ["dst = ds + dupd", "dc_theta = dc_theta + tl.sum(tl.sum(dst * s_prev, axis=1), axis=0)",
                      "dc_eta = dc_eta - tl.sum(tl.sum(dst * grad, axis=1), axis=0)",
                      "dgrad = -c_eta * dst", "ds = c_theta * dst"]
        else:
            lines += ["dc_eta = dc_eta - tl.sum(tl.sum(dupd * grad, axis=1), axis=0)", "dgrad = -c_eta * dupd"]
        lines += ["ct_delta1 = tl.sum(dgrad * input1[None, :], axis=1)",
                  "ct_input1 = tl.sum(dgrad * delta1[:, None], axis=0)"]
        v_lines, v_out, _ = _graph_lines(vjp, "b_", ["anchor" if mb else "w_dec"], scal,
                                         {"k": ("k", "k"), "v": ("v", "v"), "ct_delta1": ("ct_delta1", "v"),
                                          "ct_input1": ("ct_input1", "k")}, wdims)
        lines += v_lines
        lines.append(f"dk = {v_out['d_k']}" if "d_k" in vjp_outputs else "dk = tl.zeros_like(k)")
        lines.append(f"dv = {v_out['d_v']}" if "d_v" in vjp_outputs else "dv = tl.zeros_like(v)")
        for n in coef_order:
            if f"d_{n}" in vjp_outputs:
                lines.append(f"dc_{n} = dc_{n} + {v_out['d_' + n]}")  # already a per-token scalar (rowsum)
        if "dz0" in vjp_outputs:
            lines.append(f"dA = {v_out['dz0']}[:, None] * k[None, :]")
            lines.append("da = da + dA" if mb else "dw_dec = dw_dec + dA")
        if r.kind == "decay" and r.order == "pre":
            lines += ["dc_alpha = dc_alpha + tl.sum(tl.sum(dw_dec * w_prev, axis=1), axis=0)", "dw = c_alpha * dw_dec"]
        elif r.kind == "decay":
            lines.append("dw = dw_dec")
        elif readout:
            lines.append("dw = dw_dec")  # the gradient read R(y_{t-1}); its cotangent reaches y at token t-1
        else:
            lines.append("dw = dw_dec")
        if mb:
            lines += ["dw = tl.where(new_chunk, dw + da, dw)", "da = tl.where(new_chunk, tl.zeros_like(da), da)"]
        lines += ["tl.store(DQ + (bh * T + t) * Nk + rk, dq, mask=mk)",
                  "tl.store(DK + (bh * T + t) * Nk + rk, dk, mask=mk)",
                  "tl.store(DV + (bh * T + t) * Nv + rv, dv, mask=mv)"]
        lines += [f"tl.store(DC + (bh * T + t) * NC + {j}, dc_{n})" for j, n in enumerate(coef_order)]
        return lines

    init = ["bh = tl.program_id(0)", "rk = tl.arange(0, BK)", "rv = tl.arange(0, BV)", "mk = rk < Nk",
            "mv = rv < Nv", "wmask = mv[:, None] & mk[None, :]",
            f"w = tl.load(W_in + {tile}, mask=wmask, other=0.0).to(tl.float32)"]
    if store_acc:
        init.append(f"y = tl.load(Y_in + {tile}, mask=wmask, other=0.0).to(tl.float32)")
    elif r.kind == "bregman":
        init += print_triton_block({"y": d.phi_prime}, {sp.Symbol("w", real=True): "w"}, prefix="_y_")
        init.append("y = tl.where(wmask, y, 0.0)")
    if mom:
        init.append(f"s = tl.load(S_in + {tile}, mask=wmask, other=0.0).to(tl.float32)")
    if mb:
        init.append("anchor = w")
    body = list(init)
    # pass 1: forward, checkpointing the state at each segment start
    body.append("for t in range(T):")
    body.append(f"    if t % {seg} == 0:")
    body += [f"        tl.store({scratch(n, f't // {seg}')}, {n}, mask=wmask)" for n in state]
    body += ["    " + ln for ln in load_token() + step()]
    # pass 2: segments in reverse
    body += [f"dw = tl.load(DW_fin + {tile}, mask=wmask, other=0.0).to(tl.float32)"]
    if readout:
        body.append(f"dy = tl.load(DY_fin + {tile}, mask=wmask, other=0.0).to(tl.float32)" if store_acc
                    else "dy = tl.zeros_like(dw)")
    if mom:
        body.append(f"ds = tl.load(DS_fin + {tile}, mask=wmask, other=0.0).to(tl.float32)")
    if mb:
        body.append("da = tl.zeros_like(dw)")
    body += [f"for sg in range(0, tl.cdiv(T, {seg})):",
             f"    g0 = (tl.cdiv(T, {seg}) - 1 - sg) * {seg}",
             f"    n_tok = tl.minimum({seg}, T - g0)"]
    body += [f"    {n} = tl.load({scratch(n, f'g0 // {seg}')}, mask=wmask, other=0.0)" for n in state]
    body += ["    for j in range(0, n_tok):", "        t = g0 + j"]
    body += [f"        tl.store({scratch(n, 'NCK + j')}, {n}, mask=wmask)" for n in state]
    body += ["        " + ln for ln in load_token() + step()]
    body += ["    tl.debug_barrier()", "    for jj in range(0, n_tok):", "        j = n_tok - 1 - jj",
             "        t = g0 + j"]
    body += [f"        {n} = tl.load({scratch(n, 'NCK + j')}, mask=wmask, other=0.0)" for n in state]
    body += ["        " + ln for ln in load_token() + step() + reverse()]
    # cotangents of the initial state
    if r.kind == "bregman":
        w0 = "tl.load(W_in + " + tile + ", mask=wmask, other=0.0).to(tl.float32)"
        phi2 = ir._clean_derivative(sp.diff(d.phi_prime, sp.Symbol("w", real=True)))
        body += [f"w_init = {w0}"] + print_triton_block({"phi2": phi2}, {sp.Symbol("w", real=True): "w_init"},
                                                        prefix="_p2_")
        body.append("dw = dw + tl.where(wmask, phi2 * dy, 0.0)")
    body.append(f"tl.store(DW_in + {tile}, dw, mask=wmask)")
    if store_acc:
        body.append(f"tl.store(DY_in + {tile}, dy, mask=wmask)")
    if mom:
        body.append(f"tl.store(DS_in + {tile}, ds, mask=wmask)")
    ptrs = ["Q", "K", "V", "C", "DO", "W_in", "DW_fin", "DW_in"]
    if store_acc:
        ptrs += ["Y_in", "DY_fin", "DY_in"]
    if mom:
        ptrs += ["S_in", "DS_fin", "DS_in"]
    ptrs += [f"BUF_{n}" for n in state] + ["DQ", "DK", "DV", "DC"]
    sig = ", ".join(ptrs) + ", T, Nk, Nv, NCK, NSLOT, NC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr"
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
# Triton: fused recurrent forward kernel, printed from the IR (one program per (batch, head); the
# memory lives in registers; tokens are walked in order). backend="triton" uses it for the forward;
# the backward recomputes the torch recurrence (exact gradients, torch speed); a registered custom op,
# so torch.compile keeps it in one graph. Runs on the CPU under
# TRITON_INTERPRET=1 (set before triton is imported).
# ----------------------------------------------------------------------------------------------
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

_COEF_ORDER = {{COEF_ORDER}}
_STORE_ACC = {{STORE_ACC}}
_MOMENTUM = {{MOMENTUM}}
# The backward kernel's per-token state (empty: the backward recomputes the torch recurrence, because
# {{BWD_REASON}}) and its checkpoint interval (a schedule choice).
_BWD_STATE = {{BWD_STATE}}
_BWD_SEGMENT = {{BWD_SEGMENT}}

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
    coefs = torch.stack([c[n].float() for n in _COEF_ORDER], dim=-1).contiguous() if _COEF_ORDER else \\
        torch.zeros(B, H, T, 1, device=q.device)
    o = torch.empty(B, H, T, Dv, dtype=q.dtype, device=q.device)
    args = [q.contiguous(), k.contiguous(), v.contiguous(), coefs, o]
    final = {}
    for key in _state_keys():
        src = state[key].float().contiguous()
        final[key] = torch.empty_like(src)
        args += [src, final[key]]
    _fused_recurrent_fwd[(B * H,)](*args, T, Dk, Dv, Ne, NC=max(1, len(_COEF_ORDER)),
                                   BK=triton.next_power_of_2(Dk), BV=triton.next_power_of_2(Dv),
                                   BE=triton.next_power_of_2(Ne))
    return o, final


def _launch_recurrent_bwd(q, k, v, coefs, state, grads_out):
    """The generated reverse sweep: gradients of q, k, v, every coefficient and the initial state."""
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    f32 = dict(dtype=torch.float32, device=q.device)
    keys = _state_keys()
    do = grads_out[0] if grads_out[0] is not None else torch.zeros(B, H, T, Dv, **f32)
    dfinal = [g if g is not None else torch.zeros_like(s, dtype=torch.float32) for g, s in zip(grads_out[1:], state)]
    coef = torch.stack([c.float() for c in coefs], dim=-1).contiguous()
    args = [q.float().contiguous(), k.float().contiguous(), v.float().contiguous(), coef, do.float().contiguous()]
    d_init = [torch.empty(B, H, Dv, Dk, **f32) for _ in keys]
    for key, s, g, out in zip(keys, state, dfinal, d_init):
        args += [s.float().contiguous(), g.float().contiguous(), out]
    n_ck = triton.cdiv(T, _BWD_SEGMENT)
    args += [torch.empty(B * H, n_ck + _BWD_SEGMENT, Dv, Dk, **f32) for _ in _BWD_STATE]
    dq, dk = torch.empty(B, H, T, Dk, **f32), torch.empty(B, H, T, Dk, **f32)
    dv, dc = torch.empty(B, H, T, Dv, **f32), torch.empty(B, H, T, len(_COEF_ORDER), **f32)
    _fused_recurrent_bwd[(B * H,)](*args, dq, dk, dv, dc, T, Dk, Dv, n_ck, n_ck + _BWD_SEGMENT,
                                   NC=len(_COEF_ORDER), BK=triton.next_power_of_2(Dk), BV=triton.next_power_of_2(Dv))
    dcoefs = [dc[..., j].to(c.dtype, copy=True) for j, c in enumerate(coefs)]  # copies: outputs may not alias
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
