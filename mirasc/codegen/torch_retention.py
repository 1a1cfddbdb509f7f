"""A retention's part of the torch module's token recurrence (docs/semantics.md, step 4), one printer per way a
retention turns the learner's update U into the next weights, as codegen/triton_retention.py is for the fused Triton
kernels. Each printer gives lines (unindented) for the module's functions and the torch template's retention hooks:

- `header`: the values of its parameters' module constants (kl's c, lq's q; what they mean: mirasc.runtime.memory_spec);
- `functions`: the module-level helpers it reads (the readout R of an accumulator, `_readout`; lq's norm);
- `start`: the accumulators Y at the start of a recurrence (the body of `_accumulators`; Y = None where there are none);
- `before_gradient`: the body of `_before_gradient(W, carry, c, first)`, the weights a token's gradient and step start
  from (decay first under order=pre; a chunk readout's frozen normaliser at a mini-batch's first token);
- `retain`: the body of `_retain(W, Y, updates, c, carry, first)`, from the updates U to the next weights W (and the
  accumulators Y), which mirasc.runtime.token_step calls once per token;
- `initial_accumulator`: the body of `_initial_accumulator(w, state, name, dtype, device)`, which init_state calls
  (mirasc.runtime.memory_state): the drawn value `w` as the accumulator stored as A_<name>, and the weights it reads as.

`for_spec` picks the printer for a spec; the facts it reads are the retention's (language/retention.py) and whether
the parallel form reads the weights at chunk ends (docs/semantics.md: chunk readouts). `step_functions` prints the
token step's three functions, the learner's (codegen/torch_learner.py) with the retention's two; `state_functions` the
retention's two of the state.
"""

from __future__ import annotations

import textwrap

from ..language import spec as S
from .torch_learner import GD

ALPHA = '_on_weight("alpha", c["alpha"])'  # α_t as a factor of one weight (per head, or per row/column channel)
FIRST = "torch.is_tensor(first) or first"  # the token starts a mini-batch (in one row of the batch at least)


class Plain:
    """The weights are the state, W_t = W_{t−1} + U_t (retention none)."""

    doc = "none: W_t = W_{t−1} + U_t."

    def __init__(self, spec: S.Spec):
        self.r = spec.retention

    def _nothing(self) -> list[str]:
        return []

    # the hooks a retention without a map leaves empty (a subclass overrides the ones it fills)
    functions = initial_accumulator = _nothing

    def header(self) -> dict[str, str]:
        return {}

    def start(self) -> list[str]:
        return ["Y = None"]

    def before_gradient(self) -> list[str]:
        return ["return W"]

    def retain(self) -> list[str]:
        return ["return [w + update for w, update in zip(W, updates)], Y"]


class Decay(Plain):
    """W_t = α_t W_{t−1} + U_t (order=post), or the gradient taken at α_t W_{t−1} and U_t added there (order=pre)."""

    @property
    def doc(self) -> str:
        if self.r.decays_first:
            return "decay, order=pre: the gradient is taken at α_t W_{t−1} and W_t = α_t W_{t−1} + U_t."
        return "decay: W_t = α_t W_{t−1} + U_t."

    def before_gradient(self) -> list[str]:
        if self.r.decays_first:
            return ["# order=pre: decay first, take the gradient there", f"return [{ALPHA} * w for w in W]"]
        return super().before_gradient()

    def retain(self) -> list[str]:
        if self.r.decays_first:
            return super().retain()
        return [f"return [{ALPHA} * w + update for w, update in zip(W, updates)], Y"]


class Mapped(Plain):
    """W = R(Y): the accumulator Y_t = α_t Y_{t−1} + U_t (Bregman: φ'(W_{t−1}) + U_t, no α) and its readout at every
    token. Y is carried as A_<name> where R cannot be inverted (`keeps_accumulator`), else recomputed from W."""

    @property
    def doc(self) -> str:
        alpha = "α_t Y_{t−1}" if self.r.gated else "Y_{t−1}"
        return f"{self.r.kind}: the accumulator Y_t = {alpha} + U_t, read as the weights W_t = R(Y_t) (_readout)."

    def functions(self) -> list[str]:
        return ["", "", "def _readout(acc):",
                '    """Memory weights from the retention\'s accumulator (last two axes are [out, in])."""',
                *(f"    {line}" for line in self.readout())]

    def readout(self) -> list[str]:
        """The body of `_readout(acc)`."""
        raise NotImplementedError

    def start(self) -> list[str]:
        if self.r.keeps_accumulator:
            return ['Y = [state["A_" + n] for n in WEIGHTS]']
        return [f"Y = [{self.image('w')} for w in W]"]

    def image(self, w: str) -> str:
        """The accumulator recomputed from weights `w` (a retention that does not keep it)."""
        raise NotImplementedError

    def retain(self) -> list[str]:
        alpha = f"{ALPHA} * " if self.r.gated else ""
        return [f"Y = [{alpha}y + update for y, update in zip(Y, updates)]", "return [_readout(y) for y in Y], Y"]

    def initial_accumulator(self) -> list[str]:
        if not self.r.keeps_accumulator:
            return []
        return ['state["A_" + name] = w.to(dtype=dtype, device=device)', "w = _readout(w)"]


