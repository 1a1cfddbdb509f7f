"""The module assembler of a parametric memory: fills the hand-written skeleton (templates/torch_module.py.tmpl)
with code printed from the derivation and the IR, the runtime pieces the spec and its Plan (mirasc/plan.py) name
(torch_pieces), the header's constants (mirasc.runtime.memory_spec's declarations with the spec's values) and the
optional sections of the spec's choices (its slots: mirasc.codegen.slots), and appends the Triton sections the Plan
names and the Layer. Nothing in the output imports mirasc.
"""

from __future__ import annotations

import sympy as sp

from .. import derive as D
from .. import ir
from ..explain import equations
from ..language import layer_options
from ..language import spec as S
from ..plan import Plan, channel_decay_side, window_coefficients
from ..printers import TorchPrinter, print_block
from . import torch_learner, torch_pieces, torch_retention, triton_backend, triton_minibatch
from .slots import TEMPLATES, fill_lines, section
from .standalone import quoted, runtime_constants, runtime_functions, runtime_source

TEMPLATE = (TEMPLATES / "torch_module.py.tmpl").read_text()
LAYER = (TEMPLATES / "layer.py.tmpl").read_text()
# The template's optional sections: the flag that keeps each, the line it fills and its file in templates/sections/
SECTIONS = (("precond", "PRECOND_SECTION", "precond"),
            ("chunk_readout_triton", "CHUNK_READOUT_SECTION", "chunk_readout"),
            ("multistep", "VARIANT_SECTION", "multistep"), ("composite", "VARIANT_SECTION", "composite"))
# The header's constants (what each means: mirasc.runtime.memory_spec), and those that only some choices have, with
# the flag that keeps each (a retention's and a learner's own come from their printers, torch_retention and
# torch_learner)
HEADER = ("GATES", "GATE_CHANNELS", "EXTRAS", "WEIGHTS", "CONSTANTS", "CHUNKED", "NO_CHUNK_REASON", "POSITIVE_WEIGHTS",
          "RESIDUAL", "DEFAULT_CHUNK", "HALF_IN_PLACE", "PACKED", "MINIBATCH", "CHUNK_READOUT", "ERASE_WRITE",
          "ACCUMULATORS", "MOMENTUM_BUFFERS", "STATISTIC", "WEIGHT_INIT", "POSITIVE_SCALE", "WINDOW", "WINDOW_COEFS",
          "WINDOW_STATE")
CHOICES = {"STEPS": "multistep", "HALF_DOTS": "triton", "CHANNEL_SIDE": "channel_minibatch",
           "POLY_DEGREE": "poly_features"}


def layer_source(spec: S.Spec, d: D.Derivation) -> str:
    """The Layer class shared by every emitted module (it only calls the module's own functions)."""
    # how the Layer keeps learned initial weights positive: kl's rows c·softmax(logits), a Bregman potential on w > 0
    # exp(log-weights); None where the weights may take any sign
    positive = ("softmax" if spec.retention.kind == "kl" else "exp") if d.positive_domain else None
    defaults = spec.layer_defaults()  # the layer block over the family defaults (MLP memories, attention)
    par = spec.parallel
    lq_chunk = par.chunk_readout and spec.retention.kind == "lq"
    unread = spec.weights if lq_chunk else ()
    unread += ("A",) if spec.precond else ()  # the preconditioner's statistic: a sum of squares from 0
    schema = "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in layer_options.schema().items()) + "}"
    header = runtime_constants("memory_spec", {
        "LAYER_DEFAULTS": repr(defaults), "LAYER_SCHEMA": schema, "_POSITIVE": repr(positive),
        "_POSITIVE_SCALE": repr(float(spec.retention.c)) if positive == "softmax" else "1.0",
        "_UNREAD": repr(tuple(unread)), "_LAYER_STEPS": "STEPS" if spec.steps > 1 else "1"})
    return (fill_lines(LAYER, {"LAYER_HEADER": header})
            .replace("{{LAYER_CHECKS}}", runtime_source("layer_options"))
            .replace("{{LAYER_GATES}}", runtime_source("layer_gates"))
            .replace("{{LAYER_STREAMS}}", runtime_source("layer_streams"))
            .replace("{{LAYER_STATE}}", runtime_source("layer_state"))
            .replace("{{LAYER}}", runtime_functions("layer", ["Layer"] + torch_pieces.default_layer_hooks(spec))))


