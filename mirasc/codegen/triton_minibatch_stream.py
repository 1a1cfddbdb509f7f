"""The streamed mini-batch kernels: the dual form (triton_minibatch.py) with the weights in global memory.

Why: the single-tile kernels hold every weight (and momentum buffer) of a head as one register tile, so a
Titans head at D = 128, E = 512 needs 4 × 256 KB on chip. Here nothing of size D·E or C·E lives on chip.

What is where. One program per (batch, head) still walks the chunks in order, but
  * the anchor weights W_0 (and S_0) of chunk c are the checkpoint CKW[c] the forward writes anyway
    (CKW[c + 1] = the chunk end (1), written tile by tile from CKW[c]); the backward reads them back;
  * every vector an IR graph computes ([C, n], n in {Dk, Dv, E}) is a slot of a per-program global
    scratch buffer (a few hundred KB per head: L2-resident), every per-token scalar a [C] slot;
  * on chip there are only [C, T] tiles (T = TK, TV or TE columns of one dimension), [T, T] weight tiles
    and the chunk's [C, C] dual-form matrices.

Each IR node is one stage: a loop over the column tiles of its output. Elementwise nodes load the same
column tile of their sources; row reductions (norms, LayerNorm and its first and second backward) take
one pass per reduced quantity over the tiles. A matmul on the anchor weights,

    Z[:, J] = Σ_I H[:, I] W_0[J, I]ᵀ                                                   (layer, linear)
    Z[:, I] = Σ_J G[:, J] W_0[J, I]                                                     (linear_t)

accumulates over the input tiles. A matmul on each token's own weights (the dual form (2)) first
accumulates the [C, C] matrix A = K ∘ (H Xᵀ) = K ∘ Σ_I H[:, I] X[:, I]ᵀ over the input tiles (A = K ∘ (G Δᵀ)
for linear_t), then per output tile

    Z[:, J] = γ ∘ Σ_I H[:, I] W_0[J, I]ᵀ + b ∘ Σ_I H[:, I] S_0[J, I]ᵀ + A Δ[:, J].

The chunk end is W_n[J, I] = g W_0[J, I] + b_n S_0[J, I] + (Δ[:, J] ∘ k_n)ᵀ X[:, I] per weight tile. The
backward is the same printer on the reverse-mode graphs, plus the weight cotangent's flow through (1) and
(2): with dW the cotangent of the chunk end (a ping-pong pair of scratch buffers, swapped per chunk) and
each pair (L, R) of ∂ℓ/∂W_t = Σ L_t R_tᵀ from the read's reverse graph:

    dW_0 = g dW + Σ_pairs (L ∘ γ)ᵀ R + Σ_(gradient factors' pairs) Lᵀ R          (per [T, T] tile)
    dΔ[:, J] = k_n ∘ Σ_I X[:, I] dW[J, I]ᵀ + Σ_pairs (K ∘ R Xᵀ)ᵀ L[:, J]
    dX[:, I] = k_n ∘ Σ_J Δ[:, J] dW[J, I]  + Σ_pairs (K ∘ L Δᵀ)ᵀ R[:, I]
    dK = Σ_pairs (L Δᵀ) ∘ (R Xᵀ),  dγ = Σ_pairs rowsum(L ∘ R W_0ᵀ),  dk_n = rowsum(Δ ∘ X dWᵀ), dg = ⟨dW, W_0⟩

(and the same with S_0, b, Θ for momentum). Stages exchange data through global memory, so a barrier
(tl.debug_barrier) separates them. Everything is printed from the IR graphs `memory_forward`,
`memory_grad` and their `ir.vjp`, so any depth, activation, norm, residual and bias is covered.

Kernels: the forward is one kernel (a loop over the chunks). The backward is two kernels launched in turn
per chunk, in reverse order (emit_backward): A (the factors, the read's reverse, the chunk end's reverse)
and B (the factors' reverse into k, v, the gates and dW_0); the chunk-to-chunk cotangent lives in the dW_0
output buffers. One kernel held ~650 lines of stages and took ptxas 85-185 s; the halves take < 60 s.

Schedule choices that keep registers in check (measured with the AOT compile for sm_90, D = 128):
  * addresses are (scalar base + tile offset) + an invariant [rows, cols] offset tensor, so no per-use
    pointer tensor is hoisted out of the chunk loop (that alone kept dozens live: 255 registers, spills);
  * temporaries are renamed per stage (Triton refuses a name re-assigned with another tile shape in a loop);
  * γ ∘ (H W_0ᵀ) + b ∘ (H S_0ᵀ) = (γ ∘ H) W_0ᵀ + (b ∘ H) S_0ᵀ: row scales commute, one accumulator;
  * tile width 16 and 8 warps by default: Titans' forward at D = 128 then needs 232 registers, no spill.

Cost: the same flops as the single-tile kernels plus re-reading each matmul's input once per output
tile, from L2. Scratch per (batch, head) ≈ (number of IR vectors) · C · n floats: 1 MB (forward) and
3.1 MB (backward) for Titans at D = 128, E = 512, C = 64. Parallelism is still one program per (batch,
head): these kernels make the MLP memories launch at D = 128; they are not yet tuned for speed (no split
of E across programs).
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from contextlib import contextmanager

from .. import ir
from .printers import print_triton_block
from .triton_backend import SIZE, Unsupported

TILE = {"k": "TK", "v": "TV", "e": "TE"}
AR = {"k": "tk", "v": "tv", "e": "te"}


def _dot(a: str, b: str) -> str:
    return f"tl.dot({a}, {b}, input_precision=PREC)"


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
    def loop(self, dim: str, var: str):
        self(f"for {var} in range(0, {SIZE[dim]}, {TILE[dim]}):")
        self.ind += 1
        yield
        self.ind -= 1

    def barrier(self) -> None:
        self("tl.debug_barrier()")


# Values: ("vec", dim, base, stride) a [BC, N_dim] row-major block; ("scal", base) a [BC] vector;
# ("coef", j) column j of the per-token coefficients; ("weight", i).


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
                em(f"amat += {_dot(ld(h, 'i'), 'tl.trans(' + ld(f_in, 'i') + ')')}")
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
                        em(f"acc += {_dot(lhs, wload(base, self.wdims[i], 'i', 'j'))}")
                    else:
                        em(f"acc += {_dot(lhs, 'tl.trans(' + wload(base, self.wdims[i], 'j', 'i') + ')')}")
            val = f"acc + {_dot('amat', ld(f_out, 'j'))}" if dual else "acc"
            em(st(out, "j", val))
        return out


def check(spec) -> None:
    if spec.memory.kind not in ("mlp", "linear"):
        raise Unsupported("the streamed mini-batch kernels need a parametric memory")


# ---------------------------------------------------------------------------------------------- kernels
CONSTS = ("T, Nk, Nv, Ne, NCH, SSTR, NC: tl.constexpr, BC: tl.constexpr, TK: tl.constexpr, TV: tl.constexpr, "
          "TE: tl.constexpr, PREC: tl.constexpr")


def _tokens(base: str, dim: str):
    """The chunk's rows of a [B·H, T, N] token tensor as a vector value."""
    return ("vec", dim, f"{base} + (bh * T + ci * BC) * {SIZE[dim]}", SIZE[dim])


