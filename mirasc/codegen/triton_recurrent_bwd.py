"""The fused recurrent backward kernel `_fused_recurrent_bwd`: a generated reverse sweep over segments of
`seg` tokens (the grid of the forward).

Pass 1 walks the tokens forward and checkpoints the state at each segment start; pass 2 visits the
segments in reverse, replays the segment forward into a scratch buffer (the state before each token),
then walks it backward: per token it recomputes the step from the saved state and applies the reverse
of each piece — the read y = M(q) and the gradient factors (δ_i, x_i) through the reverse-mode graphs
`ir.vjp(memory_forward)` and `ir.vjp(memory_grad)` (bias derivative, activations, LayerNorm, residual),
then the learner (gd or momentum), the retention (decay, or an accumulator and its elementwise readout)
and the mini-batch anchor, written once here for every spec.

Naming in the printed code: dw<i>, dy<i>, ds<i>, da<i> are the carried cotangents of the weights, the
accumulator, the momentum and the anchor; dc_<name> a coefficient's cotangent for the token.
"""

from __future__ import annotations

from .. import ir
from ..derive import Derivation
from ..language import spec as S
from ..plan import window_coefficients
from . import triton_retention
from .triton_printing import SIZE, graph_lines, indent, jit_kernel, part_row, part_rows, ring_row, ring_rows, rows
from .triton_recurrent import (
    batched_factors,
    chunk_tiles,
    factor_lines,
    load_state,
    load_token,
    outer_sum,
    program_ids,
    state_tile,
    tile_matmul_ieee,
    vector_coefficients,
    widx,
    window_factor_lines,
)


def emit_backward(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str],
                  seg: int) -> tuple[str, list[str]]:
    """(source of `_fused_recurrent_bwd`, the names of the per-token state tiles it checkpoints).
    Raises ir.NoVJP or NotImplementedError where a piece has no reverse (the module then recomputes)."""
    bw = _Backward(spec, d, forward, grad, coef_order, seg)
    return jit_kernel("_fused_recurrent_bwd", bw.signature(), bw.body()), bw.state