# The range each coefficient's per-head constant must lie in, as code on a tensor x, and in words.
PER_HEAD_RANGE = {"eta": ("x >= 0", "a learning rate is >= 0"), "alpha": ("(x >= 0) & (x <= 1)", "a retention "
                  "factor is in [0, 1]"), "theta": ("(x >= 0) & (x <= 1)", "a momentum factor is in [0, 1]"),
                  "delta": ("x > 0", "a Huber threshold is > 0"),
                  "gamma": ("(x >= 0) & (x <= 1)", "an Omega-rule token weight is in [0, 1]"),
                  "nu": ("(x >= 0) & (x <= 1)", "a preconditioner statistic's decay is in [0, 1]"),
                  "rho": ("x >= 0", "a preconditioner statistic's rate is >= 0")}


def per_head_source(spec: S.Spec, none: bool = False) -> str:
    """`_per_head_coefficients(H, device)`: the spec's per-head constants (docs/language.md, "Per-head constants")
    evaluated for H heads, each [H] in float64 and checked against its coefficient's range (the compiler checked
    H <= 64; a module may run with more heads). Without any: empty text, or with `none` a function that returns
    none (a parametric memory's coefficients ask for them)."""
    per_head = spec.per_head()
    if not per_head:
        return "" if not none else ("\n\ndef _per_head_coefficients(H, device):\n    \"\"\"The coefficients that are "
                                    "constant over tokens with one value per head: none in this spec.\"\"\"\n"
                                    "    return {}\n")
    printer = TorchPrinter()
    lines = ["", "", "def _per_head_coefficients(H, device):",
             '    """The coefficients that are constant over tokens with one value per head h = 0..H-1, as the spec',
             '    writes them in h and H: name -> [H] (float64), each checked against its range."""',
             "    h = torch.arange(H, dtype=torch.float64, device=device)",
             "    out = {}"]
    for name, c in sorted(per_head.items()):
        cond, words = PER_HEAD_RANGE[name]
        lines += [f"    # {name}_h = {S.format_value(c)}",
                  f"    x = torch.as_tensor({printer.doprint(c.expr)}, dtype=torch.float64, device=device).expand(H)",
                  f"    if not bool((torch.isfinite(x) & ({cond})).all()):",
                  f"        raise ValueError(f\"per-head {name} = {S.format_value(c)} leaves its range for H = {{H}} "
                  f"heads\"",
                  f"                         f\" ({words}): {{x.tolist()}}\")",
                  f'    out["{name}"] = x']
    lines.append("    return out")
    return "\n".join(lines) + "\n"


def _scaled_factors(grad: ir.Graph) -> ir.Graph:
    """The gradient-factor graph with each δ_i multiplied by a per-token coefficient `lqs<i-1>` (lq under
    readout=chunk on the Triton kernels: the chunk's updates of weight i in weight space are scaled by 1/n_i)."""
    out = ir.Graph(grad.title)
    out.g = grad.g.copy()
    out.counter = grad.counter
    s, g = sp.Symbol("s", real=True), sp.Symbol("g", real=True)
    for o in grad.outputs():
        name = grad.node(o).arg
        if not name.startswith("delta"):
            continue
        i = int(name[len("delta"):]) - 1
        src = grad.srcs(o)[0]
        coef = out.add("input", arg=f"lqs{i}", name=f"lqs{i}")
        scaled = out.ew(s * g, {s: coef, g: src}, name=f"scaled_delta{i + 1}")
        out.g.remove_edge(src, o)
        out.g.add_edge(scaled, o)
        out.g.nodes[o]["srcs"] = (scaled,)
    return ir.run_pipeline(out)


