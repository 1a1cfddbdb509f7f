"""The errors a user sees: `SpecError` (a bad spec, located), and the helpers that word them — what a symbolic
failure or a derived value means, in words a user can act on, expressions printed short (no 300-digit constants, no
SymPy names such as `zoo`), the closest accepted word."""

from __future__ import annotations

import difflib


def plain_failure(err: Exception) -> str:
    """What a SymPy failure on a user's expression means, in words (not the exception's internals)."""
    import decimal

    if isinstance(err, RecursionError):
        return "it is nested too deeply for the symbolic algebra; write it with fewer levels"
    if isinstance(err, (OverflowError, decimal.InvalidOperation, MemoryError)):
        return ("a number overflows while working with it (a constant or exponent is far beyond float range); "
                "use constants and exponents of moderate size")
    return (f"the symbolic algebra cannot handle it ({type(err).__name__}); simplify the expression "
            "or use another form")


def brief(expr, limit: int = 100) -> str:
    """An expression in the spec language's syntax with long numbers rounded (1.999e+300), cut at `limit`."""
    import sympy as sp

    from .spec import format_value

    if isinstance(expr, sp.Basic):
        # a symbol named like the rounded number prints as that text, sign in front
        long_numbers = {n: sp.sign(n) * sp.Symbol(f"{abs(float(n)):.4g}" if abs(float(n)) < float("inf")
                                                  else str(sp.Float(abs(n), 4)))
                        for n in expr.atoms(sp.Number) if len(str(n)) > 12}
        expr = expr.xreplace(long_numbers)
    text = format_value(expr)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def describe_value(value) -> str:
    """A non-finite or non-real SymPy value in words."""
    import sympy as sp

    if value is sp.zoo or value in (sp.oo, -sp.oo):
        return "infinite (a division by zero or a pole)"
    if value is sp.nan:
        return "undefined (0/0, ∞ − ∞ or 0·∞)"
    try:
        z = complex(value)
    except (TypeError, ValueError):
        return f"not a number ({brief(value, 60)})"
    if z.imag:
        return "complex, not real"
    return "too large to represent (it overflows)"


def suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def one_of(choices) -> str:
    return ", ".join(f"`{c}`" for c in choices)


class SpecError(Exception):
    """A bad spec: carries the location and a message that says what would be accepted.

    `also` holds the file's further errors (fields in file order, then missing fields) when the front end
    could go on after the first one; str() gives every error, one `path:line:col: message` line each."""

    def __init__(self, path: str, line: int, col: int, message: str, also: tuple[SpecError, ...] = ()):
        self.path, self.line, self.col, self.message = path, line, col, message
        self.also = tuple(also)
        super().__init__("\n".join(f"{e.path}:{e.line}:{e.col}: {e.message}" for e in self.all))

    @property
    def all(self) -> list[SpecError]:
        return [self, *self.also]

    @classmethod
    def several(cls, errors: list[SpecError]) -> SpecError:
        first, *rest = errors
        return cls(first.path, first.line, first.col, first.message, also=rest)
