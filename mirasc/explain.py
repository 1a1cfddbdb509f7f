"""Human-readable derived equations (Unicode or LaTeX): `mirasc explain`, and the emitted docstring."""

from __future__ import annotations

import re

import sympy as sp

from .derive import Derivation
from .language import spec as S

# The feature maps of a linear memory (docs/semantics.md, "Feature maps and the normaliser").
FEATURE_TEXT = {"elu1": "elu(x) + 1  (elementwise; Dφ = Dk)",
                "taylor": "1 ⊕ x ⊕ (x⊗x)/√2, pairs i ≤ j once: φ(q)ᵀφ(k) = 1 + qᵀk + (qᵀk)²/2",
                "hedgehog": "softmax([U x + c, −(U x + c)])  (U, c learned per head; Dφ = 2Dk)"}


def _sym(value, gate: str) -> str:
    if isinstance(value, S.PerHead):  # constant over tokens, one value per head h
        return f"{gate}_h"
    return f"{gate}_t" if value in S.GATE_FORMS else S.format_value(value)


def _scaled(value, gate: str, mat: str) -> str:
    """`gate·M`, or with a channel-wise gate (docs/semantics.md: channel-wise gates) `M·diag(gate)` (key channels,
    columns) or `diag(gate)·M` (value channels, rows)."""
    if value == S.GATE_K:
        return f"{mat}·diag({gate}_t)"
    if value == S.GATE_V:
        return f"diag({gate}_t)·{mat}"
    return f"{_sym(value, gate)}·{mat}"


def _show(expr, latex: bool) -> str:
    if isinstance(expr, str):
        return expr
    # LaTeX from SymPy is fenced so that latex_line() passes it through untouched
    return f"{_FENCE[0]}{sp.latex(expr)}{_FENCE[1]}" if latex else sp.sstr(expr)


_FENCE = ("\x02", "\x03")
# Unicode in the equations -> LaTeX math
_TEX = {"ℓ": r"\ell ", "∂": r"\partial ", "∇": r"\nabla ", "α": r"\alpha ", "η": r"\eta ", "θ": r"\theta ",
        "φ": r"\phi ", "δ": r"\delta ", "κ": r"\kappa ", "λ": r"\lambda ", "Σ": r"\sum ", "Π": r"\prod ", "‖": r"\|",
        "⟨": r"\langle ", "⟩": r"\rangle ", "½": r"\tfrac{1}{2}", "²": "^{2}", "¹": "^{1}", "₂": "_{2}",
        "ᵢ": "_{i}", "−": "-", "–": "-", "·": r"\cdot ", "⊙": r"\odot ", "∈": r"\in ", "ℝ": r"\mathbb{R}",
        "×": r"\times ", "⊕": r"\oplus ", "⊗": r"\otimes ", "ᵀ": r"^{\top}", "≤": r"\le ", "≥": r"\ge ", "→": r"\to ",
        "←": r"\leftarrow ", "∞": r"\infty ", "√": r"\sqrt ", "..": r"\ldots ", "γ": r"\gamma ", "…": r"\ldots ",
        "ν": r"\nu ", "ρ": r"\rho ", "β": r"\beta ", "σ": r"\sigma "}
# words that are functions (upright operators; those with their own macro first)
_MACROS = {"exp", "log", "tanh", "sin", "cos", "cosh", "sinh", "max", "min"}
_OPERATORS = {"sign", "sqrt", "erf", "sigmoid", "softmax", "softplus", "gelu", "silu", "relu", "identity", "asinh",
              "acosh", "atan", "abs", "prox", "read", "LayerNorm", "RMSNorm", "act"}
_SYMBOLS = {"Dk": "D_k", "Dv": "D_v", "Dφ": r"D_\phi ", "Tk": "T_k", "eps": r"\epsilon ", "scale": r"\mathrm{scale}"}
_TOKEN = re.compile(r"[A-Za-z]+\d*|\x02[^\x03]*\x03|\s+|.", re.S)