def _prologue(em: Lines) -> None:
    em("bh = tl.program_id(0)", "rc = tl.arange(0, BC)", "tk = tl.arange(0, TK)", "tv = tl.arange(0, TV)",
       "te = tl.arange(0, TE)", "scr = SCR + bh.to(tl.int64) * SSTR")


def _chunk_coefs(em: Lines, mom: bool) -> None:
    em("tok = ci * BC + rc", "gam = tl.load(GAM + bh * T + tok)[:, None]",
       "kl = tl.load(KL + (bh * NCH + ci) * BC + rc)", "gl = tl.load(SC + (bh * NCH + ci) * 3)")
    if mom:
        em("bm = tl.load(BM + bh * T + tok)[:, None]", "kml = tl.load(KML + (bh * NCH + ci) * BC + rc)",
           "bl = tl.load(SC + (bh * NCH + ci) * 3 + 1)", "thl = tl.load(SC + (bh * NCH + ci) * 3 + 2)")


def _kmat(em: Lines) -> None:
    em("kmat = tl.load(KMAT + ((bh * NCH + ci) * BC + rc[:, None]) * BC + rc[None, :])")


def _ck(base: str, wd, slot: str) -> str:
    rows, cols = wd
    return f"{base} + (bh * (NCH + 1) + {slot}) * {SIZE[rows]} * {SIZE[cols]}"


