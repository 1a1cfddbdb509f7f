"""The tiled graph printer of the streamed mini-batch kernels (triton_minibatch_stream.py): every vector an
IR graph computes ([C, n], n in {Dk, Dv, E}) is a slot of a per-program global scratch buffer, every
per-token scalar a [C] slot, and each IR node is one stage — a loop over the column tiles of its output,
separated from the next by a barrier. Elementwise nodes load the same column tile of their sources; row
reductions (norms, LayerNorm and its first and second backward) take one pass per reduced quantity over the
tiles; matmuls accumulate over the input tiles, on the anchor weights or with the dual form (2).

Values: ("vec", dim, base, stride) a [BC, N_dim] row-major block; ("scal", base) a [BC] vector;
("coef", j) column j of the per-token coefficients; ("weight", i).
"""

from __future__ import annotations

import re
from collections import Counter
from contextlib import contextmanager

from .. import ir
from ..printers import print_triton_block
from .triton_printing import SIZE

TILE = {"k": "TK", "v": "TV", "e": "TE"}
AR = {"k": "tk", "v": "tv", "e": "te"}


def dot(a: str, b: str) -> str:
    return f"_mb_dot({a}, {b}, PREC)"


class Scratch:
    """Slots of the per-program scratch buffer: offsets as polynomials in BC, Nk, Nv, Ne."""

    def __init__(self):
        self.used = Counter()

    def take(self, size: dict[str, int]) -> str:
        off = self.expr(self.used)
        self.used.update(size)
        return f"scr + ({off})" if off != "0" else "scr"

    def vec(self, dim: str) -> str:
        return self.take({f"BC * {SIZE[dim]}": 1})

    def scal(self) -> str:
        return self.take({"BC": 1})

    def mat(self, rows: str, cols: str) -> str:
        return self.take({f"{SIZE[rows]} * {SIZE[cols]}": 1})

    @staticmethod
    def expr(c: Counter) -> str:
        terms = [f"{n} * {m}" if n != 1 else m for m, n in sorted(c.items()) if n]
        return " + ".join(terms) if terms else "0"


# a stage's temporaries: renamed per stage (acc_7, ...), since Triton refuses a name that a later loop
# re-assigns with another shape (e.g. [BC, TK] then [BC, TE])
TEMPS = ("acc", "acc_s", "racc", "amat", "kmat", "_h", "_x", "_d", "_l", "_r", "_w", "_s", "_dw", "_ds", "_lg", "_lb",
         "_dy", "_c", "_a", "_g", "_pk", "mu", "rs", "var", "s_dy", "s_dyh", "mdy", "mac", "ga", "gc", "r3", "sx",
         "rx", "lx", "rxk", "lxk")
_TEMP_RE = re.compile(r"\b(" + "|".join(TEMPS) + r")\b")