def latex_line(line: str) -> str:
    """One equation line (`label: content`) as `label: $content$`, everything in the math converted:
    Unicode symbols to macros, function names to operators, prose to \\text{...}."""
    m = re.match(r"^\s*([A-Za-z][\w \-]*?):\s+(.*)$", line)
    label, body = (m.group(1), m.group(2)) if m else ("", line.strip())
    body = re.sub(r"(\d(?:\.\d+)?)e(-?)0*(\d+)", r"\1·10^{\2\3}", body)   # 1e-06 -> 1·10^{-6}
    body = body.replace("⁻¹", "^{-1}")
    tokens = _TOKEN.findall(body)
    out: list[str] = []
    prose: list[str] = []     # a run of words (and the spaces between them) that becomes one \text{}

    def flush():
        if prose:
            words = "".join(prose).replace("–", "--")   # an en dash in text mode
            out.append(rf"\text{{{words.rstrip()}}}" + (r"\ " if words != words.rstrip() else ""))
            prose.clear()

    for i, tok in enumerate(tokens):
        word = re.fullmatch(r"([A-Za-z]+)(\d*)", tok)
        if tok.startswith(_FENCE[0]):
            flush()
            out.append(tok[1:-1])
        elif word and ((len(word.group(1)) >= 2 and word.group(1) not in _MACROS | _OPERATORS | set(_SYMBOLS)
                        and not (i > 0 and tokens[i - 1] in ("_", "^"))) or (prose and prose[-1] in "'-–")):
            prose.append(tok)
        elif tok.isspace() and prose:
            prose.append(" ")
        elif tok in ("'", "-", "–") and prose and i + 1 < len(tokens) and tokens[i + 1].isalpha():
            prose.append(tok)     # Yaad's, cross-attention, Nadaraya–Watson
        else:
            flush()
            if word:
                name, digits = word.groups()
                sub = f"_{{{digits}}}" if digits else ""
                if name in _MACROS:
                    text = f"\\{name}{sub} "
                elif name in _OPERATORS:
                    text = rf"\operatorname{{{name}}}{sub} "
                else:
                    text = _SYMBOLS.get(name, name) + sub
                # a subscript or superscript of several letters (a_ts, λ_init, ℝ^Dk) is one group
                grouped = i > 0 and tokens[i - 1] in ("_", "^") and len(text.strip()) > 1
                out.append("{" + text.strip() + "}" if grouped else text)
            elif tok.isspace():
                out.append(r"\quad " if len(tok) > 1 else " ")
            elif tok in ("%", "&", "#", "$"):
                out.append("\\" + tok)
            else:  # braces stay: the equations already write subscripts and superscripts as TeX groups
                out.append(_TEX.get(tok, tok))
    flush()
    math = "".join(out).replace("..", r"\ldots ")
    math = re.sub(r"([\^_])\(([^()]*)\)", r"\1{(\2)}", math)        # u^(h+1) -> u^{(h+1)}
    math = re.sub(r"([A-Za-z0-9}])\*", r"\1^{*}", math)             # e* -> e^{*}
    math = re.sub(r"\\sqrt ([A-Za-z_{}]+)", r"\\sqrt{\1}", math)  # √Dk -> \sqrt{D_k}
    return f"{label}: ${math.strip()}$" if label else f"${math.strip()}$"


def equations(spec: S.Spec, d: Derivation, latex: bool = False) -> list[str]:
    """The update rule of one token, step by step (docs/semantics.md), with the derived pieces; with latex=True
    every line is `label: $...$` in LaTeX."""
    lines = _equations(spec, d, latex) if spec.parametric else _nonparametric(spec.memory, spec.retention)
    greek = {"eta": "η", "alpha": "α", "theta": "θ", "delta": "δ", "gamma": "γ", "nu": "ν", "rho": "ρ"}
    lines += [f"per head:   {greek[g]}_h = {_show(c.expr, latex) if latex else S.format_value(c)}  "
              "(constant over tokens; head h = 0..H−1 of H)" for g, c in spec.per_head().items()]
    return [latex_line(line) for line in lines] if latex else lines


