"""The typed spec model: every form of the language, its parameters, defaults and ranges.

The front end (`frontend.py`) turns a parse tree into these pydantic models; anything pydantic
rejects is reported at the source position of the offending argument. Cross-field rules (design
combinations without a defined meaning) live in legality.py, each with its reason.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

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


# ----------------------------------------------------------------------------------- memory
class Linear(Form):
    """M(x) = W φ(x). `feature`: the map φ applied to keys and queries (identity; elu1 = elu(x) + 1; taylor =
    1 ⊕ x ⊕ x⊗x/√2, Based's second-order Taylor kernel; hedgehog = softmax([U x + c, −(U x + c)]) with U, c learned
    per head). `normalize`: the read divides by z_t·φ(q_t) + eps with the normaliser state z_t = the same update
    applied to a constant value 1 (z_t = Σ φ(k_s) for linear attention): docs/semantics.md, "Feature maps and the
    normaliser"."""

    kind: Literal["linear"] = "linear"
    feature: Literal["identity", "elu1", "taylor", "hedgehog", "poly"] = "identity"
    degree: Annotated[int, Field(ge=1, le=4)] = 2  # p of feature=poly (Atlas' φ_p); unused by the other maps
    normalize: bool = False
    eps: Annotated[float, Field(ge=0, le=1)] = 1e-6


# Feature widths Dφ of a key width D (docs/semantics.md, "Feature maps and the normaliser").
FEATURE_WIDTH = {"identity": "D", "elu1": "D", "taylor": "1 + D + D(D+1)/2", "hedgehog": "2D",
                 "poly": "1 + D + … + D^p"}


class MLP(Form):
    kind: Literal["mlp"] = "mlp"
    depth: Annotated[int, Field(ge=1, le=16)] = 2
    expansion: Annotated[int, Field(ge=1, le=64)] = 4
    act: Literal["gelu", "silu", "relu", "tanh", "identity"] = "gelu"
    residual: bool = True
    norm: Literal["layernorm", "none"] = "layernorm"
    feature: Literal["identity", "poly"] = "identity"   # poly: the first layer reads φ_p(x); the residual adds x
    degree: Annotated[int, Field(ge=1, le=4)] = 2


class Nonparametric(Form):
    """Nadaraya–Watson memory: o_t = Σ_s κ(u_t, k_s) v_s / Σ_s κ(u_t, k_s) (docs/semantics.md); or, with
    kernel=stickbreaking, the stick-breaking read o_t = Σ_s β_ts Π_{s<l<t}(1 − β_tl) v_s (Tan et al. 2024)."""

    kind: Literal["nonparametric"] = "nonparametric"
    kernel: Literal["softmax", "additive", "poly", "stickbreaking"] = "softmax"
    scale: Annotated[float, Field(gt=0)] | None = None    # softmax/poly: κ uses scale·q·k; None: 1/sqrt(Dk)
    degree: Annotated[int, Field(ge=2, le=8)] = 2          # poly: Σ_{i<=degree} (scale q·k)^i / i! (even)
    window: Annotated[int, Field(ge=0)] = 0                # attend to the last `window` tokens (0: all)
    causal: bool = True                                    # false: cross-attention over another sequence
    hops: Annotated[int, Field(ge=1, le=16)] = 1           # MemN2N query refinement u^{h+1} = u^h + o^h
    tying: Literal["adjacent", "layerwise"] = "adjacent"   # MemN2N weight tying across hops
    temporal: Annotated[int, Field(ge=0, le=65536)] = 0    # MemN2N temporal encoding over this many positions
    score_conv: tuple[Annotated[int, Field(ge=1, le=64)], Annotated[int, Field(ge=1, le=64)]] | None = None  # MTA
    head_mix: Annotated[int, Field(ge=1, le=256)] = 1      # MTA head-mixing group size (1: off)
    head_norm: bool = False                                # MTA per-head RMS norm with depth scaling
    # stickbreaking only: where the stick left over, 1 − Σ_s w_ts, goes (nothing; the query's own value; a learned
    # vector per head), and whether query t reads its own pair (false: the pairs stored before it, the paper's)
    remainder: Literal["none", "current", "bias"] = "none"
    attend_current: bool = False
    # softmax only: an attention sink, a learned logit b_h per head in every read's denominator with no value
    # (GPT-OSS's sinks, FLA's sink_bias): o_t = Σ_s e^{ℓ_ts} v_s / (e^{b_h} + Σ_s e^{ℓ_ts})
    sink: bool = False


# --------------------------------------------------------------------------------- parallel
class Exact(Form):
    kind: Literal["exact"] = "exact"


class Minibatch(Form):
    kind: Literal["minibatch"] = "minibatch"
    C: Annotated[int, Field(ge=1, le=4096)]
    # "token": every token reads through the retention's map (§3); "chunk": the map is applied at chunk
    # boundaries only, the published parallel form of Moneta (lq) and Memora (kl) (docs/semantics.md: chunk readouts)
    readout: Literal["token", "chunk"] = "token"


