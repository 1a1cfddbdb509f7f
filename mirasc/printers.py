"""SymPy printers, one per target, with `_print_<Node>` methods (the SymPy printer design)."""

from __future__ import annotations

import sympy as sp
from sympy.printing.pycode import PythonCodePrinter


class TorchPrinter(PythonCodePrinter):
    """Prints an elementwise SymPy expression as torch code over tensors (and Python scalars)."""

    printmethod = "_torchcode"
    _FUNCS = {
        "exp": "torch.exp", "log": "torch.log", "erf": "torch.erf", "tanh": "torch.tanh", "sin": "torch.sin",
        "cos": "torch.cos", "cosh": "torch.cosh", "sinh": "torch.sinh", "atan": "torch.atan", "Abs": "torch.abs",
        "sign": "torch.sign", "sigmoid": "torch.sigmoid", "relu": "torch.relu", "asinh": "torch.asinh",
        "acosh": "torch.acosh", "sqrt": "torch.sqrt",
    }

    def __init__(self, settings=None):
        super().__init__(dict(settings or {}, fully_qualified_modules=True, full_prec=True))

    def _print(self, expr, **kwargs):
        # Constant subexpressions (sqrt(2), pi/4, ...) print as Python floats, never as torch calls.
        if isinstance(expr, sp.Expr) and expr.is_number and not expr.is_Integer:
            val = complex(expr.evalf(20))
            if val.imag != 0:
                raise NotImplementedError(f"complex constant {expr}")
            return repr(val.real)
        return super()._print(expr, **kwargs)

    def _fn(self, expr, name):
        return f"{name}({', '.join(self._print(a) for a in expr.args)})"

    def _print_Function(self, expr):
        name = type(expr).__name__
        if name in self._FUNCS:
            return self._fn(expr, self._FUNCS[name])
        raise NotImplementedError(f"the function {name}")

    _print_LambertW = _print_Function
    _print_exp = _print_log = _print_erf = _print_tanh = _print_sin = _print_cos = _print_Function
    _print_cosh = _print_sinh = _print_atan = _print_Abs = _print_sign = _print_Function
    _print_sigmoid = _print_relu = _print_asinh = _print_acosh = _print_Function

    def _print_step(self, expr):
        arg = self._print(expr.args[0])
        return f"torch.heaviside({arg}, torch.zeros_like({arg}))"

    def _print_spow(self, expr):
        x, a = expr.args
        px = self._print(x)
        return f"(torch.sign({px}) * torch.abs({px}) ** {self._print(a)})"

    def _print_apow(self, expr):
        x, a = expr.args
        return f"(torch.abs({self._print(x)}) ** {self._print(a)})"

    # Library calls that differ between targets (TritonPrinter overrides them).
    _where, _maximum, _minimum = "torch.where", "torch.maximum", "torch.minimum"
    _clamp_min, _clamp_max = "torch.clamp_min", "torch.clamp_max"

    def _extremum(self, expr, binary, clamp):
        nums = [a for a in expr.args if a.is_number]
        rest = [a for a in expr.args if not a.is_number]
        if len(nums) == 1 and len(rest) == 1:  # max(x, 0) -> clamp: a tensor op with a scalar bound
            return f"{clamp}({self._print(rest[0])}, {self._print(nums[0])})"
        out = self._print(expr.args[0])
        for a in expr.args[1:]:
            out = f"{binary}({out}, {self._print(a)})"
        return out

    def _print_Max(self, expr):
        return self._extremum(expr, self._maximum, self._clamp_min)

    def _print_Min(self, expr):
        return self._extremum(expr, self._minimum, self._clamp_max)

    def _print_Piecewise(self, expr):
        *branches, (last, cond) = expr.args
        if cond is not sp.true:
            raise NotImplementedError("Piecewise without a default branch")
        out = self._print(last)
        for val, c in reversed(branches):
            out = f"{self._where}({self._print(c)}, {self._print(val)}, {out})"
        return out

    def _print_Relational(self, expr):
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[expr.rel_op]
        return f"({self._print(expr.lhs)} {op} {self._print(expr.rhs)})"

    def _print_And(self, expr):
        return " & ".join(f"({self._print(a)})" for a in expr.args)

    def _print_Or(self, expr):
        return " | ".join(f"({self._print(a)})" for a in expr.args)

    def _print_Pow(self, expr, rational=False):
        base, ex = expr.args
        b = self.parenthesize(base, sp.printing.precedence.PRECEDENCE["Pow"])
        if ex == sp.Rational(1, 2):
            return f"torch.sqrt({self._print(base)})"
        if ex == -sp.Rational(1, 2):
            return f"torch.rsqrt({self._print(base)})"
        if ex == -1:
            return f"(1 / {b})"
        if ex == 2:
            return f"({b} * {b})" if base.is_Symbol else f"{b} ** 2"
        if not ex.is_number:  # a per-head constant's exponent in h (losses and potentials have constant ones)
            return f"{b} ** ({self._print(ex)})"
        return f"{b} ** {self._print(ex) if ex.is_Integer else repr(float(ex))}"

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_Rational(self, expr):
        return repr(float(expr))

    def _print_Half(self, expr):
        return "0.5"

    def _print_Exp1(self, expr):
        return repr(float(sp.E))

    def _print_Pi(self, expr):
        return repr(float(sp.pi))

    def _print_ImaginaryUnit(self, expr):
        raise NotImplementedError("complex values are not supported")