class Entrywise(Mapped):
    """R acts on each entry alone (elastic, box): the function the derivation prints from the retention's map."""

    def readout(self) -> list[str]:
        return [f"return {self.r.map_name}(acc)"]


class Bregman(Mapped):
    """W = (φ')⁻¹(Y), the accumulator Y = φ'(W) recomputed from the weights."""

    def readout(self) -> list[str]:
        return ["return _phi_prime_inv(acc)"]

    def image(self, w: str) -> str:
        return f"_phi_prime({w})"


class KL(Mapped):
    """W = c·softmax(Z) over each row, Z = log(W / c) recomputed from the weights."""

    def header(self) -> dict[str, str]:
        return {"KL_C": repr(float(self.r.c))}

    def readout(self) -> list[str]:
        return ["# W = c·softmax(Z) over each row, Z = log(W / c) accumulated linearly.",
                "return KL_C * torch.softmax(acc, dim=-1)"]

    def image(self, w: str) -> str:
        return f"torch.log({w} / KL_C)"


class Lq(Mapped):
    """W = A / ‖A‖_q^(q−2), the entrywise q-norm of each matrix; A kept in the state."""

    def header(self) -> dict[str, str]:
        return {"LQ_Q": repr(float(self.r.q))}

    def functions(self) -> list[str]:
        return ["", "", "def _lq_norm(acc):",
                '    """n = ‖A‖_q^(q-2) of each matrix (entrywise q-norm; last two axes), as [..., 1, 1]; '
                "1 where A = 0 (the map is",
                "    undefined there: a per-token readout keeps 0 at 0, a chunk readout reads the chunk's raw "
                'accumulator)."""',
                "    total = acc.abs().pow(LQ_Q).sum((-2, -1), keepdim=True)",
                "    nonzero = total > 0",
                "    total = torch.where(nonzero, total, torch.ones_like(total))  # (no 0^(1/q) in the backward)",
                "    return torch.where(nonzero, total.pow(1.0 / LQ_Q).clamp_min(1e-30).pow(LQ_Q - 2), total)",
                *super().functions()]

    def readout(self) -> list[str]:
        return ["# W = A / ‖A‖_q^(q-2), entrywise q-norm of each matrix; 0 stays 0.", "return acc / _lq_norm(acc)"]

    def initial_accumulator(self) -> list[str]:
        return ["if LQ_Q != 3.0:",
                "    # A_0 such that the read weights A_0 / ‖A_0‖_q^(q-2) are the drawn w (the readout scales as "
                "s^(3-q))",
                "    w = w * _lq_norm(w).pow(1.0 / (3.0 - LQ_Q))", *super().initial_accumulator()]


class ChunkLq(Lq):
    """readout=chunk (docs/semantics.md: chunk readouts): the normaliser n_c is taken from the accumulator at each
    chunk's first token and frozen for the chunk, W = A / n_c."""

    doc = ("lq, readout=chunk: the accumulator Y_t = α_t Y_{t−1} + U_t, read as W_t = Y_t / n_c with the chunk's "
           "frozen normaliser.")

    def before_gradient(self) -> list[str]:
        return [f"if not ({FIRST}):",
                "    return W",
                "# readout=chunk (docs/semantics.md: chunk readouts): re-normalise from the accumulator once per "
                "chunk, W_{s-1} := A_{s-1} / n_c;",
                "# every read of the chunk uses this frozen normaliser n_c",
                'norm = [_lq_norm(y) for y in carry["Y"]]',
                'carry["norm"] = [_per_row(first, n, old) for n, old in zip(norm, carry.get("norm", norm))]',
                'return [_per_row(first, y / n, w) for y, n, w in zip(carry["Y"], carry["norm"], W)]']

    def retain(self) -> list[str]:
        return [f"Y = [{ALPHA} * y + update for y, update in zip(Y, updates)]",
                'return [y / n for y, n in zip(Y, carry["norm"])], Y  # the chunk\'s frozen normaliser']


