"""The learners of the language, one class each (docs/semantics.md, step 3 "Learner"): how the memory's update
U_t follows from the gradient g_t of the inner loss, its parameters, and the facts about it the rest of the compiler
reads. A new learner is one class here, registered in LEARNERS.

- `momentum_buffer`: a buffer S_i per weight is carried in the state (momentum, muon), so a token's sub-steps
  (`steps=n`) have no defined meaning with it.
- `proximal`: the step is the exact minimiser of ℓ(W) + (1/2η_t)‖W − W_{t−1}‖² (implicit): the derivation passes
  the bias's derivative through the proximal map, which exists in closed form only for some biases
  (`Bias.proximal_step`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Field

from mirasc.language.form import GATE, Coef, Form


class Learner(Form):
    momentum_buffer: ClassVar[bool] = False
    proximal: ClassVar[bool] = False

    def hidden(self, param: str, value: Any) -> bool:
        return param == "steps" and value == 1  # one inner step per token


# Inner gradient steps per token (a multi-step learner, Gated DeltaProduct): the token's n (key, value) pairs are
# taken one after another, each step at the state the previous one left (docs/semantics.md, "Multi-step learners").
Steps = Annotated[int, Field(ge=1, le=64)]


class GD(Learner):
    kind: Literal["gd"] = "gd"
    lr: Coef = GATE
    steps: Steps = 1


class Momentum(Learner):
    kind: Literal["momentum"] = "momentum"
    lr: Coef = GATE
    theta: Coef = GATE
    steps: Steps = 1  # accepted by the grammar so that steps > 1 is rejected with its reason (legality.py)
    momentum_buffer: ClassVar[bool] = True


class Muon(Learner):
    """Atlas' inner optimiser: S_t = θ_t S_{t-1} + ∇ℓ_t, U_t = -η_t NS_k(S_t), the momentum orthogonalised by
    `ns_steps` quintic Newton–Schulz iterations, each weight matrix on its own (docs/semantics.md, "Muon")."""

    kind: Literal["muon"] = "muon"
    lr: Coef = GATE
    theta: Coef = GATE
    ns_steps: Annotated[int, Field(ge=1, le=32)] = 5
    steps: Steps = 1  # accepted by the grammar so that steps > 1 is rejected with its reason (legality.py)
    momentum_buffer: ClassVar[bool] = True


class Implicit(Learner):
    kind: Literal["implicit"] = "implicit"
    lr: Coef = GATE
    steps: Steps = 1
    proximal: ClassVar[bool] = True


class Precond(Learner):
    """A diagonal preconditioned learner (docs/semantics.md, "Preconditioned learner"): a second-moment statistic of
    the gradient's key-side factor per key channel, a_t = ν_t a_{t−1} + ρ_t k_t², and the step of gd with the key
    channel learning rate η_t·m(a_t): `transform=atk` FLA's ATK squash (preconditioned Gated DeltaNet / KDA),
    m(a) = base^(−r/(1+|r|)), r = log(a + eps) − center; `transform=rms` m(a) = (a + eps)^(−1/2) (RMSprop / Adagrad).
    For a linear memory the gradient is e kᵀ, so the statistic never reads the memory and the step stays chunkable:
    the op runs gd(lr=gate(k)) with η_t ⊙ m(a_t) (`Spec.inner_spec`)."""

    kind: Literal["precond"] = "precond"
    lr: Coef = GATE
    nu: Coef = GATE   # ν_t: the statistic's decay (FLA: e^{g_atk}); 1 with rho=1 is Adagrad's plain running sum
    rho: Coef = GATE  # ρ_t: the statistic's rate (FLA: β_atk); 1 − ν for an exponential moving average
    transform: Literal["atk", "rms"] = "rms"
    base: Annotated[float, Field(gt=1, le=1e6)] = 1.5          # atk: m ranges over (1/base, base)
    center: Annotated[float, Field(ge=-100, le=100)] = -0.2    # atk: log a at which m = 1
    eps: Annotated[float, Field(gt=0, le=1)] = 1e-6            # > 0: m(0) is finite (the statistic starts at 0)

    def hidden(self, param: str, value: Any) -> bool:
        return self.transform == "rms" and param in PRECOND_ATK_PARAMS  # (legality.py rejects them changed)


# The atk-only parameters and their defaults (rejected with transform=rms unless left at them).
PRECOND_ATK_PARAMS = ("base", "center")


class NonparametricLearner(Learner):
    kind: Literal["nonparametric"] = "nonparametric"





LEARNERS: dict[str, type[Learner]] = {"gd": GD, "momentum": Momentum, "implicit": Implicit, "muon": Muon,
                                      "precond": Precond, "nonparametric": NonparametricLearner}
AnyLearner = Union[tuple(LEARNERS.values())]  # noqa: UP007  (the spec's learner field: any registered one)
