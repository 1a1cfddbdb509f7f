"""A retention's part of the torch module's token recurrence (docs/semantics.md, step 4), one printer per way a
retention turns the learner's update U into the next weights, as codegen/triton_retention.py is for the fused Triton
kernels. Each printer fills the torch template's retention hooks (lines, unindented; the hook's line gives the
indentation):

- `functions`: the module-level helpers it reads (the readout R of an accumulator, `_readout`; lq's norm);
- `start`: the accumulators Y at the start of a recurrence (`_start`; Y = None where there are none);
- `chunk_start`: at the first token of a mini-batch, before its anchor is taken (a chunk readout's normaliser);
- `before_gradient`: a per-token step, before the gradient is taken (decay with order=pre);
- `copy`: before the per-weight loop, where the step writes the accumulators;
- `step`: inside the per-weight loop, from `update` (U of weight i) to W[i] (and Y[i]);
- `after_step`: after the loop (a chunk readout's anchor);
- `initial_accumulator`: in init_state, turning the drawn weights `w` into the accumulator stored as A_<name>.

`for_spec` picks the printer for a spec; the facts it reads are the retention's (language/retention.py) and whether
the parallel form reads the weights at chunk ends (docs/semantics.md: chunk readouts).
"""

from __future__ import annotations

from ..language import spec as S

ALPHA = '_on_weight("alpha", c_t["alpha"])'  # α_t as a factor of one weight (per head, or per row/column channel)


class Plain:
    """The weights are the state, W_t = W_{t−1} + U_t (retention none)."""

    def __init__(self, spec: S.Spec):
        self.r = spec.retention

    def _nothing(self) -> list[str]:
        return []

    # the hooks a retention without a map leaves empty (a subclass overrides the ones it fills)
    functions = chunk_start = before_gradient = copy = after_step = initial_accumulator = _nothing

    def start(self) -> list[str]:
        return ["Y = None"]

    def step(self) -> list[str]:
        return ["W[i] = W[i] + update"]


class Decay(Plain):
    """W_t = α_t W_{t−1} + U_t (order=post), or the gradient taken at α_t W_{t−1} and U_t added there (order=pre)."""

    def before_gradient(self) -> list[str]:
        if self.r.order == "pre":
            return [f"W = [{ALPHA} * w for w in W]  # order=pre: decay first, take the gradient there"]
        return []

    def step(self) -> list[str]:
        return super().step() if self.r.order == "pre" else [f"W[i] = {ALPHA} * W[i] + update"]


class Mapped(Plain):
    """W = R(Y): the accumulator Y_t = α_t Y_{t−1} + U_t (Bregman: φ'(W_{t−1}) + U_t, no α) and its readout at every
    token. Y is carried as A_<name> where R cannot be inverted (`keeps_accumulator`), else recomputed from W."""

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

    def copy(self) -> list[str]:
        return ["Y = list(Y)"]

    def step(self) -> list[str]:
        alpha = f"{ALPHA} * " if self.r.gated else ""
        return [f"Y[i] = {alpha}Y[i] + update", "W[i] = _readout(Y[i])"]

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

    def readout(self) -> list[str]:
        return ["# W = c·softmax(Z) over each row, Z = log(W / c) accumulated linearly.",
                "return KL_C * torch.softmax(acc, dim=-1)"]

    def image(self, w: str) -> str:
        return f"torch.log({w} / KL_C)"


class Lq(Mapped):
    """W = A / ‖A‖_q^(q−2), the entrywise q-norm of each matrix; A kept in the state."""

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

    def chunk_start(self) -> list[str]:
        return ["# readout=chunk (docs/semantics.md: chunk readouts): re-normalise from the accumulator once per "
                "chunk, W_{s-1} := A_{s-1} / n_c;",
                "# every read of the chunk uses this frozen normaliser n_c",
                "norm = [_lq_norm(y) for y in Y]",
                'carry["norm"] = [_per_row(first, n, old) for n, old in zip(norm, carry.get("norm", norm))]',
                "W = [_per_row(first, y / n, w) for y, n, w in zip(Y, carry[\"norm\"], W)]"]

    def step(self) -> list[str]:
        return [f"Y[i] = {ALPHA} * Y[i] + update",
                'W[i] = Y[i] / carry["norm"][i]  # the chunk\'s frozen normaliser']


class ChunkKL(KL):
    """readout=chunk (docs/semantics.md: chunk readouts): the chunk's first token (the lag token) takes the full step
    from log W̃, W̃ = max(W, 1e-12); the later tokens a plain decay step in weight space, their gradients at W_s."""

    def start(self) -> list[str]:
        return ["Y = None  # readout=chunk: the state stays in weight space (log W̃ is taken at each chunk's first "
                "token)"]

    copy = Plain._nothing  # (the state stays in weight space: no accumulators to copy)

    def step(self) -> list[str]:
        return ["lag = plain = None",
                "if torch.is_tensor(first) or first:  # Memora's lag token: the full step from log W̃_{s-1}, "
                "W̃ = max(W, 1e-12)",
                "    log_w = torch.log(W[i].clamp_min(1e-12))",
                f"    lag = KL_C * torch.softmax({ALPHA} * log_w + update, dim=-1)",
                "if torch.is_tensor(first) or not first:  # later tokens of the chunk: a plain decay step, gradient "
                "at W_s",
                f"    plain = {ALPHA} * W[i] + update",
                "W[i] = plain if lag is None else lag if plain is None else _per_row(first, lag, plain)"]

    def after_step(self) -> list[str]:
        return ["if torch.is_tensor(first) or first:  # W_s anchors the gradients of the chunk's later tokens",
                '    carry["anchor"] = tuple(_per_row(first, w, a) for w, a in zip(W, carry["anchor"]))']


def for_spec(spec: S.Spec, entrywise: bool) -> Plain:
    """The printer of the spec's retention; `entrywise`: the derivation has an entrywise map for it."""
    r, par = spec.retention, spec.parallel
    if not r.mapped:
        return Decay(spec) if r.kind == "decay" else Plain(spec)
    if par.kind == "minibatch" and par.readout == "chunk":
        return {"lq": ChunkLq, "kl": ChunkKL}[r.kind](spec)
    if entrywise:
        return Entrywise(spec)
    return {"lq": Lq, "kl": KL, "bregman": Bregman}[r.kind](spec)


def hooks(printer: Plain) -> dict[str, list[str]]:
    """The template's retention hooks, RETENTION_<NAME>, and their lines."""
    names = ("functions", "start", "chunk_start", "before_gradient", "copy", "step", "after_step",
             "initial_accumulator")
    return {f"RETENTION_{n.upper()}": getattr(printer, n)() for n in names}