def _equations(spec: S.Spec, d: Derivation, latex: bool) -> list[str]:
    """The update rule as lines: the memory and the bias, the gradient and the learner's step, the retention, the
    read."""
    return (_memory_lines(spec, d, latex) + _step_lines(spec, d, latex) + _retention_lines(spec, d, latex)
            + _read_lines(spec, d))


def _memory_lines(spec: S.Spec, d: Derivation, latex: bool) -> list[str]:
    """The memory, its features, the bias and its derivative (and the MLP's chain rule)."""
    m, l = spec.memory, spec.learner
    out: list[str] = []
    p = spec.poly_degree
    if m.kind == "linear" and (spec.feature != "identity" or p):
        out.append("memory:     M_W(x) = W φ(x),  W ∈ ℝ^{Dv×Dφ}")
        if not p:
            out.append(f"features:   φ(x) = {FEATURE_TEXT[spec.feature]}")
    elif m.kind == "linear":
        out.append("memory:     M_W(x) = W x,  W ∈ ℝ^{Dv×Dk}")
    else:
        layers = " → ".join([f"h{i} = {m.act}(W{i} h{i - 1})" for i in range(1, m.depth)]
                            + [f"y = W{m.depth} h{m.depth - 1}"])
        norm = ", y ← LayerNorm(y)" if m.norm == "layernorm" else ""
        res = ", M(x) = x + y" if m.residual else ", M(x) = y"
        out.append(f"memory:     h0 = {'φ(x)' if p else 'x'}, {layers}{norm}{res}")
    if p:
        terms = ", ".join(["1", "x", "x⊗x/√2!", "x^⊗3/√3!", "x^⊗4/√4!"][:p + 1])
        out.append(f"features:   φ(x) = [{terms}] (p = {p}), so φ(q)·φ(k) = Σ_{{i≤{p}}} (q·k)^i / i!")
    loss_text = d.loss_text
    if spec.bias.kind == "custom":  # the loss itself is an expression: print it like the derived ones
        loss_text = f"ℓ = Σᵢ f(eᵢ),  f(e) = {_show(d.loss, latex)}"
    out.append(f"bias:       {loss_text}")
    read_key = "κ" if spec.generalized_delta else "k"
    residual_note = f"   (e = M({read_key}) − v)" if d.dloss.has(sp.Symbol("e", real=True)) else ""
    out.append(f"derived:    ∂ℓ/∂y = {_show(d.dloss, latex)}{residual_note}")
    if l.kind == "implicit":
        out.append("            implicit step: e* = prox_{cℓ}(e), c = η_t‖k_t‖², ∂ℓ/∂y evaluated at e*")
    if m.kind == "mlp":
        out.append(f"derived:    {m.act}'(x) = {_show(d.act_grad, latex)}")
        last = "LayerNorm'ᵀ ∂ℓ/∂y" if m.norm == "layernorm" else "∂ℓ/∂y"  # (norm=none: y is the last layer's output)
        out.append(f"chain rule: ∇_{{W_i}} ℓ = δ_i h_{{i−1}}ᵀ, δ_L = {last}, "
                   "δ_{i} = (W_{i+1}ᵀ δ_{i+1}) ⊙ act'(z_i)")
    return out


