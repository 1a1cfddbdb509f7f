"""Mini-batch (dual-form) Triton kernels, forward and backward, printed from the IR.

For `parallel=minibatch(C)` every gradient in a chunk of C tokens is taken at the chunk's anchor
state W_0 (and S_0, the momentum), so with identity readout (retention none or decay; learner gd
or momentum) each weight is, at token t of the chunk,

    W_t = γ_t W_0 + b_t S_0 + Σ_{r<=t} K[t, r] δ_r x_rᵀ                                         (1)

with (δ_r, x_r) the gradient factors of token r at W_0 (the `memory_grad` graph on a [C, n] tile:
the MLP on C keys, the bias derivative, LayerNorm and activation backward, as matmuls) and γ, b, K
from the decay and momentum segment products (a chunk-local, differentiable torch preparation). A
matmul of the read with the per-token weights (1) is then a sum of three matmuls:

    layer_i(H)     = γ ∘ H W_0ᵀ + b ∘ H S_0ᵀ + (K ∘ H Xᵀ) Δ                                     (2)
    linear_t_i(G)  = γ ∘ G W_0  + b ∘ G S_0  + (K ∘ G Δᵀ) X

so the `memory_forward` graph prints as the chunk's outputs with (2) for each weight. The chunk end
is (1) at the chunk's last token. The backward walks the chunks in reverse from checkpoints of W_0
and S_0 (O(T/C · state) memory): the reverse-mode graph of the read (`ir.vjp(memory_forward)`,
printed with (2)) gives dq and, per weight, pairs (L, R) with ∂ℓ/∂W_t = L_t R_tᵀ; those flow through
(1) into W_0, S_0, Δ, X, K, γ and b; then `ir.vjp(memory_grad)` carries dΔ and dX back to k, v,
the bias's gates and W_0. Torch autograd carries dK, dγ, db through the preparation into η, α, θ.

Schedules (the template's `_mb_schedule`). "tile": one program per (batch, head) holds every weight as one
register tile (no tiling of the hidden width); its shared memory and registers grow with the state, so only
the interpreter uses it (small states); on a GPU it spills even at D = 16. "stream"
(triton_minibatch_stream.py): the weights stay in global memory (the W_0 checkpoints) and every dimension
is walked in tiles, so the on-chip footprint depends only on the chunk tile BC and the tile width; this is
what runs Titans, TTT-MLP and Yaad at D = 128, E = 512. Both print the same IR graphs.
Channel-wise coefficients (docs/semantics.md: channel-wise gates): `lr=gate(v)` (`lr=gate(k)` on a linear memory) and
`huber(delta=gate(v))` are inputs of `memory_grad` (`eta_ch` weights dℓ/dy, or the first layer's input
η ⊙ k; `delta` is the Huber threshold), so the kernels load them as [C, n] token tiles like k and v and
take their cotangents from `ir.vjp(memory_grad)` with them as vector inputs; the per-head η of the
preparation is then 1. A channel-wise α or θ would make K one [C, C] matrix per channel: refused.
The Omega rule (window=c) runs on these kernels unchanged: the module's _on_chunk_kernels presents token t as c
kernel rows (row j: window token t − c + 1 + j with rate η_t γ_i; α_t and θ_t on row 0, q_t on row c − 1), so a
mini-batch of C tokens is one kernel chunk of C·c rows and every window token's factors are taken at its anchor,
previous mini-batch's included; with momentum the preparation adds S to W on a step's last row only (S_t then
sums the step's c rows). A channel-wise coefficient inside the window is refused by the module (triton_backend).
A chunk is one tile of BC = max(16, next_pow2(C)) rows (tl.dot's minimum is 16): the torch glue pads
each chunk with BC - C rows whose K rows and columns, γ, b and chunk-end weights are zero, so any C works
and padded rows change nothing (their outputs are dropped).
"""

from __future__ import annotations

from pathlib import Path