def print_block(exprs: dict[str, sp.Expr], names: dict[sp.Symbol, str], prefix: str = "_t",
                printer: TorchPrinter | None = None) -> list[str]:
    """CSE the expressions together and print `name = code` lines (SSA, fresh temporaries)."""
    outs = list(exprs)
    rename = {s: sp.Symbol(n, **s.assumptions0) for s, n in names.items()}
    vals = [exprs[o].xreplace(rename) for o in outs]
    repl, reduced = sp.cse(vals, symbols=sp.numbered_symbols(prefix), order="canonical")
    p = printer or TorchPrinter()
    lines = [f"{s} = {p.doprint(ex)}" for s, ex in repl]
    lines += [f"{o} = {p.doprint(ex)}" for o, ex in zip(outs, reduced)]
    return lines


def latex(expr: sp.Expr) -> str:
    return sp.latex(expr)


class TritonPrinter(TorchPrinter):
    """Prints an elementwise expression as triton.language code (fp32 tiles and scalars).
    Functions Triton lacks are written in terms of exp/log/sigmoid, stably."""

    printmethod = "_tritoncode"
    _where, _maximum, _minimum = "tl.where", "tl.maximum", "tl.minimum"
    _clamp_min, _clamp_max = "tl.maximum", "tl.minimum"
    _FUNCS = {"exp": "tl.exp", "log": "tl.log", "erf": "tl.erf", "Abs": "tl.abs", "sigmoid": "tl.sigmoid",
              "sqrt": "tl.sqrt", "sin": "tl.sin", "cos": "tl.cos"}

    def _print_Function(self, expr):
        name = type(expr).__name__
        if name in self._FUNCS:
            return self._fn(expr, self._FUNCS[name])
        x = self._print(expr.args[0])
        if name == "tanh":
            return f"(2 * tl.sigmoid(2 * ({x})) - 1)"
        if name == "sign":
            return f"tl.where(({x}) > 0, 1.0, tl.where(({x}) < 0, -1.0, 0.0))"
        if name == "relu":
            return f"tl.maximum({x}, 0.0)"
        if name == "cosh":
            return f"(0.5 * (tl.exp({x}) + tl.exp(-({x}))))"
        if name == "sinh":
            return f"(0.5 * (tl.exp({x}) - tl.exp(-({x}))))"
        if name == "asinh":  # sign(x) log(|x| + sqrt(x² + 1)): no cancellation for large negative x
            return (f"(tl.where(({x}) < 0, -1.0, 1.0) * tl.log(tl.abs({x}) + tl.sqrt(({x}) * ({x}) + 1)))")
        if name == "acosh":
            return f"tl.log(({x}) + tl.sqrt(({x}) * ({x}) - 1))"
        raise NotImplementedError(f"the function {name} (no Triton equivalent)")

    _print_exp = _print_log = _print_erf = _print_tanh = _print_sin = _print_cos = _print_Function
    _print_cosh = _print_sinh = _print_atan = _print_Abs = _print_sign = _print_Function
    _print_sigmoid = _print_relu = _print_asinh = _print_acosh = _print_LambertW = _print_Function

    def _print_step(self, expr):
        return f"tl.where(({self._print(expr.args[0])}) > 0, 1.0, 0.0)"

    def _print_apow(self, expr):
        x, a = expr.args
        return f"tl.exp({float(a)!r} * tl.log(tl.abs({self._print(x)})))"

    def _print_spow(self, expr):
        x, a = expr.args
        px = self._print(x)
        return f"(tl.where(({px}) < 0, -1.0, 1.0) * tl.exp({float(a)!r} * tl.log(tl.abs({px}))))"

    def _print_Pow(self, expr, rational=False):
        base, ex = expr.args
        b = self.parenthesize(base, sp.printing.precedence.PRECEDENCE["Pow"])
        if ex == sp.Rational(1, 2):
            return f"tl.sqrt({self._print(base)})"
        if ex == -sp.Rational(1, 2):
            return f"tl.rsqrt({self._print(base)})"
        if ex.is_Integer and 1 <= abs(int(ex)) <= 4:
            prod = " * ".join([b] * abs(int(ex)))
            return f"({prod})" if ex > 0 else f"(1 / ({prod}))"
        # x^a = exp(a log x): NaN for x < 0 exactly where torch's pow is NaN
        return f"tl.exp({float(ex)!r} * tl.log({self._print(base)}))"


def print_triton_block(exprs: dict[str, sp.Expr], names: dict[sp.Symbol, str], prefix: str = "_t") -> list[str]:
    return print_block(exprs, names, prefix, TritonPrinter())