def _step_lines(spec: S.Spec, d: Derivation, latex: bool) -> list[str]:
    """Where the gradient is taken (chunk anchors, pre-decay), the gradient, the learning rate, the learner."""
    par = spec.parallel
    out: list[str] = []
    at = "W_{t−1}"
    if par.kind == "minibatch":
        at = f"the anchor state (end of the previous chunk of {par.C})"
    lines, at = _RetentionText(spec, d, latex).anchor(at)
    out += lines
    gdelta = spec.generalized_delta
    if gdelta == "read":  # l2(read=kappa): the error read at κ, stepped along k
        out.append(f"gradient:   g_t = (M_W(κ_t) − v_t) k_tᵀ at {at}   (error read at κ, stepped along k)")
    elif gdelta == "erase":  # l2(erase=kappa): erase at κ; the write v kᵀ follows the learner
        out.append(f"gradient:   g_t = ∇_W ½‖M_W(κ_t)‖² = (W κ_t) κ_tᵀ at {at}   (the erase at κ)")
    elif spec.window > 1:
        c, gam = spec.window, _sym(spec.bias.gamma, "γ").replace("_t", "_i")
        out.append(f"gradient:   g_t = ∇_W Σ_{{i=t−{c - 1}..t}} {gam}·ℓ(M_W(k_i), v_i) at {at}   (the Omega rule, "
                   f"c = {c}; each term with token i's own coefficients; tokens before the first are absent)")
    else:
        out.append(f"gradient:   g_t = ∇_W ℓ(M_W(k_t), v_t) at {at}")
    return out + _LearnerText(spec).lines()


class _LearnerText:
    """A learner's lines of the update rule, from the gradient g_t to the update U_t: one `_print_<Class>` method per
    learner of language/learner.py (as _RetentionText), after the learning rate's own line where it has one."""

    def __init__(self, spec: S.Spec):
        self.l, self.erase = spec.learner, spec.generalized_delta == "erase"
        self.lr = getattr(self.l, "lr", 1.0)

    def lines(self) -> list[str]:
        out = []
        if self.lr == S.GATE_V:  # the loss weighted per output channel; for a linear memory this is diag(η_t)·g_t
            out.append("loss:       ℓ_t = Σᵢ η_{t,i}·ℓ(eᵢ)  (lr=gate(v): η_t ∈ ℝ^Dv weights each output channel)")
        return out + getattr(self, f"_print_{type(self.l).__name__}", self._print_GD)()

    def step(self) -> str:
        """η_t·g_t as the learner scales it."""
        if self.lr == S.GATE_V:
            return "g_t"
        return "g_t·diag(η_t)" if self.lr == S.GATE_K else f"{_sym(self.lr, 'η')}·g_t"

    def _print_GD(self, step: str | None = None) -> list[str]:
        step = step or self.step()
        if self.erase:
            return [f"learner:    U_t = −{step} + v_t k_tᵀ   (the write, at unit rate)"]
        return [f"learner:    U_t = −{step}"]

    def _print_Precond(self) -> list[str]:  # the statistic of the gradient's key-side factor k_t, per key channel
        l, lr = self.l, self.lr
        out = [f"statistic:  a_t = {_sym(l.nu, 'ν')}·a_{{t−1}} + {_sym(l.rho, 'ρ')}·k_t ⊙ k_t   (a ∈ ℝ^Dk, per key "
               "channel; it does not read W)"]
        if l.transform == "atk":
            out.append(f"multiplier: m_t = {S.format_value(l.base)}^(−r/(1+|r|)),  r = log(a_t + "
                       f"{S.format_value(l.eps)}) − ({S.format_value(l.center)})   (ATK)")
        else:
            out.append(f"multiplier: m_t = (a_t + {S.format_value(l.eps)})^(−1/2)   (rms)")
        return out + self._print_GD("g_t·diag(η_t ⊙ m_t)" if lr == S.GATE_K else f"{_sym(lr, 'η')}·g_t·diag(m_t)")

    def _print_Momentum(self) -> list[str]:
        return [f"learner:    S_t = {_scaled(self.l.theta, 'θ', 'S_{t−1}')} − {self.step()},  U_t = S_t"]

    def _print_Muon(self) -> list[str]:
        return [f"learner:    S_t = {_scaled(self.l.theta, 'θ', 'S_{t−1}')} + g_t,  "
                f"U_t = −{_sym(self.lr, 'η')}·NS_{self.l.ns_steps}(S_t)   (Newton–Schulz on each weight matrix)"]


