"""SymPy primitives with hand-stated derivatives, so non-smooth points never print as 0/0.

`diff(Abs(x)**p, x)` in SymPy is `p*Abs(x)**p*sign(x)/Abs(x)`, NaN at x = 0. Writing |x|^p as
`apow(x, p)` whose derivative is `p*spow(x, p-1)` (= p*sign(x)*|x|^(p-1)) keeps every printed
expression finite where the function is differentiable (or has a conventional subgradient).
"""

from __future__ import annotations

import sympy as sp


class spow(sp.Function):
    """sign(x) * |x|**a, the odd power."""

    nargs = 2
    is_real = True

    def fdiff(self, argindex=1):
        x, a = self.args
        if argindex == 1:
            return a * apow(x, a - 1)
        raise sp.ArgumentIndexError(self, argindex)

    @classmethod
    def eval(cls, x, a):
        if a == 1:
            return x
        if a == 0:
            return sp.sign(x)
        if x.is_number and a.is_number:
            return sp.sign(x) * sp.Abs(x) ** a


class apow(sp.Function):
    """|x|**a, the even power (with the subgradient 0 at x = 0 when a = 1)."""

    nargs = 2
    is_real = True

    def fdiff(self, argindex=1):
        x, a = self.args
        if argindex == 1:
            return a * spow(x, a - 1)
        raise sp.ArgumentIndexError(self, argindex)

    @classmethod
    def eval(cls, x, a):
        if a == 0:
            return sp.Integer(1)
        if a.is_integer and a.is_even:
            return x**a
        if x.is_number and a.is_number:
            return sp.Abs(x) ** a


class step(sp.Function):
    """Heaviside step with step(0) = 0 (the derivative used for ReLU), unlike SymPy's H(0) = 1/2."""

    nargs = 1
    is_real = True

    def fdiff(self, argindex=1):
        return sp.Integer(0)


class sigmoid(sp.Function):
    """The logistic function, printed as a stable library call instead of 1/(1+exp(-x))."""

    nargs = 1
    is_real = True

    def fdiff(self, argindex=1):
        s = sigmoid(self.args[0])
        return s * (1 - s)

    @classmethod
    def eval(cls, x):
        if x == 0:
            return sp.Rational(1, 2)


class relu(sp.Function):
    nargs = 1
    is_real = True

    def fdiff(self, argindex=1):
        return step(self.args[0])


def _sign(x):
    return sp.sign(x)


# Functions an expression in a spec may call (custom losses, Bregman potentials).
EXPRESSION_FUNCTIONS = {
    "abs": lambda x: apow(x, sp.Integer(1)),
    "exp": sp.exp,
    "log": sp.log,
    "sqrt": sp.sqrt,
    "tanh": sp.tanh,
    "sin": sp.sin,
    "cos": sp.cos,
    "cosh": sp.cosh,
    "sinh": sp.sinh,
    "atan": sp.atan,
    "erf": sp.erf,
    "sigmoid": sigmoid,
    "softplus": lambda x: sp.log(1 + sp.exp(x)),
    "sign": _sign,
}
