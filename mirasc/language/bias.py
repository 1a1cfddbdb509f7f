"""The attentional biases of the language, one class each (docs/semantics.md, step 2 "Attentional bias"): the
inner loss ℓ of the memory's output y = M(k) against the value v, its parameters, and what the rest of the compiler
needs to know about it. A new bias is one class here, registered in BIASES.

Each bias gives its loss as SymPy (`inner_loss()`), per coordinate in the residual e = y − v (or in y and v), with the
derivative where it is written directly rather than differentiated, and the facts:
- `proximal_step`: the implicit learner has a closed-form proximal step for it (the residual e* solving
  e* + c·ℓ'(e*) = e is derived per branch of ℓ'): dot, l2, coordinate-wise Huber.
- `reads_error_norm`: its derivative reads the norm of the whole error vector ‖e‖ (Yaad's Huber mixture), so the
  memory's value rows do not update on their own.
Every bias also takes the Omega rule's `window` and `gamma` (docs/semantics.md, "The Omega rule").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import Field

from mirasc.language.form import GATE, GATE_FORMS, Coef, Form, PerHead, format_number

if TYPE_CHECKING:
    import sympy as sp


@dataclass(frozen=True)
class Loss:
    """ℓ per coordinate (None where only the derivative is defined), dℓ/dy where it is given rather than
    differentiated from ℓ (None: SymPy differentiates ℓ in e), and ℓ in words for a module's docstring."""

    loss: sp.Expr | None
    derivative: sp.Expr | None
    text: str


def symbols():
    """The symbols a loss is written in: e (the residual M(k) − v, one coordinate), y (the memory's output), v (the
    value), enorm (‖e‖₂ of the token's residual) and delta (a Huber threshold given per token). SymPy is imported
    here, not with the language: `mirasc check` runs without it."""
    import sympy as sp

    return (sp.Symbol("e", real=True), sp.Symbol("y", real=True), sp.Symbol("v", real=True),
            sp.Symbol("enorm", nonnegative=True), sp.Symbol("delta", positive=True))


class Bias(Form):
    proximal_step: ClassVar[bool] = False
    reads_error_norm: ClassVar[bool] = False

    def hidden(self, param: str, value: Any) -> bool:
        return (param == "window" and value == 1) or (param == "gamma" and value == 1.0)  # no Omega rule

    def inner_loss(self) -> Loss:
        raise NotImplementedError


class Dot(Bias):
    kind: Literal["dot"] = "dot"
    # the Omega rule (Atlas): ℓ_t sums this bias over the last `window` tokens, token i weighted by γ_i (`gamma`)
    window: Annotated[int, Field(ge=1, le=64)] = 1
    gamma: Coef = 1.0

    proximal_step: ClassVar[bool] = True

    def inner_loss(self) -> Loss:
        e, y, v, enorm, delta = symbols()
        return Loss(-y * v, -v, "ℓ = -⟨M(k), v⟩")


class L2(Bias):
    """½‖e‖². `read=kappa` reads the memory for the error at a separate regression key κ (an input of the op) and
    steps along the write key k (Comba); `erase=kappa` erases what is stored at κ and writes v along k (RWKV-7):
    the generalized delta transition W_t = W_{t-1}(diag(w_t) - a_t b_tᵀ) + v_t k_tᵀ (docs/semantics.md)."""

    kind: Literal["l2"] = "l2"
    read: Literal["key", "kappa"] = "key"
    erase: Literal["key", "kappa"] = "key"
    # the Omega rule (Atlas): ℓ_t sums this bias over the last `window` tokens, token i weighted by γ_i (`gamma`)
    window: Annotated[int, Field(ge=1, le=64)] = 1
    gamma: Coef = 1.0

    proximal_step: ClassVar[bool] = True

    def hidden(self, param: str, value: Any) -> bool:
        return super().hidden(param, value) or (param in ("read", "erase") and value == "key")

    def inner_loss(self) -> Loss:
        e, y, v, enorm, delta = symbols()
        if self.erase == "kappa":
            # the erase half: ℓ = ½‖M(κ)‖² (regress what κ reads to 0); the write v kᵀ is added by the transition
            return Loss(y**2 / 2, y, "erase ℓ = ½‖M(κ)‖², write + v kᵀ (the generalized delta transition)")
        text = "ℓ = ½‖e‖², e = M(κ) − v read at κ, stepped along k" if self.read == "kappa" else "ℓ = ½‖e‖²"
        return Loss(e**2 / 2, None, text)