def _print_graph(gr: ir.Graph, fn: str) -> str:
    """Print an IR graph as one Python function."""
    if gr.title == "memory_forward":
        head = f"def {fn}(layer, x):\n    \"\"\"y = M(x); layer(i, h) applies weight i to h.\"\"\""
    else:
        head = (f"def {fn}(W, k, v, c):\n    \"\"\"Gradient factors at weights W: for each weight i, (δ_i, x_i) with "
                "∇_{W_i} ℓ = δ_i x_iᵀ per token.\"\"\"")
    names: dict[int, str] = {}
    body: list[str] = []
    outputs: dict[str, str] = {}
    for nid in gr.order():
        op, srcs = gr.node(nid), gr.srcs(nid)
        a = [names[s] for s in srcs]
        var = op.name
        if op.op == "input":
            names[nid] = op.arg if op.arg in ("x", "k", "v") else f'c["{op.arg}"]'
            continue
        if op.op == "weight":
            names[nid] = f"W[{op.arg}]"
            continue
        if op.op == "output":
            outputs[op.arg] = a[0]
            continue
        if op.op == "ew" and not srcs:  # a constant (e.g. the derivative of a linear custom loss)
            body.append(f"{var} = torch.full_like(v, {float(op.arg[0])!r})")
        elif op.op == "ew":
            expr, syms = op.arg
            body += print_block({var: expr}, dict(zip(syms, a)), prefix=f"_{var}_")
        elif op.op == "layer":
            body.append(f"{var} = layer({op.arg}, {a[0]})")
        elif op.op == "linear":
            body.append(f"{var} = {a[1]} @ {a[0]}.transpose(-1, -2)")
        elif op.op == "linear_t":
            body.append(f"{var} = {a[1]} @ {a[0]}")
        elif op.op == "rownorm":
            body.append(f"{var} = torch.linalg.vector_norm({a[0]}, dim=-1, keepdim=True)")
        elif op.op == "rowsumsq":
            body.append(f"{var} = ({a[0]} * {a[0]}).sum(-1, keepdim=True)")
        elif op.op == "layernorm":
            body.append(f"{var} = _layernorm({a[0]})")
        elif op.op == "layernorm_bwd":
            body.append(f"{var} = _layernorm_backward({a[0]}, {a[1]})")
        elif op.op == "features":
            body.append(f"{var} = _poly_features({a[0]})")
        else:
            raise ir.IRError(f"torch backend: no printer for op {op.op}")
        names[nid] = var
    if gr.title == "memory_forward":
        body.append(f"return {outputs['y']}")
    else:
        layers = sorted(int(k[5:]) for k in outputs if k.startswith("delta"))
        pairs = ", ".join(f"({outputs[f'delta{i}']}, {outputs[f'input{i}']})" for i in layers)
        body.append(f"return ({pairs},)")
    return head + "\n" + "\n".join("    " + line for line in body) + "\n"


def _elementwise_fn(name: str, arg: str, symbol, expr, doc: str) -> str:
    body = print_block({"out": expr}, {symbol: arg})
    return (f'def {name}({arg}):\n    """{doc}"""\n' + "\n".join("    " + line for line in body)
            + "\n    return out\n")


def _elementwise(spec: S.Spec, d: D.Derivation) -> str:
    parts = []
    r = spec.retention
    if d.entrywise is not None:  # the retention's entrywise map of its accumulator
        parts.append(_elementwise_fn(r.map_name, "a", D.a, d.entrywise, r.map_doc))
    if d.phi_prime is not None:
        parts.append(_elementwise_fn("_phi_prime", "w", D.w, d.phi_prime, "φ'(w), the mirror map."))
        parts.append(_elementwise_fn("_phi_prime_inv", "u", D.u, d.phi_prime_inv,
                                     "(φ')⁻¹(u), derived by symbolic inversion."))
    if not parts:
        return "# (none here: activations and the bias derivative are inlined into the IR functions below)\n"
    return "\n\n".join(parts)