class _Backward:
    """What every part of the backward kernel needs to know about the spec, and one method per part."""

    def __init__(self, spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str],
                 seg: int):
        r, l = spec.retention, spec.learner
        self.spec, self.d, self.r, self.coef_order, self.seg = spec, d, r, coef_order, seg
        self.mom, self.mb = l.kind == "momentum", (spec.parallel.size)
        self.map = triton_retention.for_spec(spec, d)  # the readout map's printer (None: the weights are the state)
        self.store_acc = r.keeps_accumulator
        self.write = spec.generalized_delta == "erase"  # l2(erase=kappa): the update adds v kᵀ outside the factors
        self.wdims = spec.weight_dims()
        self.n_w = len(self.wdims)
        self.bc = batched_factors(spec)
        self.scal = {n: f"c_{n}" for n in coef_order}
        # channel-wise (docs/semantics.md: channel-wise gates): their cotangents are vectors too
        self.vectors = vector_coefficients(spec)
        self.scalars = [n for n in coef_order if n not in self.vectors]
        seeds = {}
        for i in range(self.n_w):
            seeds[f"delta{i + 1}"] = f"ct_delta{i + 1}"
            seeds[f"input{i + 1}"] = f"ct_input{i + 1}"
        self.grad = grad
        self.window, self.wcoefs = spec.window, window_coefficients(spec, grad)
        if any(n in self.vectors for n in self.wcoefs):
            raise NotImplementedError("a channel-wise coefficient inside the Omega window has no reverse here")
        self.gvjp = ir.vjp(grad, seeds, "memory_grad_vjp", ir.VECTOR_INPUTS + tuple(self.vectors))
        self.fvjp = ir.vjp(forward, {"y": "ct_y"}, "memory_forward_vjp")
        names = ["w"] + (["y"] if self.map else []) + (["s"] if self.mom else []) + (["anchor"] if self.mb else [])
        self.state = [f"{n}{i}" for i in range(self.n_w) for n in names]

    # ---- the kernel

    def signature(self) -> str:
        ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in self.vectors], "DO"]
        if self.window > 1:  # the Omega window's sequences [B·H, T + c − 1, ·] (forward's KW, VW, CW)
            ptrs += ["KW", "VW", "CW", "NW"]
        for i in range(self.n_w):  # in the order of the state keys: W, A_W, S_W per weight
            ptrs += [f"W{i}_in", f"DW{i}_fin", f"DW{i}_in"]
            if self.store_acc:
                ptrs += [f"Y{i}_in", f"DY{i}_fin", f"DY{i}_in"]
            if self.mom:
                ptrs += [f"S{i}_in", f"DS{i}_fin", f"DS{i}_in"]
        ptrs += [f"BUF_{n}" for n in self.state] + ["DQ", "DK", "DV", "DC", *[f"DG_{n}" for n in self.vectors]]
        if self.window > 1:  # their cotangents (keys and coefficients: per-V-tile partial sums, like DK and DC)
            ptrs += ["DKW", "DVW", "DCW"]
        ptrs += [f"{b}{i}" for i in range(self.n_w) for b in ("FDL", "FX", "CTD", "CTX")]  # factor scratch
        return (", ".join(ptrs) + ", T, Nk, Nv, Ne, NCK, NSLOT, NC: tl.constexpr, BK: tl.constexpr, "
                "BV: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr")

    def body(self) -> list[str]:
        body = program_ids()
        if self.window > 1:
            body.append(f"TW = T + {self.window - 1}")
        for i in range(self.n_w):
            body += load_state(self.spec, self.d, i, bool(self.mb))
        return body + self.checkpoint_pass() + self.final_cotangents() + self.window_slots() + \
            self.reverse_pass() + self.window_flush() + self.initial_state_cotangents()

    # ---- the Omega window's cotangents: a shift register of c slots

    def window_slots(self) -> list[str]:
        """At reverse step t, slot j (pk<j>, pv<j>, pc<j>_<name>) sums the cotangents of window row t + j (token
        t − c + 1 + j) from the steps walked so far (t .. its last window, t + j); zero before the walk."""
        if self.window == 1:
            return []
        lines = []
        for j in range(self.window):
            lines += [f"pk{j} = tl.zeros([BK], tl.float32)", f"pv{j} = tl.zeros([BV], tl.float32)"]
            lines += [f"pc{j}_{n} = tl.sum(tl.zeros([BK], tl.float32), axis=0)" for n in self.wcoefs]
        return lines

    def window_store(self, j: int, row_: str) -> list[str]:
        lines = [f"tl.store(DKW + (pid * TW + {row_}) * Nk + rk, pk{j}, mask=mk)",
                 f"tl.store(DVW + (bh * TW + {row_}) * Nv + rv, pv{j}, mask=mv)"]
        return lines + [f"tl.store(DCW + (pid * TW + {row_}) * NW + {m}, pc{j}_{n})" for m, n in enumerate(self.wcoefs)]

    def window_shift(self) -> list[str]:
        """After step t: row t + c − 1 (token t) has had its last term (step t); store it and shift the slots."""
        c = self.window
        lines = self.window_store(c - 1, f"t + {c - 1}")
        for j in range(c - 1, 0, -1):
            lines += [f"pk{j} = pk{j - 1}", f"pv{j} = pv{j - 1}"] + [f"pc{j}_{n} = pc{j - 1}_{n}" for n in self.wcoefs]
        return lines + self.window_slots()[:2 + len(self.wcoefs)]

    def window_flush(self) -> list[str]:
        """After the walk: slots 1 .. c − 1 are rows 0 .. c − 2, the carried window's tokens."""
        return [x for j in range(1, self.window) for x in self.window_store(j, str(j - 1))]

    def scratch(self, var: str, slot: str) -> str:
        """Buffer BUF_<var>: per program NSLOT tiles (NCK checkpoints, then a segment)."""
        r, c = self.wdims[widx(var)]
        return f"BUF_{var} + (bh * NSLOT + {slot}) * {SIZE[r]} * {SIZE[c]} + r{r}[:, None] * {SIZE[c]} + r{c}[None, :]"

    def tile(self, base: str, i: int) -> str:
        return state_tile(self.wdims, base, i)

    def token(self) -> list[str]:
        return load_token(self.scalars, self.vectors)

    def checkpoint_pass(self) -> list[str]:
        """Pass 1: forward, checkpointing the state at each segment start."""
        seg = self.seg
        lines = ["for t in range(T):", f"    if t % {seg} == 0:"]
        lines += [f"        tl.store({self.scratch(n, f't // {seg}')}, {n}, mask=mask{widx(n)})" for n in self.state]
        return lines + indent(self.token() + self.step())

    def final_cotangents(self) -> list[str]:
        """The cotangents of the final state, where pass 2 starts."""
        lines = []
        for i in range(self.n_w):
            lines.append(f"dw{i} = tl.load({self.tile(f'DW{i}_fin', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
            if self.map:
                lines.append(f"dy{i} = tl.load({self.tile(f'DY{i}_fin', i)}, mask=mask{i}, other=0.0).to(tl.float32)"
                             if self.store_acc else f"dy{i} = tl.zeros_like(dw{i})")
            if self.mom:
                lines.append(f"ds{i} = tl.load({self.tile(f'DS{i}_fin', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
            if self.mb and not self.bc:
                lines.append(f"da{i} = tl.zeros_like(dw{i})")
        return lines

    def reverse_pass(self) -> list[str]:
        """Pass 2: segments in reverse; each replayed into the scratch, then walked backward."""
        seg, state = self.seg, self.state
        lines = [f"for sg in range(0, tl.cdiv(T, {seg})):",
                 f"    g0 = (tl.cdiv(T, {seg}) - 1 - sg) * {seg}",
                 f"    n_tok = tl.minimum({seg}, T - g0)"]
        lines += [f"    {n} = tl.load({self.scratch(n, f'g0 // {seg}')}, mask=mask{widx(n)}, other=0.0)" for n in state]
        lines += ["    for j in range(0, n_tok):", "        t = g0 + j"]
        lines += [f"        tl.store({self.scratch(n, 'NCK + j')}, {n}, mask=mask{widx(n)})" for n in state]
        lines += indent(self.token() + self.step(compute_factors=False), 2)
        lines += ["    tl.debug_barrier()", "    for jj in range(0, n_tok):", "        j = n_tok - 1 - jj",
                  "        t = g0 + j"]
        lines += [f"        {n} = tl.load({self.scratch(n, 'NCK + j')}, mask=mask{widx(n)}, other=0.0)" for n in state]
        return lines + indent(self.token() + self.step(compute_factors=False) + self.reverse(), 2)

    def initial_state_cotangents(self) -> list[str]:
        """Store the cotangents of the initial state (through y_0 = φ'(W_0) or log(W_0 / c) where the
        retention keeps an image of the weights)."""
        lines = []
        for i in range(self.n_w):
            if self.map is not None:  # through an accumulator recomputed from the weights (kl, Bregman)
                lines += self.map.initial_cotangent(i)
            lines.append(f"tl.store({self.tile(f'DW{i}_in', i)}, dw{i}, mask=mask{i})")
            if self.store_acc:
                lines.append(f"tl.store({self.tile(f'DY{i}_in', i)}, dy{i}, mask=mask{i})")
            if self.mom:
                lines.append(f"tl.store({self.tile(f'DS{i}_in', i)}, ds{i}, mask=mask{i})")
        return lines

    # ---- one token forward

    def step(self, compute_factors: bool = True) -> list[str]:
        """One token forward from the state variables (updated in place); keeps the intermediates.
        With batched factors, pass 1 computes each mini-batch's factors at its start into the factor
        scratch (compute_factors) and every later replay reads them from there."""
        r, mb = self.r, self.mb
        lines = [f"new_chunk = (t % {mb}) == 0"] if mb else []
        for i in range(self.n_w):
            if mb:
                lines.append(f"anchor{i} = tl.where(new_chunk, w{i}, anchor{i})")
            lines.append(f"w_prev{i} = w{i}")
            lines.append(f"w_dec{i} = c_alpha * w{i}" if r.decays_first else f"w_dec{i} = w{i}")
        at = [f"anchor{i}" if mb else f"w_dec{i}" for i in range(self.n_w)]
        if self.window > 1:  # the Omega rule: grad<i> = Σ_j γ_j δ_ij x_ijᵀ, the factors kept for the reverse
            lines += window_factor_lines(self.spec, self.grad, self.coef_order, at)
        else:
            g_lines, g_out = factor_lines(self.spec, self.grad, self.coef_order, at, compute_factors)
            lines += g_lines
        for i in range(self.n_w):
            if self.window == 1:
                lines += [f"delta{i} = {g_out[f'delta{i + 1}']}", f"input{i} = {g_out[f'input{i + 1}']}",
                          f"grad{i} = delta{i}[:, None] * input{i}[None, :]"]
            if self.mom:
                lines += [f"s_prev{i} = s{i}", f"s{i} = c_theta * s{i} - c_eta * grad{i}", f"upd{i} = s{i}"]
            else:
                lines.append(f"upd{i} = -c_eta * grad{i}")
            if self.write:
                lines.append(f"upd{i} = upd{i} + v[:, None] * k[None, :]")
            if self.map:
                lines.append(f"y_prev{i} = y{i}")
                lines.append(f"y{i} = c_alpha * y{i} + upd{i}" if r.gated else f"y{i} = y{i} + upd{i}")
                lines += self.map.readout(i)
            elif r.decays_last:
                lines.append(f"w{i} = c_alpha * w{i} + upd{i}")
            else:
                lines.append(f"w{i} = w_dec{i} + upd{i}")
        return lines

    # ---- one token backward

    def dcoef(self, name: str, prod: str) -> str:
        """dc_<name> += the reduction of a weight-shaped product: to a scalar, or over the rows (a gate over key
        channels) or the columns (value channels)."""
        side = self.vectors.get(name)
        red = f"tl.sum(tl.sum({prod}, axis=1), axis=0)" if side is None else \
            f"tl.sum({prod}, axis={0 if side == 'k' else 1})"
        return f"dc_{name} = dc_{name} + {red}"

    def reverse(self) -> list[str]:
        """The reverse of step(): carried cotangents dw, dy, ds, da (after the token) -> before it."""
        lines = ["do = tl.load(DO + (bh * T + t) * Nv + rv, mask=mv, other=0.0).to(tl.float32)"]
        for n in self.coef_order:  # a channel-wise coefficient's cotangent is a vector over its side
            side = self.vectors.get(n)
            lines.append(f"dc_{n} = " + ("0.0" if side is None else f"tl.zeros([B{side.upper()}], tl.float32)"))
        f_lines, f_out, _ = graph_lines(self.fvjp, "fb_", [f"w{i}" for i in range(self.n_w)], self.scal,
                                        {"x": ("q", "k"), "ct_y": ("do", "v")}, self.wdims)
        lines += f_lines
        lines.append(f"dq = {f_out['d_x']}")
        for i in range(self.n_w):
            read = outer_sum(f_out, i)
            if read:
                lines.append(f"dw{i} = dw{i} + {read}")  # y_t = M_{W_t}(q_t)
            lines += self.reverse_retention(i) + self.reverse_learner(i)
            if self.window == 1:
                lines += [f"ct_delta{i + 1} = tl.sum(dgrad{i} * input{i}[None, :], axis=1)",
                          f"ct_input{i + 1} = tl.sum(dgrad{i} * delta{i}[:, None], axis=0)"]
        if self.bc:
            return lines + self.reverse_batched_factors()
        return lines + self.reverse_factors()

    def reverse_retention(self, i: int) -> list[str]:
        """dw<i> (after the token) -> dupd<i> (the update's cotangent) and dw_dec<i> (the decayed weights')."""
        r = self.r
        if self.map:
            lines = self.reverse_readout(i)
            lines += [f"dupd{i} = dyv{i}", f"dw_dec{i} = tl.zeros_like(dw{i})"]
            if r.gated:
                return lines + [self.dcoef("alpha", f"dyv{i} * y_prev{i}"), f"dy{i} = c_alpha * dyv{i}"]
            return lines + [f"dy{i} = dyv{i}"]
        if r.decays_last:
            return [f"dupd{i} = dw{i}", self.dcoef("alpha", f"dw{i} * w_prev{i}"),
                    f"dw_dec{i} = c_alpha * dw{i}"]  # W_t = α W_{t-1} + upd; the gradient read W_{t-1}
        return [f"dupd{i} = dw{i}", f"dw_dec{i} = dw{i}"]

    def reverse_readout(self, i: int) -> list[str]:
        """dyv<i>: the accumulator's cotangent, dy<i> plus dw<i> through the readout w = R(y)."""
        return self.map.reverse(i)

    def reverse_learner(self, i: int) -> list[str]:
        """dupd<i> -> dgrad<i> (the gradient's cotangent), dc_eta (and ds<i>, dc_theta with momentum)."""
        if self.mom:
            return [f"dst{i} = ds{i} + dupd{i}", self.dcoef("theta", f"dst{i} * s_prev{i}"),
                    f"dc_eta = dc_eta - tl.sum(tl.sum(dst{i} * grad{i}, axis=1), axis=0)",
                    f"dgrad{i} = -c_eta * dst{i}", f"ds{i} = c_theta * dst{i}"]
        return [f"dc_eta = dc_eta - tl.sum(tl.sum(dupd{i} * grad{i}, axis=1), axis=0)",
                f"dgrad{i} = -c_eta * dupd{i}"]

    def reverse_factors(self) -> list[str]:
        """One token at a time: the reverse-mode graph of `memory_grad` on the factors' cotangents gives dk,
        dv, the bias's gates and the anchor's (or decayed weights') cotangent; then the token's stores."""
        r, mb = self.r, self.mb
        at = [f"anchor{i}" if mb else f"w_dec{i}" for i in range(self.n_w)]
        if self.window > 1:
            lines = self.reverse_window_factors(at) + ["dk = tl.zeros_like(k)", "dv = tl.zeros_like(v)"]
        else:
            cts = {"k": ("k", "k"), "v": ("v", "v")}
            for i, (rw, cl) in enumerate(self.wdims):
                cts[f"ct_delta{i + 1}"] = (f"ct_delta{i + 1}", rw)
                cts[f"ct_input{i + 1}"] = (f"ct_input{i + 1}", cl)
            v_lines, v_out, _ = graph_lines(self.gvjp, "b_", at, self.scal, cts, self.wdims)
            lines = list(v_lines)
            lines.append(f"dk = {v_out['d_k']}" if "d_k" in v_out else "dk = tl.zeros_like(k)")
            lines.append(f"dv = {v_out['d_v']}" if "d_v" in v_out else "dv = tl.zeros_like(v)")
            for n in self.coef_order:
                if f"d_{n}" in v_out:
                    lines.append(f"dc_{n} = dc_{n} + {v_out['d_' + n]}")  # already a per-token scalar (rowsum)
            for i in range(self.n_w):
                at_grad = outer_sum(v_out, i)
                if at_grad:
                    lines.append(f"da{i} = da{i} + {at_grad}" if mb else f"dw_dec{i} = dw_dec{i} + {at_grad}")
        if self.write:  # the write v kᵀ (linear memory: weight 0): dv += dU k, dk += dUᵀ v (a partial sum over V tiles)
            lines += ["dk = dk + tl.sum(dupd0 * v[:, None], axis=0)", "dv = dv + tl.sum(dupd0 * k[None, :], axis=1)"]
        for i in range(self.n_w):
            if r.decays_first:
                lines += [self.dcoef("alpha", f"dw_dec{i} * w_prev{i}"), f"dw{i} = c_alpha * dw_dec{i}"]
            else:  # post decay: already scaled; readouts: the read of R(y_{t-1}) reaches y at token t-1
                lines.append(f"dw{i} = dw_dec{i}")
            if mb:
                lines += [f"dw{i} = tl.where(new_chunk, dw{i} + da{i}, dw{i})",
                          f"da{i} = tl.where(new_chunk, tl.zeros_like(da{i}), da{i})"]
        return lines + self.store_token_grads() + (self.window_shift() if self.window > 1 else [])

    def reverse_window_factors(self, at: list[str]) -> list[str]:
        """The reverse of grad<i> = Σ_j γ_j δ_ij x_ijᵀ: per window slot j, γ_j's cotangent Σ_i δ_ijᵀ dgrad<i> x_ij,
        the factors' cotangents (times γ_j) through the reverse-mode graph of `memory_grad` at the token's own
        key, value and coefficients, into slot j; the anchor's (or decayed weights') cotangent as one token's."""
        lines = []
        for j in range(self.window):
            cts = {"k": (f"kw{j}", "k"), "v": (f"vw{j}", "v")}
            for i, (rw, cl) in enumerate(self.wdims):
                lines += [f"u{i}_{j} = tl.sum(dgrad{i} * input{i}_{j}[None, :], axis=1)",
                          f"pc{j}_gamma = pc{j}_gamma + tl.sum(u{i}_{j} * delta{i}_{j}, axis=0)",
                          f"ct_delta{i + 1}_{j} = cw{j}_gamma * u{i}_{j}",
                          f"ct_input{i + 1}_{j} = cw{j}_gamma * tl.sum(dgrad{i} * delta{i}_{j}[:, None], axis=0)"]
                cts[f"ct_delta{i + 1}"] = (f"ct_delta{i + 1}_{j}", rw)
                cts[f"ct_input{i + 1}"] = (f"ct_input{i + 1}_{j}", cl)
            scal = {n: (f"cw{j}_{n}" if n in self.wcoefs else f"c_{n}") for n in self.coef_order}
            v_lines, v_out, _ = graph_lines(self.gvjp, f"b{j}_", at, scal, cts, self.wdims)
            lines += v_lines
            if "d_k" in v_out:
                lines.append(f"pk{j} = pk{j} + {v_out['d_k']}")
            if "d_v" in v_out:
                lines.append(f"pv{j} = pv{j} + {v_out['d_v']}")
            for n in self.coef_order:
                if f"d_{n}" in v_out:  # the token's own coefficients into its slot, step t's into dc
                    lines.append(f"pc{j}_{n} = pc{j}_{n} + {v_out['d_' + n]}" if n in self.wcoefs else
                                 f"dc_{n} = dc_{n} + {v_out['d_' + n]}")
            for i in range(self.n_w):
                at_grad = outer_sum(v_out, i)
                if at_grad:
                    lines.append(f"da{i} = da{i} + {at_grad}" if self.mb else f"dw_dec{i} = dw_dec{i} + {at_grad}")
        return lines

    def store_token_grads(self) -> list[str]:
        lines = [f"tl.store({part_row('DQ', 'k')}, dq, mask=mk)", f"tl.store({part_row('DK', 'k')}, dk, mask=mk)",
                 "tl.store(DV + (bh * T + t) * Nv + rv, dv, mask=mv)"]
        lines += [f"tl.store(DC + (pid * T + t) * NC + {j}, dc_{n})" for j, n in enumerate(self.scalars)]
        for n, side in self.vectors.items():  # key channels: per-V-tile partial sums; value channels: this tile's rows
            lines.append(f"tl.store({part_row(f'DG_{n}', 'k')}, dc_{n}, mask=mk)" if side == "k" else
                         f"tl.store(DG_{n} + (bh * T + t) * Nv + rv, dc_{n}, mask=mv)")
        return lines

    def reverse_batched_factors(self) -> list[str]:
        """The rest of the token's reverse with batched factors: the factors' cotangents go to scratch;
        at a mini-batch start (the last of its tokens the reverse walk meets) the reverse-mode graph of
        `memory_grad` runs on the whole mini-batch as one tile computation: dk, dv, the bias's gates and
        the anchor's cotangent, which joins dW (the anchor is the state before this token)."""
        r, lines = self.r, []
        for i, (rw, cl) in enumerate(self.wdims):
            if r.decays_first:
                lines += [f"dc_alpha = dc_alpha + tl.sum(tl.sum(dw_dec{i} * w_prev{i}, axis=1), axis=0)",
                          f"dw{i} = c_alpha * dw_dec{i}"]
            else:
                lines.append(f"dw{i} = dw_dec{i}")
            lines += [f"tl.store({ring_row(f'CTD{i}', rw)}, ct_delta{i + 1}, mask=m{rw})",
                      f"tl.store({ring_row(f'CTX{i}', cl)}, ct_input{i + 1}, mask=m{cl})"]
        lines += [f"tl.store({part_row('DQ', 'k')}, dq, mask=mk)"]
        lines += [f"tl.store(DC + (pid * T + t) * NC + {j}, dc_{n})" for j, n in enumerate(self.coef_order)]
        return lines + ["if new_chunk:"] + indent(self.minibatch_factor_reverse())

    def minibatch_factor_reverse(self) -> list[str]:
        """At a mini-batch start: the reverse of `memory_grad` on its [BC, n] tiles of tokens and cotangents."""
        block = ["tl.debug_barrier()"] + chunk_tiles(self.coef_order)
        cts = {"k": ("kc", "k"), "v": ("vc", "v")}
        for i, (rw, cl) in enumerate(self.wdims):
            block += [f"ctd{i} = tl.load({ring_rows(f'CTD{i}', rw)}, mask=cm[:, None] & m{rw}[None, :], "
                      "other=0.0)",
                      f"ctx{i} = tl.load({ring_rows(f'CTX{i}', cl)}, mask=cm[:, None] & m{cl}[None, :], "
                      "other=0.0)"]
            cts[f"ct_delta{i + 1}"] = (f"ctd{i}", rw)
            cts[f"ct_input{i + 1}"] = (f"ctx{i}", cl)
        v_lines, v_out, _ = graph_lines(self.gvjp, "gb_", [f"anchor{i}" for i in range(self.n_w)],
                                        {n: f"cc_{n}" for n in self.coef_order}, cts, self.wdims,
                                        matmul=tile_matmul_ieee)
        block += v_lines
        for x, ptr in (("k", part_rows("DK", "k")), ("v", rows("DV", "v"))):
            val = v_out.get(f"d_{x}", f"tl.zeros([BC, B{x.upper()}], tl.float32)")
            block.append(f"tl.store({ptr}, {val}, mask=cm[:, None] & m{x}[None, :])")
        for j, n in enumerate(self.coef_order):
            if f"d_{n}" in v_out:  # a gate inside the bias: add its part to what the token's reverse stored
                block += [f"dcc = tl.load(DC + (pid * T + ctok) * NC + {j}, mask=cm, other=0.0)",
                          f"tl.store(DC + (pid * T + ctok) * NC + {j}, dcc + tl.sum({v_out[f'd_{n}']} "
                          "+ tl.zeros([BC, 1], tl.float32), axis=1), mask=cm)"]
        for i in range(self.n_w):
            terms, j = [], 0
            while f"outer{i}_{j}_l" in v_out:
                terms.append(f"tl.dot(tl.trans({v_out[f'outer{i}_{j}_l']}), {v_out[f'outer{i}_{j}_r']}, "
                             "input_precision=\"ieee\")")
                j += 1
            if terms:
                block.append(f"dw{i} = dw{i} + " + " + ".join(terms))
        return block
