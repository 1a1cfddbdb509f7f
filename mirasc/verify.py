"""`mirasc verify SPEC`: every algorithm and backend of a compiled module against the module's own float64
token-by-token recurrence (docs/cli.md, "mirasc verify").

At small random sizes (a few chunks or mini-batches, with a partial last one), each (algorithm, backend, dtype)
the module has runs forward and backward; its output o, its final state and the gradient of a fixed random
function of both with respect to every input (q, k, v, each gate, each extra key input and the read's learned
parameters) are compared with `apply(..., algorithm="recurrent", backend="torch")` in float64 on the same inputs.
An error is ‖x − x_ref‖ / ‖x_ref‖ (‖x − x_ref‖ where x_ref = 0), and a row passes when every error is within its
bound: the tolerance of its dtype (TOLERANCE) in float64; in float32, per quantity, max(tolerance, 2 × the error of
the module's own float32 torch recurrence against the same float64 reference) — the rule benchmarks/gpu_check.py
applies — so that a design whose float32 recurrence itself rounds beyond the tolerance is judged by what float32
gives it. The float32 torch recurrence row is then the measure of that rounding, shown for information.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Relative error (norm-wise) allowed per dtype. float64: the algorithms are exact rewrites of the recurrence, so
# only rounding differs (measured ≤ 2e-12 on the bundled specs); float32: single-precision rounding through T
# steps and the backward (measured ≤ 3e-5 on the bundled specs), widened per quantity to OWN_ROUNDING × the
# float32 recurrence's own error where that is larger: a design that amplifies rounding is judged by what float32
# gives it (docs/cli.md, "mirasc verify").
TOLERANCE = {"float64": 1e-9, "float32": 1e-4}
OWN_ROUNDING = 2.0
# The per-token coefficient ranges random inputs are drawn from (mirasc demo uses the same)
GATE_RANGES = {"eta": (0.05, 0.5), "alpha": (0.9, 1.0), "theta": (0.0, 0.9), "delta": (0.2, 1.0),
               "gamma": (0.5, 1.0), "nu": (0.5, 1.0), "rho": (0.1, 1.0)}


def random_inputs(mod, B: int, T: int, H: int, D: int, generator, dtype=None) -> dict:
    """Inputs the module's `apply` takes, drawn from `generator`: unit-norm q, k (and extras), normal v, gates in
    GATE_RANGES; multi-step learners get STEPS keys, values and learning rates per token. Returns
    {"q", "k", "v", "gates": {...}, "extras": {...}}."""
    import torch

    dtype = dtype or torch.float32
    sub = [mod.STEPS] if getattr(mod, "STEPS", 1) > 1 else []

    def unit(*shape):
        return torch.nn.functional.normalize(torch.randn(*shape, generator=generator, dtype=torch.float64),
                                             dim=-1).to(dtype)

    q = unit(B, T, H, D)
    k = unit(B, T, H, *sub, D)
    v = torch.randn(B, T, H, *sub, D, generator=generator, dtype=torch.float64).to(dtype)
    gates = {}
    for g in mod.GATES:
        lo, hi = GATE_RANGES[g]
        channels = [D] if g in getattr(mod, "GATE_CHANNELS", {}) else []  # Dk = Dv = D here
        shape = (B, T, H, *(sub if g == "eta" else []), *channels)
        gates[g] = (lo + (hi - lo) * torch.rand(*shape, generator=generator, dtype=torch.float64)).to(dtype)
    extras = {n: unit(B, T, H, *sub, D) for n in getattr(mod, "EXTRAS", ())}
    return {"q": q, "k": k, "v": v, "gates": gates, "extras": extras}


@dataclass
class Row:
    algorithm: str
    backend: str
    dtype: str
    errors: dict = field(default_factory=dict)   # quantity -> relative error
    note: str = ""                                # why the row did not run (a refusal), or the failure
    failed: bool = False
    bounds: dict = field(default_factory=dict)   # quantity -> the error allowed, where it is not TOLERANCE
    info: bool = False                            # the float32 torch recurrence: it sets the float32 bounds

    @property
    def ran(self) -> bool:
        return bool(self.errors)

    def bound(self, quantity: str) -> float:
        return self.bounds.get(quantity, TOLERANCE[self.dtype])

    def passed(self) -> bool:
        if self.info:  # judged only as information; it fails only when it is not finite
            return self.ran and not self.failed and all(math.isfinite(e) for e in self.errors.values())
        return self.ran and not self.failed and all(e <= self.bound(q) for q, e in self.errors.items())


def sizes(mod) -> dict:
    """Small sizes that reach every code path: several chunks (or mini-batches) with a partial last one."""
    heads = max(2, getattr(mod, "HEAD_MIX", 1))
    minibatch = getattr(mod, "MINIBATCH", None)
    if minibatch:
        return {"B": 2, "T": 2 * minibatch + 5, "H": heads, "D": 16, "chunk_size": None}
    return {"B": 2, "T": 37, "H": heads, "D": 16, "chunk_size": 16}


def _flat(state) -> dict:
    """The tensors of a final state (a dict, a list of dicts for packed runs, or None), by name."""
    import torch

    if state is None:
        return {}
    if isinstance(state, (list, tuple)):
        return {f"{i}.{n}": t for i, s in enumerate(state) for n, t in _flat(s).items()}
    return {n: t for n, t in state.items() if isinstance(t, torch.Tensor)}


def _run(mod, inputs: dict, state, params, weights: dict, *, algorithm: str, backend: str, dtype, chunk_size,
         device):
    """One forward and backward at `dtype`: (o, final state tensors, {input name: gradient}) in float64."""
    import torch

    leaves = {}

    def leaf(name, t):
        x = t.detach().to(device=device, dtype=dtype).requires_grad_(True)
        leaves[name] = x
        return x

    q, k, v = (leaf(n, inputs[n]) for n in ("q", "k", "v"))
    gates = {g: leaf(f"gate {g}", t) for g, t in inputs["gates"].items()}
    extras = {n: leaf(f"extra {n}", t) for n, t in inputs["extras"].items()}
    kwargs = {}
    if extras:
        kwargs["extras"] = extras
    if params:
        kwargs["params"] = {n: leaf(f"param {n}", t) for n, t in params.items()}
    if chunk_size is not None and algorithm == "chunked":
        kwargs["chunk_size"] = chunk_size
    start = None if state is None else {n: (t.detach().to(device=device, dtype=dtype) if isinstance(t, torch.Tensor)
                                            else t) for n, t in state.items()}
    o, final = mod.apply(q, k, v, gates, state=start, algorithm=algorithm, backend=backend, **kwargs)
    final = _flat(final)
    objective = (o.double() * weights["o"].to(device)).sum()
    for n, t in final.items():
        if t.is_floating_point() and n in weights:
            objective = objective + (t.double() * weights[n].to(device)).sum()
    grads = torch.autograd.grad(objective, list(leaves.values()), allow_unused=True)
    out_grads = {n: (torch.zeros_like(x, dtype=torch.float64) if g is None else g.double()).cpu()
                 for (n, x), g in zip(leaves.items(), grads)}
    return o.detach().double().cpu(), {n: t.detach().double().cpu() for n, t in final.items()}, out_grads


def _error(x, ref) -> float:
    import torch

    if x.shape != ref.shape:
        return math.inf
    diff = (x - ref).norm().item()
    scale = ref.norm().item()
    if not math.isfinite(diff):
        return math.inf
    return diff / scale if scale > 0 else diff if not torch.equal(x, ref) else 0.0


def verify(mod, *, dtypes=("float64", "float32"), backends=("torch", "triton"), device=None, seed: int = 0,
           size: dict | None = None) -> list[Row]:
    """Every (algorithm, backend, dtype) of `mod` against its float64 torch recurrence; one Row each."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    s = dict(sizes(mod), **(size or {}))
    B, T, H, D = s["B"], s["T"], s["H"], s["D"]
    gen = torch.Generator().manual_seed(seed)
    inputs = random_inputs(mod, B, T, H, D, gen, dtype=torch.float64)
    state = mod.init_state(B, H, D, D, dtype=torch.float64, generator=gen)
    params = mod.init_params(H, D, D, dtype=torch.float64) if hasattr(mod, "init_params") else {}
    params = {n: t + 0.1 * torch.randn(t.shape, generator=gen, dtype=torch.float64) for n, t in params.items()}
    o_ref, final_ref, grads_ref = None, None, None
    # the reference: float64, token by token, on the torch backend
    weights = {}
    with torch.no_grad():
        o0, f0 = mod.apply(*(inputs[n] for n in ("q", "k", "v")), inputs["gates"], state=state,
                           algorithm="recurrent", backend="torch",
                           **({"extras": inputs["extras"]} if inputs["extras"] else {}),
                           **({"params": params} if params else {}))
    weights["o"] = torch.randn(o0.shape, generator=gen, dtype=torch.float64)
    for n, t in _flat(f0).items():
        if t.is_floating_point():
            weights[n] = torch.randn(t.shape, generator=gen, dtype=torch.float64)
    o_ref, final_ref, grads_ref = _run(mod, inputs, state, params, weights, algorithm="recurrent", backend="torch",
                                       dtype=torch.float64, chunk_size=None, device="cpu")
    algorithms = ["recurrent"] + (["chunked"] if getattr(mod, "CHUNKED", False) else [])

    def run_row(row: Row, device) -> None:
        try:
            o, final, grads = _run(mod, inputs, state, params, weights, algorithm=row.algorithm, backend=row.backend,
                                   dtype=getattr(torch, row.dtype), chunk_size=s["chunk_size"], device=device)
        except (RuntimeError, ValueError) as err:
            text = str(err).splitlines()[0] if str(err) else type(err).__name__
            # a documented refusal (no such kernel, sizes it has no configuration for) is not a failure
            if "backend='torch'" in text or "algorithm='recurrent'" in text or "needs the triton" in text:
                row.note = text
            else:
                row.note, row.failed = f"{type(err).__name__}: {text}", True
            return
        row.errors["o"] = _error(o, o_ref)
        missing = sorted(set(final_ref) - set(final))
        if missing:
            row.failed, row.note = True, f"final state lacks {missing}"
        state_errors = [_error(final[n], final_ref[n]) for n in final_ref if n in final]
        row.errors["state"] = max(state_errors, default=0.0)
        for n, g in grads_ref.items():
            row.errors[f"∂{n.split(' ')[-1]}"] = _error(grads[n], g)

    # float32: the torch recurrence's own error against the float64 one sets each quantity's bound
    own = None
    if "float32" in dtypes:
        own = Row("recurrent", "torch", "float32", info=True)
        run_row(own, "cpu")
        if own.ran and not own.passed():
            own.failed, own.note = True, "the float32 recurrence is not finite"
    rows = []
    for dtype_name in dtypes:
        if dtype_name == "float32" and own is not None:
            rows.append(own)  # (shown whatever the backends: it sets the float32 rows' bounds)
        for backend in backends:
            for algorithm in algorithms:
                if backend == "triton" and dtype_name == "float64":
                    continue  # (the Triton kernels take float32, bf16 and fp16)
                if own is not None and (algorithm, backend, dtype_name) == ("recurrent", "torch", "float32"):
                    continue
                row = Row(algorithm, backend, dtype_name)
                rows.append(row)
                run_row(row, device if backend == "triton" else "cpu")
                if dtype_name == "float32" and own is not None:
                    row.bounds = {q: OWN_ROUNDING * e for q, e in own.errors.items()
                                  if math.isfinite(e) and OWN_ROUNDING * e > TOLERANCE["float32"]}
    return rows