def _weight_shapes(spec: S.Spec) -> str:
    """The weights' [rows, cols] as code in d_k and d_v."""
    size = {"k": "d_k", "v": "d_v", "e": f"{getattr(spec.memory, 'expansion', 1)} * d_k", "f": "_feature_width(d_k)"}
    return "[" + ", ".join(f"({size[r]}, {size[c]})" for r, c in spec.weight_dims()) + "]"


def _constants(spec: S.Spec) -> dict[str, float]:
    """The coefficients that are numbers in the spec, and the undeclared ones the update reads (η = 1, α = 1, θ = 0)."""
    r, l = spec.retention, spec.learner
    coefs = spec.coefficients()
    per_head = spec.per_head()  # filled per head by _per_head_coefficients, then like a gate
    constants = {g: float(v) for g, v in coefs.items() if v not in S.GATE_FORMS and g not in per_head}
    for g, val in S.UNDECLARED.items():
        if g not in coefs and ((g == "eta") or (g == "alpha" and r.gated)
                               or (g == "theta" and l.kind == "momentum")):
            constants[g] = val
    return constants


def emit(spec: S.Spec, d: D.Derivation, forward: ir.Graph, grad: ir.Graph, the_plan: Plan) -> tuple[str, Plan]:
    """The emitted module: docstring, the torch template (its flags and slots), the Triton sections, the Layer.
    A `precond` learner: the public op (its gates, constants, spec text, state "A") is the spec's, and everything
    after the preconditioner is printed for `spec.inner_spec()`, gd(lr=gate(k)) (the IR graphs are the inner
    spec's too: compiler.compile_parsed). Returns the text and the Plan as emitted (without Triton kernels where a
    function has no Triton equivalent)."""
    outer, spec = spec, spec.inner_spec()
    kind, reason = the_plan.chunk_form, the_plan.no_chunk_form
    per_head = spec.per_head()
    constants = _constants(spec)
    flags = _flags(spec, d, kind)
    subs = _slots(spec, d, forward, grad, kind, reason, constants)
    if outer.precond:  # the op's public coefficients are the precond learner's (η, ν, ρ); the inner run's follow
        public = outer.gate_channels()
        subs.update(SPEC=outer.canonical(), GATES=repr(outer.gates), CONSTANTS=repr(dict(sorted(
            _constants(outer).items()))), GATE_CHANNELS=repr({g: side for g, side in public.items() if side}),
            PER_HEAD=per_head_source(outer, none=True))
        lrn = outer.learner
        flags.update(precond=True)
        subs["STATISTIC"] = "True"
        multiplier = {"transform": lrn.transform, "eps": float(lrn.eps)} | (
            {"base": float(lrn.base), "center": float(lrn.center)} if lrn.transform == "atk" else {})
        subs["PRECOND_CONSTANT"] = "\n".join(runtime_constants("memory_spec", {"PRECOND": repr(multiplier)}))
    coef_order = sorted(set(spec.gates) | set(constants) | set(per_head)) \
        + (["eta_ch"] if spec.gate_channels().get("eta") else []) \
        + list(spec.extras)  # (the key inputs, e.g. κ, travel to the Triton kernels with the coefficients)
    triton_section, the_plan = _triton_sections(spec, the_plan, coef_order)
    flags.update(_triton_flags(the_plan))
    subs["HALF_DOTS"] = quoted(the_plan.dots)
    subs["CHUNK_READOUT"] = repr(flags["chunk_readout_triton"])
    # the retention works with log W (a given state's weights must be > 0), except kl's chunk readout, in weight space
    subs["POSITIVE_WEIGHTS"] = repr(d.positive_domain and not flags["chunk_kl"])
    subs.update(torch_pieces.pieces(outer, spec, flags, the_plan))
    retention, learner = torch_retention.for_spec(spec, d.entrywise is not None), torch_learner.for_spec(spec)
    hooks = torch_retention.hooks(retention)
    subs["UPDATE_RULE"] = torch_retention.step_functions(retention, learner)
    subs["RETENTION_STATE"] = torch_retention.state_functions(retention)
    hooks.update(_line_slots(flags, subs.pop("CHUNK_SECTIONS"), the_plan.no_triton))
    hooks["HEADER"] = runtime_constants("memory_spec", {"SPEC": f'"""\\\n{subs["SPEC"]}"""'} | {
        name: subs[name] for name in HEADER} | {name: subs[name] for name, flag in CHOICES.items() if flags[flag]}
        | retention.header() | learner.header())
    body = fill_lines(TEMPLATE, hooks)
    for key, val in subs.items():
        body = body.replace("{{" + key + "}}", val)
    if "{{" in body:
        raise ValueError("unfilled template slot: " + body[body.index("{{"):][:40])
    triton_line = _triton_line(spec, the_plan)
    return (docstring(outer, d, kind, reason, triton_line) + "\n" + body + triton_section + layer_source(outer, d),
            the_plan)


