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

Kernels: the forward is two kernels launched in turn per chunk (emit_forward): the read and the chunk end. The
backward is two kernels launched in turn per chunk, in reverse order (emit_backward): A (the factors, the read's
reverse, the chunk end's reverse) and B (the factors' reverse into k, v, the gates and dW_0); the chunk-to-chunk
cotangent lives in the dW_0 output buffers. One kernel held ~650 lines of stages and took ptxas 85-185 s; the
halves take < 60 s.

Schedule choices that keep registers in check (measured with the AOT compile for sm_90, D = 128):
  * addresses are (scalar base + tile offset) + an invariant [rows, cols] offset tensor, so no per-use
    pointer tensor is hoisted out of the chunk loop (that alone kept dozens live: 255 registers, spills);
  * temporaries are renamed per stage (Triton refuses a name re-assigned with another tile shape in a loop);
  * γ ∘ (H W_0ᵀ) + b ∘ (H S_0ᵀ) = (γ ∘ H) W_0ᵀ + (b ∘ H) S_0ᵀ: row scales commute, one accumulator;
  * tile width 16 and 8 warps by default; the chunk end (its own kernel: in the read's kernel its products
    spilled) on row tiles of 4 column tiles and 4 warps: with 16-row products every warp held the whole
    [16, C] operand, in two bf16 parts (bf16x3), and it spilled on its own too. Titans at D = 128 on sm_90 in
    bf16 (maxnreg 255): the read 164 registers, the chunk end 252, the backward halves 234 and 202, no spill.

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

from .. import ir
from .triton_printing import SIZE, Unsupported, jit_kernel
from .triton_stream_printer import AR, TILE, GraphPrinter, Lines, Scratch, dot, ld, st, wload, wstore


def check(spec) -> None:
    if not spec.parametric:
        raise Unsupported("the streamed mini-batch kernels need a parametric memory")


