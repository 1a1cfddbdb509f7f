"""PyTorch backend: fills the hand-written module skeleton (templates/torch_module.py.tmpl) with
code printed from the derivation and the IR, and keeps only the skeleton sections the spec needs.

Template directives are whole lines: `# @if FLAG`, `# @elif FLAG`, `# @else`, `# @endif`
(`not FLAG` allowed); `{{NAME}}` is substituted. Nothing in the output imports mirasc.
"""

from __future__ import annotations

from pathlib import Path

from .. import derive as D
from .. import ir
from .. import spec as S
from ..explain import equations
from . import triton_backend, triton_minibatch
from .printers import print_block

TEMPLATE = (Path(__file__).parent / "templates" / "torch_module.py.tmpl").read_text()
LAYER = (Path(__file__).parent / "templates" / "layer.py.tmpl").read_text()


def layer_source(spec: S.Spec, d: D.Derivation) -> str:
    """The Layer class shared by every emitted module (it only calls the module's own functions)."""
    positive = d.positive_domain  # kl, or a Bregman potential defined on w > 0
    defaults = spec.layer_defaults()  # the layer block over the family defaults (MLP memories, attention)
    return LAYER.replace("{{LAYER_DEFAULTS}}", repr(defaults)).replace("{{POSITIVE}}", repr(positive))


def preprocess(text: str, flags: dict[str, bool]) -> str:
    out, stack = [], []  # stack of (branch_taken, active)
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("# @"):
            word, _, arg = s[3:].partition(" ")
            if word == "if":
                val = _flag(arg, flags)
                stack.append((val, val))
            elif word == "elif":
                taken, _ = stack.pop()
                val = (not taken) and _flag(arg, flags)
                stack.append((taken or val, val))
            elif word == "else":
                taken, _ = stack.pop()
                stack.append((True, not taken))
            elif word == "endif":
                stack.pop()
            else:
                raise ValueError(f"unknown template directive {s}")
            continue
        if all(active for _, active in stack):
            out.append(line)
    if stack:
        raise ValueError("unterminated # @if in template")
    return "\n".join(out) + "\n"


def _flag(arg: str, flags: dict[str, bool]) -> bool:
    arg = arg.strip()
    if arg.startswith("not "):
        return not flags[arg[4:].strip()]
    return flags[arg]


def chunked_form(spec: S.Spec, grad_graph: ir.Graph) -> tuple[str | None, str]:
    """Which chunked algorithm computes this spec exactly, or None with the reason."""
    m, b, r, l, par = spec.memory, spec.bias, spec.retention, spec.learner, spec.parallel
    if par.kind == "minibatch":
        return "minibatch", ""
    if ir.state_independent_gradient(grad_graph):
        return "minibatch", ""  # e.g. Hebbian: the gradient never reads the state, any chunking is exact
    if m.kind == "linear" and b.kind == "l2" and l.kind in ("gd", "implicit") and r.kind in ("none", "decay"):
        return "delta", ""
    return None, (f"with parallel=exact, each token's gradient ({b.kind} bias, {m.kind} memory, {l.kind} learner, "
                  f"{r.kind} retention) reads the state the previous token left, and no exact chunked form is "
                  "derived for that combination; parallel=minibatch(C) has one")


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
    if d.elastic is not None:
        parts.append(_elementwise_fn("_elastic_shrink", "a", D.a, d.elastic, "sign(a)·max(|a| − λ, 0)."))
    if d.phi_prime is not None:
        parts.append(_elementwise_fn("_phi_prime", "w", D.w, d.phi_prime, "φ'(w), the mirror map."))
        parts.append(_elementwise_fn("_phi_prime_inv", "u", D.u, d.phi_prime_inv,
                                     "(φ')⁻¹(u), derived by symbolic inversion."))
    if not parts:
        return "# (none here: activations and the bias derivative are inlined into the IR functions below)\n"
    return "\n\n".join(parts)


def _weight_shapes(spec: S.Spec) -> str:
    """The weights' [rows, cols] as code in d_k and d_v."""
    size = {"k": "d_k", "v": "d_v", "e": f"{getattr(spec.memory, 'expansion', 1)} * d_k"}
    return "[" + ", ".join(f"({size[r]}, {size[c]})" for r, c in spec.weight_dims()) + "]"


def _init_doc(spec: S.Spec, d: D.Derivation) -> str:
    m, r = spec.memory, spec.retention
    if d.positive_domain:
        scale = f"c = {S.format_value(r.c)}" if r.kind == "kl" else "1"
        lines = [f"    Weights are positive (the retention needs log W): each row is {scale}·softmax(0.5·N(0, 1))."]
    elif m.kind == "linear":
        lines = ["    Linear memory: W = 0 (an empty memory)."]
    else:
        lines = ["    MLP memory: every W_i ~ N(0, 1/fan_in)."]
    if r.kind in ("lq", "elastic"):
        lines.append("    The accumulator A_i is drawn as above and W_i is its readout, so the pair is consistent.")
    if spec.learner.kind == "momentum":
        lines.append("    Momentum buffers S_i start at 0.")
    return "\n".join(lines)