def _staged(fn):
    """Run an emitter as one stage (its temporaries renamed apart from other stages')."""
    def run(em, *args, **kw):
        with em.stage():
            return fn(em, *args, **kw)
    return run


@_staged
def _each_tile(em: Lines, wd, body) -> None:
    with em.loop(wd[0], "j"):
        with em.loop(wd[1], "i"):
            body()


def _copy_weight(em: Lines, wd, src: str, dst: str) -> None:
    _each_tile(em, wd, lambda: em(wstore(dst, wd, "j", "i", wload(src, wd, "j", "i"))))


def _copy_tokens(em: Lines, dim: str, src, dst) -> None:
    with em.loop(dim, "j"):
        em(st(dst, "j", ld(src, "j") if src is not None else f"tl.zeros([BC, {TILE[dim]}], tl.float32)"))


class _Printer(GraphPrinter):
    def _matmul(self, i, h, transposed):
        if self.factors is not None:
            _kmat(self.em)
        return super()._matmul(i, h, transposed)


def _factors(em, scr, wdims, grad, coef_order, vecs, anchors, mom_anchors, mom):
    """The chunk's gradient factors at its anchor: `memory_grad` on the chunk (plain matmuls). Per-head
    coefficients are columns of C; channel-wise ones (`vecs`, CONTRACT §6) token rows of G_<name>, like k and v."""
    env = {"k": _tokens("K", "k"), "v": _tokens("V", "v")}
    env.update({n: ("coef", j) for j, n in enumerate(n for n in coef_order if n not in vecs)})
    env.update({n: _tokens(f"G_{n}", side) for n, side in vecs.items()})
    out = _Printer(em, scr, wdims, anchors, mom_anchors, None, mom).run(grad, env)
    return env, [(out[f"delta{i + 1}"], out[f"input{i + 1}"]) for i in range(len(wdims))]