class _RetentionText:
    """A retention's lines of the update rule, one `_print_<Class>` method per retention of language/retention.py
    (the SymPy printers' design): its step from W_{t−1} and U_t (`step`), and what the state holds at the end of a
    sequence where it differs from W (`state`). `chunk`: the parallel form reads the weights at chunk ends
    (docs/semantics.md: chunk readouts), which changes what lq and kl compute."""

    def __init__(self, spec: S.Spec, d: Derivation, latex: bool):
        par = spec.parallel
        self.r, self.d, self.latex = spec.retention, d, latex
        self.chunk = par.chunk_readout
        self.C = getattr(par, "C", None)

    def step(self) -> list[str]:
        return getattr(self, f"_print_{type(self.r).__name__}")()

    def state(self) -> list[str]:
        return getattr(self, f"_state_{type(self.r).__name__}", list)() if self.chunk else []

    def anchor(self, at: str) -> tuple[list[str], str]:
        """Where the gradient is taken, `at` unless the retention moves it (with the lines that say why)."""
        method = getattr(self, f"_anchor_{type(self.r).__name__}", None)
        return method(at) if method is not None else ([], at)

    def _anchor_Decay(self, at: str) -> tuple[list[str], str]:
        if self.r.order != "pre":
            return [], at
        return [f"pre-decay:  W'_{{t−1}} = {_scaled(self.r.alpha, 'α', 'W_{t−1}')}"], "W'_{t−1}"

    def _anchor_Lq(self, at: str) -> tuple[list[str], str]:
        if not self.chunk:
            return [], at
        return ([f"chunk:      tokens s..e, {self.C} per chunk; readout=chunk: n_c = ‖A_{{s−1}}‖_q^(q−2) "
                 "once per chunk"], "the anchor W_{s−1} = A_{s−1} / n_c")

    def _anchor_KL(self, at: str) -> tuple[list[str], str]:
        if not self.chunk:
            return [], at
        return ([f"chunk:      tokens s..e, {self.C} per chunk; readout=chunk: the first token s takes the "
                 "softmax step"], "W_{s−1} for t = s (the state the previous chunk left), at W_s for t = s+1..e")

    def _print_NoRetention(self) -> list[str]:
        return ["retention:  W_t = W_{t−1} + U_t"]

    def _print_Decay(self) -> list[str]:
        if self.r.order == "pre":
            return ["retention:  W_t = W'_{t−1} + U_t"]
        return [f"retention:  W_t = {_scaled(self.r.alpha, 'α', 'W_{t−1}')} + U_t"]

    def _print_Lq(self) -> list[str]:
        r, q = self.r, S.format_value(self.r.q)
        if self.chunk:
            return [f"retention:  A_t = {_scaled(r.alpha, 'α', 'A_{t−1}')} + U_t,  W_t = A_t / n_c  (the chunk's "
                    f"frozen normaliser), q = {q}"]
        return [f"retention:  A_t = {_scaled(r.alpha, 'α', 'A_{t−1}')} + U_t,  W_t = A_t / ‖A_t‖_q^(q−2), q = {q}"]

    def _print_KL(self) -> list[str]:
        r, c = self.r, S.format_value(self.r.c)
        if self.chunk:
            alpha_s = _sym(r.alpha, "α").replace("_t", "_s")
            return [f"retention:  W_s = c·softmax({alpha_s}·log max(W_{{s−1}}, 1e-12) + U_s), c = {c}"
                    "  (rows; the chunk's first token s)",
                    f"later:      W_t = {_scaled(r.alpha, 'α', 'W_{t−1}')} + U_t  for t = s+1..e (weight space)"]
        return [f"retention:  W_t = c·softmax({_scaled(r.alpha, 'α', 'log W_{t−1}')} + U_t), c = {c}"
                "  (rows; computed as Z_t = α Z_{t−1} + U_t, Z = log(W/c))"]

    def _print_Elastic(self) -> list[str]:  # an entrywise map of the accumulator
        return [f"retention:  A_t = {_scaled(self.r.alpha, 'α', 'A_{t−1}')} + U_t,  "
                f"W_t = {_show(self.d.entrywise, self.latex)} at a = A_t"]

    _print_Box = _print_Elastic

    def _print_Bregman(self) -> list[str]:
        d, latex = self.d, self.latex
        return [f"retention:  W_t = (φ')⁻¹(φ'(W_{{t−1}}) + U_t),  φ(w) = {_show(d.phi, latex)}",
                f"derived:    φ'(w) = {_show(d.phi_prime, latex)},  (φ')⁻¹(u) = {_show(d.phi_prime_inv, latex)}"]

    def _state_Lq(self) -> list[str]:
        return ["state:      final A = A_T, W = A_T / n_c of the last chunk (what its last read used); a state's W "
                "is not read: each chunk re-normalises from A"]

    def _state_KL(self) -> list[str]:
        return ["state:      final W = W_T in weight space (it may leave the simplex); the next chunk's first token "
                "reads log max(W, 1e-12)"]


