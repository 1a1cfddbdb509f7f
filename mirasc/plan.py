"""Which algorithm and which kernels compute a spec, and why each absent one is absent (docs/kernels.md, "Which
kernels run a spec"). Every such decision lives here, once: the code generators, the emitted docstring and
refusals, `mirasc explain` and the tests read the `Plan`.

A parametric memory has two torch algorithms: `recurrent` (always) and `chunked` where a chunk form computes the
spec exactly (`chunk_form`). On Triton, the fused recurrent kernels print any spec the Atlas pieces allow, and at
most one chunk-parallel family runs beside them: a chunked family (`CHUNK_FAMILIES`, each asked whether it covers
the spec: `chunk_family_reason`) or else the mini-batch dual-form kernels (`minibatch_reason`). A nonparametric
memory has the query-blocked torch read and, where it is exact, a flash-style Triton kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from . import derive as D
from . import ir
from .language import spec as S


@dataclass(frozen=True)
class Kernels:
    """What the Triton kernels print: the spec they run (a feature=poly linear memory's plain copy, or a chunk
    readout's decay form) and its derivation and IR graphs."""

    spec: S.Spec
    d: D.Derivation
    forward: ir.Graph
    grad: ir.Graph


@dataclass(frozen=True)
class Plan:
    """The algorithms and kernels of one spec. A reason is "" where the path exists."""

    chunk_form: str | None         # the torch chunked algorithm, None: recurrent only; delta, gdelta,
                                   # momentum_delta, muon, minibatch, query_blocks (attention)
    no_chunk_form: str             # why there is none
    triton: bool                   # Triton kernels exist (the fused recurrent ones, or the flash kernel)
    no_triton: str                 # why there are none
    chunk_family: str | None       # the chunk-parallel Triton family beside the recurrent kernels: hebbian,
                                   # delta, gdelta, minibatch, momentum; flash or stickbreaking (attention)
    minibatch: bool                # the mini-batch dual-form Triton kernels (when no chunked family covers it)
    chunk_readout: bool = False    # readout=chunk: each chunk on its decay form's chunk-parallel kernels
    features: bool = False         # feature=poly, linear memory: the kernels run the plain memory on φ_p(q), φ_p(k)
    lq_scale: bool = False         # lq with readout=chunk: weight i's updates scaled by 1/n_i per chunk
    lq_on_chunks: bool = False     # ... as a per-chunk factor on η in the chunked kernels (no mini-batch kernel)
    no_chunk_family: str = ""      # why no chunked family runs beside the recurrent kernels (where they run)
    v_tiles: bool = False          # the recurrent kernels split the memory's value rows over programs (BV rows each)
    no_v_tiles: str = ""           # why one program holds a (batch, head)'s whole state (where the kernels run)
    kernels: Kernels | None = field(default=None, compare=False, repr=False)

    @property
    def dots(self) -> str:
        """How the dots of 16-bit inputs multiply (docs/semantics.md, "Numerics"): "input" (16-bit operands on the
        tensor cores: the chunk kernels of per-head and key-channel decays, the momentum delta scans), "split" (the
        MLP memories' mini-batch kernels, chunk readouts included: fp32 operands as two bf16 parts, Triton's bf16x3)
        or "ieee" (exact fp32: the linear memories' chunk readouts). "input_split": a feature map or normaliser
        around a linear memory, which hands it φ(q), φ(k) and [v, 1] in the inputs' dtype and takes its output in
        fp32: 16-bit operands as they are, fp32 ones (the running state, the output's cotangent) as two bf16 parts,
        because the normaliser's gradient is a difference of nearly equal terms (dq: one bf16 rounding of dO there
        doubled the error of the torch path)."""
        if self.triton and not self.chunk_readout and self.chunk_family in ("hebbian", "delta", "gdelta", "minibatch",
                                                                             "momentum"):
            return "input_split" if self.kernels.spec.composite else "input"
        if self.triton and self.minibatch:
            return "split"
        return "ieee"

    @property
    def half_in_place(self) -> bool:
        """16-bit q, k, v reach the chunk family's one op as they are (its kernels read them in place)."""
        return (self.dots in ("input", "input_split") and not self.features
                and one_chunk_op(self.kernels.spec, self.chunk_family or ""))

    @property
    def packed(self) -> bool:
        """A parametric memory's chunk-parallel kernels take packed sequences (cu_seqlens) in one launch: not for
        chunk readouts, whose padding would not be inert, nor with an Omega window, whose carried tokens padded
        rows would enter."""
        return (self.kernels is not None and (self.chunk_family is not None or self.minibatch)
                and not self.chunk_readout and self.kernels.spec.window == 1)

    def without_triton(self, reason: str) -> Plan:
        """The plan when the kernels cannot be printed after all (a function without a Triton equivalent)."""
        return dataclasses.replace(self, triton=False, no_triton=reason, chunk_family=None, minibatch=False,
                                   no_chunk_family="", v_tiles=False, no_v_tiles="")

    def summary(self) -> dict[str, str]:
        """The decisions in short words (a bundled spec's row in tests/plan/test_plan.py): the torch chunked form, the
        Triton kernels, and how a parametric memory's kernels multiply 16-bit dots ("" for attention)."""
        if not self.triton:
            triton = "none"
        elif self.chunk_family in FLASH:
            triton = self.chunk_family
        elif self.chunk_readout:  # one launch per chunk of the decay form's kernels, no fused recurrent kernel
            triton = f"chunked {self.chunk_family} per chunk" if self.chunk_family else "mini-batch per chunk"
        else:
            triton = " + ".join(["recurrent"] + ([f"chunked {self.chunk_family}"] if self.chunk_family else [])
                                + (["mini-batch"] if self.minibatch else []))
        return {"chunked": self.chunk_form or "none", "triton": triton,
                "dots": self.dots if self.kernels is not None and self.triton else ""}

    def describe(self) -> list[str]:
        """The decisions as lines for people (`mirasc explain`, `mirasc kernels`), with the reason of each absent
        path."""
        s = self.summary()
        lines = [f"chunked algorithm: {s['chunked']}" + (f" ({self.no_chunk_form})" if not self.chunk_form else "")]
        lines.append(f"Triton kernels: {s['triton']}" + (f" ({self.no_triton})" if not self.triton else ""))
        if self.triton and self.kernels is not None and self.chunk_family is None:
            lines.append(f"chunked Triton family: none ({self.no_chunk_family})")
        if self.triton and self.kernels is not None and not self.chunk_readout:
            lines.append("recurrent kernels: " + ("the value rows split over programs, BV rows each" if self.v_tiles
                                                  else f"one program per (batch, head) ({self.no_v_tiles})"))
        if s["dots"]:
            lines.append(f"16-bit dots: {DOTS[s['dots']]}")
        if self.half_in_place:
            lines.append("16-bit q, k, v: read in place by one op (as the [B, T, H, D] tensors given, T a whole "
                         "number of chunks)")
        return lines


DOTS = {"input": "16-bit operands on the tensor cores, fp32 accumulation",
        "input_split": "16-bit operands as they are and fp32 ones (the state, dO) as two bf16 parts each on the "
                       "tensor cores, fp32 accumulation",
        "split": "fp32 operands as two bf16 parts each on the tensor cores (about 16 bits), fp32 accumulation",
        "ieee": "fp32 (exact products)"}
FLASH = ("flash", "stickbreaking")


def plan(spec: S.Spec, d: D.Derivation, forward: ir.Graph | None, grad: ir.Graph | None) -> Plan:
    """The Plan of a spec; `forward`, `grad`: its memory graphs (a precond learner's: those of its inner spec)."""
    if not spec.parametric:
        return _attention_plan(spec.memory)
    spec = spec.inner_spec()
    kind, no_chunk = chunk_form(spec, grad)
    par = spec.parallel
    chunk_readout = par.chunk_readout
    lq_scale = chunk_readout and spec.retention.kind == "lq"
    kernels = Kernels(spec, d, forward, grad)
    features = feature_spec(spec) if not chunk_readout else None
    if features is not None:
        fd = D.derive(features)
        kernels = Kernels(features, fd, *ir.compile_graphs(features, fd))
    if chunk_readout:
        kernels = dataclasses.replace(kernels, spec=spec.model_copy(update={
            "name": f"{spec.name}_chunk_rest", "retention": S.Decay(alpha=spec.retention.alpha),
            "parallel": S.Minibatch(C=par.C)}))
    tri = kernels.spec
    common = dict(chunk_form=kind, no_chunk_form=no_chunk, chunk_readout=chunk_readout, features=features is not None,
                  lq_scale=lq_scale, kernels=kernels)
    why = recurrent_reason(tri, kernels.grad)
    if why:
        return Plan(triton=False, no_triton=why, chunk_family=None, minibatch=False, **common)
    # lq: the per-weight scale is in the IR graphs, which the mini-batch kernels print; where those refuse (a decay
    # over key channels), a linear memory's chunked kernels take it as a per-chunk factor on η (one weight, n_c)
    lq_on_chunks = lq_scale and minibatch_reason(tri) is not None
    family, no_family = chunk_family_reason(tri, kind)
    if family is not None and lq_scale and not lq_on_chunks:
        family, no_family = None, ("lq's chunk readout scales weight i's updates by 1/n_i, which the mini-batch "
                                   "kernels take from the IR graphs they print")
    elif family is not None and chunk_readout and spec.window > 1:
        family, no_family = None, "readout=chunk with an Omega window"
    minibatch = family is None and minibatch_reason(tri) is None
    if chunk_readout and family is None and not minibatch:
        return Plan(triton=False, chunk_family=None, minibatch=False, lq_on_chunks=lq_on_chunks, no_triton=(
            f"readout=chunk (docs/semantics.md: chunk readouts) with {spec.retention.kind} retention runs on the "
            "decay form's chunk kernels, and there are none for this memory and learner"), **common)
    coupled = v_tile_reason(tri, kernels.forward, kernels.grad)
    return Plan(triton=True, no_triton="", chunk_family=family, minibatch=minibatch, lq_on_chunks=lq_on_chunks,
                no_chunk_family=no_family, v_tiles=coupled is None, no_v_tiles=coupled or "", **common)


def _attention_plan(m: S.Nonparametric) -> Plan:
    """A nonparametric memory: the query-blocked torch read, and the flash kernel where it computes the read exactly."""
    if m.kernel == "stickbreaking":
        why = "the per-head output norm runs on the torch path" if m.head_norm else ""
    elif m.kernel != "softmax":
        why = f"the {m.kernel} kernel runs on the torch path (query-blocked, memory O(block x T))"
    elif m.hops > 1 or m.temporal or m.score_conv is not None or m.head_mix > 1 or m.head_norm:
        why = "hops, temporal encoding and Multi-Token Attention run on the torch path"
    else:
        why = ""
    family = None if why else "stickbreaking" if m.kernel == "stickbreaking" else "flash"
    return Plan(chunk_form="query_blocks", no_chunk_form="", triton=not why, no_triton=why, chunk_family=family,
                minibatch=False)


# ------------------------------------------------------------------------------------------- torch chunk forms
def channel_decay_side(spec: S.Spec) -> str | None:
    """The weight side ("k" or "v") that channel-wise α/θ scale, or None (all per head)."""
    sides = {side for g, side in spec.gate_channels().items() if side and g in ("alpha", "theta")}
    return sides.pop() if len(sides) == 1 else None


def chunk_form(spec: S.Spec, grad_graph: ir.Graph) -> tuple[str | None, str]:
    """Which chunked algorithm computes this spec exactly, or None with the reason."""
    m, b, r, l, par = spec.memory, spec.bias, spec.retention, spec.learner, spec.parallel
    channels = spec.gate_channels()
    if spec.generalized_delta:  # validated: linear memory, gd, none/decay over heads or key channels, exact
        return "gdelta", ""
    if {channels.get("alpha"), channels.get("theta")} == {"k", "v"}:
        return None, ("α over key channels and θ over value channels (or the reverse) make every pair of tokens "
                      "in a chunk a full matrix of factors, so no chunked form is derived; put both on the same "
                      "side or use algorithm='recurrent'")
    anchored = par.kind == "minibatch" or ir.state_independent_gradient(grad_graph)  # e.g. Hebbian: any chunking
    channel_decay = channel_decay_side(spec)
    if l.kind == "muon":
        if not anchored:
            return None, ("muon with parallel=exact takes each token's gradient at the state the previous token "
                          "left, and Newton–Schulz is not linear, so no chunked form exists; parallel=minibatch(C) "
                          "has one (Atlas §5.1)")
        if not r.linear or channel_decay:
            return None, (f"muon's chunk form unrolls W_t = α_t W_{{t−1}} − η_t NS(S_t) with α per head; "
                          f"`retention = {r.kind}`{' with channel-wise α/θ' if channel_decay else ''} has no such "
                          "unrolling here")
        return "muon", ""
    if anchored and (spec.window > 1 or spec.poly_degree) and channel_decay:
        return None, ("the channel-wise mini-batch form reads raw keys and one token per step; with an Omega window "
                      "or feature=poly it is not derived")
    if anchored:
        return "minibatch", ""
    if spec.window > 1:
        return None, (f"with parallel=exact, each token's gradient sums the Omega window's {spec.window} tokens at "
                      "the state the previous token left; no exact chunked form is derived for that (the delta "
                      "chunk form is one token per step); parallel=minibatch(C) has one (Atlas §3.3)")
    if m.kind == "linear" and b.kind == "l2" and l.kind in ("gd", "implicit") and r.linear:
        return "delta", ""
    if m.kind == "linear" and b.kind == "l2" and l.kind == "momentum" and r.linear:
        if any(channels.values()):
            return None, ("the momentum delta rule's chunk form carries W and S as one state [W, S] whose per-token "
                          "transition mixes them through scalar 2x2 factors (α, θ); a channel-wise gate makes "
                          "those factors per channel, and no chunked form is derived for it: use gates per head "
                          "or algorithm='recurrent'")
        return "momentum_delta", ""
    return None, (f"with parallel=exact, each token's gradient ({b.kind} bias, {m.kind} memory, {l.kind} learner, "
                  f"{r.kind} retention) reads the state the previous token left, and no exact chunked form is "
                  "derived for that combination; parallel=minibatch(C) has one")


# ------------------------------------------------------------------------------------------- Triton kernels
# V tiles: which specs' recurrent kernels split the value rows of the memory over programs
_REDUCTIONS = ("rownorm", "rowsumsq", "rowsum", "layernorm", "layernorm_bwd", "layernorm_bwd2")


def v_tile_reason(spec: S.Spec, forward: ir.Graph, grad: ir.Graph) -> str | None:
    """None when the recurrent kernels may split the value rows of the memory over programs (grid
    (cdiv(Dv, BV), B·H), each program owning BV rows of W and of its accumulator, momentum and anchor):
    every row's update and read depend only on that row and the token. Else the coupling, as a reason."""
    m, b, r = spec.memory, spec.bias, spec.retention
    if m.kind != "linear":
        return f"an MLP memory couples every weight ({'LayerNorm, ' if m.layernorm else ''}hidden layer)"
    if r.kind == "lq":
        return "lq retention normalises by the q-norm of the whole matrix"
    if b.reads_error_norm:  # (Yaad's Huber mixture)
        return f"{b.kind}(mode={b.mode}) switches on the norm of the whole error vector"
    for gr in (forward, grad):  # a reduction over the rows (dimension v) that feeds a computation couples them
        dims = _dims(gr, spec.weight_dims())
        for nid in gr.order():
            op = gr.node(nid)
            if op.op in _REDUCTIONS and dims[gr.srcs(nid)[0]] == "v" and \
                    any(gr.node(c).op != "output" for c in gr.consumers(nid)):
                return f"the {gr.title} graph reduces over the value rows ({op.op})"
    return None


def _dims(gr: ir.Graph, wdims) -> dict[int, str]:
    """The dimension name (k, v, e; s for a per-token scalar, w for a weight) of each node of a graph."""
    dims: dict[int, str] = {}
    for nid in gr.order():
        op, srcs = gr.node(nid), gr.srcs(nid)
        if op.op == "input":
            dims[nid] = {"k": "k", "x": "k", "v": "v", **S.EXTRA_INPUTS}.get(op.arg, "s")
        elif op.op == "weight":
            dims[nid] = "w"
        elif op.op in ("linear", "layer"):
            dims[nid] = wdims[op.arg][0]
        elif op.op == "linear_t":
            dims[nid] = wdims[op.arg][1]
        elif op.op in ("rownorm", "rowsumsq", "rowsum"):
            dims[nid] = "s"
        else:
            dims[nid] = next((dims[x] for x in srcs if dims[x] not in ("s", "w")), "s")
    return dims


def feature_spec(spec: S.Spec) -> S.Spec | None:
    """feature=poly on a linear memory: the plain linear memory the Triton kernels run on φ_p(q), φ_p(k) (mapped
    in torch before every launch; the kernels' key width is φ_p's), under its own name; else None."""
    if not spec.poly_degree or spec.memory.kind != "linear":
        return None
    return spec.model_copy(update={"name": f"{spec.name}_features",
                                   "memory": spec.memory.model_copy(update={"feature": "identity"})})


def window_coefficients(spec: S.Spec, grad: ir.Graph) -> tuple[str, ...]:
    """The per-token coefficients an Omega window carries besides k and v (the module's WINDOW_COEFS): γ, and
    every coefficient the gradient graph reads per token (e.g. Huber's δ), so that token i's loss is ℓ(W; k_i, v_i)
    with its own coefficients."""
    if spec.window == 1:
        return ()
    read = {grad.node(n).arg for n in grad.inputs() if grad.node(n).op == "input"} - {"x", "k", "v"}
    return ("gamma", *sorted(read))


def recurrent_reason(spec: S.Spec, grad: ir.Graph) -> str:
    """Why the fused recurrent kernels (and so every Triton kernel) do not print this spec (the kernels' spec: a chunk
    readout's is its decay form, see `plan`), or "". The Omega rule runs on them (c gradient-factor evaluations per
    token, the window read from sequences with the carried tokens in front), except with a channel-wise coefficient
    inside the window."""
    whys = []
    channel = [n for n in window_coefficients(spec, grad) if spec.gate_channels().get(n)]
    if channel:
        whys.append(f"the Omega rule's window carries the channel-wise {', '.join(channel)}, which the recurrent "
                    "kernels' window sequences (one scalar per token and coefficient) do not take")
    if spec.poly_degree and spec.memory.kind == "mlp":  # (a linear memory's reaches here as its plain copy)
        whys.append(f"feature=poly on an MLP memory feeds φ_p(x) (width 1 + Dk + … + Dk^{spec.poly_degree}) to the "
                    "first layer while the residual adds x itself, two key widths the kernels' tiles do not take")
    elif spec.poly_degree:
        whys.append("feature=poly runs on the kernels as a linear memory over φ_p(q), φ_p(k), but not with "
                    "readout=chunk")
    if spec.learner.kind == "muon":
        whys.append("muon orthogonalises each momentum matrix by Newton–Schulz (whole-matrix products every token), "
                    "which the kernels' row-tiled state updates do not express")
    return "; ".join(whys)


@dataclass(frozen=True)
class ChunkFamily:
    """A chunked Triton kernel family: its name, what it computes in words (its reason where it does not cover a
    spec), and `covers(spec, chunk_kind)`, asked only of specs the chunked kernels take at all
    (`chunk_kernels_reason`)."""

    name: str
    needs: str
    covers: Callable[[S.Spec, str | None], bool]


# The chunked Triton families, in the order they are asked (the first that covers a spec runs it). All but momentum
# share one kernel pair (W_t = e^{g_t} W_0 - Σ e^{g_t - g_s} u_s k_sᵀ, u = Wk W_0ᵀ - U) and differ in the
# chunk-local preparation of Wk and U; momentum's own scans carry the state [W, S] (one triangular solve per chunk
# in the preparation).
CHUNK_FAMILIES = (
    ChunkFamily("hebbian", "the dot bias with gd", lambda s, kind: s.bias.kind == "dot" and s.learner.kind == "gd"),
    ChunkFamily("delta", "the delta chunk form (l2 bias, gd or implicit, parallel=exact; one triangular solve per "
                "chunk)", lambda s, kind: s.bias.kind == "l2" and kind == "delta"),
    ChunkFamily("gdelta", "the generalized delta transition (l2 with read=kappa or erase=kappa; erase as two kernel "
                "rows per token)", lambda s, kind: kind == "gdelta"),
    ChunkFamily("momentum", "the momentum delta chunk form (l2 bias, momentum, gates per head, parallel=exact)",
                lambda s, kind: kind == "momentum_delta"),
    ChunkFamily("minibatch", "l2 bias with gd under parallel=minibatch(C) (gradients at the chunk's anchor)",
                lambda s, kind: s.bias.kind == "l2" and s.parallel.kind == "minibatch" and s.learner.kind == "gd"),
)


def chunk_kernels_reason(spec: S.Spec) -> str:
    """Why no chunked Triton family can take this spec, whatever its bias and learner ("" where one may).
    Channel-wise gates (docs/semantics.md: channel-wise gates): a decay over key channels (alpha=gate(k)) selects the
    kernels that take g per key channel, and lr=gate(k) only scales the written key (folded into the preparation),
    for every family; value-side gates and channel-wise θ run on the recurrent kernel only."""
    m, b, r, l = spec.memory, spec.bias, spec.retention, spec.learner
    if m.kind != "linear":
        return f"the chunked kernels run a linear memory's rank-1 updates; this memory is {m.kind}"
    if not r.linear:
        return f"{r.kind} retention reads the memory through a map of its accumulator"
    if spec.window > 1 and not (l.kind == "gd" and (b.kind == "dot" or spec.parallel.kind == "minibatch")
                                and not spec.channel_gates):
        # the Omega rule as c kernel rows per token needs gradients that do not move within a token
        return ("the Omega rule runs on them as c kernel rows per token only with gradients that do not move within "
                "a token (gd with the dot bias or under minibatch(C), gates per head)")
    value_side = sorted(name for name, side in spec.gate_channels().items()
                        if side and (name, side) not in (("alpha", "k"), ("eta", "k")))
    if value_side:
        return f"the channel-wise {', '.join(value_side)} runs on the recurrent kernel only"
    return ""


def chunk_family_reason(spec: S.Spec, chunk_kind: str | None) -> tuple[str | None, str]:
    """The chunked Triton family that computes this spec exactly (the first of CHUNK_FAMILIES that covers it), or None
    and why none does."""
    why = chunk_kernels_reason(spec)
    if why:
        return None, why
    for family in CHUNK_FAMILIES:
        if family.covers(spec, chunk_kind):
            return family.name, ""
    return None, "the chunked families compute " + "; ".join(f.needs for f in CHUNK_FAMILIES)


def one_chunk_op(spec: S.Spec, family: str) -> bool:
    """Whether a chunk family's whole path (preparation and scan, forward and backward) is one op on q, k, v as they
    are given: the Hebbian write; the delta rule with a decay per head; with a decay over key channels where the
    op runs the scores too (order=pre, the written key the read key). (For chunks of a power of two >= 16 rows.)"""
    sides = spec.gate_channels()
    if family == "hebbian":
        return True
    if family != "delta":
        return False
    r = spec.retention
    return sides.get("alpha") != "k" or (r.decays_first and sides.get("eta") != "k")


def minibatch_reason(spec: S.Spec) -> str | None:
    """Why the mini-batch kernels do not compute this spec (None: they do)."""
    r, l = spec.retention, spec.learner
    if spec.parallel.kind != "minibatch":
        return "the spec is not parallel=minibatch(C)"
    if spec.parallel.readout == "chunk":
        return f"readout=chunk (docs/semantics.md: chunk readouts) with {r.kind} retention has no mini-batch kernel yet"
    if not r.linear:
        return (f"{r.kind} retention reads the memory through a nonlinear map of its accumulator, so the "
                "per-token weights of a chunk are not a sum of rank-1 matmuls")
    if l.kind not in ("gd", "momentum"):
        return f"the {l.kind} learner"
    decays = sorted(g for g, side in spec.gate_channels().items() if side and g in ("alpha", "theta"))
    if decays:
        return (f"a channel-wise {' and '.join(decays)} makes the chunk's decay products one [C, C] matrix per "
                "channel; these kernels take one per head (the torch chunked path has them)")
    return None