def emit_forward(spec, forward: ir.Graph, grad: ir.Graph, coef_order: list[str],
                 vecs: dict[str, str]) -> tuple[str, str]:
    """(kernel source, scratch floats per program as a Python expression in Nk, Nv, Ne, BC). `vecs`: the
    channel-wise coefficients the gradient graph reads as token vectors (name -> side)."""
    mom = spec.learner.kind == "momentum"
    wdims = spec.weight_dims()
    em, scr = Lines(), Scratch()
    _prologue(em)
    for i, wd in enumerate(wdims):  # the first anchor is the initial state
        _copy_weight(em, wd, f"W{i}_in + bh * {SIZE[wd[0]]} * {SIZE[wd[1]]}", _ck(f"CKW{i}", wd, "0"))
        if mom:
            _copy_weight(em, wd, f"S{i}_in + bh * {SIZE[wd[0]]} * {SIZE[wd[1]]}", _ck(f"CKS{i}", wd, "0"))
    em.barrier()
    em("for ci in range(NCH):")
    em.ind += 1
    _chunk_coefs(em, mom)
    anchors = [_ck(f"CKW{i}", wd, "ci") for i, wd in enumerate(wdims)]
    mom_anchors = [_ck(f"CKS{i}", wd, "ci") for i, wd in enumerate(wdims)]
    _, facs = _factors(em, scr, wdims, grad, coef_order, vecs, anchors, mom_anchors, mom)
    out = _Printer(em, scr, wdims, anchors, mom_anchors, facs, mom).run(forward, {"x": _tokens("Q", "k")})
    em("# the read's outputs")
    _copy_tokens(em, "v", out["y"], _tokens("O", "v"))
    em("# the chunk end (1): W_n = g W_0 + b_n S_0 + (Δ ∘ k_n)ᵀ X per weight tile")
    for i, wd in enumerate(wdims):
        dl, x = facs[i]

        def end(i=i, wd=wd, dl=dl, x=x):
            em(f"_d = {ld(dl, 'j')}", f"_x = {ld(x, 'i')}", f"_w = {wload(anchors[i], wd, 'j', 'i')}")
            if mom:
                em(f"_s = {wload(mom_anchors[i], wd, 'j', 'i')}",
                   wstore(_ck(f"CKW{i}", wd, "ci + 1"), wd, "j", "i",
                          f"gl * _w + bl * _s + {_dot('tl.trans(_d * kl[:, None])', '_x')}"),
                   wstore(_ck(f"CKS{i}", wd, "ci + 1"), wd, "j", "i",
                          f"thl * _s + {_dot('tl.trans(_d * kml[:, None])', '_x')}"))
            else:
                em(wstore(_ck(f"CKW{i}", wd, "ci + 1"), wd, "j", "i",
                          f"gl * _w + {_dot('tl.trans(_d * kl[:, None])', '_x')}"))
        _each_tile(em, wd, end)
    em.barrier()
    em.ind -= 1
    ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in vecs], "KMAT", "GAM", "BM", "KL", "KML", "SC", "O"]
    for i in range(len(wdims)):
        ptrs += [f"W{i}_in", f"S{i}_in", f"CKW{i}", f"CKS{i}"]
    src = ("    @triton.jit\n    def _minibatch_stream_fwd(" + ", ".join(ptrs + ["SCR"]) + ", " + CONSTS
           + "):  # noqa: C901\n" + "\n".join("        " + ln for ln in em.lines) + "\n")
    return src, Scratch.expr(scr.used)