def _line_slots(flags: dict[str, bool], chunk_sections: str, no_triton: str) -> dict[str, list[str]]:
    """The template's slots that are whole lines, or none: the imports, the optional sections, the torch chunked
    algorithm's sections and the Triton kernels' names (or why there are none)."""
    slots = {"IMPORTS": ["import functools"] if flags["chunked"] else [],
             "CHUNK_SECTIONS": chunk_sections.split("\n")[:-1],
             "TRITON_NAMES": ["_triton_kernels = {{KERNEL_PLAN}}  # launch_plan's kernels on a GPU"] if flags["triton"]
             else runtime_constants("memory_spec", {"NO_TRITON_REASON": quoted(no_triton)}) + [
                   "# (no Triton kernel: this module imports no triton, and the route refuses backend='triton' before "
                   "these are read)", "triton = _triton_kernels = _dot_precision = None"]}
    for flag, slot, name in SECTIONS:
        slots.setdefault(slot, [])
        if flags[flag]:
            slots[slot] = section(name)
    return slots


def _flags(spec: S.Spec, d: D.Derivation, kind: str | None) -> dict[str, bool]:
    """The choices that decide which pieces, sections and header constants the module carries (the Triton ones are
    added from the Plan by _triton_flags)."""
    m, r, l, par = spec.memory, spec.retention, spec.learner, spec.parallel
    channel_decay = channel_decay_side(spec)
    chunk_readout = par.chunk_readout  # docs/semantics.md: chunk readouts (lq or kl)
    return {
        "chunked": kind is not None,  # a chunked form exists (CHUNKED; algorithm='chunked' is refused otherwise)
        "chunk_lq": chunk_readout and r.kind == "lq",
        "chunk_kl": chunk_readout and r.kind == "kl",
        "token_readout": r.mapped and not chunk_readout,
        "pre_decay": r.decays_first,
        "muon": l.kind == "muon",
        "omega": spec.window > 1,
        "poly_features": bool(spec.poly_degree),
        "chunk_muon": kind == "muon",
        "implicit": l.kind == "implicit",
        "layernorm": m.layernorm,
        "composite": spec.composite,
        "chunk_minibatch": kind == "minibatch" and not channel_decay,
        "chunk_delta": kind == "delta" and not spec.channel_gates,
        "chunk_momentum_delta": kind == "momentum_delta",
        "channel_minibatch": kind == "minibatch" and bool(channel_decay),
        "channel_delta": kind == "delta" and spec.channel_gates,
        "channel_chunks": (kind is not None and spec.channel_gates) or kind == "gdelta",
        "chunk_gdelta": kind == "gdelta",
        "gdelta_write": spec.generalized_delta == "erase",
        "multistep": spec.steps > 1,
        "precond": False,  # (set by emit for a precond learner's public op)
        "channel_k_fast": (channel_decay == "k" and spec.gate_channels().get("alpha") == "k"
                           and l.kind != "momentum" and r.linear),
    }