class ChunkKL(KL):
    """readout=chunk (docs/semantics.md: chunk readouts): the chunk's first token (the lag token) takes the full step
    from log W̃, W̃ = max(W, 1e-12); the later tokens a plain decay step in weight space, their gradients at W_s."""

    doc = ("kl, readout=chunk: a chunk's first token takes kl's full step (_kl_step), the later ones a decay step "
           "in weight space.")

    def start(self) -> list[str]:
        return ["Y = None  # readout=chunk: the state stays in weight space (log W̃ is taken at each chunk's first "
                "token)"]

    def retain(self) -> list[str]:
        return ["out = []",
                "for w, update in zip(W, updates):",
                "    lag = plain = None",
                f"    if {FIRST}:  # Memora's lag token: the full step from log W̃_{{s-1}}, W̃ = max(W, 1e-12)",
                f"        lag = _kl_step(w, update, {ALPHA})",
                "    if torch.is_tensor(first) or not first:  # later tokens of the chunk: a plain decay step, "
                "gradient at W_s",
                f"        plain = {ALPHA} * w + update",
                "    out.append(plain if lag is None else lag if plain is None else _per_row(first, lag, plain))",
                f"if {FIRST}:  # W_s anchors the gradients of the chunk's later tokens",
                '    carry["anchor"] = tuple(_per_row(first, w, a) for w, a in zip(out, carry["anchor"]))',
                "return out, Y"]


def for_spec(spec: S.Spec, entrywise: bool) -> Plain:
    """The printer of the spec's retention; `entrywise`: the derivation has an entrywise map for it."""
    r, par = spec.retention, spec.parallel
    if not r.mapped:
        return Decay(spec) if r.kind == "decay" else Plain(spec)
    if par.chunk_readout:
        return {"lq": ChunkLq, "kl": ChunkKL}[r.kind](spec)
    if entrywise:
        return Entrywise(spec)
    return {"lq": Lq, "kl": KL, "bregman": Bregman}[r.kind](spec)


def hooks(printer: Plain) -> dict[str, list[str]]:
    """The template's retention hooks and their lines: the module-level helpers the retention reads."""
    return {"RETENTION_FUNCTIONS": printer.functions()}


def state_functions(printer: Plain) -> str:
    """The retention's part of the state, which mirasc.runtime.memory_state calls: the accumulators at the start of a
    recurrence, and the weights a drawn initial value reads as."""
    return _functions((("_accumulators(W, state)", "The retention's accumulators Y at the start of a recurrence from "
                        "the weights W and the state (None: none).", printer.start() + ["return Y"]),
                       ("_initial_accumulator(w, state, name, dtype, device)", "The weights a drawn initial value w "
                        "reads as; where the retention keeps an accumulator, it is stored in the state as A_<name>.",
                        printer.initial_accumulator() + ["return w"])))


def step_functions(printer: Plain, learner: GD) -> str:
    """The token step's functions the spec prints (mirasc.runtime.token_step calls them): the learner's `_learn`, the
    retention's `_before_gradient` and `_retain`."""
    functions = (("_learn(grads, S, c)", f"The learner (docs/semantics.md, step 3), {learner.doc}", learner.learn()),
                 ("_before_gradient(W, carry, c, first)",
                  "The weights the token's gradient and step start from (docs/semantics.md, step 4).",
                  printer.before_gradient()),
                 ("_retain(W, Y, updates, c, carry, first)",
                  f"The retention (docs/semantics.md, step 4), {printer.doc}", printer.retain()))
    return _functions(functions)


def _functions(functions: tuple[tuple[str, str, list[str]], ...]) -> str:
    """Functions from their heads, docstrings and bodies, two blank lines apart."""
    return "\n\n\n".join("\n".join([f"def {head}:", *_docstring(doc), *(f"    {line}" for line in lines)])
                          for head, doc, lines in functions)


def _docstring(doc: str) -> list[str]:
    """A function's docstring, wrapped at 120 columns."""
    return textwrap.wrap(f'"""{doc}"""', 116, initial_indent="    ", subsequent_indent="    ", break_long_words=False)
