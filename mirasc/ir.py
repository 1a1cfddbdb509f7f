"""The dataflow IR: one small node type in a networkx graph, a verifier, and named passes.

Two graphs are built per parametric spec:
  * `memory_forward`: y = M(x) with each weight matmul abstracted as `layer[i](h)`, so the same
    graph prints the plain read (h @ W_iᵀ) and the chunked dual form (masked matmuls);
  * `memory_grad`: the per-token gradient factors at given weights: for each weight W_i the pair
    (δ_i, x_i) with ∇_{W_i} ℓ = δ_i x_iᵀ, obtained by the chain rule through the memory: forward on
    k, residual e, dℓ/dy from the derivation, then back through residual, LayerNorm, activations.
Token tensors are [B, H, N, D] (N = 1 for the recurrent step, N = C for a mini-batch chunk).

Passes (PIPELINE) run in order with the verifier between them: CSE, elementwise fusion (SymPy
substitution of single-use elementwise producers into their consumer), dead-code removal, kernel
grouping. `dump()` is the stable text form behind `mirasc compile --dump-ir`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import sympy as sp

from . import derive as D
from .language import primitives as P
from .language import spec as S

# op -> number of sources (None: variable)
ARITY = {
    "input": 0, "weight": 0,
    "layer": 1,        # layer[i](h) = h @ W_iᵀ (forward graph: the weight is abstract)
    "linear": 2,       # (W_i, h) -> h @ W_iᵀ
    "linear_t": 2,     # (W_i, d) -> d @ W_i        (back-propagation through W_i)
    "ew": None,        # elementwise SymPy expression of its sources (broadcasting)
    "rownorm": 1,      # ‖t‖₂ over the last axis, keepdim
    "rowsumsq": 1,     # Σ t² over the last axis, keepdim
    "layernorm": 1,    # LayerNorm over the last axis, no affine, eps 1e-5
    "layernorm_bwd": 2,  # (z, dℓ/dy) -> dℓ/dz for y = LayerNorm(z)
    "rowsum": 1,       # Σ t over the last axis, keepdim (a vector's cotangent flowing into a scalar)
    "layernorm_bwd2": 3,  # (z, dy, g) -> ∂/∂z ⟨g, layernorm_bwd(z, dy)⟩ (reverse mode through LayerNorm's backward)
    "features": 1,     # φ_p(x) = [1, x, x⊗x/√2!, …, x^⊗p/√p!] over the last axis (arg: p; Atlas' polynomial map)
    "output": 1,
}
MATMUL_OPS = ("layer", "linear", "linear_t")


@dataclass(frozen=True)
class Op:
    """The one IR node type: what it computes (`op`), its payload (`arg`), and a readable name."""

    op: str
    arg: Any = None
    name: str = ""


@dataclass
class Graph:
    title: str
    g: nx.DiGraph = field(default_factory=nx.DiGraph)
    counter: int = 0

    def add(self, op: str, *srcs: int, arg: Any = None, name: str = "") -> int:
        nid = self.counter
        self.counter += 1
        self.g.add_node(nid, node=Op(op, arg, name or f"{op}{nid}"), srcs=tuple(srcs))
        for s in srcs:
            self.g.add_edge(s, nid)
        return nid

    def ew(self, expr: sp.Expr, bind: dict[sp.Symbol, int], name: str = "") -> int:
        """An elementwise node; `bind` maps each free symbol of `expr` to a source node."""
        syms = tuple(sorted((s for s in expr.free_symbols), key=lambda s: s.name))
        missing = [s for s in syms if s not in bind]
        if missing:
            raise ValueError(f"unbound symbols {missing} in {expr}")
        if not syms:  # a constant: still a tensor-producing node, bound to nothing
            return self.add("ew", arg=(expr, ()), name=name)
        return self.add("ew", *(bind[s] for s in syms), arg=(expr, syms), name=name)

    # ------------------------------------------------------------------ views
    def node(self, nid: int) -> Op:
        return self.g.nodes[nid]["node"]

    def srcs(self, nid: int) -> tuple[int, ...]:
        return self.g.nodes[nid]["srcs"]

    def order(self) -> list[int]:
        return list(nx.lexicographical_topological_sort(self.g))

    def outputs(self) -> list[int]:
        return [n for n in self.order() if self.node(n).op == "output"]

    def inputs(self) -> list[int]:
        return [n for n in self.order() if self.node(n).op in ("input", "weight")]

    def consumers(self, nid: int) -> list[int]:
        return sorted(self.g.successors(nid))


# ------------------------------------------------------------------------------- verifier
class IRError(Exception):
    pass


def verify(gr: Graph) -> Graph:
    if not nx.is_directed_acyclic_graph(gr.g):
        raise IRError(f"{gr.title}: graph has a cycle")
    names = set()
    for nid in gr.order():
        op, srcs = gr.node(nid), gr.srcs(nid)
        if op.op not in ARITY:
            raise IRError(f"{gr.title}: unknown op {op.op}")
        want = ARITY[op.op]
        if want is not None and len(srcs) != want:
            raise IRError(f"{gr.title}: %{nid} {op.op} takes {want} sources, has {len(srcs)}")
        for s in srcs:
            if s not in gr.g or not gr.g.has_edge(s, nid):
                raise IRError(f"{gr.title}: %{nid} source %{s} missing or not linked")
        if op.op == "ew":
            expr, syms = op.arg
            if len(syms) != len(srcs) or not expr.free_symbols <= set(syms):
                raise IRError(f"{gr.title}: %{nid} ew symbols {syms} do not bind {expr.free_symbols}")
        if op.op == "output":
            if op.arg in names:
                raise IRError(f"{gr.title}: output {op.arg} defined twice")
            names.add(op.arg)
    if not names:
        raise IRError(f"{gr.title}: no outputs")
    return gr


# --------------------------------------------------------------------------------- passes
def cse(gr: Graph) -> Graph:
    """Merge nodes that compute the same op on the same sources."""
    seen: dict[tuple, int] = {}
    for nid in gr.order():
        op = gr.node(nid)
        if op.op in ("input", "weight", "output"):
            key = (op.op, op.arg)
            if op.op == "output":
                continue
        else:
            arg = op.arg
            if op.op == "ew":
                arg = (sp.srepr(op.arg[0]), op.arg[1])
            key = (op.op, arg, gr.srcs(nid))
        if key in seen:
            _replace_uses(gr, nid, seen[key])
            gr.g.remove_node(nid)
        else:
            seen[key] = nid
    return gr


def _replace_uses(gr: Graph, old: int, new: int) -> None:
    for c in list(gr.g.successors(old)):
        gr.g.nodes[c]["srcs"] = tuple(new if s == old else s for s in gr.srcs(c))
        gr.g.add_edge(new, c)


def fuse_elementwise(gr: Graph) -> Graph:
    """Inline an elementwise node into its only consumer when that consumer is elementwise too."""
    changed = True
    while changed:
        changed = False
        for nid in gr.order():
            op = gr.node(nid)
            cons = gr.consumers(nid)
            if op.op != "ew" or len(cons) != 1 or gr.node(cons[0]).op != "ew":
                continue
            c = cons[0]
            cexpr, csyms = gr.node(c).arg
            csrcs = gr.srcs(c)
            pexpr, psyms = op.arg
            psrcs = gr.srcs(nid)
            # Rename the producer's symbols to the consumer's symbols for the same source, or fresh.
            bind: dict[int, sp.Symbol] = {s: sym for s, sym in zip(csrcs, csyms) if s != nid}
            rename = {}
            for s, sym in zip(psrcs, psyms):
                if s in bind:
                    rename[sym] = bind[s]
                else:
                    fresh = sym
                    taken = {b.name for b in bind.values()}
                    k = 0
                    while fresh.name in taken:
                        k += 1
                        fresh = sp.Symbol(f"{sym.name}_{k}", **sym.assumptions0)
                    bind[s] = fresh
                    rename[sym] = fresh
            inlined = pexpr.xreplace(rename)
            own = [sym for s, sym in zip(csrcs, csyms) if s == nid]
            new_expr = cexpr.xreplace({o: inlined for o in own})
            items = sorted(((b, s) for s, b in bind.items() if b in new_expr.free_symbols), key=lambda t: t[0].name)
            new_syms = tuple(b for b, _ in items)
            new_srcs = tuple(s for _, s in items)
            node = gr.node(c)
            gr.g.nodes[c]["node"] = Op("ew", (new_expr, new_syms), node.name)
            gr.g.nodes[c]["srcs"] = new_srcs
            for s in list(gr.g.predecessors(c)):
                gr.g.remove_edge(s, c)
            for s in new_srcs:
                gr.g.add_edge(s, c)
            gr.g.remove_node(nid)
            changed = True
            break
    return gr


def dead_code(gr: Graph) -> Graph:
    live = set()
    for o in gr.outputs():
        live |= nx.ancestors(gr.g, o) | {o}
    for nid in list(gr.g.nodes):
        if nid not in live:
            gr.g.remove_node(nid)
    return gr


def group_kernels(gr: Graph) -> Graph:
    """Annotate fusion groups: connected regions of elementwise/row-reduction ops between matmuls.
    Each group is what one fused kernel computes; the Triton backend prints one kernel per group."""
    fusable = [n for n in gr.g.nodes
               if gr.node(n).op in ("ew", "rownorm", "rowsumsq", "rowsum", "layernorm", "layernorm_bwd",
                                    "layernorm_bwd2")]
    sub = gr.g.subgraph(fusable).to_undirected()
    for i, comp in enumerate(sorted((sorted(c) for c in nx.connected_components(sub)), key=lambda c: c[0])):
        for n in comp:
            gr.g.nodes[n]["group"] = i
    return gr


PIPELINE = [
    ("verify", verify),
    ("common-subexpressions", cse),
    ("fuse-elementwise", fuse_elementwise),
    ("dead-code", dead_code),
    ("group-kernels", group_kernels),
    ("verify", verify),
]


def run_pipeline(gr: Graph) -> Graph:
    for _, fn in PIPELINE:
        gr = fn(gr)
    return gr


def dump(gr: Graph) -> str:
    lines = [f"graph {gr.title} {{"]
    for nid in gr.order():
        op, srcs = gr.node(nid), gr.srcs(nid)
        args = ", ".join(f"%{s}" for s in srcs)
        if op.op == "ew":
            expr, syms = op.arg
            payload = f"[{expr} | {', '.join(s.name for s in syms)}]"
        elif op.arg is not None:
            payload = f"[{op.arg}]"
        else:
            payload = ""
        group = gr.g.nodes[nid].get("group")
        tail = f"    # fused group {group}" if group is not None else ""
        lines.append(f"  %{nid} {op.name} = {op.op}{payload}({args}){tail}")
    lines.append("}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- builders
def _forward(gr: Graph, spec: S.Spec, d: D.Derivation, x: int, weights: list[int] | None):
    """Adds y = M(x). With `weights`, matmuls are explicit (W_i, h); else abstract `layer[i]`.
    Returns (out, pre_activations, hidden_inputs, y_pre_norm)."""
    m = spec.memory
    depth = m.layers
    # feature=poly: the first layer reads φ_p(x) (the residual below still adds x itself)
    h = gr.add("features", x, arg=spec.poly_degree, name="phi") if spec.poly_degree else x
    zs, hs = [], []
    for i in range(depth):
        hs.append(h)
        z = (gr.add("linear", weights[i], h, arg=i, name=f"z{i + 1}") if weights is not None
             else gr.add("layer", h, arg=i, name=f"z{i + 1}"))
        zs.append(z)
        if i < depth - 1:
            h = gr.ew(d.act.xreplace({D.x: sp.Symbol("z", real=True)}), {sp.Symbol("z", real=True): z},
                      name=f"h{i + 1}")
    y_pre = zs[-1]
    out = y_pre
    if m.layernorm:
        out = gr.add("layernorm", y_pre, name="y_norm")
    if m.adds_input:
        xs, ys = sp.Symbol("x", real=True), sp.Symbol("y", real=True)
        out = gr.ew(xs + ys, {xs: x, ys: out}, name="y")
    return out, zs, hs, y_pre


def build_forward(spec: S.Spec, d: D.Derivation) -> Graph:
    gr = Graph("memory_forward")
    x = gr.add("input", arg="x", name="x")
    out, *_ = _forward(gr, spec, d, x, None)
    gr.add("output", out, arg="y", name="out_y")
    return gr


def build_grad(spec: S.Spec, d: D.Derivation) -> Graph:
    gr = Graph("memory_grad")
    m = spec.memory
    depth = m.layers
    k = gr.add("input", arg="k", name="k")
    vv = gr.add("input", arg="v", name="v")
    weights = [gr.add("weight", arg=i, name=name) for i, name in enumerate(m.weights)]
    # l2(read=kappa | erase=kappa): the memory is read at the regression key κ; the gradient's input factor is
    # the write key k (read) or κ itself (erase; the transition then adds the write v kᵀ)
    gdelta = spec.generalized_delta
    read_at = gr.add("input", arg="kappa", name="kappa") if gdelta else k
    y_out, zs, hs, y_pre = _forward(gr, spec, d, read_at, weights)
    if gdelta == "read":
        hs[0] = k
    bind: dict[sp.Symbol, int] = {D.v: vv, D.y: y_out}
    expr = d.dloss
    if expr.has(D.e) or expr.has(D.enorm):
        bind[D.e] = gr.ew(D.y - D.v, {D.y: y_out, D.v: vv}, name="e")
    if expr.has(D.enorm):
        bind[D.enorm] = gr.add("rownorm", bind[D.e], name="e_norm")
    if expr.has(D.delta):
        bind[D.delta] = gr.add("input", arg="delta", name="delta")
    if expr.has(D.cprox):
        eta = gr.add("input", arg="eta", name="eta")
        ksq = gr.add("rowsumsq", hs[0], name="k_sq")  # ‖x‖² of what the (linear) memory reads: k, or φ_p(k)
        es, ks = sp.Symbol("eta", positive=True), sp.Symbol("ksq", nonnegative=True)
        bind[D.cprox] = gr.ew(es * ks, {es: eta, ks: ksq}, name="c")
    dy = gr.ew(expr, bind, name="dl_dy")
    eta_side = spec.gate_channels().get("eta")
    # lr=gate(v): ℓ = Σᵢ ηᵢ ℓ(eᵢ), so dℓ/dy is weighted per output channel (docs/semantics.md: channel-wise gates)
    if eta_side == "v":
        eta = gr.add("input", arg="eta_ch", name="eta_ch")
        es, gs = sp.Symbol("eta", real=True), sp.Symbol("g", real=True)
        dy = gr.ew(es * gs, {es: eta, gs: dy}, name="dl_dy_weighted")
    # residual: ∂/∂y of x + y is the identity; LayerNorm: its backward.
    if m.layernorm:
        dy = gr.add("layernorm_bwd", y_pre, dy, name="dl_dz")
    delta_i = dy
    if eta_side == "k":  # lr=gate(k), linear memory: U = -g·diag(η), i.e. the input factor is η ⊙ k
        eta = gr.add("input", arg="eta_ch", name="eta_ch")
        es, ks = sp.Symbol("eta", real=True), sp.Symbol("k", real=True)
        hs[0] = gr.ew(es * ks, {es: eta, ks: hs[0]}, name="k_weighted")
    for i in reversed(range(depth)):
        gr.add("output", delta_i, arg=f"delta{i + 1}", name=f"out_delta{i + 1}")
        gr.add("output", hs[i], arg=f"input{i + 1}", name=f"out_input{i + 1}")
        if i > 0:
            dh = gr.add("linear_t", weights[i], delta_i, arg=i, name=f"dl_dh{i}")
            zs_sym, dh_sym = sp.Symbol("z", real=True), sp.Symbol("g", real=True)
            delta_i = gr.ew(dh_sym * d.act_grad.xreplace({D.x: zs_sym}), {dh_sym: dh, zs_sym: zs[i - 1]},
                            name=f"dl_dz{i}")
    return gr


def state_independent_gradient(gr: Graph) -> bool:
    """True when no gradient factor depends on the weights (e.g. linear memory with the dot bias):
    then every chunking of the sequence gives the exact recurrence."""
    weights = [n for n in gr.g.nodes if gr.node(n).op == "weight"]
    return all(not (nx.descendants(gr.g, w) & set(gr.outputs())) for w in weights)


# ------------------------------------------------------------------------------- reverse mode
class NoVJP(Exception):
    """The graph holds an op without a reverse-mode rule here (the caller keeps another backward)."""


# graph inputs that are token vectors (κ: the regression key of l2(read|erase=kappa)); the rest are per-token scalars
VECTOR_INPUTS = ("x", "k", "v", "eta_ch", "kappa")


def _vector_valued(gr: Graph, vector_inputs=VECTOR_INPUTS) -> dict[int, bool]:
    """Which nodes are vectors (token tensors) rather than per-token scalars (gates, norms)."""
    vec: dict[int, bool] = {}
    for nid in gr.order():
        op, srcs = gr.node(nid), gr.srcs(nid)
        if op.op == "input":
            vec[nid] = op.arg in vector_inputs
        elif op.op in ("weight", "output"):
            vec[nid] = False
        elif op.op in ("rownorm", "rowsumsq", "rowsum"):
            vec[nid] = False
        elif op.op == "ew":
            vec[nid] = not srcs or any(vec[s] for s in srcs)
        else:
            vec[nid] = True
    return vec


def _clean_derivative(expr: sp.Expr) -> sp.Expr:
    """∂ of sign/|·|/Piecewise conditions gives DiracDelta terms: zero almost everywhere (and what
    autograd returns), so they are dropped; anything SymPy could not differentiate is refused."""
    expr = expr.replace(sp.DiracDelta, lambda *args: sp.S.Zero)
    expr = expr.replace(sp.Heaviside, lambda *args: P.step(args[0]))  # the a.e. derivative of max/|·| kinks
    if expr.has(sp.Derivative, sp.Subs):
        raise NoVJP(f"no closed-form derivative of {expr}")
    return expr


def vjp(gr: Graph, seeds: dict[str, str], title: str, vector_inputs=VECTOR_INPUTS) -> Graph:
    """Reverse mode on an IR graph, as a new IR graph (the backward is derived, never hand-written).

    `seeds` maps output names of `gr` to the names of new inputs holding their cotangents. The result
    recomputes the forward nodes it needs and has outputs `d_<input>` (the cotangent of each input
    reached: d_x, d_k, d_v, d_eta, ...) and, for each weight i, pairs `outer<i>_<j>_l` / `outer<i>_<j>_r`
    whose outer products sum to ∂/∂W_i (the caller forms them on its weight tiles). Rules: ew by SymPy
    differentiation per source (summed over the row when a vector flows into a scalar), rownorm, rowsumsq,
    linear/layer (h ↦ W h), linear_t (d ↦ Wᵀ d), layernorm and layernorm_bwd (LayerNorm's Jacobian is
    symmetric; its second-order term is the layernorm_bwd2 op). `vector_inputs` names the inputs that are
    vectors (a channel-wise δ is one)."""
    rev = _Reverse(gr, seeds, title, vector_inputs)
    for nid in reversed(gr.order()):
        if nid not in rev.cts or gr.node(nid).op == "output":
            continue
        op, g = gr.node(nid), rev.total(nid)
        rule = getattr(rev, f"rule_{op.op}", None)
        if rule is None:
            raise NoVJP(f"no reverse-mode rule for IR op {op.op}")
        rule(nid, op, gr.srcs(nid), g)
    return run_pipeline(rev.out)


class _Reverse:
    """The state of one reverse sweep: the new graph (the forward's nodes and the reverse's), each node's cotangent
    terms (`cts`), which nodes are vectors, the weights and the outer-product pairs made so far; one `rule_<op>` per
    IR op, each adding the cotangents of the op's sources."""

    def __init__(self, gr: Graph, seeds: dict[str, str], title: str, vector_inputs):
        self.gr = gr
        self.out = out = Graph(title)
        out.g = gr.g.copy()
        out.counter = gr.counter
        self.vec = _vector_valued(gr, vector_inputs)
        by_name = {gr.node(n).arg: gr.srcs(n)[0] for n in gr.outputs()}
        self.cts: dict[int, list[int]] = {}
        for name, ct_name in sorted(seeds.items()):
            c = out.add("input", arg=ct_name, name=ct_name)
            self.vec[c] = self.vec[by_name[name]]
            self.cts.setdefault(by_name[name], []).append(c)
        for o in gr.outputs():
            out.g.remove_node(o)
        self.weights = {gr.node(n).arg: n for n in gr.g.nodes if gr.node(n).op == "weight"}
        self.n_pairs: dict[int, int] = {}

    def is_vec(self, n: int) -> bool:  # for nodes made here, by the same rule as _vector_valued
        if n not in self.vec:
            op, srcs = self.out.node(n), self.out.srcs(n)
            self.vec[n] = (op.op not in ("rownorm", "rowsumsq", "rowsum", "weight", "output")
                           and (op.op != "ew" or not srcs or any(self.is_vec(x) for x in srcs)))
        return self.vec[n]

    def weight(self, i: int) -> int:  # the forward graph's matmuls name their weight only by index
        if i not in self.weights:
            self.weights[i] = self.out.add("weight", arg=i, name=f"W{i + 1}")
        return self.weights[i]

    def outer(self, i: int, left: int, right: int) -> None:
        j = self.n_pairs[i] = self.n_pairs.get(i, -1) + 1
        self.out.add("output", left, arg=f"outer{i}_{j}_l", name=f"out_outer{i}_{j}_l")
        self.out.add("output", right, arg=f"outer{i}_{j}_r", name=f"out_outer{i}_{j}_r")

    def total(self, nid: int) -> int:
        terms = self.cts[nid]
        acc = terms[0]
        for t in terms[1:]:
            a, b = sp.Symbol("a", real=True), sp.Symbol("b", real=True)
            acc = self.out.ew(a + b, {a: acc, b: t}, name=f"ct_{self.gr.node(nid).name}")
        return acc

    def add(self, src: int, term: int) -> None:
        self.cts.setdefault(src, []).append(term)

    def rule_input(self, nid, op, srcs, g):
        self.out.add("output", g, arg=f"d_{op.arg}", name=f"out_d_{op.arg}")

    def rule_weight(self, nid, op, srcs, g):
        pass

    def rule_linear(self, nid, op, srcs, g):  # h ↦ W h
        h = srcs[-1]
        self.outer(op.arg, g, h)
        w = srcs[0] if op.op == "linear" else self.weight(op.arg)
        self.add(h, self.out.add("linear_t", w, g, arg=op.arg, name=f"dh_{op.name}"))

    rule_layer = rule_linear

    def rule_linear_t(self, nid, op, srcs, g):  # d ↦ Wᵀ d
        w, dd = srcs
        self.outer(op.arg, dd, g)
        self.add(dd, self.out.add("linear", w, g, arg=op.arg, name=f"dd_{op.name}"))

    def rule_layernorm(self, nid, op, srcs, g):  # LayerNorm's Jacobian is symmetric
        self.add(srcs[0], self.out.add("layernorm_bwd", srcs[0], g, name=f"dz_{op.name}"))

    def rule_layernorm_bwd(self, nid, op, srcs, g):
        z, dy = srcs
        self.add(dy, self.out.add("layernorm_bwd", z, g, name=f"ddy_{op.name}"))
        self.add(z, self.out.add("layernorm_bwd2", z, dy, g, name=f"dz_{op.name}"))

    def rule_ew(self, nid, op, srcs, g):  # SymPy differentiation per source, summed over the row into a scalar
        expr, syms = op.arg
        g_sym = sp.Symbol("cot", real=True)  # the incoming cotangent: a name the expression does not use
        while g_sym in syms:
            g_sym = sp.Symbol(g_sym.name + "_", real=True)
        for src, sym in zip(srcs, syms):
            dexpr = _clean_derivative(sp.diff(expr, sym))
            if dexpr == 0:
                continue
            bind = dict(zip(syms, srcs))
            bind[g_sym] = g
            term = self.out.ew(dexpr * g_sym, {s: bind[s] for s in (dexpr * g_sym).free_symbols},
                               name=f"d{self.gr.node(src).name}_{op.name}")
            if self.is_vec(term) and not self.is_vec(src):
                term = self.out.add("rowsum", term, name=f"sum_{self.gr.node(src).name}_{op.name}")
            self.add(src, term)

    def rule_rownorm(self, nid, op, srcs, g):  # ∂‖t‖/∂t = t/‖t‖ (0 at t = 0, as autograd gives)
        g_sym = sp.Symbol("g", real=True)
        ts, ns = sp.Symbol("t", real=True), sp.Symbol("n", nonnegative=True)
        self.add(srcs[0], self.out.ew(sp.Piecewise((g_sym * ts / ns, ns > 0), (0, True)),
                                      {ts: srcs[0], ns: nid, g_sym: g}, name=f"d{self.gr.node(srcs[0]).name}_norm"))

    def rule_rowsumsq(self, nid, op, srcs, g):
        g_sym, ts = sp.Symbol("g", real=True), sp.Symbol("t", real=True)
        self.add(srcs[0], self.out.ew(2 * ts * g_sym, {ts: srcs[0], g_sym: g},
                                      name=f"d{self.gr.node(srcs[0]).name}_sumsq"))


def compile_graphs(spec: S.Spec, d: D.Derivation) -> tuple[Graph, Graph]:
    return run_pipeline(build_forward(spec, d)), run_pipeline(build_grad(spec, d))
