"""The typed spec model: every form of the language, its parameters, defaults and ranges.

The front end (`frontend.py`) turns a parse tree into these pydantic models; anything pydantic
rejects is reported at the source position of the offending argument. Cross-field rules (design
combinations without a defined meaning) live in legality.py, each with its reason.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

# (the spec's names for the forms' base, the biases, learners and retentions, which live in their own modules)
from mirasc.language.bias import BIASES, L2, AnyBias, Custom, Dot, Huber, Lp  # noqa: F401
from mirasc.language.form import (  # noqa: F401
    GATE,
    GATE_FORMS,
    GATE_K,
    GATE_V,
    HEAD_SYMBOLS,
    Coef,
    Form,
    PerHead,
    format_number,
)
from mirasc.language.learner import (  # noqa: F401
    GD,
    LEARNERS,
    PRECOND_ATK_PARAMS,
    AnyLearner,
    Implicit,
    Momentum,
    Muon,
    NonparametricLearner,
    Precond,
)
from mirasc.language.memory import (  # noqa: F401
    FEATURE_WIDTH,
    MEMORIES,
    MLP,
    MLP_LAYER_DEFAULTS,
    Linear,
    Nonparametric,
)
from mirasc.language.retention import RETENTIONS, AnyRetention, Decay, NoRetention  # noqa: F401

# Gate names are fixed by role (docs/language.md, "Gates"). Parameter name -> gate name.
GATE_OF_PARAM = {"lr": "eta", "alpha": "alpha", "theta": "theta", "delta": "delta", "gamma": "gamma", "nu": "nu",
                 "rho": "rho"}
GATE_ORDER = ("eta", "alpha", "theta", "delta", "gamma", "nu", "rho")
# Per-token inputs of the op that are not coefficients (keys): name -> the channels they span. They are
# declared by the module as EXTRAS and passed as `apply(..., extras={name: [B, T, H, Dk]})`.
EXTRA_INPUTS = {"kappa": "k"}
# Accepted constant values of each coefficient (the same ranges the Layer's gates produce).
COEF_RANGE = {
    "lr": (lambda x: x >= 0, lambda x: True, "a learning rate is >= 0"),
    "alpha": (lambda x: x >= 0, lambda x: x <= 1, "a retention factor is in [0, 1]"),
    "theta": (lambda x: x >= 0, lambda x: x <= 1, "a momentum factor is in [0, 1]"),
    "delta": (lambda x: x > 0, lambda x: True, "a Huber threshold is > 0"),
    "gamma": (lambda x: x >= 0, lambda x: x <= 1, "an Omega-rule token weight is in [0, 1]"),
    "nu": (lambda x: x >= 0, lambda x: x <= 1, "a preconditioner statistic's decay is in [0, 1]"),
    "rho": (lambda x: x >= 0, lambda x: True, "a preconditioner statistic's rate is >= 0"),
}
# Value a coefficient takes when the spec does not declare it.
UNDECLARED = {"eta": 1.0, "alpha": 1.0, "theta": 0.0}


# --------------------------------------------------------------------------------- parallel
class Exact(Form):
    kind: Literal["exact"] = "exact"
    size: ClassVar[int] = 0  # the tokens whose gradients share an anchor (0: none, each token's at its own state)
    chunk_readout: ClassVar[bool] = False


class Minibatch(Form):
    kind: Literal["minibatch"] = "minibatch"
    C: Annotated[int, Field(ge=1, le=4096)]
    # "token": every token reads through the retention's map (§3); "chunk": the map is applied at chunk
    # boundaries only, the published parallel form of Moneta (lq) and Memora (kl) (docs/semantics.md: chunk readouts)
    readout: Literal["token", "chunk"] = "token"

    def hidden(self, param: str, value: Any) -> bool:
        return param == "readout" and value == "token"

    @property
    def size(self) -> int:
        """The tokens whose gradients share an anchor: C."""
        return self.C

    @property
    def chunk_readout(self) -> bool:
        """The retention's map is read at chunk boundaries only (docs/semantics.md: chunk readouts)."""
        return self.readout == "chunk"