# The vocabulary as data: field -> form name -> model class. Positional arguments bind to the
# model's fields in declaration order (after `kind`).
VOCABULARY: dict[str, dict[str, type[Form]]] = {
    "memory": {"linear": Linear, "mlp": MLP, "nonparametric": Nonparametric},
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


# Layer defaults that differ for MLP memories, each found by reading a run that failed (docs/training.md has the
# mechanism and the measurements of each): a retention gate that decays an MLP memory shrinks the network that
# computes every key's features, so α stays within [alpha_min, 1]; a channel-wise gate starts as the per-head gate
# (gate_head_term); the gate projections train at a tenth of the outer learning rate (gate_lr), because under AdamW
# a gate's pre-activation moves ~lr per weight per step and a failing seed's η saturated on every token within 150
# steps; v is RMS-normalised (v_norm), the scale a LayerNorm'd read returns, so the outer loop cannot grow v until the
# error passes the Huber threshold, where the update δ·sign(e) passes no gradient to v; the error then starts near
# √(2·head_dim + 1) (≈ 8 at head_dim 32), so δ starts at softplus(12) ≈ 12; the keys' convolution tap one token
# back starts at 0.5 (key_shift): recall needs the key written at a value to carry the token before it, and an MLP
# memory's run sat on MQAR's loss plateau until its convolution had formed that key (a conv without that tap drops
# it). A spec's own `layer { ... }` block wins.
MLP_LAYER_DEFAULTS: dict[str, Any] = {"alpha_min": 0.999, "delta_bias": 12.0, "gate_head_term": True,
                                      "gate_lr": 0.1, "key_shift": 0.5, "v_norm": "rms"}


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
        family = dict(MLP_LAYER_DEFAULTS) if self.memory.kind == "mlp" else {}
        if family and self.memory.norm != "layernorm":
            del family["v_norm"]  # the target scale of a LayerNorm'd read; an MLP without one has none to match
        if family and out["conv"] < 2:
            del family["key_shift"]  # a convolution without a tap one token back has nothing to shift
        if not self.parametric:
            # Unit-norm q and k with the 1/sqrt(Dk) scale cap the logits at ±1/sqrt(Dk): near-uniform attention.
            family["qk_norm"] = "none"
            # A forget gate starts near 1 (σ(5) ≈ 0.993: a pair keeps half its weight for ~100 tokens), so the
            # memory starts as plain softmax attention and learns where to forget; like FoX's f = σ(W x + b), the
            # gate is projected at full rank (one number per head: d_model·H weights, fewer than rank 16's).
            if self.retention.kind == "decay":
                family.update(alpha_bias=5.0, gate_rank=0)
        out.update({p: v for p, v in family.items() if p not in given})
        return out

    @property
    def parametric(self) -> bool:
        return self.memory.kind != "nonparametric"

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
        f = self.memory.feature if self.memory.kind == "linear" else "identity"
        return "identity" if f == "poly" else f

    @property
    def normalized(self) -> bool:
        """Whether the read divides by the normaliser z_t·φ(q_t) + eps."""
        return self.memory.kind == "linear" and self.memory.normalize

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
        m = self.memory
        return m.degree if getattr(m, "feature", "identity") == "poly" else 0

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
        if self.memory.kind == "linear":
            return ("W",)
        if self.memory.kind == "mlp":
            return tuple(f"W{i + 1}" for i in range(self.memory.depth))
        return ()

    def weight_dims(self) -> list[tuple[str, str]]:
        """(rows, cols) of each weight in `weights`, as k = Dk, v = Dv, e = expansion·Dk (MLP hidden width)."""
        m = self.memory
        x = "f" if self.poly_degree else "k"  # the first layer reads φ_p(x), of width f = Σ_{i<=p} Dk^i
        if m.kind == "linear" or (m.kind == "mlp" and m.depth == 1):
            return [("v", x)]
        if m.kind == "mlp":
            return [("e", x)] + [("e", "e")] * (m.depth - 2) + [("v", "e")]
        return []

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
    """One form as spec text with every parameter written out, e.g. `lq(q=4, alpha=gate)`; the exceptions are
    `minibatch`'s `readout=token`, `l2`'s `read=key`/`erase=key`, a learner's `steps=1`, a bias's `window=1`/`gamma=1`
    (no Omega rule), a memory's `feature=identity` (with `degree`, which only `feature=poly` reads) and `linear`'s
    `normalize`/`eps` at their defaults and a nonparametric memory's `remainder`/`attend_current` unless
    kernel=stickbreaking (§3), left out so that every spec written before them reads as before."""
    args = [f"{p}={format_value(v)}" for p, v in form
            if p != "kind" and v is not None and not (p == "readout" and v == "token")
            and not (p in ("read", "erase") and v == "key") and not (p == "steps" and v == 1)
            and not (p == "window" and v == 1) and not (p == "gamma" and v == 1.0)
            and not (p == "feature" and v == "identity")
            and not (p == "degree" and form.kind in ("linear", "mlp") and form.feature != "poly")
            and not (form.kind == "linear" and p in ("normalize", "eps") and v == type(form).model_fields[p].default)
            and not (form.kind == "precond" and form.transform == "rms" and p in PRECOND_ATK_PARAMS)
            and not (form.kind == "nonparametric" and form.kernel != "stickbreaking"
                     and p in ("remainder", "attend_current"))
            and not (form.kind == "nonparametric" and p == "sink" and not v)]
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
