"""The memories of the language, one class each (docs/semantics.md: "Parametric memories", "Nonparametric
memories"): the parameters a spec gives it, and the facts about it the rest of the compiler reads.

The facts:
- `parametric`: the memory is a set of weights updated by the learner (linear, MLP); a nonparametric memory keeps
  every past pair and reads them with a kernel.
- `layers`, `weights`, `weight_dims(...)`: the weights W (linear) or W1..Wn (an MLP of depth n) and their
  [rows, cols] as k = Dk, v = Dv, e = expansion·Dk, f = the width of the polynomial features φ_p(k).
- `layernorm`, `adds_input`: an MLP's LayerNorm on its output and its residual x + f(x).
- `poly_degree`: p of the polynomial feature map the memory itself reads (`feature=poly`), 0 otherwise;
  `op_feature` and `normalized`: the key/query feature map and the normaliser the op applies around a linear memory.
- `layer_family(...)`: the Layer defaults this memory's family changes (docs/training.md says why for each).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from mirasc.language.form import Form

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


class Memory(Form):
    parametric: ClassVar[bool] = True
    layernorm: ClassVar[bool] = False
    adds_input: ClassVar[bool] = False

    @property
    def layers(self) -> int:
        return 0

    @property
    def weights(self) -> tuple[str, ...]:
        return ()

    @property
    def poly_degree(self) -> int:
        """p of the polynomial feature map φ_p the memory reads (`feature=poly, degree=p`); 0: it reads x as is."""
        return 0

    @property
    def op_feature(self) -> str:
        return "identity"

    @property
    def normalized(self) -> bool:
        return False

    def weight_dims(self) -> list[tuple[str, str]]:
        """(rows, cols) of each weight in `weights`, as k = Dk, v = Dv, e = expansion·Dk (MLP hidden width), f = the
        width of φ_p(k) where the first layer reads the polynomial features."""
        return []

    def layer_family(self, layer: dict[str, Any], retention: Form) -> dict[str, Any]:
        """The Layer defaults of this memory's family, given the Layer options `layer` and the spec's retention."""
        return {}

    def hidden(self, param: str, value: Any) -> bool:
        # a feature map at its default, and `degree`, which only feature=poly reads
        return (param == "feature" and value == "identity") or (param == "degree" and self.feature != "poly")


class Linear(Memory):
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

    @property
    def layers(self) -> int:
        return 1

    @property
    def weights(self) -> tuple[str, ...]:
        return ("W",)

    @property
    def poly_degree(self) -> int:
        return self.degree if self.feature == "poly" else 0

    @property
    def op_feature(self) -> str:
        """The key/query feature map the op applies around the memory (elu1, taylor, hedgehog; "identity"
        otherwise). `feature=poly` is not one of them: the memory itself reads φ_p(x) (`poly_degree`)."""
        return "identity" if self.feature == "poly" else self.feature

    @property
    def normalized(self) -> bool:
        return self.normalize

    def weight_dims(self) -> list[tuple[str, str]]:
        return [("v", "f" if self.poly_degree else "k")]

    def hidden(self, param: str, value: Any) -> bool:
        return super().hidden(param, value) or (
            param in ("normalize", "eps") and value == type(self).model_fields[param].default)


# Feature widths Dφ of a key width D (docs/semantics.md, "Feature maps and the normaliser").
FEATURE_WIDTH = {"identity": "D", "elu1": "D", "taylor": "1 + D + D(D+1)/2", "hedgehog": "2D",
                 "poly": "1 + D + … + D^p"}


class MLP(Memory):
    kind: Literal["mlp"] = "mlp"
    depth: Annotated[int, Field(ge=1, le=16)] = 2
    expansion: Annotated[int, Field(ge=1, le=64)] = 4
    act: Literal["gelu", "silu", "relu", "tanh", "identity"] = "gelu"
    residual: bool = True
    norm: Literal["layernorm", "none"] = "layernorm"
    feature: Literal["identity", "poly"] = "identity"   # poly: the first layer reads φ_p(x); the residual adds x
    degree: Annotated[int, Field(ge=1, le=4)] = 2

    @property
    def layers(self) -> int:
        return self.depth

    @property
    def layernorm(self) -> bool:  # type: ignore[override]  (a fact of the instance here: its `norm`)
        return self.norm == "layernorm"

    @property
    def adds_input(self) -> bool:  # type: ignore[override]
        return self.residual

    @property
    def weights(self) -> tuple[str, ...]:
        return tuple(f"W{i + 1}" for i in range(self.depth))

    @property
    def poly_degree(self) -> int:
        return self.degree if self.feature == "poly" else 0

    def weight_dims(self) -> list[tuple[str, str]]:
        x = "f" if self.poly_degree else "k"  # the first layer reads φ_p(x), of width f = Σ_{i<=p} Dk^i
        if self.depth == 1:
            return [("v", x)]
        return [("e", x)] + [("e", "e")] * (self.depth - 2) + [("v", "e")]

    def layer_family(self, layer: dict[str, Any], retention: Form) -> dict[str, Any]:
        family = dict(MLP_LAYER_DEFAULTS)
        if not self.layernorm:
            del family["v_norm"]  # the target scale of a LayerNorm'd read; an MLP without one has none to match
        if layer["conv"] < 2:
            del family["key_shift"]  # a convolution without a tap one token back has nothing to shift
        return family


class Nonparametric(Memory):
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
    parametric: ClassVar[bool] = False

    def layer_family(self, layer: dict[str, Any], retention: Form) -> dict[str, Any]:
        # Unit-norm q and k with the 1/sqrt(Dk) scale cap the logits at ±1/sqrt(Dk): near-uniform attention.
        family: dict[str, Any] = {"qk_norm": "none"}
        # A forget gate starts near 1 (σ(5) ≈ 0.993: a pair keeps half its weight for ~100 tokens), so the
        # memory starts as plain softmax attention and learns where to forget; like FoX's f = σ(W x + b), the
        # gate is projected at full rank (one number per head: d_model·H weights, fewer than rank 16's).
        if retention.kind == "decay":
            family.update(alpha_bias=5.0, gate_rank=0)
        return family

    def hidden(self, param: str, value: Any) -> bool:
        # the stick-breaking options unless kernel=stickbreaking, and no sink
        return ((self.kernel != "stickbreaking" and param in ("remainder", "attend_current"))
                or (param == "sink" and not value))


MEMORIES: dict[str, type[Memory]] = {"linear": Linear, "mlp": MLP, "nonparametric": Nonparametric}