def _retention_lines(spec: S.Spec, d: Derivation, latex: bool) -> list[str]:
    """The retention's step from W_{t−1} and U_t, and a multi-step learner's sub-steps."""
    r = spec.retention
    out = _RetentionText(spec, d, latex).step()
    if spec.steps > 1:  # a multi-step learner: the token's pairs as sub-steps (docs/semantics.md)
        alpha = "; α_t at j = 1 only (1 after it)" if getattr(r, "alpha", None) is not None else ""
        out.append(f"steps:      token t runs the lines above {spec.steps} times, j = 1..{spec.steps}, with "
                   f"(k_{{t,j}}, v_{{t,j}}, η_{{t,j}}) at the state sub-step j − 1 left{alpha}; "
                   "o_t reads the last")
    return out


def _read_lines(spec: S.Spec, d: Derivation) -> list[str]:
    """The read, and the state a chunk readout leaves."""
    m, r, l = spec.memory, spec.retention, spec.learner
    out: list[str] = []
    if spec.normalized:
        out.append(f"normaliser: z_t = {_scaled(r.alpha, 'α', 'z_{t−1}') if r.kind == 'decay' else 'z_{t−1}'} + "
                   f"{_sym(getattr(l, 'lr', 1.0), 'η')}·φ(k_t)  (W's row for the value 1)")
        out.append(f"read:       o_t = W_t φ(q_t) / (z_tᵀ φ(q_t) + eps),  eps = {S.format_value(m.eps)}")
    else:
        out.append("read:       o_t = M_{W_t}(q_t)")
    return out + _RetentionText(spec, d, False).state()


