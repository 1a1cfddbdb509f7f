"""A retention's part of the fused recurrent Triton kernels, one printer per readout map (as SymPy keeps one
printer method per node): for a retention whose weights are a map of an accumulator, w = R(y) (docs/semantics.md,
step 4), the accumulator's tile at the start (`image`: loaded where the state keeps it, else recomputed from the
weights), the readout (`readout`), its reverse (`reverse`: the accumulator's cotangent dy + R'(y)ᵀ dw) and the
initial weights' cotangent through the recomputed image (`initial_cotangent`). Tiles are named by weight i: w<i>,
y<i>, mask<i>; dw<i>, dy<i> in the backward. `for_spec` picks the printer; a retention without a map has none."""

from __future__ import annotations

import sympy as sp

from .. import derive as D
from .. import ir
from ..derive import Derivation
from ..language import spec as S
from ..printers import print_triton_block
from .triton_printing import state_tile


class Readout:
    """The accumulator is kept in the state (language/retention.py: `keeps_accumulator`) and loaded as it is."""

    def __init__(self, spec: S.Spec, d: Derivation):
        self.r, self.d, self.wdims = spec.retention, d, spec.weight_dims()

    def tile(self, base: str, i: int) -> str:
        return state_tile(self.wdims, base, i)

    def image(self, i: int) -> list[str]:
        return [f"y{i} = tl.load({self.tile(f'Y{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)"]

    def initial_cotangent(self, i: int) -> list[str]:
        return []  # (a kept accumulator's own cotangent is stored beside the weights')


class Entrywise(Readout):
    """R acts on each entry alone: the retention's entrywise map of its accumulator (elastic, box)."""

    def expression(self) -> tuple[sp.Expr, sp.Symbol]:
        return self.d.entrywise, D.a

    def readout(self, i: int) -> list[str]:
        expr, sym = self.expression()
        return (print_triton_block({f"w{i}": expr}, {sym: f"y{i}"}, prefix=f"_w{i}_")
                + [f"w{i} = tl.where(mask{i}, w{i}, 0.0)"])

    def reverse(self, i: int) -> list[str]:
        expr, sym = self.expression()
        dexpr = ir._clean_derivative(sp.diff(expr, sym))  # R'(y)
        return print_triton_block({f"rprime{i}": dexpr}, {sym: f"y{i}"}, prefix=f"_rp{i}_") + \
            [f"dyv{i} = dy{i} + rprime{i} * dw{i}"]


class Bregman(Entrywise):
    """w = (φ')⁻¹(y), the accumulator y = φ'(w) recomputed from the weights."""

    def expression(self) -> tuple[sp.Expr, sp.Symbol]:
        return self.d.phi_prime_inv, D.u

    def image(self, i: int) -> list[str]:
        return print_triton_block({f"y{i}": self.d.phi_prime}, {D.w: f"w{i}"}, prefix=f"_y{i}_") + \
            [f"y{i} = tl.where(mask{i}, y{i}, 0.0)"]

    def initial_cotangent(self, i: int) -> list[str]:
        return ([f"w_init{i} = tl.load({self.tile(f'W{i}_in', i)}, mask=mask{i}, other=0.0).to(tl.float32)"]
                + print_triton_block({f"phi2_{i}": ir._clean_derivative(sp.diff(self.d.phi_prime, D.w))},
                                     {D.w: f"w_init{i}"}, prefix=f"_p2{i}_")
                + [f"dw{i} = dw{i} + tl.where(mask{i}, phi2_{i} * dy{i}, 0.0)"])


class Lq(Readout):
    """w = y / ‖y‖_q^(q−2), the q-norm over the whole matrix."""

    def readout(self, i: int) -> list[str]:
        q, y = float(self.r.q), f"y{i}"
        return [f"nrm{i} = tl.sum(tl.sum(tl.where(mask{i}, tl.exp({q!r} * tl.log(tl.abs({y}))), 0.0), axis=1), axis=0)",
                f"nrm{i} = tl.maximum(tl.exp(tl.log(nrm{i}) / {q!r}), 1e-30)",
                f"w{i} = {y} * tl.exp(-{q - 2!r} * tl.log(nrm{i}))"]

    def reverse(self, i: int) -> list[str]:
        # W = c Y with c = ‖Y‖_q^{-(q-2)}: dY = c dW - (q-2) c ‖Y‖_q^{-q} ⟨dW, Y⟩ sign(Y)|Y|^{q-1}
        qq = float(self.r.q)
        return [f"cq{i} = tl.exp(-{qq - 2!r} * tl.log(nrm{i}))",
                f"ip{i} = tl.sum(tl.sum(dw{i} * y{i}, axis=1), axis=0)",
                f"sp{i} = tl.where(mask{i}, tl.where(y{i} < 0, -1.0, 1.0) * "
                f"tl.exp({qq - 1!r} * tl.log(tl.where(mask{i}, tl.abs(y{i}), 1.0))), 0.0)",
                f"dyv{i} = dy{i} + cq{i} * dw{i} - {qq - 2!r} * cq{i} * tl.exp(-{qq!r} * tl.log(nrm{i})) "
                f"* ip{i} * sp{i}"]


class KL(Readout):
    """w = c·softmax(y) over each row, the accumulator y = log(w / c) recomputed from the weights."""

    def image(self, i: int) -> list[str]:
        return [f"y{i} = tl.where(mask{i}, tl.log(tl.where(mask{i}, w{i}, 1.0) / {float(self.r.c)!r}), 0.0)"]

    def readout(self, i: int) -> list[str]:
        return [f"ym{i} = tl.where(mask{i}, y{i}, -float('inf'))",
                f"ex{i} = tl.exp(ym{i} - tl.max(ym{i}, axis=1)[:, None])",
                f"w{i} = tl.where(mask{i}, {float(self.r.c)!r} * ex{i} / tl.sum(ex{i}, axis=1)[:, None], 0.0)"]

    def reverse(self, i: int) -> list[str]:  # W = c softmax_row(Y): dY = c S ∘ (dW - rowsum(dW ∘ S))
        cc = float(self.r.c)
        return [f"sm{i} = tl.where(mask{i}, w{i} / {cc!r}, 0.0)",
                f"rs{i} = tl.sum(dw{i} * sm{i}, axis=1)",
                f"dyv{i} = dy{i} + {cc!r} * sm{i} * (dw{i} - rs{i}[:, None])"]

    def initial_cotangent(self, i: int) -> list[str]:  # y_0 = log(W_0 / c)
        return [f"w_init{i} = tl.load({self.tile(f'W{i}_in', i)}, mask=mask{i}, other=1.0).to(tl.float32)",
                f"dw{i} = dw{i} + tl.where(mask{i}, dy{i} / w_init{i}, 0.0)"]


def for_spec(spec: S.Spec, d: Derivation) -> Readout | None:
    """The printer of the spec's readout map; None where the weights are the state (no map)."""
    r = spec.retention
    if not r.mapped:
        return None
    if d.entrywise is not None:
        return Entrywise(spec, d)
    return {"lq": Lq, "kl": KL, "bregman": Bregman}[r.kind](spec, d)