def emit_backward(spec, forward: ir.Graph, grad: ir.Graph, coef_order: list[str],
                  vecs: dict[str, str]) -> tuple[str, str]:
    """Two kernels per chunk, launched in turn for chunks NCH-1 .. 0 (CC = NCH-1-chunk); one is ~half the code,
    so each compiles in well under a minute. DW0_i / DS0_i hold the cotangent of the chunk end on entry and of
    the chunk's anchor on exit (the torch glue starts them at the final state's cotangent):
      A: the factors, the read's reverse (dq, the pairs), the chunk end's reverse: dΔ, dX, dK, dγ, db, dk_n,
         dg, dΘ, and M = g dW + Σ (L ∘ γ)ᵀ R (MS = b_n dW + Θ_n dS + Σ (L ∘ b)ᵀ R) in scratch;
      B: the factors' reverse (dk, dv, the bias's gates, the channel-wise η / δ) and dW_0 = M + Σ Lᵀ R, dS_0 = MS.
    Each kernel only reads what the other writes, so a repeated launch (the autotuner's) gives the same result.
    Returns (both kernels' source, scratch floats per program)."""
    mom = spec.learner.kind == "momentum"
    wdims = spec.weight_dims()
    n_w = len(wdims)
    gvjp = ir.vjp(grad, {f"{n}{i + 1}": f"ct_{n}{i + 1}" for i in range(n_w) for n in ("delta", "input")},
                  "memory_grad_vjp", ir.VECTOR_INPUTS + tuple(vecs))
    fvjp = ir.vjp(forward, {"y": "ct_y"}, "memory_forward_vjp")
    shared = Scratch()  # what A hands to B; each kernel's own slots come after
    size = [f"{SIZE[r]} * {SIZE[c]}" for r, c in wdims]
    mid = [shared.take({size[i]: 1}) for i in range(n_w)]
    mid_s = [shared.take({size[i]: 1}) for i in range(n_w)] if mom else [None] * n_w
    ddl = [("vec", r, shared.vec(r), SIZE[r]) for r, _ in wdims]
    dx = [("vec", c, shared.vec(c), SIZE[c]) for _, c in wdims]
    dw = [f"DW0_{i} + bh * {size[i]}" for i in range(n_w)]
    ds = [f"DS0_{i} + bh * {size[i]}" for i in range(n_w)] if mom else [None] * n_w
    anchors = [_ck(f"CKW{i}", wd, "ci") for i, wd in enumerate(wdims)]
    mom_anchors = [_ck(f"CKS{i}", wd, "ci") for i, wd in enumerate(wdims)]

    def start():
        em, scr = Lines(), copy.deepcopy(shared)
        _prologue(em)
        em("ci = NCH - 1 - CC")
        _chunk_coefs(em, mom)
        env, facs = _factors(em, scr, wdims, grad, coef_order, vecs, anchors, mom_anchors, mom)
        return em, scr, env, facs

    # ---- A
    em, scr_a, env, facs = start()
    em("tl.store(DKMAT + ((bh * NCH + ci) * BC + rc[:, None]) * BC + rc[None, :], tl.zeros([BC, BC], tl.float32))",
       "dgam = tl.zeros([BC], tl.float32)", "dkl = tl.zeros([BC], tl.float32)", "dgl = 0.0")
    if mom:
        em("dbm = tl.zeros([BC], tl.float32)", "dkml = tl.zeros([BC], tl.float32)", "dbl = 0.0", "dthl = 0.0")
    # the read's reverse, printed with the dual form: dq and the pairs (L, R) of ∂ℓ/∂W_t
    fo = _Printer(em, scr_a, wdims, anchors, mom_anchors, facs, mom).run(
        fvjp, {"x": _tokens("Q", "k"), "ct_y": _tokens("DO", "v")})
    _copy_tokens(em, "k", fo.get("d_x"), _tokens("DQ", "k"))
    for i, wd in enumerate(wdims):
        _chunk_end_bwd(em, i, wd, facs[i], ddl[i], dx[i], dw[i], mid[i], anchors[i], ds[i], mid_s[i], mom_anchors[i])
    em.barrier()
    for i, wd in enumerate(wdims):
        j = 0
        while f"outer{i}_{j}_l" in fo:
            _pair_bwd(em, wd, facs[i], fo[f"outer{i}_{j}_l"], fo[f"outer{i}_{j}_r"], ddl[i], dx[i], mid[i],
                      anchors[i], mid_s[i], mom_anchors[i])
            em.barrier()
            j += 1
    em("tl.store(DGAM + bh * T + tok, dgam)", "tl.store(DKL + (bh * NCH + ci) * BC + rc, dkl)",
       "tl.store(DSC + (bh * NCH + ci) * 3, dgl)")
    if mom:
        em("tl.store(DBM + bh * T + tok, dbm)", "tl.store(DKML + (bh * NCH + ci) * BC + rc, dkml)",
           "tl.store(DSC + (bh * NCH + ci) * 3 + 1, dbl)", "tl.store(DSC + (bh * NCH + ci) * 3 + 2, dthl)")
    lines_a = em.lines

    # ---- B: the gradient factors' reverse: dΔ, dX back to k, v, the bias's gates and W_0
    em, scr_b, env, facs = start()
    env = dict(env)
    for i in range(n_w):
        env[f"ct_delta{i + 1}"], env[f"ct_input{i + 1}"] = ddl[i], dx[i]
    go = _Printer(em, scr_b, wdims, anchors, mom_anchors, None, mom).run(gvjp, env)
    _copy_tokens(em, "k", go.get("d_k"), _tokens("DK", "k"))
    _copy_tokens(em, "v", go.get("d_v"), _tokens("DV", "v"))
    for j, n in enumerate(n for n in coef_order if n not in vecs):
        if f"d_{n}" in go:
            v = go[f"d_{n}"]
            if v[0] != "scal":
                raise Unsupported(f"the gradient of the gate {n} is not a per-token scalar")
            em(f"tl.store(DC + (bh * T + tok) * NC + {j}, tl.load({v[1]} + rc))")
    for n, side in vecs.items():  # a channel-wise η or δ: a vector cotangent of the reverse graph, per token row
        _copy_tokens(em, side, go.get(f"d_{n}"), _tokens(f"DG_{n}", side))
    for i, wd in enumerate(wdims):
        _copy_weight(em, wd, mid[i], dw[i])
        if mom:
            _copy_weight(em, wd, mid_s[i], ds[i])
    em.barrier()
    for i, wd in enumerate(wdims):
        j = 0
        while f"outer{i}_{j}_l" in go:
            lft, rgt = go[f"outer{i}_{j}_l"], go[f"outer{i}_{j}_r"]
            _each_tile(em, wd, lambda lft=lft, rgt=rgt, i=i, wd=wd: em(
                wstore(dw[i], wd, "j", "i", wload(dw[i], wd, "j", "i") + " + "
                       + _dot(f"tl.trans({ld(lft, 'j')})", ld(rgt, "i")))))
            em.barrier()
            j += 1
    lines_b = em.lines

    ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in vecs], "KMAT", "GAM", "BM", "KL", "KML", "SC", "DO"]
    for i in range(n_w):
        ptrs += [f"CKW{i}", f"CKS{i}", f"DW0_{i}", f"DS0_{i}"]
    ptrs += ["DQ", "DK", "DV", "DC", *[f"DG_{n}" for n in vecs], "DKMAT", "DGAM", "DBM", "DKL", "DKML", "DSC", "SCR",
             "CC"]
    src = ""
    for name, lines in (("a", lines_a), ("b", lines_b)):
        src += (f"\n    @triton.jit\n    def _minibatch_stream_bwd_{name}(" + ", ".join(ptrs) + ", " + CONSTS
                + "):  # noqa: C901\n" + "\n".join("        " + ln for ln in lines) + "\n")
    used = Counter(scr_a.used)
    for m, n in scr_b.used.items():
        used[m] = max(used[m], n)
    return src, Scratch.expr(used)