def _slots(spec: S.Spec, d: D.Derivation, forward: ir.Graph, grad: ir.Graph, kind: str | None, reason: str,
           constants: dict[str, float]) -> dict[str, str]:
    """The {{SLOT}} texts of the torch template."""
    r, par = spec.retention, spec.parallel
    window = window_coefficients(spec, grad)  # (what an Omega window token keeps besides k and v)
    init = "softmax" if d.positive_domain else "zeros" if spec.memory.kind == "linear" else "normal"
    return {
        "SPEC": spec.canonical(),
        "GATES": repr(spec.gates),
        "EXTRAS": repr(spec.extras),
        "GATE_CHANNELS": repr({g: side for g, side in spec.gate_channels().items() if side}),
        "WEIGHTS": repr(spec.weights),
        "CONSTANTS": repr(dict(sorted(constants.items()))),
        "PER_HEAD": per_head_source(spec, none=True),
        "COMPOSITE_CONSTANTS": "\n".join(runtime_constants("composite", {  # (a composite memory's section)
            "FEATURE": quoted(spec.feature), "NORMALIZE": repr(spec.normalized),
            "NORM_EPS": repr(float(spec.memory.eps)) if spec.memory.kind == "linear" else "None"})),
        "CHUNKED": repr(kind is not None),
        "DEFAULT_CHUNK": "64",
        "MINIBATCH": repr(par.size or None),
        "RESIDUAL": repr(spec.memory.adds_input),
        "ERASE_WRITE": repr(spec.generalized_delta == "erase"),
        "ELEMENTWISE": _elementwise(spec, d),
        "IR_FUNCTIONS": _print_graph(forward, "_memory_forward") + "\n\n" + _print_graph(grad, "_memory_grad"),
        "SHAPES": _weight_shapes(spec),
        "POSITIVE_SCALE": repr(float(r.c)) if r.kind == "kl" else "1.0",
        "NO_CHUNK_REASON": "None" if kind is not None else repr(reason),
        "CHANNEL_SIDE": quoted(channel_decay_side(spec) or ""),
        "STEPS": str(spec.steps),
        "WINDOW": str(spec.window),
        "WINDOW_COEFS": repr(window),
        "WINDOW_STATE": "(" + ", ".join(f'"win_{n}"' for n in ("k", "v", *window)) + ")" if spec.window > 1 else "()",
        "ACCUMULATORS": repr(r.keeps_accumulator),
        "MOMENTUM_BUFFERS": repr(spec.learner.momentum_buffer),
        "STATISTIC": "False",  # (a precond learner's public op sets it: emit)
        "WEIGHT_INIT": quoted(init),
        "POLY_DEGREE": str(spec.poly_degree),
    }


def _triton_sections(spec: S.Spec, the_plan: Plan, coef_order: list[str]) -> tuple[str, Plan]:
    """The Triton sections of the module: the fused recurrent kernels, then the chunk-parallel family the Plan names
    (chunked, or else mini-batch); and the Plan, without Triton kernels where the printers find no Triton
    equivalent of a function."""
    if not the_plan.triton:
        return "", the_plan
    # readout=chunk (docs/semantics.md: chunk readouts) on Triton: each chunk is the dual form of a decay retention,
    # launched per chunk by _chunk_readout_triton. kl: after the lag token (torch), anchored at W_s. lq: anchored at
    # A_{s-1} / n_c, in weight space, with the updates of weight i scaled by 1/n_i: δ_i times a per-chunk coefficient
    # lqs<i>.
    k = the_plan.kernels
    tri_grad, tri_coefs = k.grad, coef_order
    if the_plan.lq_scale:
        tri_grad = _scaled_factors(k.grad)
        tri_coefs = coef_order + [f"lqs{i}" for i in range(len(spec.weights))]
    try:
        section = triton_backend.emit(k.spec, k.d, k.forward, tri_grad, tri_coefs, the_plan.no_v_tiles,
                                      the_plan.features)
    except triton_backend.Unsupported as err:
        return "", the_plan.without_triton(str(err))
    if the_plan.chunk_family is not None:
        section += triton_backend.emit_chunked(k.spec, the_plan.chunk_family, lq_scale=the_plan.lq_on_chunks,
                                               features=the_plan.features)
    if the_plan.minibatch:
        section += triton_minibatch.emit_minibatch(k.spec, k.d, k.forward, tri_grad, tri_coefs)
    return section, the_plan


