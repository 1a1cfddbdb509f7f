"""A learner's part of the torch module's token recurrence (docs/semantics.md, step 3): from the gradients of the
weights to their updates U, one printer per learner. Each gives its parameters' module constants (`header`) and the
body of `_learn(grads, S, c)` (the gradients, the
momentum buffers S where the learner keeps them, else None, and the token's coefficients; it returns the updates and
the buffers), which mirasc.runtime.token_step calls once per token and a chunk readout's lag token once per chunk;
codegen/torch_retention.py prints it with the retention's functions."""

from __future__ import annotations

from ..language import spec as S
from ..runtime.memory_spec import NS_COEFFICIENTS


class GD:
    """U = −η g (gd; implicit too: its proximal factor is in the gradient graph, docs/semantics.md)."""

    doc = "gd: U = −η g."

    def __init__(self, spec: S.Spec):
        self.l = spec.learner

    def header(self) -> dict[str, str]:
        """The values of the learner's module constants (none for most; what they mean: mirasc.runtime.memory_spec)."""
        return {}

    def learn(self) -> list[str]:
        return ['return [-c["eta"] * grad for grad in grads], S']


class Momentum(GD):
    """S_t = θ_t S_{t−1} − η_t g_t, U = S_t."""

    doc = "momentum: S_t = θ_t S_{t−1} − η_t g_t, U = S_t."

    def learn(self) -> list[str]:
        return ['S = [_on_weight("theta", c["theta"]) * s - c["eta"] * grad for s, grad in zip(S, grads)]',
                "return S, S"]


class Muon(GD):
    """S_t = θ_t S_{t−1} + g_t, U = −η_t NS(S_t): Newton–Schulz of the momentum (Atlas Eqs. 32-33)."""

    doc = "muon: S_t = θ_t S_{t−1} + g_t, U = −η_t NS(S_t)."

    def header(self) -> dict[str, str]:
        return {"NS_STEPS": str(self.l.ns_steps), "NS_COEFFICIENTS": repr(NS_COEFFICIENTS)}

    def learn(self) -> list[str]:
        return ['S = [_on_weight("theta", c["theta"]) * s + grad for s, grad in zip(S, grads)]  # Atlas Eq. 33: '
                "momentum of the raw gradient",
                'return [-c["eta"] * _newton_schulz(s) for s in S], S  # Eq. 32: the orthogonalised momentum, scaled '
                "by η_t"]


def for_spec(spec: S.Spec) -> GD:
    return {"momentum": Momentum, "muon": Muon}.get(spec.learner.kind, GD)(spec)