@_staged
def _chunk_end_bwd(em, i, wd, fac, ddl, dx, dw, dwn, w0, ds, dsn, s0):
    """The chunk end's reverse for weight i: dΔ, dX (initialised here), dk_n, dg (and db_n, dΘ_n), and
    the new cotangent g dW (+ b_n dW + Θ_n dS for S) of the anchor."""
    dl, x = fac
    rows, cols = wd
    em(f"# the chunk end's reverse, weight {i}")

    def accumulate(outer, inner, tmp, fac_tile, weight):
        """acc (and acc_s) = Σ over the inner tiles of fac_tile · weight(dW) (and weight(dS))."""
        em(f"acc = tl.zeros([BC, {TILE[outer]}], tl.float32)")
        if ds:
            em(f"acc_s = tl.zeros([BC, {TILE[outer]}], tl.float32)")
        with em.loop(inner, "i" if inner == cols else "j"):
            em(f"{tmp} = {fac_tile}", f"acc += {_dot(tmp, weight(dw))}")
            if ds:
                em(f"acc_s += {_dot(tmp, weight(ds))}")

    scaled = "kl[:, None] * acc" + (" + kml[:, None] * acc_s" if ds else "")
    with em.loop(rows, "j"):  # dΔ = kl ∘ (X dWᵀ) (+ kml ∘ (X dSᵀ)), and dk_n
        accumulate(rows, cols, "_x", ld(x, "i"), lambda m: "tl.trans(" + wload(m, wd, "j", "i") + ")")
        em(f"_d = {ld(dl, 'j')}", "dkl += tl.sum(_d * acc, axis=1)")
        if ds:
            em("dkml += tl.sum(_d * acc_s, axis=1)")
        em(st(ddl, "j", scaled))
    with em.loop(cols, "i"):  # dX = kl ∘ (Δ dW) (+ kml ∘ (Δ dS))
        accumulate(cols, rows, "_d", ld(dl, "j"), lambda m: wload(m, wd, "j", "i"))
        em(st(dx, "i", scaled))

    def tile():
        em(f"_dw = {wload(dw, wd, 'j', 'i')}",
           f"dgl += tl.sum(tl.sum(_dw * {wload(w0, wd, 'j', 'i')}, axis=1), axis=0)")
        if ds:
            em(f"_ds = {wload(ds, wd, 'j', 'i')}", f"_s = {wload(s0, wd, 'j', 'i')}",
               "dbl += tl.sum(tl.sum(_dw * _s, axis=1), axis=0)", "dthl += tl.sum(tl.sum(_ds * _s, axis=1), axis=0)",
               wstore(dsn, wd, "j", "i", "bl * _dw + thl * _ds"))
        em(wstore(dwn, wd, "j", "i", "gl * _dw"))
    _each_tile(em, wd, tile)