from .. import ir
from ..derive import Derivation
from ..language import spec as S
from ..plan import minibatch_reason
from . import triton_minibatch_stream as stream
from .standalone import kernels_source, runtime_constants, runtime_source
from .triton_printing import BLOCK, SIZE, Unsupported, graph_lines, indent, jit_kernel, tile_matmul
from .triton_recurrent import vector_coefficients

TEMPLATE = (Path(__file__).parent / "templates" / "triton_minibatch.py.tmpl").read_text()


def vector_inputs(spec: S.Spec) -> dict[str, str]:
    """The channel-wise coefficients the kernels read as [C, n] token tiles of the gradient graph (docs/semantics.md:
    channel-wise gates):
    lr=gate(v|k) as `eta_ch` (dℓ/dy weighted per output channel, or the first layer's input η ⊙ k) and
    huber(delta=gate(v)); name -> the side ("k" or "v") they run over. Their cotangents come out of the
    reverse-mode graph of `memory_grad` like those of k and v."""
    return {n: side for n, side in vector_coefficients(spec).items() if n in ("eta_ch", "delta")}


def _dot(a: str, b: str) -> str:
    return f"_mb_dot({a}, {b}, PREC)"


def _tr(a: str) -> str:
    return f"tl.trans({a})"


CONSTS = ("T, Nk, Nv, Ne, NCH, NC: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, "
          "BE: tl.constexpr, PREC: tl.constexpr")


def emit_minibatch(spec: S.Spec, d: Derivation, forward: ir.Graph, grad: ir.Graph, coef_order: list[str]) -> str:
    """Source of the mini-batch Triton section: the kernels printed for `spec` (for a feature=poly linear memory, its
    plain copy, run on φ_p(q), φ_p(k)) and their host side, mirasc/runtime/minibatch_host.py."""
    reason = minibatch_reason(spec)
    if reason:
        raise Unsupported(reason)
    dual = _DualForm(spec, forward, grad, coef_order)
    kernels = jit_kernel("_minibatch_fwd", dual.forward_params(), dual.forward_body())
    kernels += "\n" + jit_kernel("_minibatch_bwd", dual.backward_params(), dual.backward_body())
    # the streamed kernels (weights in global memory, tiles over every dimension): see triton_minibatch_stream
    fwd_src, fwd_scratch = stream.emit_forward(spec, forward, grad, coef_order, dual.vecs)
    bwd_src, bwd_scratch = stream.emit_backward(spec, forward, grad, coef_order, dual.vecs)
    kernels += "\n" + fwd_src + "\n" + bwd_src
    constants = runtime_constants("minibatch_spec", {"_MB_DECAY": repr(spec.retention.kind == "decay")})
    return (TEMPLATE.replace("{{MB_DOTS}}\n", kernels_source("minibatch") + "\n")
            .replace("{{KERNELS}}", kernels).replace("{{MB_CONSTANTS}}", "\n".join(constants))
            .replace("{{MINIBATCH_HOST}}", runtime_source("minibatch_host"))
            .replace("{{SCRATCH_FWD}}", fwd_scratch).replace("{{SCRATCH_BWD}}", bwd_scratch))


