"""The retentions of the language, one class each (docs/semantics.md, step 4 "Retention"): the parameters a spec
gives it, and the facts about it that decide how the rest of the compiler computes it. A new retention is one class
here, registered in RETENTIONS; the derivation, the code generators, the plan and the legality rules read these facts
(only the maps that do not act entry by entry — lq's norm, kl's softmax, Bregman's mirror map — and decay's order
are written out by name where they are printed: codegen/triton_retention.py, the torch template).

Every retention turns the learner's update U_t into the next weights. The facts:
- `gated`: a retention factor α_t scales the state (decay) or the accumulator (lq, kl, elastic, box) at each
  token; α is a gate unless the spec makes it a number or a per-head constant (undeclared: 1).
- `linear`: W_t is linear in W_{t−1} and U_t (none, decay). Only these have chunked forms, nonparametric memories,
  the implicit step and the generalized delta transition.
- `mapped`: the weights are a nonlinear map of an accumulator, W_t = R(Y_t), with Y_t = α_t Y_{t−1} + U_t (lq, kl,
  elastic, box; Bregman's Y_t = φ'(W_{t−1}) + U_t without α).
- `keeps_accumulator`: Y is carried in the state beside W (A_<name>), because R cannot be inverted (lq's
  normalisation, the flat regions of elastic and box); kl and Bregman recompute Y from W (log(W/c), φ'(W)).
- `decays_first`, `decays_last`: a decay applied before the gradient, which then sees the decayed state W_{t−1} D_t
  (decay, order=pre), or after the update (order=post); neither for every other retention.
- `entrywise()`: R as a SymPy expression in one accumulator entry `a`, where R acts on each entry alone
  (elastic, box); the torch and Triton paths print it, and its derivative, from this one expression.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import Field

from mirasc.language.form import GATE, Coef, Form

if TYPE_CHECKING:
    import sympy as sp


def accumulator_entry() -> sp.Symbol:
    """An entry a of the accumulator A, the argument of an entrywise map. (SymPy is imported where a map is
    built, not with the language: `mirasc check` and `--help` run without it.)"""
    import sympy as sp

    return sp.Symbol("a", real=True)


class Retention(Form):
    gated: ClassVar[bool] = True
    linear: ClassVar[bool] = False
    mapped: ClassVar[bool] = True
    keeps_accumulator: ClassVar[bool] = False
    map_name: ClassVar[str] = ""   # the emitted function that applies an entrywise map R to an accumulator
    map_doc: ClassVar[str] = ""    # R in words, its docstring
    decays_first: ClassVar[bool] = False
    decays_last: ClassVar[bool] = False

    def entrywise(self) -> sp.Expr | None:
        """R(a) for a map that acts on each accumulator entry alone; None for any other retention."""
        return None


class NoRetention(Retention):
    kind: Literal["none"] = "none"
    gated: ClassVar[bool] = False
    linear: ClassVar[bool] = True
    mapped: ClassVar[bool] = False


class Decay(Retention):
    kind: Literal["decay"] = "decay"
    alpha: Coef = GATE
    order: Literal["post", "pre"] = "post"
    linear: ClassVar[bool] = True
    mapped: ClassVar[bool] = False

    @property
    def decays_first(self) -> bool:
        return self.order == "pre"

    @property
    def decays_last(self) -> bool:
        return self.order == "post"


class Lq(Retention):
    kind: Literal["lq"] = "lq"
    q: Annotated[float, Field(gt=1, le=64)]
    alpha: Coef = GATE
    keeps_accumulator: ClassVar[bool] = True


class KL(Retention):
    kind: Literal["kl"] = "kl"
    c: Annotated[float, Field(gt=0)] = 1.0
    alpha: Coef = GATE


class Elastic(Retention):
    """W = sign(A)·max(|A| − λ, 0): the soft threshold, the proximal map of λ‖·‖₁ at the accumulator."""

    kind: Literal["elastic"] = "elastic"
    lam: Annotated[float, Field(ge=0)]
    alpha: Coef = GATE
    keeps_accumulator: ClassVar[bool] = True
    map_name: ClassVar[str] = "_elastic_shrink"
    map_doc: ClassVar[str] = "sign(a)·max(|a| − λ, 0)."

    def entrywise(self) -> sp.Expr:
        import sympy as sp

        a = accumulator_entry()
        return sp.sign(a) * sp.Max(sp.Abs(a) - sp.Float(self.lam), 0)


class Box(Retention):
    """W = max(−r, min(A, r)): the minimiser of ½‖W − A‖² over the box |w| ≤ r (the ℓ∞ ball), the accumulator
    projected onto it; every weight stays within ±r however many updates pile up."""

    kind: Literal["box"] = "box"
    radius: Annotated[float, Field(gt=0)]
    alpha: Coef = GATE
    keeps_accumulator: ClassVar[bool] = True
    map_name: ClassVar[str] = "_box_clip"
    map_doc: ClassVar[str] = "max(−r, min(a, r)), the projection onto the box |w| ≤ r."

    def entrywise(self) -> sp.Expr:
        import sympy as sp

        r = sp.Float(self.radius)
        return sp.Max(-r, sp.Min(accumulator_entry(), r))


class Bregman(Retention):
    kind: Literal["bregman"] = "bregman"
    phi: Any  # a sympy expression in the symbol `w`
    gated: ClassVar[bool] = False


RETENTIONS: dict[str, type[Retention]] = {
    "none": NoRetention, "decay": Decay, "lq": Lq, "kl": KL, "elastic": Elastic, "box": Box, "bregman": Bregman}
AnyRetention = Union[tuple(RETENTIONS.values())]  # noqa: UP007  (the spec's retention field: any registered one)