@_staged
def _pair_bwd(em, wd, fac, lft, rgt, ddl, dx, dwn, w0, dsn, s0):
    """One pair (L, R) of the read's ∂ℓ/∂W_t = Σ L Rᵀ through the dual form (2)."""
    dl, x = fac
    rows, cols = wd
    em("# a pair (L, R) of the read's weight cotangent", "rx = tl.zeros([BC, BC], tl.float32)",
       "lx = tl.zeros([BC, BC], tl.float32)")
    with em.loop(cols, "i"):
        em(f"rx += {_dot(ld(rgt, 'i'), 'tl.trans(' + ld(x, 'i') + ')')}")
    with em.loop(rows, "j"):
        em(f"lx += {_dot(ld(lft, 'j'), 'tl.trans(' + ld(dl, 'j') + ')')}")
    _kmat(em)
    em("_pk = DKMAT + ((bh * NCH + ci) * BC + rc[:, None]) * BC + rc[None, :]",
       "tl.store(_pk, tl.load(_pk) + lx * rx)", "rxk = tl.trans(kmat * rx)", "lxk = tl.trans(kmat * lx)")
    with em.loop(rows, "j"):
        em(f"_l = {ld(lft, 'j')}", st(ddl, "j", f"{ld(ddl, 'j')} + {_dot('rxk', '_l')}"),
           f"acc = tl.zeros([BC, {TILE[rows]}], tl.float32)")
        if dsn:
            em(f"acc_s = tl.zeros([BC, {TILE[rows]}], tl.float32)")
        with em.loop(cols, "i"):
            em(f"_r = {ld(rgt, 'i')}", f"acc += {_dot('_r', 'tl.trans(' + wload(w0, wd, 'j', 'i') + ')')}")
            if dsn:
                em(f"acc_s += {_dot('_r', 'tl.trans(' + wload(s0, wd, 'j', 'i') + ')')}")
        em("dgam += tl.sum(_l * acc, axis=1)")
        if dsn:
            em("dbm += tl.sum(_l * acc_s, axis=1)")
    with em.loop(cols, "i"):
        em(st(dx, "i", f"{ld(dx, 'i')} + {_dot('lxk', ld(rgt, 'i'))}"))
    with em.loop(rows, "j"):
        em(f"_lg = tl.trans({ld(lft, 'j')} * gam)")
        if dsn:
            em(f"_lb = tl.trans({ld(lft, 'j')} * bm)")
        with em.loop(cols, "i"):
            em(f"_r = {ld(rgt, 'i')}", wstore(dwn, wd, "j", "i", f"{wload(dwn, wd, 'j', 'i')} + {_dot('_lg', '_r')}"))
            if dsn:
                em(wstore(dsn, wd, "j", "i", f"{wload(dsn, wd, 'j', 'i')} + {_dot('_lb', '_r')}"))
