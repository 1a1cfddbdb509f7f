"""A learner's part of the torch module's token recurrence (docs/semantics.md, step 3): from the gradient `grad` of
weight i to its update U (`update`), one printer per learner, filled into the template's learner hooks like the
retention's (codegen/torch_retention.py). The coefficients are read from a dict whose name the hook gives (`c_t` in
the token step, `g1` in a chunk readout's lag token). A momentum buffer S_i, where a learner keeps one, is carried
by the template (`has_S`: language/learner.py's `momentum_buffer`)."""

from __future__ import annotations

from ..language import spec as S


class GD:
    """U = −η g (gd; implicit too: its proximal factor is in the gradient graph, docs/semantics.md)."""

    def step(self, c: str) -> list[str]:
        return [f'update = -{c}["eta"] * grad']


class Momentum(GD):
    """S_t = θ_t S_{t−1} − η_t g_t, U = S_t."""

    def step(self, c: str) -> list[str]:
        return [f'S[i] = _on_weight("theta", {c}["theta"]) * S[i] - {c}["eta"] * grad', "update = S[i]"]


class Muon(GD):
    """S_t = θ_t S_{t−1} + g_t, U = −η_t NS(S_t): Newton–Schulz of the momentum (Atlas Eqs. 32-33)."""

    def step(self, c: str) -> list[str]:
        return [f'S[i] = _on_weight("theta", {c}["theta"]) * S[i] + grad  # Atlas Eq. 33: momentum of the raw '
                "gradient",
                f'update = -{c}["eta"] * _newton_schulz(S[i])  # Eq. 32: the orthogonalised momentum, scaled by η_t']


def for_spec(spec: S.Spec) -> GD:
    return {"momentum": Momentum, "muon": Muon}.get(spec.learner.kind, GD)()


def hooks(printer: GD) -> dict[str, list[str]]:
    """The template's learner hooks and their lines: the token step's, and a chunk readout's lag token's."""
    return {"LEARNER_STEP": printer.step("c_t"), "LEARNER_LAG_STEP": printer.step("g1")}