# The vocabulary as data: field -> form name -> model class. Positional arguments bind to the
# model's fields in declaration order (after `kind`).
VOCABULARY: dict[str, dict[str, type[Form]]] = {
    "memory": MEMORIES,
    "bias": BIASES,
    "retention": RETENTIONS,
    "learner": LEARNERS,
    "parallel": {"exact": Exact, "minibatch": Minibatch},
}
FIELDS = tuple(VOCABULARY)
# Parameters whose value is an expression, and the one free symbol each may use.
EXPRESSION_PARAMS = {("bias", "custom", "loss"): "e", ("retention", "bregman", "phi"): "w"}
# Defaults for fields a spec leaves out (nonparametric memories imply the rest).
FIELD_DEFAULTS = {"retention": NoRetention(), "learner": GD(), "parallel": Exact()}


class LayerOptions(Form):
    """The layer around the memory op (docs/module-api.md, `Layer`): the defaults of
    `Layer(d_model, num_heads, **options)`."""

    kind: Literal["layer"] = "layer"
    conv: Annotated[int, Field(ge=0, le=16)] = 4          # depthwise causal conv on q, k, v (0: off)
    # added at initialisation to the key stream's convolution tap one token back: each key starts as a mix of its
    # own token and the previous one (a previous-token key, the first half of a recall circuit); needs conv >= 2
    key_shift: Annotated[float, Field(ge=-4, le=4)] = 0.0
    gate_rank: Annotated[int, Field(ge=0, le=1024)] = 16  # low-rank gate projections (0: full rank)
    eta_max: Annotated[float, Field(gt=0, le=100)] = 1.0  # η = eta_max·sigmoid(·)
    # α = sigmoid(alpha_bias + ·) at initialisation: 3 gives 0.95 (MLP memories: see MLP_LAYER_DEFAULTS)
    alpha_bias: Annotated[float, Field(ge=-20, le=20)] = 3.0
    # channel-wise α (gate(k)/gate(v)): the initial pre-activations spread evenly over
    # [alpha_bias, alpha_bias + alpha_spread] across a head's channels, i.e. several timescales per head
    alpha_spread: Annotated[float, Field(ge=0, le=20)] = 0.0
    # channel-wise gates: each head's pre-activation is a shared per-head term plus a per-channel term whose
    # projection starts at 0, so the gate starts as the per-head one and learns per channel from there
    gate_head_term: bool = False
    # α = alpha_min + (1 − alpha_min)·sigmoid(·): a floor on the retention gate (0: α = sigmoid(·))
    alpha_min: Annotated[float, Field(ge=0, lt=1)] = 0.0
    # the retention gate's squashing: sigmoid, or exp for α = exp(−e^{−·}) (RWKV-7's w = exp(−exp(·)) up to the sign
    # of the pre-activation, chosen so that alpha_bias means about the same: exp(−e^{−3}) = 0.951, σ(3) = 0.953)
    alpha_act: Literal["sigmoid", "exp"] = "sigmoid"
    eta_bias: Annotated[float, Field(ge=-20, le=20)] = -2.0    # η = eta_max·sigmoid(eta_bias + ·) at init
    theta_bias: Annotated[float, Field(ge=-20, le=20)] = 0.0   # momentum θ = sigmoid(theta_bias + ·) at init
    delta_bias: Annotated[float, Field(ge=-20, le=100)] = 0.5  # Huber δ = softplus(delta_bias + ·) at init
    gamma_bias: Annotated[float, Field(ge=-20, le=20)] = 3.0   # Omega token weight γ = sigmoid(gamma_bias + ·) at init
    nu_bias: Annotated[float, Field(ge=-20, le=20)] = 5.0      # precond statistic's decay ν = sigmoid(nu_bias + ·)
    rho_bias: Annotated[float, Field(ge=-20, le=20)] = 0.0     # precond statistic's rate ρ = sigmoid(rho_bias + ·)
    qk_norm: Literal["l2", "none"] = "l2"
    # rms: v is RMS-normalised per head (no gain), the scale of what an MLP memory's LayerNorm'd read can return
    v_norm: Literal["rms", "none"] = "none"
    out_norm: Literal["rms", "none"] = "rms"
    out_gate: bool = True
    # the gate projections' share of the outer learning rate: the Layer keeps it as `gate_lr` and the trainers'
    # `param_groups` give those parameters lr·gate_lr (docs/module-api.md, "Layer"; docs/training.md)
    gate_lr: Annotated[float, Field(gt=0, le=1)] = 1.0
    head_dim: Annotated[int, Field(ge=0, le=4096)] = 0     # 0: d_model // num_heads