def _triton_flags(the_plan: Plan) -> dict[str, bool]:
    """The template's Triton flags, from the Plan."""
    return {
        "triton": the_plan.triton,
        "triton_chunked": the_plan.chunk_family is not None,
        "triton_minibatch": the_plan.minibatch,
        "chunk_readout_triton": the_plan.chunk_readout and the_plan.triton,
    }


def _triton_line(spec: S.Spec, the_plan: Plan) -> str:
    """The docstring's line on what runs with backend='triton'."""
    family, minibatch = the_plan.chunk_family, the_plan.minibatch
    if not the_plan.triton:
        return f"Triton: none ({the_plan.no_triton})."
    if the_plan.chunk_readout:
        how = ("each chunk's lag token in torch and the rest of the chunk" if spec.retention.kind == "kl" else
               "each chunk, anchored at A_{s-1}/n_c with weight i's updates scaled by 1/n_i,")
        kernels = f"chunked {family} family" if family else "mini-batch"
        return (f"Triton (backend='triton', algorithm='chunked' or 'auto'): readout=chunk runs {how} on the "
                f"dual-form kernels of its decay form ({kernels} kernels, forward and backward), one launch "
                "per chunk; no fused recurrent kernel.")
    return ("Triton (backend='triton'): a fused recurrent kernel printed from the IR, with a generated "
            "reverse-sweep backward" + (f"; chunked kernels for the {family} family, forward and backward"
                                        if family else "")
            + ("; mini-batch dual-form kernels, forward and backward" if minibatch else "") + ".")


def docstring(spec: S.Spec, d: D.Derivation, kind: str | None, reason: str, triton_line: str = "") -> str:
    eqs = "\n".join("    " + line for line in equations(spec, d))
    algos = {"minibatch": "chunked = mini-batch dual form (prefix sums of rank-1 updates, masked matmuls)",
             "delta": "chunked = delta-rule chunk form (one unit-triangular solve per chunk)",
             "gdelta": "chunked = generalized delta chunk form (one unit-triangular solve per chunk, WY/UT form)",
             "momentum_delta": "chunked = momentum delta chunk form (the state [W, S] under 2x2 scalar transitions, "
                               "one unit-triangular solve per chunk)",
             "muon": "chunked = muon's chunk form (momentum prefix sums at the anchor, batched Newton–Schulz, "
                     "per-token weights)",
             None: f"chunked: not available ({reason})"}[kind]
    if spec.steps > 1:
        algos += f"; both run over the T·{spec.steps} sub-steps"
    spec_text = "\n".join("    " + line for line in spec.canonical().splitlines())
    return (f'"""mirasc-generated memory `{spec.name}` — standalone: imports only torch.\n\n'
            f"Spec:\n\n{spec_text}\n\nDerived update rule, per (batch, head), for t = 1..T:\n\n{eqs}\n\n"
            f"Algorithms: recurrent = the token loop above (reference); {algos}.\n"
            + (f"{triton_line}\n" if triton_line else "")
            + (_shapes_line(spec) if spec.steps > 1 else
               "Shapes: q, k [B, T, H, Dk]; v [B, T, H, Dv]; gates [B, T, H]; o [B, T, H, Dv]"
               + "".join(f"; extras['{n}'] [B, T, H, Dk]" for n in spec.extras) + ".\n")
            + '"""\n').replace("\\", "\\\\")


def _shapes_line(spec: S.Spec) -> str:
    """The docstring's shapes for a multi-step learner: a key, a value and η per inner step."""
    n = spec.steps
    return (f"Shapes: q [B, T, H, Dk]; k [B, T, H, {n}, Dk]; v [B, T, H, {n}, Dv] ({n} pairs per token); "
            f"gates [B, T, H], η [B, T, H, {n}]; o [B, T, H, Dv]"
            + "".join(f"; extras['{x}'] [B, T, H, {n}, Dk]" for x in spec.extras) + ".\n")


__all__ = ["emit", "layer_source"]