class Lp(Bias):
    kind: Literal["lp"] = "lp"
    p: Annotated[float, Field(ge=1, le=64)]
    eps: Annotated[float, Field(ge=0, le=1)] = 1e-6
    # the Omega rule (Atlas): ℓ_t sums this bias over the last `window` tokens, token i weighted by γ_i (`gamma`)
    window: Annotated[int, Field(ge=1, le=64)] = 1
    gamma: Coef = 1.0

    def inner_loss(self) -> Loss:
        import sympy as sp

        from mirasc.language.primitives import apow

        e, y, v, enorm, delta = symbols()
        p, eps = sp.nsimplify(self.p), sp.Float(self.eps) if self.eps else sp.Integer(0)
        loss = apow(e, p) / p if eps == 0 else (e**2 + eps) ** (p / 2) / p
        text = f"ℓ = (1/p) Σᵢ (eᵢ² + eps)^(p/2), p = {format_number(self.p)}, eps = {format_number(self.eps)}"
        return Loss(loss, None, text)


class Huber(Bias):
    kind: Literal["huber"] = "huber"
    delta: Coef = GATE
    mode: Literal["coordinate", "mixture"] = "coordinate"
    # the Omega rule (Atlas): ℓ_t sums this bias over the last `window` tokens, token i weighted by γ_i (`gamma`)
    window: Annotated[int, Field(ge=1, le=64)] = 1
    gamma: Coef = 1.0

    @property
    def proximal_step(self) -> bool:  # coordinate-wise only: the mixture switches on ‖e‖
        return self.mode == "coordinate"

    @property
    def reads_error_norm(self) -> bool:
        return self.mode == "mixture"

    def inner_loss(self) -> Loss:
        import sympy as sp

        e, y, v, enorm, delta = symbols()
        # δ: a gate (or a per-head constant, filled like one) is the symbol; a number is itself
        dlt = delta if self.delta in GATE_FORMS or isinstance(self.delta, PerHead) else sp.Float(self.delta)
        if self.mode == "coordinate":
            loss = sp.Piecewise((e**2 / 2, sp.Abs(e) <= dlt), (dlt * (sp.Abs(e) - dlt / 2), True))
            return Loss(loss, None, "ℓ = Σᵢ H_δ(eᵢ),  H_δ(a) = ½a² if |a| ≤ δ else δ(|a| − ½δ)")
        return Loss(None, sp.Piecewise((e, enorm <= dlt), (dlt * sp.sign(e), True)),
                    "∇ℓ = ∇½‖e‖² if ‖e‖₂ ≤ δ else δ·∇Σᵢ|eᵢ|   (Yaad's smooth mixture)")


class Custom(Bias):
    kind: Literal["custom"] = "custom"
    loss: Any  # a sympy expression in the symbol `e`
    # the Omega rule (Atlas): ℓ_t sums this bias over the last `window` tokens, token i weighted by γ_i (`gamma`)
    window: Annotated[int, Field(ge=1, le=64)] = 1
    gamma: Coef = 1.0

    def inner_loss(self) -> Loss:
        import sympy as sp

        e, y, v, enorm, delta = symbols()
        loss = self.loss.subs(sp.Symbol("e", real=True), e)
        return Loss(loss, None, f"ℓ = Σᵢ f(eᵢ),  f(e) = {loss}")


BIASES: dict[str, type[Bias]] = {"dot": Dot, "l2": L2, "lp": Lp, "huber": Huber, "custom": Custom}
AnyBias = Union[tuple(BIASES.values())]  # noqa: UP007  (the spec's bias field: any registered one)