def params_of(cls: type[Form]) -> list[str]:
    return [name for name in cls.model_fields if name != "kind"]


# Parameters given by keyword only (they modify a form rather than define it; `lp(3, 0.1, 2)` stays an error)
KEYWORD_ONLY = {"window", "gamma", "feature", "degree"}


def positional_params(cls: type[Form]) -> list[str]:
    """The parameters a positional argument binds to, in declaration order: all but the Omega window of a bias and
    the feature map of a linear/MLP memory (a nonparametric memory's `window` and `degree` stay positional)."""
    modifiers = KEYWORD_ONLY if cls in (Linear, MLP) or "window" in cls.model_fields and cls is not Nonparametric \
        else set()
    return [p for p in params_of(cls) if p not in modifiers]


class Spec(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    name: str
    memory: Linear | MLP | Nonparametric
    bias: AnyBias
    retention: AnyRetention
    learner: AnyLearner
    parallel: Exact | Minibatch
    layer: LayerOptions = LayerOptions()

    # ------------------------------------------------------------------ derived facts
    def layer_defaults(self) -> dict[str, Any]:
        """The defaults of this spec's Layer: the `layer { ... }` block over the family defaults (MLP memories:
        `MLP_LAYER_DEFAULTS`, v_norm only with a LayerNorm, key_shift only with conv >= 2; memories that are not
        parametric read raw q, k unless the spec asks for qk_norm)."""
        out = {p: v for p, v in self.layer if p != "kind"}
        given = self.layer.model_fields_set
        family = self.memory.layer_family(out, self.retention)
        out.update({p: v for p, v in family.items() if p not in given})
        return out

    @property
    def parametric(self) -> bool:
        return self.memory.parametric

    def coefficients(self) -> dict[str, Coef]:
        """Gate name -> `gate`, `gate(k)`, `gate(v)` or constant, for every coefficient the spec uses."""
        out: dict[str, Coef] = {}
        for form in (self.bias, self.retention, self.learner):
            for param, value in form:
                if param == "gamma" and not self.window > 1:
                    continue  # the Omega weights exist only with a window (legality.py rejects γ without one)
                if param in GATE_OF_PARAM:
                    out[GATE_OF_PARAM[param]] = value
        return out

    def per_head(self) -> dict[str, PerHead]:
        """Gate name -> per-head constant, for the coefficients written as an expression in h and H."""
        return {g: v for g, v in self.coefficients().items() if isinstance(v, PerHead)}

    @property
    def feature(self) -> str:
        """The key/query feature map the op applies around a linear memory (elu1, taylor, hedgehog; "identity"
        otherwise). `feature=poly` is not one of them: the memory itself reads φ_p(x) (`poly_degree`)."""
        return self.memory.op_feature

    @property
    def normalized(self) -> bool:
        """Whether the read divides by the normaliser z_t·φ(q_t) + eps."""
        return self.memory.normalized

    @property
    def composite(self) -> bool:
        """A linear memory with a feature map or a normaliser: the op maps its inputs around the plain memory."""
        return self.feature != "identity" or self.normalized

    @property
    def window(self) -> int:
        """c of the Omega rule: the bias is summed over the last c tokens (1: the online bias of docs/semantics.md,
        parametric memories)."""
        return getattr(self.bias, "window", 1)

    @property
    def poly_degree(self) -> int:
        """Degree p of the memory's polynomial feature map φ_p (`feature=poly, degree=p`), or 0 when the memory
        reads its input as is."""
        return self.memory.poly_degree

    @property
    def has_expressions(self) -> bool:
        """Whether a parameter is an expression (custom loss, Bregman potential): only the symbolic
        derivation can tell whether such a spec is usable."""
        return any((field, getattr(self, field).kind, param) in EXPRESSION_PARAMS
                   for field in FIELDS for param in params_of(type(getattr(self, field))))

    @property
    def generalized_delta(self) -> str | None:
        """"read" (l2(read=kappa)), "erase" (l2(erase=kappa)) or None: the generalized delta transition."""
        b = self.bias
        if b.kind != "l2":
            return None
        return "erase" if b.erase == "kappa" else "read" if b.read == "kappa" else None

    @property
    def extras(self) -> tuple[str, ...]:
        """Names of the op's per-token inputs besides q, k, v and the gates (EXTRA_INPUTS), in a fixed order."""
        return ("kappa",) if self.generalized_delta else ()

    @property
    def steps(self) -> int:
        """Inner gradient steps per token (`gd(steps=n)`, `implicit(steps=n)`); 1 for every other learner."""
        return getattr(self.learner, "steps", 1)

    @property
    def precond(self) -> bool:
        """Whether the learner is the diagonal preconditioned one (`precond`)."""
        return self.learner.kind == "precond"

    def inner_spec(self) -> Spec:
        """The spec the op runs once the preconditioner has made the learning rate: `precond` becomes
        gd(lr=gate(k)), whose key-channel η is η_t·m(a_t) (docs/semantics.md, "Preconditioned learner"); every
        other spec is itself."""
        if not self.precond:
            return self
        return self.model_copy(update={"learner": GD(lr=GATE_K)})

    @property
    def gates(self) -> tuple[str, ...]:
        coefs = self.coefficients()
        return tuple(g for g in GATE_ORDER if coefs.get(g) in GATE_FORMS)

    def gate_channels(self) -> dict[str, str | None]:
        """Gate name -> None (one value per head and token), "k" or "v" (a vector over those channels)."""
        coefs = self.coefficients()
        return {g: {GATE: None, GATE_K: "k", GATE_V: "v"}[coefs[g]] for g in self.gates}

    @property
    def channel_gates(self) -> bool:
        return any(self.gate_channels().values())

    @property
    def weights(self) -> tuple[str, ...]:
        return self.memory.weights

    def weight_dims(self) -> list[tuple[str, str]]:
        """(rows, cols) of each weight in `weights` (language/memory.py: `Memory.weight_dims`)."""
        return self.memory.weight_dims()

    def canonical(self) -> str:
        """Canonical spec text: every parameter written out, one field per line."""
        lines = [f"model {self.name} {{"]
        for field in FIELDS:
            lines.append(f"    {field:<9} = {form_text(getattr(self, field))}")
        given = self.layer.model_fields_set  # only the options the block sets: the others follow the family defaults
        if given:
            opts = "; ".join(f"{p} = {format_value(v)}" for p, v in self.layer if p in given)
            lines.append(f"    layer {{ {opts} }}")
        lines.append("}")
        return "\n".join(lines) + "\n"


def form_text(form: Form) -> str:
    """One form as spec text with every parameter written out, e.g. `lq(q=4, alpha=gate)`, except those the form
    hides at their value (`Form.hidden`: parameters added after specs were written, at the value that keeps those
    specs' meaning, such as `minibatch`'s `readout=token` or a learner's `steps=1`), so that every spec written
    before them reads as before: the SPEC text of its module (docs/module-api.md) stays the same."""
    args = [f"{p}={format_value(v)}" for p, v in form if p != "kind" and v is not None and not form.hidden(p, v)]
    return form.kind + (f"({', '.join(args)})" if args else "")


def format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return format_number(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(format_value(x) for x in v) + ")"
    if isinstance(v, PerHead):
        return _spec_printer().doprint(v.expr)
    sympy = sys.modules.get("sympy")  # an expression exists only if sympy was imported to build it
    if sympy is not None and isinstance(v, sympy.Basic):  # a custom loss, a Bregman potential
        return _spec_printer().doprint(v)
    if v is None:
        return "default"
    return str(v)


def _spec_printer():
    """Prints an expression back in the spec language (so canonical() text parses again). Built on first
    use: sympy is imported only for specs that contain expressions (`mirasc check` stays fast)."""
    import sympy as sp
    from sympy.printing.precedence import precedence
    from sympy.printing.str import StrPrinter

    class SpecPrinter(StrPrinter):
        def _print_apow(self, expr):
            x, a = expr.args
            return f"abs({self._print(x)})" if a == 1 else f"abs({self._print(x)})^({self._print(a)})"

        def _print_spow(self, expr):
            x, a = expr.args
            return f"sign({self._print(x)})*abs({self._print(x)})^({self._print(a)})"

        def _print_Abs(self, expr):
            return f"abs({self._print(expr.args[0])})"

        def _print_Exp1(self, expr):
            return "exp(1)"

        def _print_Pow(self, expr, rational=False):
            base, ex = expr.args
            if ex == sp.Rational(1, 2):
                return f"sqrt({self._print(base)})"
            return f"{self.parenthesize(base, precedence(expr), strict=True)}^({self._print(ex)})"

        def _print_Float(self, expr):
            return repr(float(expr))

    return SpecPrinter()
