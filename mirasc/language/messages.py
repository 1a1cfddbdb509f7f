"""Error-message helpers: what a symbolic failure or a derived value means, in words a user can act on,
and expressions printed short (no 300-digit constants, no SymPy names such as `zoo`)."""

from __future__ import annotations


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