class Lines:
    def __init__(self):
        self.lines: list[str] = []
        self.ind = 0
        self.n = 0
        self.stages = 0

    @contextmanager
    def stage(self):
        start = len(self.lines)
        yield
        self.stages += 1
        sfx = f"_{self.stages}"
        self.lines[start:] = [_TEMP_RE.sub(lambda m: m.group(1) + sfx, ln) for ln in self.lines[start:]]

    def __call__(self, *lines: str) -> None:
        self.lines += ["    " * self.ind + ln for ln in lines]

    def fresh(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    @contextmanager
    def loop(self, dim: str, var: str, step: str | None = None):
        self(f"for {var} in range(0, {SIZE[dim]}, {step or TILE[dim]}):")
        self.ind += 1
        yield
        self.ind -= 1

    def barrier(self) -> None:
        self("tl.debug_barrier()")


# Addresses are written as (scalar base + tile offset) + (a loop-invariant [rows, cols] offset tensor): the
# scalar part changes with the loop, so the compiler cannot hoist a [BC, T] pointer tensor per use out of the
# chunk loop (that kept dozens of them live: 255 registers and spills); the invariant integer offsets are few
# (one per stride) and shared.
def ld(v, off: str, dim: str | None = None) -> str:
    """A [BC, T_dim] tile of vector value v from column `off`; padded columns read as 0. `dim`: the loop's
    dimension when it differs from v's (x + y with x of Dk and y of Dv lanes, Dk = Dv)."""
    _, vdim, base, stride = v
    dim = dim or vdim
    return (f"tl.load({base} + {off} + (rc[:, None] * {stride} + {AR[dim]}[None, :]), "
            f"mask=({AR[dim]} < {SIZE[vdim]} - {off})[None, :], other=0.0)")


def st(v, off: str, val: str) -> str:
    _, dim, base, stride = v
    return (f"tl.store({base} + {off} + (rc[:, None] * {stride} + {AR[dim]}[None, :]), {val}, "
            f"mask=({AR[dim]} < {SIZE[dim]} - {off})[None, :])")


def ld_s(v) -> str:
    """A per-token scalar value as a [BC, 1] tile."""
    if v[0] == "coef":
        return f"tl.load(C + (bh * T + ci * BC) * NC + {v[1]} + rc * NC)[:, None]"
    return f"tl.load({v[1]} + rc)[:, None]"


def wtile(base: str, dims, r: str, c: str) -> tuple[str, str]:
    """(pointers, mask) of the [T_rows, T_cols] tile at (r, c) of a [N_rows, N_cols] weight at base."""
    rows, cols = dims
    return (f"{base} + {r} * {SIZE[cols]} + {c} + ({AR[rows]}[:, None] * {SIZE[cols]} + {AR[cols]}[None, :])",
            f"({AR[rows]} < {SIZE[rows]} - {r})[:, None] & ({AR[cols]} < {SIZE[cols]} - {c})[None, :]")


def wload(base: str, dims, r: str, c: str) -> str:
    p, m = wtile(base, dims, r, c)
    return f"tl.load({p}, mask={m}, other=0.0)"


def wstore(base: str, dims, r: str, c: str, val: str) -> str:
    p, m = wtile(base, dims, r, c)
    return f"tl.store({p}, {val}, mask={m})"


class GraphPrinter:
    """Prints one IR graph as tiled stages. `anchor[i]` (W_0) and `mom_anchor[i]` (S_0) are weight bases;
    `factors[i]` = (Δ_i, X_i) values for the dual form (None: plain matmuls on the anchor)."""

    def __init__(self, em: Lines, scr: Scratch, wdims, anchor, mom_anchor, factors, mom: bool):
        self.em, self.scr, self.wdims = em, scr, wdims
        self.anchor, self.mom_anchor, self.factors, self.mom = anchor, mom_anchor, factors, mom

    def new_vec(self, dim: str):
        return ("vec", dim, self.scr.vec(dim), SIZE[dim])

    def run(self, gr: ir.Graph, env: dict) -> dict:
        vals, outs = {}, {}
        for nid in gr.order():
            op, srcs = gr.node(nid), gr.srcs(nid)
            a = [vals[s] for s in srcs]
            if op.op == "input":
                vals[nid] = env[op.arg]
            elif op.op == "weight":
                vals[nid] = ("weight", op.arg)
            elif op.op == "output":
                outs[op.arg] = a[0]
            else:
                self.em(f"# {op.name} = {op.op}")
                with self.em.stage():
                    vals[nid] = getattr(self, "op_" + op.op)(op, a)
                self.em.barrier()
        return outs

    # ------------------------------------------------------------------ elementwise and reductions
    def op_ew(self, op, a):
        expr, syms = op.arg
        em = self.em
        vdims = [v[1] for v in a if v[0] == "vec"]
        if not a:  # a constant vector (of the value dimension, as the one-tile printer)
            out = self.new_vec("v")
            with em.loop("v", "j"):
                em(st(out, "j", f"tl.full([BC, TV], {float(expr)!r}, tl.float32)"))
            return out
        names = {}
        if not vdims:  # per-token scalars only
            for s, v in zip(syms, a):
                names[s] = em.fresh("_a")
                em(f"{names[s]} = {ld_s(v)}")
            var = em.fresh("_r")
            em(*print_triton_block({var: expr}, names, prefix=f"{var}_"))
            out = ("scal", self.scr.scal())
            em(f"tl.store({out[1]} + rc, tl.sum({var} + tl.zeros([BC, 1], tl.float32), axis=1))")
            return out
        out = self.new_vec(vdims[0])
        with em.loop(vdims[0], "j"):
            for s, v in zip(syms, a):
                names[s] = em.fresh("_a")
                em(f"{names[s]} = {ld(v, 'j', vdims[0]) if v[0] == 'vec' else ld_s(v)}")
            var = em.fresh("_r")
            em(*print_triton_block({var: expr}, names, prefix=f"{var}_"))
            em(st(out, "j", var))
        return out

    def _sum(self, v, term, acc: str, init: bool = True) -> None:
        """acc (a [BC] register vector) += Σ over v's columns of term(tile var)."""
        em = self.em
        if init:
            em(f"{acc} = tl.zeros([BC], tl.float32)")
        with em.loop(v[1], "j"):
            t = em.fresh("_x")
            em(f"{t} = {ld(v, 'j')}")
            em(f"{acc} += tl.sum({term(t)}, axis=1)")

    def _red(self, op, a, fn):
        out = ("scal", self.scr.scal())
        self._sum(a[0], lambda t: f"{t} * {t}" if op.op != "rowsum" else t, "racc")
        self.em(f"tl.store({out[1]} + rc, {fn('racc')})")
        return out

    def op_rownorm(self, op, a):
        return self._red(op, a, lambda x: f"tl.sqrt({x})")

    def op_rowsumsq(self, op, a):
        return self._red(op, a, lambda x: x)

    def op_rowsum(self, op, a):
        return self._red(op, a, lambda x: x)

    def _moments(self, z, n):
        """mu [BC, 1] and rstd [BC, 1] of z's rows (two passes)."""
        N = SIZE[n]
        self._sum(z, lambda t: t, "mu")
        self.em(f"mu = (mu / {N})[:, None]")
        cen = f"tl.where(({AR[n]} < {N} - j)[None, :], {{t}} - mu, 0.0)"
        self._sum(z, lambda t: f"{cen.format(t=t)} * {cen.format(t=t)}", "var")
        self.em(f"rs = tl.rsqrt(var / {N} + 1e-5)[:, None]")

    def _mask(self, n):
        return f"({AR[n]} < {SIZE[n]} - j)[None, :]"

    def op_layernorm(self, op, a):
        z = a[0]
        n = z[1]
        self._moments(z, n)
        out = self.new_vec(n)
        with self.em.loop(n, "j"):
            self.em(st(out, "j", f"({ld(z, 'j')} - mu) * rs"))
        return out

    def op_layernorm_bwd(self, op, a):
        z, dy = a
        n, N, em = z[1], SIZE[z[1]], self.em
        self._moments(z, n)
        em("s_dy = tl.zeros([BC], tl.float32)", "s_dyh = tl.zeros([BC], tl.float32)")
        with em.loop(n, "j"):
            em(f"_dy = {ld(dy, 'j')}", f"_h = tl.where({self._mask(n)}, {ld(z, 'j')} - mu, 0.0) * rs",
               "s_dy += tl.sum(_dy, axis=1)", "s_dyh += tl.sum(_dy * _h, axis=1)")
        out = self.new_vec(n)
        with em.loop(n, "j"):
            em(f"_h = ({ld(z, 'j')} - mu) * rs",
               st(out, "j", f"rs * ({ld(dy, 'j')} - s_dy[:, None] / {N} - _h * s_dyh[:, None] / {N})"))
        return out

    def op_layernorm_bwd2(self, op, a):
        """∂/∂z ⟨g, layernorm_bwd(z, dy)⟩, the one-tile printer's formula with its row sums taken over tiles."""
        z, dy, g = a
        n, N, em = z[1], SIZE[z[1]], self.em
        self._moments(z, n)
        self._sum(dy, lambda t: t, "mdy")
        em(f"mdy = (mdy / {N})[:, None]")
        for s in ("mac", "ga", "gc"):
            em(f"{s} = tl.zeros([BC], tl.float32)")
        with em.loop(n, "j"):
            em(f"_c = tl.where({self._mask(n)}, {ld(z, 'j')} - mu, 0.0)",
               f"_a = tl.where({self._mask(n)}, {ld(dy, 'j')} - mdy, 0.0)", f"_g = {ld(g, 'j')}",
               "mac += tl.sum(_a * _c, axis=1)", "ga += tl.sum(_g * _a, axis=1)", "gc += tl.sum(_g * _c, axis=1)")
        em(f"mac = (mac / {N})[:, None]", "ga = ga[:, None]", "gc = gc[:, None]", "r3 = rs * rs * rs")
        x = (f"tl.where({self._mask(n)}, r3 * ((3.0 * rs * rs * mac * gc - ga) * _c / {N} - gc * _a / {N} "
             "- mac * _g), 0.0)")
        tile = [f"_c = tl.where({self._mask(n)}, {ld(z, 'j')} - mu, 0.0)",
                f"_a = tl.where({self._mask(n)}, {ld(dy, 'j')} - mdy, 0.0)", f"_g = {ld(g, 'j')}"]
        em("sx = tl.zeros([BC], tl.float32)")
        with em.loop(n, "j"):
            em(*tile, f"sx += tl.sum({x}, axis=1)")
        out = self.new_vec(n)
        with em.loop(n, "j"):
            em(*tile, st(out, "j", f"{x} - sx[:, None] / {N}"))
        return out

    # ------------------------------------------------------------------ matmuls
    def op_layer(self, op, a):
        return self._matmul(op.arg, a[-1], False)

    op_linear = op_layer

    def op_linear_t(self, op, a):
        return self._matmul(op.arg, a[1], True)

    def _matmul(self, i, h, transposed):
        """layer/linear: Z = H W_iᵀ (in: cols, out: rows); linear_t: Z = G W_i (in: rows, out: cols); on the
        anchor, or with the dual form when factors are given."""
        rows, cols = self.wdims[i]
        din, dout = (rows, cols) if transposed else (cols, rows)
        em = self.em
        dual = self.factors is not None
        if dual:
            dl, x = self.factors[i]
            f_in, f_out = (dl, x) if transposed else (x, dl)
            em("amat = tl.zeros([BC, BC], tl.float32)")
            with em.loop(din, "i"):
                em(f"amat += {dot(ld(h, 'i'), 'tl.trans(' + ld(f_in, 'i') + ')')}")
            em("amat = kmat * amat")
        out = self.new_vec(dout)
        with em.loop(dout, "j"):
            em(f"acc = tl.zeros([BC, {TILE[dout]}], tl.float32)")
            with em.loop(din, "i"):
                em(f"_h = {ld(h, 'i')}")
                # γ ∘ (H W_0ᵀ) = (γ ∘ H) W_0ᵀ: a row scale commutes with the matmul, so one accumulator
                bases = [("_h * gam" if dual else "_h", self.anchor[i])]
                if dual and self.mom:
                    bases.append(("_h * bm", self.mom_anchor[i]))
                for lhs, base in bases:
                    if transposed:
                        em(f"acc += {dot(lhs, wload(base, self.wdims[i], 'i', 'j'))}")
                    else:
                        em(f"acc += {dot(lhs, 'tl.trans(' + wload(base, self.wdims[i], 'j', 'i') + ')')}")
            val = f"acc + {dot('amat', ld(f_out, 'j'))}" if dual else "acc"
            em(st(out, "j", val))
        return out