def emit(spec: S.Spec, d: D.Derivation, forward: ir.Graph, grad: ir.Graph) -> str:
    m, r, l, par = spec.memory, spec.retention, spec.learner, spec.parallel
    kind, reason = chunked_form(spec, grad)
    coefs = spec.coefficients()
    constants = {g: float(v) for g, v in coefs.items() if v != S.GATE}
    for g, val in S.UNDECLARED.items():
        if g not in coefs and ((g == "eta") or (g == "alpha" and r.kind in ("decay", "lq", "kl", "elastic"))
                               or (g == "theta" and l.kind == "momentum")):
            constants[g] = val
    flags = {
        "minibatch": par.kind == "minibatch",
        "pre_decay": r.kind == "decay" and r.order == "pre",
        "momentum": l.kind == "momentum",
        "implicit": l.kind == "implicit",
        "add_update": r.kind == "none" or (r.kind == "decay" and r.order == "pre"),
        "decay_post": r.kind == "decay" and r.order == "post",
        "alpha_acc": r.kind in ("lq", "kl", "elastic"),
        "has_alpha": r.kind in ("decay", "lq", "kl", "elastic"),
        "lq": r.kind == "lq", "kl": r.kind == "kl", "elastic": r.kind == "elastic", "bregman": r.kind == "bregman",
        "acc_A": r.kind in ("lq", "elastic"),
        "readout": r.kind in ("lq", "kl", "elastic", "bregman"),
        "layernorm": m.kind == "mlp" and m.norm == "layernorm",
        "residual": m.kind == "mlp" and m.residual,
        "linear": m.kind == "linear",
        "positive": d.positive_domain,
        "chunk_minibatch": kind == "minibatch",
        "chunk_delta": kind == "delta",
    }
    subs = {
        "SPEC": spec.canonical(),
        "GATES": repr(spec.gates),
        "WEIGHTS": repr(spec.weights),
        "CONSTANTS": repr(dict(sorted(constants.items()))),
        "CHUNKED": repr(kind is not None),
        "DEFAULT_CHUNK": "64",
        "MINIBATCH": str(par.C) if par.kind == "minibatch" else "None",
        "KL_C": repr(float(r.c)) if r.kind == "kl" else "None",
        "LQ_Q": repr(float(r.q)) if r.kind == "lq" else "None",
        "ELEMENTWISE": _elementwise(spec, d),
        "IR_FUNCTIONS": _print_graph(forward, "_memory_forward") + "\n\n" + _print_graph(grad, "_memory_grad"),
        "INIT_DOC": _init_doc(spec, d),
        "SHAPES": _weight_shapes(spec),
        "POSITIVE_SCALE": repr(float(r.c)) if r.kind == "kl" else "1.0",
        "NO_CHUNK_REASON": reason.replace('"', "'"),
        "ORDER": r.order if r.kind == "decay" else "none",
    }
    coef_order = sorted(set(spec.gates) | set(constants))
    try:
        triton_section, no_triton = triton_backend.emit(spec, d, forward, grad, coef_order), ""
    except triton_backend.Unsupported as err:
        triton_section, no_triton = "", str(err)
    flags["triton"] = bool(triton_section)
    family = triton_backend.chunk_family(spec, kind) if triton_section else None
    flags["triton_chunked"] = family is not None
    if family is not None:
        triton_section += triton_backend.emit_chunked(spec, family, preprocess)
    minibatch = bool(triton_section) and family is None and triton_minibatch.minibatch_reason(spec) is None
    flags["triton_minibatch"] = minibatch
    flags["triton_packed"] = flags["triton_chunked"] or minibatch  # cu_seqlens in one launch (padded rows)
    if minibatch:
        triton_section += triton_minibatch.emit_minibatch(spec, d, forward, grad, coef_order, preprocess)
    subs["NO_TRITON_REASON"] = no_triton.replace('"', "'")
    body = preprocess(TEMPLATE, flags)
    for key, val in subs.items():
        body = body.replace("{{" + key + "}}", val)
    if "{{" in body:
        raise ValueError("unfilled template slot: " + body[body.index("{{"):][:40])
    if not triton_section:
        triton_line = f"Triton: none ({no_triton})."
    else:
        triton_line = ("Triton (backend='triton'): a fused recurrent kernel printed from the IR, with a generated "
                       "reverse-sweep backward" + (f"; chunked kernels for the {family} family, forward and backward"
                                                   if family else "")
                       + ("; mini-batch dual-form kernels, forward and backward" if minibatch else "") + ".")
    return docstring(spec, d, kind, reason, triton_line) + "\n" + body + triton_section + layer_source(spec, d)


def docstring(spec: S.Spec, d: D.Derivation, kind: str | None, reason: str, triton_line: str = "") -> str:
    eqs = "\n".join("    " + line for line in equations(spec, d))
    algos = {"minibatch": "chunked = mini-batch dual form (prefix sums of rank-1 updates, masked matmuls)",
             "delta": "chunked = delta-rule chunk form (one unit-triangular solve per chunk)",
             None: f"chunked: not available ({reason})"}[kind]
    spec_text = "\n".join("    " + line for line in spec.canonical().splitlines())
    return (f'"""mirasc-generated memory `{spec.name}` — standalone: imports only torch.\n\n'
            f"Spec:\n\n{spec_text}\n\nDerived update rule, per (batch, head), for t = 1..T:\n\n{eqs}\n\n"
            f"Algorithms: recurrent = the token loop above (reference); {algos}.\n"
            + (f"{triton_line}\n" if triton_line else "") +
            "Shapes: q, k [B, T, H, Dk]; v [B, T, H, Dv]; gates [B, T, H]; o [B, T, H, Dv].\n"
            '"""\n').replace("\\", "\\\\")


__all__ = ["emit", "preprocess", "chunked_form", "layer_source"]