# ---------------------------------------------------------------------------------------------- kernels
WIDE = 4  # schedule: the chunk end's row tiles, in column tiles (_chunk_end)
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
    coefficients are columns of C; channel-wise ones (`vecs`, docs/semantics.md: channel-wise gates) token rows of
    G_<name>, like k and v."""
    env = {"k": _tokens("K", "k"), "v": _tokens("V", "v")}
    env.update({n: ("coef", j) for j, n in enumerate(n for n in coef_order if n not in vecs)})
    env.update({n: _tokens(f"G_{n}", side) for n, side in vecs.items()})
    out = _Printer(em, scr, wdims, anchors, mom_anchors, None, mom).run(grad, env)
    return env, [(out[f"delta{i + 1}"], out[f"input{i + 1}"]) for i in range(len(wdims))]


def emit_forward(spec, forward: ir.Graph, grad: ir.Graph, coef_order: list[str],
                 vecs: dict[str, str]) -> tuple[str, str]:
    """(both kernels' source, scratch floats per program as a Python expression in Nk, Nv, Ne, BC). Two kernels
    per chunk, launched in turn for chunks 0 .. NCH-1 (CC = the chunk), the torch glue having copied the initial
    state into CKW[0]: the read (the chunk's gradient factors at its anchor CKW[CC], the read through the dual form,
    the outputs) and the chunk end (1), which writes CKW[CC + 1] from the factors the read left in scratch. The
    chunk end's products have few rows ([T, C] × [C, T] per weight tile), so in the read's kernel its tensor-core
    operands were held once per warp on top of the read's registers and spilled. `vecs`: the channel-wise
    coefficients the gradient graph reads as token vectors (name -> side)."""
    mom = spec.learner.kind == "momentum"
    wdims = spec.weight_dims()
    em, scr = Lines(), Scratch()
    _prologue(em)
    em("ci = CC")
    _chunk_coefs(em, mom)
    anchors = [_ck(f"CKW{i}", wd, "ci") for i, wd in enumerate(wdims)]
    mom_anchors = [_ck(f"CKS{i}", wd, "ci") for i, wd in enumerate(wdims)]
    _, facs = _factors(em, scr, wdims, grad, coef_order, vecs, anchors, mom_anchors, mom)
    out = _Printer(em, scr, wdims, anchors, mom_anchors, facs, mom).run(forward, {"x": _tokens("Q", "k")})
    em("# the read's outputs")
    _copy_tokens(em, "v", out["y"], _tokens("O", "v"))
    end = Lines()
    _prologue(end)
    end("ci = CC")
    _chunk_coefs(end, mom)
    end("# the chunk end (1): W_n = g W_0 + b_n S_0 + (Δ ∘ k_n)ᵀ X per weight tile, Δ and X from the read's scratch")
    for i, wd in enumerate(wdims):
        with end.stage():
            _chunk_end(end, wd, facs[i], anchors[i], mom_anchors[i], i, mom)
    ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in vecs], "KMAT", "GAM", "BM", "KL", "KML", "SC", "O"]
    for i in range(len(wdims)):
        ptrs += [f"CKW{i}", f"CKS{i}"]
    params = ", ".join(ptrs + ["SCR", "CC"]) + ", " + CONSTS
    src = jit_kernel("_minibatch_stream_fwd", params, em.lines) + "\n" + \
        jit_kernel("_minibatch_stream_fwd_end", params, end.lines)
    return src, Scratch.expr(scr.used)


def _chunk_end(em: Lines, wd, fac, w0: str, s0: str, i: int, mom: bool) -> None:
    """W_n = g W_0 + b_n S_0 + (Δ ∘ k_n)ᵀ X (and S_n = Θ_n S_0 + (Δ ∘ k_n^m)ᵀ X) over the tiles of weight i. Its
    products contract the chunk's C rows into a [rows, T] tile: with T rows, every warp of an mma layout holds
    the whole [T, C] operand, so the rows are WIDE tiles at once (64 rows for T = 16: one warpgroup's HGMMA), where
    the weight has distinct row and column dimensions."""
    rows, cols = wd
    wide = rows != cols
    step = f"{WIDE} * {TILE[rows]}" if wide else TILE[rows]
    ar = AR[rows] + "w" if wide else AR[rows]
    if wide:
        em(f"{ar} = tl.arange(0, {step})")

    def rowwise(line: str) -> str:  # the row dimension's lanes as the wide tile's
        return re.sub(rf"\b{AR[rows]}\b", ar, line) if wide else line

    dl, x = fac
    with em.loop(rows, "j", step):
        with em.loop(cols, "i"):
            em(rowwise(f"_d = {ld(dl, 'j')}"), f"_x = {ld(x, 'i')}", rowwise(f"_w = {wload(w0, wd, 'j', 'i')}"))
            if mom:
                em(rowwise(f"_s = {wload(s0, wd, 'j', 'i')}"),
                   rowwise(wstore(_ck(f"CKW{i}", wd, "ci + 1"), wd, "j", "i",
                                  f"gl * _w + bl * _s + {dot('tl.trans(_d * kl[:, None])', '_x')}")),
                   rowwise(wstore(_ck(f"CKS{i}", wd, "ci + 1"), wd, "j", "i",
                                  f"thl * _s + {dot('tl.trans(_d * kml[:, None])', '_x')}")))
            else:
                em(rowwise(wstore(_ck(f"CKW{i}", wd, "ci + 1"), wd, "j", "i",
                                  f"gl * _w + {dot('tl.trans(_d * kl[:, None])', '_x')}")))


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
    bw = _Backward(spec, forward, grad, coef_order, vecs)
    lines_a, scr_a = bw.kernel_a()
    lines_b, scr_b = bw.kernel_b()
    ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in vecs], "KMAT", "GAM", "BM", "KL", "KML", "SC", "DO"]
    for i in range(bw.n_w):
        ptrs += [f"CKW{i}", f"CKS{i}", f"DW0_{i}", f"DS0_{i}"]
    ptrs += ["DQ", "DK", "DV", "DC", *[f"DG_{n}" for n in vecs], "DKMAT", "DGAM", "DBM", "DKL", "DKML", "DSC", "SCR",
             "CC"]
    src = ""
    for name, lines in (("a", lines_a), ("b", lines_b)):
        src += "\n" + jit_kernel(f"_minibatch_stream_bwd_{name}", ", ".join(ptrs) + ", " + CONSTS, lines)
    used = Counter(scr_a.used)
    for m, n in scr_b.used.items():
        used[m] = max(used[m], n)
    return src, Scratch.expr(used)


class _Backward:
    """The scratch both backward kernels share (what A hands to B: M, MS, dΔ, dX) and the weights' bases."""

    def __init__(self, spec, forward: ir.Graph, grad: ir.Graph, coef_order: list[str], vecs: dict[str, str]):
        self.grad, self.coef_order, self.vecs = grad, coef_order, vecs
        self.mom = mom = spec.learner.kind == "momentum"
        self.wdims = wdims = spec.weight_dims()
        self.n_w = n_w = len(wdims)
        self.gvjp = ir.vjp(grad, {f"{n}{i + 1}": f"ct_{n}{i + 1}" for i in range(n_w) for n in ("delta", "input")},
                           "memory_grad_vjp", ir.VECTOR_INPUTS + tuple(vecs))
        self.fvjp = ir.vjp(forward, {"y": "ct_y"}, "memory_forward_vjp")
        self.shared = shared = Scratch()  # what A hands to B; each kernel's own slots come after
        size = [f"{SIZE[r]} * {SIZE[c]}" for r, c in wdims]
        self.mid = [shared.take({size[i]: 1}) for i in range(n_w)]
        self.mid_s = [shared.take({size[i]: 1}) for i in range(n_w)] if mom else [None] * n_w
        self.ddl = [("vec", r, shared.vec(r), SIZE[r]) for r, _ in wdims]
        self.dx = [("vec", c, shared.vec(c), SIZE[c]) for _, c in wdims]
        self.dw = [f"DW0_{i} + bh * {size[i]}" for i in range(n_w)]
        self.ds = [f"DS0_{i} + bh * {size[i]}" for i in range(n_w)] if mom else [None] * n_w
        self.anchors = [_ck(f"CKW{i}", wd, "ci") for i, wd in enumerate(wdims)]
        self.mom_anchors = [_ck(f"CKS{i}", wd, "ci") for i, wd in enumerate(wdims)]

    def start(self):
        """A kernel's prologue: the chunk (CC counts from the last), its coefficients and gradient factors."""
        em, scr = Lines(), copy.deepcopy(self.shared)
        _prologue(em)
        em("ci = NCH - 1 - CC")
        _chunk_coefs(em, self.mom)
        env, facs = _factors(em, scr, self.wdims, self.grad, self.coef_order, self.vecs, self.anchors,
                             self.mom_anchors, self.mom)
        return em, scr, env, facs

    def printer(self, em, scr, facs):
        return _Printer(em, scr, self.wdims, self.anchors, self.mom_anchors, facs, self.mom)

    def kernel_a(self):
        """The read's reverse, printed with the dual form (dq and the pairs (L, R) of ∂ℓ/∂W_t), then the chunk
        end's reverse and each pair through (2)."""
        em, scr, env, facs = self.start()
        mom = self.mom
        em("tl.store(DKMAT + ((bh * NCH + ci) * BC + rc[:, None]) * BC + rc[None, :], tl.zeros([BC, BC], tl.float32))",
           "dgam = tl.zeros([BC], tl.float32)", "dkl = tl.zeros([BC], tl.float32)", "dgl = 0.0")
        if mom:
            em("dbm = tl.zeros([BC], tl.float32)", "dkml = tl.zeros([BC], tl.float32)", "dbl = 0.0", "dthl = 0.0")
        fo = self.printer(em, scr, facs).run(self.fvjp, {"x": _tokens("Q", "k"), "ct_y": _tokens("DO", "v")})
        _copy_tokens(em, "k", fo.get("d_x"), _tokens("DQ", "k"))
        for i, wd in enumerate(self.wdims):
            _chunk_end_bwd(em, i, wd, facs[i], self.ddl[i], self.dx[i], self.dw[i], self.mid[i], self.anchors[i],
                           self.ds[i], self.mid_s[i], self.mom_anchors[i])
        em.barrier()
        for i, wd in enumerate(self.wdims):
            for lft, rgt in _pairs(fo, i):
                _pair_bwd(em, wd, facs[i], lft, rgt, self.ddl[i], self.dx[i], self.mid[i], self.anchors[i],
                          self.mid_s[i], self.mom_anchors[i])
                em.barrier()
        em("tl.store(DGAM + bh * T + tok, dgam)", "tl.store(DKL + (bh * NCH + ci) * BC + rc, dkl)",
           "tl.store(DSC + (bh * NCH + ci) * 3, dgl)")
        if mom:
            em("tl.store(DBM + bh * T + tok, dbm)", "tl.store(DKML + (bh * NCH + ci) * BC + rc, dkml)",
               "tl.store(DSC + (bh * NCH + ci) * 3 + 1, dbl)", "tl.store(DSC + (bh * NCH + ci) * 3 + 2, dthl)")
        return em.lines, scr

    def kernel_b(self):
        """The gradient factors' reverse: dΔ, dX back to k, v, the bias's gates and W_0."""
        em, scr, env, facs = self.start()
        env = dict(env)
        for i in range(self.n_w):
            env[f"ct_delta{i + 1}"], env[f"ct_input{i + 1}"] = self.ddl[i], self.dx[i]
        go = self.printer(em, scr, None).run(self.gvjp, env)
        _copy_tokens(em, "k", go.get("d_k"), _tokens("DK", "k"))
        _copy_tokens(em, "v", go.get("d_v"), _tokens("DV", "v"))
        for j, n in enumerate(n for n in self.coef_order if n not in self.vecs):
            if f"d_{n}" in go:
                v = go[f"d_{n}"]
                if v[0] != "scal":
                    raise Unsupported(f"the gradient of the gate {n} is not a per-token scalar")
                em(f"tl.store(DC + (bh * T + tok) * NC + {j}, tl.load({v[1]} + rc))")
        for n, side in self.vecs.items():  # a channel-wise η or δ: a vector cotangent of the reverse graph, per token
            _copy_tokens(em, side, go.get(f"d_{n}"), _tokens(f"DG_{n}", side))
        for i, wd in enumerate(self.wdims):
            _copy_weight(em, wd, self.mid[i], self.dw[i])
            if self.mom:
                _copy_weight(em, wd, self.mid_s[i], self.ds[i])
        em.barrier()
        for i, wd in enumerate(self.wdims):
            dw = self.dw[i]
            for lft, rgt in _pairs(go, i):
                _each_tile(em, wd, lambda lft=lft, rgt=rgt, wd=wd, dw=dw: em(
                    wstore(dw, wd, "j", "i", wload(dw, wd, "j", "i") + " + "
                           + dot(f"tl.trans({ld(lft, 'j')})", ld(rgt, "i")))))
                em.barrier()
        return em.lines, scr


def _pairs(outputs: dict, i: int) -> list:
    """The pairs (L, R) of a reverse-mode graph's cotangent Σ L Rᵀ of weight i."""
    out, j = [], 0
    while f"outer{i}_{j}_l" in outputs:
        out.append((outputs[f"outer{i}_{j}_l"], outputs[f"outer{i}_{j}_r"]))
        j += 1
    return out


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
            em(f"{tmp} = {fac_tile}", f"acc += {dot(tmp, weight(dw))}")
            if ds:
                em(f"acc_s += {dot(tmp, weight(ds))}")

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
        em(f"rx += {dot(ld(rgt, 'i'), 'tl.trans(' + ld(x, 'i') + ')')}")
    with em.loop(rows, "j"):
        em(f"lx += {dot(ld(lft, 'j'), 'tl.trans(' + ld(dl, 'j') + ')')}")
    _kmat(em)
    em("_pk = DKMAT + ((bh * NCH + ci) * BC + rc[:, None]) * BC + rc[None, :]",
       "tl.store(_pk, tl.load(_pk) + lx * rx)", "rxk = tl.trans(kmat * rx)", "lxk = tl.trans(kmat * lx)")
    with em.loop(rows, "j"):
        em(f"_l = {ld(lft, 'j')}", st(ddl, "j", f"{ld(ddl, 'j')} + {dot('rxk', '_l')}"),
           f"acc = tl.zeros([BC, {TILE[rows]}], tl.float32)")
        if dsn:
            em(f"acc_s = tl.zeros([BC, {TILE[rows]}], tl.float32)")
        with em.loop(cols, "i"):
            em(f"_r = {ld(rgt, 'i')}", f"acc += {dot('_r', 'tl.trans(' + wload(w0, wd, 'j', 'i') + ')')}")
            if dsn:
                em(f"acc_s += {dot('_r', 'tl.trans(' + wload(s0, wd, 'j', 'i') + ')')}")
        em("dgam += tl.sum(_l * acc, axis=1)")
        if dsn:
            em("dbm += tl.sum(_l * acc_s, axis=1)")
    with em.loop(cols, "i"):
        em(st(dx, "i", f"{ld(dx, 'i')} + {dot('lxk', ld(rgt, 'i'))}"))
    with em.loop(rows, "j"):
        em(f"_lg = tl.trans({ld(lft, 'j')} * gam)")
        if dsn:
            em(f"_lb = tl.trans({ld(lft, 'j')} * bm)")
        with em.loop(cols, "i"):
            em(f"_r = {ld(rgt, 'i')}", wstore(dwn, wd, "j", "i", f"{wload(dwn, wd, 'j', 'i')} + {dot('_lg', '_r')}"))
            if dsn:
                em(wstore(dsn, wd, "j", "i", f"{wload(dsn, wd, 'j', 'i')} + {dot('_lb', '_r')}"))