def _nonparametric(m: S.Nonparametric, r=None) -> list[str]:
    scale = "1/√Dk" if m.scale is None else S.format_value(m.scale)
    out = []
    if m.kernel == "softmax":
        out.append(f"kernel:     κ(u, k) = exp(scale·u·k), scale = {scale}")
    elif m.kernel == "stickbreaking":
        rng = "s<l<t" if not m.attend_current else "s<l≤t"
        vis = "s<t" if not m.attend_current else "s≤t"
        if m.window:
            vis += f", t−s<{m.window}"
        out.append(f"break:      β_ts = σ(scale·u_t·k_s), scale = {scale}   (the share of the stick pair s takes)")
        out.append(f"read:       o_t = Σ_{{{vis}}} β_ts Π_{{{rng}}} (1 − β_tl) v_s   (stick-breaking: the newest pair "
                   "breaks first; weights sum to ≤ 1, kept in log space)")
        left = {"none": "dropped", "current": "+ r_t v_t (the query's own value)",
                "bias": "+ r_t b_h (b learned per head, zero at init)"}[m.remainder]
        out.append(f"remainder:  r_t = Π_{{{vis}}} (1 − β_ts) = 1 − Σ_s w_ts: {left}")
        return out
    elif m.kernel == "additive":
        out.append("kernel:     κ(u, k) = exp(wᵀ tanh(W_q u + W_k k))   (Bahdanau; W_q, W_k ∈ ℝ^{Dk×Dk}, w ∈ ℝ^Dk "
                   "learned per head)")
    else:
        out.append(f"kernel:     κ(u, k) = Σ_{{i≤{m.degree}}} (scale·u·k)^i / i!, scale = {scale}   "
                   "(truncated exp, positive for even degree)")
    if m.temporal:
        out.append(f"temporal:   k_s ← k_s + T_A[d], v_s ← v_s + T_C[d], d = {'t − s' if m.causal else 'Tk − 1 − s'}"
                   f" < {m.temporal} (learned; pairs with d ≥ {m.temporal} get none)")
    if m.causal:
        rng = f"t−{m.window}<s≤t" if m.window else "s≤t"
    else:
        rng = "s"
        out.append("memory:     the given (k_s, v_s), s = 1..Tk, read by every query (cross-attention, no mask)")
    if m.score_conv is not None or m.head_mix > 1:
        out.append("scores:     a_ts = log κ(u_t, k_s), masked to 0 where s is not visible (Mask_0)")
        if m.score_conv is not None:
            cq, ck = m.score_conv
            out.append(f"MTA conv:   a_ts ← Σ_{{i<{cq}, |j|≤{ck // 2}}} θ_ij a_(t−i)(s−j)   "
                       "(past queries, centred keys; θ learned per head, identity init)")
        if m.head_mix > 1:
            out.append(f"head mix:   a^h ← Σ_g M_hg a^g within groups of {m.head_mix} heads (learned, identity init)")
        out.append(f"read:       o_t = Σ_{{{rng}}} softmax_s(a_t·) v_s   (invisible keys masked to −∞)")
    elif r is not None and r.kind == "decay":
        alpha = "α_l" if r.alpha in S.GATE_FORMS else "α_h" if isinstance(r.alpha, S.PerHead) \
            else S.format_value(r.alpha)
        out.append(f"decay:      each stored pair's weight is multiplied by α_t at every step: a_ts = Π_{{s<l≤t}} "
                   f"{alpha} = exp(Σ_{{s<l≤t}} log {alpha})   (a_tt = 1; the Forgetting Transformer)")
        out.append(f"read:       o_t = Σ_{{{rng}}} a_ts κ(u_t, k_s) v_s / Σ_{{{rng}}} a_ts κ(u_t, k_s)   "
                   "(Nadaraya–Watson with decayed weights)")
    else:
        out.append(f"read:       o_t = Σ_{{{rng}}} κ(u_t, k_s) v_s / Σ_{{{rng}}} κ(u_t, k_s)   (Nadaraya–Watson)")
    if m.hops > 1:
        if m.tying == "adjacent":
            out.append(f"hops:       u¹ = q; for h = 1..{m.hops}: o^h = read(u^h; K_h, V_h), u^(h+1) = u^h + o^h; "
                       "K_1 = k, V_1 = v, K_(h+1) = V_h, V_(h+1) = V_h P_h (adjacent tying)")
        else:
            out.append(f"hops:       u¹ = q; for h = 1..{m.hops}: o^h = read(u^h; k, v), u^(h+1) = u^h H + o^h "
                       "(layer-wise tying)")
        out.append(f"output:     o = u^({m.hops + 1}) − u¹")
    if m.head_norm:
        out.append("norm:       o ← RMSNorm(o)·g_h, g_h initialised to 1 − λ_init, λ_init = 0.8 − 0.6·exp(−0.3·layer)")
    return out