def format_rows(rows: list[Row]) -> list[str]:
    """The table: one line per (algorithm, backend, dtype), its errors, tolerance and verdict."""
    quantities = []
    for r in rows:
        for q in r.errors:
            if q not in quantities:
                quantities.append(q)
    head = f"{'algorithm':<10} {'backend':<7} {'dtype':<8} " + " ".join(f"{q:>9}" for q in quantities) \
        + f" {'tolerance':>9}  result"
    lines = [head, "-" * len(head)]
    for r in rows:
        prefix = f"{r.algorithm:<10} {r.backend:<7} {r.dtype:<8} "
        if not r.ran:
            verdict = "FAIL" if r.failed else "n/a"
            lines.append(prefix + f"{verdict}: {r.note}")
            continue
        cells = " ".join(f"{r.errors[q]:>9.1e}" if q in r.errors else f"{'—':>9}" for q in quantities)
        if r.info:
            verdict = ("FAIL: " + r.note) if r.failed else "info: this design's float32 rounding"
            lines.append(prefix + cells + f" {'—':>9}  {verdict}")
            continue
        verdict = "ok" if r.passed() else "FAIL" + (f": {r.note}" if r.note else "")
        widest = max((r.bound(q) for q in r.errors), default=TOLERANCE[r.dtype])
        tolerance = f"{widest:>9.1e}" if r.bounds else f"{TOLERANCE[r.dtype]:>9.0e}"
        lines.append(prefix + cells + f" {tolerance}  {verdict}")
    return lines
