"""What every form of the language is built on: the pydantic base of a form, and the coefficient type its
parameters take (a gate, a channel-wise gate, a number or a per-head constant)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

GATE = "gate"
GATE_K, GATE_V = "gate(k)", "gate(v)"
GATE_FORMS = (GATE, GATE_K, GATE_V)
# The symbols a per-head constant may use: the head's index h = 0..H-1 and the number of heads H.
HEAD_SYMBOLS = ("h", "H")


class PerHead(BaseModel):
    """A coefficient that is constant over tokens but differs per head: an expression in the head index h
    (0-based) and the number of heads H, e.g. RetNet's γ_h = 1 − 2^(−5−h) (docs/language.md, "Per-head
    constants"). The op evaluates it for the H of its inputs and fills the coefficient with it."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    expr: Any  # a sympy expression in h, H


Coef = Literal["gate", "gate(k)", "gate(v)"] | float | PerHead
"""A coefficient: `gate` (a per-token input [B, T, H] of the op), `gate(k)` / `gate(v)` (a per-token vector
over the key / value channels, [B, T, H, Dk] / [B, T, H, Dv]: docs/semantics.md, channel-wise gates), a constant
number, or a per-head constant (`PerHead`: an expression in the head index h and the head count H)."""


def format_number(v: float) -> str:
    """A number as a spec writes it: an integral float without its ".0", any other as repr."""
    return repr(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


class Form(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def hidden(self, param: str, value: Any) -> bool:
        """Whether the canonical spec text leaves `param` out at this `value` (a parameter added to a form after
        specs were written, at the value that means what those specs meant: they read as before)."""
        return False