class _DualForm:
    """The single-tile kernels: one program per (batch, head) holds every weight w<i> (and momentum s<i>) as a
    register tile and walks the chunks; a chunk's gradient factors are dl<i>, x<i> ([BC, n] tiles)."""

    def __init__(self, spec: S.Spec, forward: ir.Graph, grad: ir.Graph, coef_order: list[str]):
        self.forward, self.grad, self.coef_order = forward, grad, coef_order
        self.mom = spec.learner.kind == "momentum"
        self.wdims = spec.weight_dims()
        self.n_w = len(self.wdims)
        self.vecs = vector_inputs(spec)  # channel-wise η / δ: [BC, n] tiles the gradient graph reads like k and v
        self.scalars = [n for n in coef_order if n not in self.vecs]
        self.scal = {n: f"c_{n}" for n in self.scalars}
        self.W = [f"w{i}" for i in range(self.n_w)]
        self.tokens = {"k": ("k", "k"), "v": ("v", "v"), **{n: (f"c_{n}", side) for n, side in self.vecs.items()}}
        self.plain = tile_matmul(_dot)  # a matmul on the anchor weights

    def dual(self, op, i, w, h):
        """A matmul on each token's own weights, (2)."""
        mom = self.mom
        if op in ("layer", "linear"):
            terms = [f"gam * {_dot(h, _tr(f'w{i}'))}"] + ([f"bm * {_dot(h, _tr(f's{i}'))}"] if mom else [])
            terms.append(_dot(f"kmat * {_dot(h, _tr(f'x{i}'))}", f"dl{i}"))
        else:
            terms = [f"gam * {_dot(h, f'w{i}')}"] + ([f"bm * {_dot(h, f's{i}')}"] if mom else [])
            terms.append(_dot(f"kmat * {_dot(h, _tr(f'dl{i}'))}", f"x{i}"))
        return " + ".join(terms)

    def tile(self, base, i, slot=None):
        """Weight i's tile in a [B·H, rows, cols] tensor, or in slot `slot` of a [B·H, NCH + 1, ...] checkpoint."""
        rows, cols = self.wdims[i]
        at = "bh" if slot is None else f"(bh * (NCH + 1) + {slot})"
        return f"{base} + {at} * {SIZE[rows]} * {SIZE[cols]} + r{rows}[:, None] * {SIZE[cols]} + r{cols}[None, :]"

    def prologue(self):
        lines = ["bh = tl.program_id(0)", "rc = tl.arange(0, BC)", "rk = tl.arange(0, BK)", "rv = tl.arange(0, BV)",
                 "re = tl.arange(0, BE)", "mk = rk < Nk", "mv = rv < Nv", "me = re < Ne"]
        lines += [f"mask{i} = m{rows}[:, None] & m{cols}[None, :]" for i, (rows, cols) in enumerate(self.wdims)]
        return lines

    def load_chunk(self):
        """Chunk ci's tokens, its dual-form coefficients and the gradient factors of its tokens at the anchor."""
        lines = ["tok = ci * BC + rc",
                 "q = tl.load(Q + (bh * T + tok[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)",
                 "k = tl.load(K + (bh * T + tok[:, None]) * Nk + rk[None, :], mask=mk[None, :], other=0.0)",
                 "v = tl.load(V + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)",
                 "kmat = tl.load(KMAT + ((bh * NCH + ci) * BC + rc[:, None]) * BC + rc[None, :])",
                 "gam = tl.load(GAM + bh * T + tok)[:, None]",
                 "kl = tl.load(KL + (bh * NCH + ci) * BC + rc)",
                 "gl = tl.load(SC + (bh * NCH + ci) * 3)"]
        if self.mom:
            lines += ["bm = tl.load(BM + bh * T + tok)[:, None]",
                      "kml = tl.load(KML + (bh * NCH + ci) * BC + rc)",
                      "bl = tl.load(SC + (bh * NCH + ci) * 3 + 1)",
                      "thl = tl.load(SC + (bh * NCH + ci) * 3 + 2)"]
        lines += [f"c_{n} = tl.load(C + (bh * T + tok) * NC + {j})[:, None]" for j, n in enumerate(self.scalars)]
        lines += [f"c_{n} = tl.load(G_{n} + (bh * T + tok[:, None]) * N{side} + r{side}[None, :], "
                  f"mask=m{side}[None, :], other=0.0)" for n, side in self.vecs.items()]
        # the gradient factors of the chunk's tokens at the anchor: (δ_i, x_i) = (dl_i, x_i)
        g_lines, g_out, _ = graph_lines(self.grad, "g_", self.W, self.scal, self.tokens, self.wdims,
                                        matmul=self.plain)
        lines += g_lines
        for i in range(self.n_w):
            lines += [f"dl{i} = {g_out[f'delta{i + 1}']}", f"x{i} = {g_out[f'input{i + 1}']}"]
        return lines

    def store_weights(self, w_base, s_base, slot=None, w="w", s="s"):
        """Store the tiles w<i> (and the momentum's s<i>) into w_base<i> (s_base<i>), at checkpoint `slot`."""
        lines = []
        for i in range(self.n_w):
            lines.append(f"tl.store({self.tile(f'{w_base}{i}', i, slot)}, {w}{i}, mask=mask{i})")
            if self.mom:
                lines.append(f"tl.store({self.tile(f'{s_base}{i}', i, slot)}, {s}{i}, mask=mask{i})")
        return lines

    # ---- forward

    def forward_params(self) -> str:
        ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in self.vecs], "KMAT", "GAM", "BM", "KL", "KML", "SC", "O"]
        for i in range(self.n_w):
            ptrs += [f"W{i}_in", f"S{i}_in", f"CKW{i}", f"CKS{i}"]
        return ", ".join(ptrs) + ", " + CONSTS

    def forward_body(self) -> list[str]:
        body = self.prologue()
        for i in range(self.n_w):
            body.append(f"w{i} = tl.load({self.tile(f'W{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
            if self.mom:
                body.append(f"s{i} = tl.load({self.tile(f'S{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        loop = self.store_weights("CKW", "CKS", "ci") + self.load_chunk()
        f_lines, f_out, _ = graph_lines(self.forward, "f_", self.W, self.scal, {"x": ("q", "k")}, self.wdims,
                                        matmul=self.dual)
        loop += f_lines
        loop.append(f"tl.store(O + (bh * T + tok[:, None]) * Nv + rv[None, :], {f_out['y']}, mask=mv[None, :])")
        for i in range(self.n_w):  # the chunk end: (1) at its last token
            upd = _dot(_tr(f"dl{i} * kl[:, None]"), f"x{i}")
            if self.mom:
                loop.append(f"w{i} = gl * w{i} + bl * s{i} + {upd}")
                loop.append(f"s{i} = thl * s{i} + {_dot(_tr(f'dl{i} * kml[:, None]'), f'x{i}')}")
            else:
                loop.append(f"w{i} = gl * w{i} + {upd}")
        return body + ["for ci in range(NCH):"] + indent(loop) + self.store_weights("CKW", "CKS", "NCH")

    # ---- backward

    def backward_params(self) -> str:
        ptrs = ["Q", "K", "V", "C", *[f"G_{n}" for n in self.vecs], "KMAT", "GAM", "BM", "KL", "KML", "SC", "DO"]
        for i in range(self.n_w):
            ptrs += [f"CKW{i}", f"CKS{i}", f"DWF{i}", f"DSF{i}", f"DW0_{i}", f"DS0_{i}"]
        ptrs += ["DQ", "DK", "DV", "DC", *[f"DG_{n}" for n in self.vecs], "DKMAT", "DGAM", "DBM", "DKL", "DKML",
                 "DSC"]
        return ", ".join(ptrs) + ", " + CONSTS

    def backward_body(self) -> list[str]:
        """Chunks in reverse from the checkpoints: the read's reverse, the chunk end's, the factors'."""
        body = self.prologue()
        for i in range(self.n_w):
            body.append(f"dw{i} = tl.load({self.tile(f'DWF{i}', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
            if self.mom:
                body.append(f"ds{i} = tl.load({self.tile(f'DSF{i}', i)}, mask=mask{i}, other=0.0).to(tl.float32)")
        loop = ["ci = NCH - 1 - cc"]
        for i in range(self.n_w):
            loop.append(f"w{i} = tl.load({self.tile(f'CKW{i}', i, 'ci')}, mask=mask{i}, other=0.0)")
            if self.mom:
                loop.append(f"s{i} = tl.load({self.tile(f'CKS{i}', i, 'ci')}, mask=mask{i}, other=0.0)")
        loop += self.load_chunk()
        loop += ["do = tl.load(DO + (bh * T + tok[:, None]) * Nv + rv[None, :], mask=mv[None, :], other=0.0)",
                 "dkmat = tl.zeros([BC, BC], tl.float32)", "dgam = tl.zeros([BC], tl.float32)",
                 "dkl = tl.zeros([BC], tl.float32)"]
        if self.mom:
            loop += ["dbm = tl.zeros([BC], tl.float32)", "dkml = tl.zeros([BC], tl.float32)"]
        loop += self.read_reverse() + self.factor_reverse() + self.store_chunk_grads()
        for i in range(self.n_w):
            loop.append(f"dw{i} = dw0_{i}")
            if self.mom:
                loop.append(f"ds{i} = ds0_{i}")
        return body + ["for cc in range(NCH):"] + indent(loop) + self.store_weights("DW0_", "DS0_", w="dw", s="ds")

    def read_reverse(self) -> list[str]:
        """The read o = M_{W_t}(q_t) with (2); its reverse gives dq and ∂ℓ/∂W_t = Σ_j L_j R_jᵀ per weight,
        which flow with the chunk end's cotangent into W_0, S_0, Δ, X, K, γ and b."""
        fvjp = ir.vjp(self.forward, {"y": "ct_y"}, "memory_forward_vjp")
        f_lines, f_out, _ = graph_lines(fvjp, "fb_", self.W, self.scal, {"x": ("q", "k"), "ct_y": ("do", "v")},
                                        self.wdims, matmul=self.dual)
        lines = f_lines + [f"dq = {f_out['d_x']}" if "d_x" in f_out else "dq = tl.zeros([BC, BK], tl.float32)"]
        for i, (rows, cols) in enumerate(self.wdims):
            lines += [f"ddl{i} = tl.zeros([BC, {BLOCK[rows]}], tl.float32)",
                      f"dx{i} = tl.zeros([BC, {BLOCK[cols]}], tl.float32)"]
            lines += self.chunk_end_reverse(i)
            j = 0
            while f"outer{i}_{j}_l" in f_out:  # each (L, R) through (2)
                lines += self.pair_reverse(i, f_out[f"outer{i}_{j}_l"], f_out[f"outer{i}_{j}_r"])
                j += 1
        return lines

    def chunk_end_reverse(self, i: int) -> list[str]:
        """The chunk end (1): W_n = γ_n W_0 + b_n S_0 + Σ_r K[n, r] δ_r x_rᵀ (and S_n = Θ_n S_0 + Σ_r K'[n, r]
        δ_r x_rᵀ), reversed for weight i."""
        lines = [f"xdw = {_dot(f'x{i}', _tr(f'dw{i}'))}",
                 f"ddl{i} += kl[:, None] * xdw",
                 f"dx{i} += kl[:, None] * {_dot(f'dl{i}', f'dw{i}')}",
                 f"dkl += tl.sum(dl{i} * xdw, axis=1)",
                 f"dw0_{i} = gl * dw{i}",
                 f"dgl_{i} = tl.sum(tl.sum(dw{i} * w{i}, axis=1), axis=0)"]
        if self.mom:
            lines += [f"xds = {_dot(f'x{i}', _tr(f'ds{i}'))}",
                      f"ddl{i} += kml[:, None] * xds",
                      f"dx{i} += kml[:, None] * {_dot(f'dl{i}', f'ds{i}')}",
                      f"dkml += tl.sum(dl{i} * xds, axis=1)",
                      f"ds0_{i} = bl * dw{i} + thl * ds{i}",
                      f"dbl_{i} = tl.sum(tl.sum(dw{i} * s{i}, axis=1), axis=0)",
                      f"dthl_{i} = tl.sum(tl.sum(ds{i} * s{i}, axis=1), axis=0)"]
        return lines

    def pair_reverse(self, i: int, lft: str, rgt: str) -> list[str]:
        """One pair (L, R) of the read's ∂ℓ/∂W_t through the dual form (2)."""
        lines = [f"rx = {_dot(rgt, _tr(f'x{i}'))}", f"ld = {_dot(lft, _tr(f'dl{i}'))}",
                 f"dw0_{i} += {_dot(_tr(f'{lft} * gam'), rgt)}",
                 f"ddl{i} += {_dot(_tr('kmat * rx'), lft)}",
                 f"dx{i} += {_dot(_tr('kmat * ld'), rgt)}",
                 "dkmat += ld * rx",
                 f"dgam += tl.sum({lft} * {_dot(rgt, _tr(f'w{i}'))}, axis=1)"]
        if self.mom:
            lines += [f"ds0_{i} += {_dot(_tr(f'{lft} * bm'), rgt)}",
                      f"dbm += tl.sum({lft} * {_dot(rgt, _tr(f's{i}'))}, axis=1)"]
        return lines

    def factor_reverse(self) -> list[str]:
        """The gradient factors: dΔ, dX back to k, v, the bias's gates and the anchor W_0."""
        seeds = {}
        for i in range(self.n_w):
            seeds[f"delta{i + 1}"] = f"ct_delta{i + 1}"
            seeds[f"input{i + 1}"] = f"ct_input{i + 1}"
        gvjp = ir.vjp(self.grad, seeds, "memory_grad_vjp", ir.VECTOR_INPUTS + tuple(self.vecs))
        cts = dict(self.tokens)
        for i, (rows, cols) in enumerate(self.wdims):
            cts[f"ct_delta{i + 1}"] = (f"ddl{i}", rows)
            cts[f"ct_input{i + 1}"] = (f"dx{i}", cols)
        v_lines, v_out, _ = graph_lines(gvjp, "gb_", self.W, self.scal, cts, self.wdims, matmul=self.plain)
        lines = list(v_lines)
        lines.append(f"dk = {v_out['d_k']}" if "d_k" in v_out else "dk = tl.zeros([BC, BK], tl.float32)")
        lines.append(f"dv = {v_out['d_v']}" if "d_v" in v_out else "dv = tl.zeros([BC, BV], tl.float32)")
        for i in range(self.n_w):
            j = 0
            while f"outer{i}_{j}_l" in v_out:
                lines.append(f"dw0_{i} += {_dot(_tr(v_out[f'outer{i}_{j}_l']), v_out[f'outer{i}_{j}_r'])}")
                j += 1
        lines += ["tl.store(DQ + (bh * T + tok[:, None]) * Nk + rk[None, :], dq, mask=mk[None, :])",
                  "tl.store(DK + (bh * T + tok[:, None]) * Nk + rk[None, :], dk, mask=mk[None, :])",
                  "tl.store(DV + (bh * T + tok[:, None]) * Nv + rv[None, :], dv, mask=mv[None, :])"]
        for j, n in enumerate(self.scalars):
            if f"d_{n}" in v_out:  # a gate inside the bias (e.g. Huber's δ): a [BC, 1] per-token scalar
                lines.append(f"tl.store(DC + (bh * T + tok) * NC + {j}, tl.sum({v_out[f'd_{n}']} "
                             f"+ tl.zeros([BC, 1], tl.float32), axis=1))")
        for n, side in self.vecs.items():  # a channel-wise η or δ: its cotangent is a [BC, n] tile of the reverse graph
            val = v_out.get(f"d_{n}", f"tl.zeros([BC, {BLOCK[side]}], tl.float32)")
            lines.append(f"tl.store(DG_{n} + (bh * T + tok[:, None]) * N{side} + r{side}[None, :], {val}, "
                         f"mask=m{side}[None, :])")
        return lines

    def store_chunk_grads(self) -> list[str]:
        """The cotangents of the chunk's dual-form coefficients (torch autograd takes them into η, α, θ)."""
        lines = ["tl.store(DKMAT + ((bh * NCH + ci) * BC + rc[:, None]) * BC + rc[None, :], dkmat)",
                 "tl.store(DGAM + bh * T + tok, dgam)",
                 "tl.store(DKL + (bh * NCH + ci) * BC + rc, dkl)",
                 "tl.store(DSC + (bh * NCH + ci) * 3, " + " + ".join(f"dgl_{i}" for i in range(self.n_w)) + ")"]
        if self.mom:
            lines += ["tl.store(DBM + bh * T + tok, dbm)", "tl.store(DKML + (bh * NCH + ci) * BC + rc, dkml)"]
            lines += [f"tl.store(DSC + (bh * NCH + ci) * 3 + {j}, " + " + ".join(f"{n}_{i}" for i in range(self.n_w))
                      + ")" for j, n in ((1, "dbl"), (2, "dthl"))]
        return lines
