"""Symbolic derivation (SymPy): from the spec's choices to the elementwise pieces of the update rule.

What is derived here:
  * the attentional bias as a loss in the residual e = M(k) - v, and dℓ/dy, its derivative with
    respect to the memory output (elementwise; the Huber mixture also reads the row norm ‖e‖);
  * for `implicit`, the proximal step: e* solves e* + c·ℓ'(e*) = e with c = η‖k‖², and the
    update uses ℓ'(e*) (the gradient of the Moreau envelope), per Piecewise branch;
  * each activation and its derivative;
  * the retention maps: the retention's entrywise map of its accumulator (language/retention.py), Bregman's φ'
    and (φ')⁻¹ by symbolic inversion.
The chain rule through the memory (matmuls, LayerNorm, residual) is assembled as a graph in ir.py.
No blind simplify(): only diff, targeted solve and cse at print time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy as sp

from .language import spec as S
from .language.bias import symbols as bias_symbols
from .language.messages import brief, describe_value, plain_failure
from .language.primitives import relu, sigmoid, spow
from .language.retention import accumulator_entry

# Symbols shared by the derivation, the IR and the printers.
# The residual M(k) − v, the memory's output y and the value v (one coordinate each), ‖e‖₂ of the token's residual
# and a Huber threshold δ: the symbols every bias writes its loss in (language/bias.py).
e, y, v, enorm, delta = bias_symbols()
cprox = sp.Symbol("c", nonnegative=True)       # η‖k‖² in the proximal step
x = sp.Symbol("x", real=True)          # activation input
w = sp.Symbol("w", real=True)          # a weight entry (Bregman potential)
a = accumulator_entry()                # an accumulator entry (language/retention.py: entrywise maps)
u = sp.Symbol("u", real=True)          # a dual coordinate φ'(w)


class DerivationError(Exception):
    """A spec whose mathematics has no usable closed form; `field`/`param` locate it in the spec."""

    def __init__(self, field: str, message: str, param: str | None = None):
        super().__init__(message)
        self.field, self.message, self.param = field, message, param


@dataclass
class Derivation:
    spec: S.Spec
    loss: sp.Expr | None = None          # ℓ as a function of e (per coordinate) — for documentation
    loss_text: str = ""
    dloss: sp.Expr | None = None         # dℓ/dy per coordinate, in e, v, enorm, delta, c
    act: sp.Expr | None = None
    act_grad: sp.Expr | None = None
    entrywise: sp.Expr | None = None     # W = R(A) entry by entry (elastic's shrink): the retention's map
    phi: sp.Expr | None = None
    phi_prime: sp.Expr | None = None     # u = φ'(w)
    phi_prime_inv: sp.Expr | None = None  # w = (φ')⁻¹(u)
    positive_domain: bool = False        # weights must stay > 0 (kl, Bregman potentials defined on w > 0)


def derive(spec: S.Spec) -> Derivation:
    d = Derivation(spec)
    if not spec.parametric:
        return d
    for where, stage in (("bias", _derive_bias), ("memory", _derive_memory), ("retention", _derive_retention)):
        try:
            stage(spec, d)
        except DerivationError:
            raise
        except Exception as err:  # SymPy on extreme input (huge powers, unsupported forms): a spec error
            raise DerivationError(where, f"cannot derive the {where}: {plain_failure(err)}") from None
    return d


def _check_codegen(expr: sp.Expr, field: str, what: str, param: str | None = None) -> None:
    """Every derived expression must print as torch code (e.g. LambertW has no torch function)."""
    from .printers import TorchPrinter

    try:
        TorchPrinter().doprint(expr)
    except NotImplementedError as err:
        raise DerivationError(field, f"{what} needs {err}; no tensor library function exists for it — "
                              "choose a form whose derivative/inverse uses exp, log, powers, trig or tanh",
                              param=param) from None


# ------------------------------------------------------------------------------------ bias
def _derive_bias(spec: S.Spec, d: Derivation) -> None:
    loss = spec.bias.inner_loss()  # the bias's own form (language/bias.py)
    d.loss, d.loss_text = loss.loss, loss.text
    dl = loss.derivative if loss.derivative is not None else sp.diff(d.loss, e)
    if spec.learner.proximal:
        dl = _proximal(dl, d)
    _check_printable(dl, "bias", "the loss derivative")
    _check_codegen(dl, "bias", "the loss derivative")
    d.dloss = dl


def _proximal(dl: sp.Expr, d: Derivation) -> sp.Expr:
    """ℓ'(e*) where e* = prox_{c·ℓ}(e), i.e. e* + c·ℓ'(e*) = e, solved per Piecewise branch."""
    if not dl.has(e):
        return dl  # dot: the proximal step equals the gradient step
    es = sp.Symbol("e_star", real=True)
    branches = dl.args if isinstance(dl, sp.Piecewise) else ((dl, sp.true),)
    out = []
    for expr, cond in branches:
        # The proximal map of a symmetric loss keeps the sign: sign(e*) = sign(e).
        eq = es + cprox * expr.subs(e, es).subs(sp.sign(es), sp.sign(e)) - e
        sols = sp.solve(eq, es)
        if len(sols) != 1:
            raise DerivationError("learner", "`implicit`: no unique closed-form proximal step for this bias")
        sol = sols[0]
        value = expr.subs(e, sol).subs(sp.sign(sol), sp.sign(e))
        if cond is not sp.true:
            cond = cond.subs(e, sol)
            _, den = sp.fraction(sp.together(sol))
            if den.is_positive and isinstance(cond, sp.core.relational.Relational):
                # |e/(1+c)| <= δ  ->  |e| <= δ(1+c): clear the positive denominator.
                cond = cond.func(cond.lhs * den, cond.rhs * den)
        out.append((value, cond))
    return out[0][0] if len(out) == 1 else sp.Piecewise(*out)


def _check_printable(expr: sp.Expr, field: str, what: str) -> None:
    bad = [t for t in (sp.DiracDelta, sp.Derivative, sp.Subs, sp.Integral) if expr.has(t)]
    if bad:
        raise DerivationError(field, f"{what} contains {bad[0].__name__}; the loss is not differentiable in "
                              "closed form (write a smooth version, e.g. sqrt(e^2 + 1e-6) for |e|)")
    args = {s: 0.3 for s in expr.free_symbols}
    for probe in (-1.7, -0.25, 0.0, 0.4, 2.3):
        vals = {**args, e: probe, enorm: abs(probe) + 0.1}
        try:
            val = complex(expr.subs(vals).evalf())
        except Exception:  # overflow in mpmath/decimal, non-numeric results: not finite
            val = complex("nan")
        if not (math.isfinite(val.real) and abs(val.imag) < 1e-12):
            raise DerivationError(field, f"{what} is not finite and real at e = {probe}: it is "
                                  f"{_value_in_words(expr, vals)}; the loss must be differentiable on the whole "
                                  "real line")


def _value_in_words(expr: sp.Expr, vals: dict) -> str:
    try:
        return describe_value(expr.subs(vals).evalf())
    except Exception:  # the evaluation itself overflowed
        return "too large to represent (it overflows)"


# ---------------------------------------------------------------------------------- memory
ACTIVATIONS = {
    "gelu": x / 2 * (1 + sp.erf(x / sp.sqrt(2))),
    "silu": x * sigmoid(x),
    "relu": relu(x),
    "tanh": sp.tanh(x),
    "identity": x,
}


def _derive_memory(spec: S.Spec, d: Derivation) -> None:
    if spec.memory.kind == "mlp":
        d.act = ACTIVATIONS[spec.memory.act]
        d.act_grad = sp.diff(d.act, x)


# ------------------------------------------------------------------------------- retention
def _derive_retention(spec: S.Spec, d: Derivation) -> None:
    r = spec.retention
    d.entrywise = r.entrywise()
    if r.kind == "kl":
        d.positive_domain = True
    elif r.kind == "bregman":
        _derive_bregman(r.phi.subs(sp.Symbol("w", real=True), w), d)


def _derive_bregman(phi: sp.Expr, d: Derivation) -> None:
    d.phi = phi
    dphi = sp.diff(phi, w)
    d2phi = sp.diff(dphi, w)
    # Domain: the whole line, or w > 0 when φ' is not real for w <= 0 (e.g. w log w).
    d.positive_domain = not _real_at(dphi, [-0.7, 0.0])
    samples = [0.05, 0.3, 1.0, 2.5] if d.positive_domain else [-2.0, -0.4, 0.0, 0.6, 1.9]
    for s in samples:
        if s == 0.0 and not _real_at(d2phi, [0.0]):
            continue
        val = _num(d2phi, s)
        # φ'' may vanish at isolated points (w^4/4 at 0) and φ stays strictly convex.
        if val is None or val < 0 or (val == 0 and s != 0.0):
            raise DerivationError("retention", f"bregman: φ must be strictly convex (φ'' > 0), but φ''({s}) = "
                                  f"{brief(d2phi.subs(w, s))}; e.g. phi = w^2/2, w*log(w), cosh(w)", param="phi")
    sols = []
    try:
        sols = sp.solve(sp.Eq(dphi, u), w)
    except (NotImplementedError, ValueError, TypeError):
        sols = []
    chosen = None
    for sol in sols:
        sol = _stable(_real_odd_roots(sol))
        ok = True
        for s in samples:
            target = _num(dphi, s)
            back = _num(sol.subs(u, target), None) if target is not None else None
            if back is None or abs(back - s) > 1e-7 * max(1.0, abs(s)):
                ok = False
                break
        if ok:
            chosen = sol
            break
    if chosen is None:
        raise DerivationError("retention", f"bregman: cannot invert φ'(w) = {brief(dphi)} in closed form; choose a "
                              "potential whose derivative SymPy can invert (e.g. w*log(w), w^4/4, cosh(w))",
                              param="phi")
    for u0 in (-5.0, 0.0, 5.0):  # a Legendre potential: φ' maps onto all of ℝ, so every φ'(W) + U is invertible
        if _num(chosen.subs(u, u0), None) is None:
            raise DerivationError("retention", f"bregman: φ'(w) = {brief(dphi)} does not map onto all reals "
                                  f"((φ')⁻¹({u0}) is undefined), so an update could leave its range; use a "
                                  "potential whose derivative is onto, e.g. w*log(w), cosh(w), w^4/4", param="phi")
    _check_codegen(dphi, "retention", "φ'", param="phi")
    _check_codegen(chosen, "retention", "(φ')⁻¹", param="phi")
    d.phi_prime, d.phi_prime_inv = dphi, chosen


_X = sp.Wild("X")
# Rewrite rules (as data) for numerically unstable closed forms SymPy's solve() returns.
STABLE_FORMS = [
    (sp.log(_X + sp.sqrt(_X**2 + 1)), sp.asinh(_X)),     # cancels for large negative X
    (sp.log(_X + sp.sqrt(_X**2 - 1)), sp.acosh(_X)),
]


def _stable(expr: sp.Expr) -> sp.Expr:
    for pattern, replacement in STABLE_FORMS:
        expr = expr.replace(pattern, replacement)
    return expr


def _real_odd_roots(expr: sp.Expr) -> sp.Expr:
    """u**(1/3) is complex for u < 0 in SymPy; the real inverse of an odd power is sign(u)|u|^(1/3)."""
    def repl(p):
        base, ex = p.args
        if ex.is_Rational and ex.q % 2 == 1 and ex.p % 2 == 1 and not ex.is_integer:
            return spow(base, ex)
        return p
    return expr.replace(lambda t: isinstance(t, sp.Pow) and t.args[1].is_Rational, repl)


def _num(expr: sp.Expr, at: float | None):
    try:
        val = complex((expr.subs(w, at) if at is not None else expr).evalf())
    except Exception:
        return None
    if not math.isfinite(val.real) or abs(val.imag) > 1e-9:
        return None
    return val.real


def _real_at(expr: sp.Expr, points) -> bool:
    return all(_num(expr, p) is not None for p in points)


# Re-exported for printers.
__all__ = ["Derivation", "DerivationError", "derive", "e", "v", "y", "enorm", "delta", "cprox", "x", "w", "a", "u"]
