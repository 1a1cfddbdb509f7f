"""`mirasc kernels`: compile every Triton kernel a module launches for a real GPU target, on any machine.

No GPU is needed. The module is run once on CPU tensors with `backend="triton"` (forward and backward);
each kernel launch is intercepted instead of executed (outputs are garbage, only which kernels launch
with which argument types and constants matters) and compiled ahead of time with `triton.compile` for
`GPUTarget("cuda", arch, 32)`, once per configuration a GPU could run it with: the section's autotuning
space (`*_AUTOTUNE` tables of the emitted module: kernel name -> space(args, smem_limit) -> configs)
without pruning, so the report also shows what the resource model rejects, or, for kernels that are not
autotuned, the configuration launched. Each is compiled as a GPU's JIT would compile that launch: with
the launch's specialization (`triton._C.libtriton.native_specialize_impl`, the function `JITFunction.run` calls, or the
same rule reimplemented on a Triton before 3.5), from the intercepted arguments' actual values, honouring the
kernel's `do_not_specialize` and `do_not_specialize_on_alignment`: `tt.divisibility = 16` on every pointer
whose address and every integer whose value is divisible by 16, integers equal to 1 compiled as constants
(floats and bools are not specialized). CPU tensors are 64-byte aligned like CUDA's (256 B), and the
module's views (offsets, strides) are the same on both, so the attributes are those a GPU launch gets and
the report is deterministic. Each row records them (`specialized`: "divisible_by_16", "equal_to_1").
Without them the cubins differ (vectorised loads, pipelining, registers, spills, shared memory).
The cubin's registers and spill stack come from the `cuobjdump` that ships with Triton; shared memory
from the compiled kernel's metadata; tensor-core use from the SASS (`cuobjdump -sass`): the kinds of matrix
instruction the cubin really issues, by unit and operand type ("HGMMA.BF16" on sm_90's warpgroup MMA,
"HMMA.BF16" / "HMMA.TF32" on the warp-level MMA; none when every product runs on the FMA units).

A row "fits" when its shared memory is within the target's per-block limit and nothing failed to
compile. `kept` says whether the module's resource model would let a GPU of that target launch it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field

# Per-block shared memory a kernel may opt into, by target (bytes); the register file is 64K 32-bit
# registers per SM on all of them (255 per thread at most).
TARGETS = {"sm_80": (80, 166912), "sm_86": (86, 101376), "sm_89": (89, 101376), "sm_90": (90, 232448),
           "sm_100": (100, 232448)}
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


class NoKernels(Exception):
    """The spec's module has no Triton kernel at all (it runs on torch only); the message says why."""


@dataclass
class Row:
    kernel: str
    config: dict
    kept: bool | None = None  # None: the kernel is not autotuned (the launched configuration)
    ok: bool = False
    registers: int = -1
    spill_bytes: int = -1
    shared_bytes: int = -1
    fits: bool = False
    tensor_cores: bool = False
    # matrix instructions in the SASS by kind ("HGMMA.BF16", "HMMA.F16", "HMMA.TF32", ...) -> how many
    mma: dict = field(default_factory=dict)
    compile_s: float = 0.0  # CPU seconds (this process and ptxas), so a busy machine does not inflate them
    error: str = ""
    direction: str = "fwd"
    # the launch's specialization the compile applied, as the JIT would: arguments given tt.divisibility 16
    # (pointers whose address, integers whose value is divisible by 16) and integers equal to 1 (constants)
    specialized: dict = field(default_factory=dict)



def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (ptxas): what a compile costs on one core, whatever
    else the machine runs (wall-clock time on a shared CI machine measures the neighbours too)."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime

def _bin_dir():
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def _cuobjdump(cubin: bytes, flag: str) -> str:
    """What Triton's `cuobjdump FLAG` prints for a cubin."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([os.path.join(_bin_dir(), "cuobjdump"), flag, path],
                              capture_output=True, text=True, check=False).stdout


def _cubin_resources(cubin: bytes) -> tuple[int, int]:
    """(registers, spill stack bytes) of the largest function in a cubin."""
    text = _cuobjdump(cubin, "--dump-resource-usage")

    def largest(key):
        return max([int(x) for x in re.findall(rf"{key}:(\d+)", text)] or [-1])

    return largest("REG"), largest("STACK")


def _sass_mma_kinds(cubin: bytes) -> dict[str, int]:
    """The matrix (tensor-core) instructions a cubin issues, by unit and operand type, counted in its SASS:
    `HGMMA.64x64x16.F32.BF16` counts as "HGMMA.BF16", `HMMA.16816.F32.BF16` as "HMMA.BF16",
    `HMMA.1688.F32.TF32` as "HMMA.TF32". Empty: every product runs on the FMA units."""
    text = _cuobjdump(cubin, "-sass")
    kinds: dict[str, int] = {}
    for unit, suffix in re.findall(r"\b(HGMMA|HMMA)\.([A-Z0-9x.]+)", text):
        kind = f"{unit}.{suffix.split('.')[-1]}"  # the operand type is the last field
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items()))


def mma_text(kinds: dict) -> str:
    """The matrix-instruction kinds of a row, short: "HGMMA.BF16" or "HMMA.TF32+HMMA.BF16"; "FMA" when none."""
    return "+".join(kinds) if kinds else "FMA"


_TORCH_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int32": "i32",
                "int64": "i64", "bool": "u1", "uint8": "u8", "int8": "i8"}


def _specialize_rule(arg, is_const: bool, specialize: bool, align: bool):
    """(type, specialization) of one non-constexpr argument by the rule of Triton's JIT (3.5 on,
    `native_specialize_impl` with the base backend's `get_int_specialization`/`get_tensor_specialization`),
    for a Triton without that native function: a tensor is a pointer `*dtype` ("D" when its address is
    divisible by 16); an integer is i32/i64/u64 by range, the constant 1 when it equals 1, "D" when it is
    divisible by 16; bools and floats are not specialized (None). `specialize=False` (do_not_specialize)
    gives None, `align=False` (do_not_specialize_on_alignment) "" where "D" would be."""
    import torch

    if isinstance(arg, torch.Tensor):
        ty = ("*k" if is_const else "*") + _TORCH_TYPES[str(arg.dtype).removeprefix("torch.")]
        return ty, (("D" if align and arg.data_ptr() % 16 == 0 else "") if specialize else None)
    if isinstance(arg, bool):
        return "u1", None
    if isinstance(arg, int):
        ty = "i32" if -2**31 <= arg < 2**31 else "i64" if -2**63 <= arg < 2**63 else "u64"
        if not specialize:
            return ty, None
        if arg == 1:
            return "constexpr", 1
        return ty, ("D" if align and arg % 16 == 0 else "")
    if isinstance(arg, float):
        return "fp32", None
    if arg is None:
        return "constexpr", None
    raise TypeError(f"argument of type {type(arg).__name__}")


def _specialize_impl():
    """Triton's own per-argument specialization of a launch (the function `JITFunction.run` calls), or the
    same rule reimplemented (`_specialize_rule`) on a Triton before 3.5 that does not export it."""
    try:
        from triton._C.libtriton import native_specialize_impl
    except ImportError:
        return None
    return native_specialize_impl


def _signature(fn, bound: dict, backend=None):
    """What `JITFunction.run` would compile for a launch of `fn` with the arguments `bound`: the signature,
    the constexprs (the declared ones and integer arguments equal to 1) and the attributes (`tt.divisibility`
    16 on pointers whose address and integers whose value is divisible by 16), built by the JIT's own
    specialization function with the kernel's `do_not_specialize` and `do_not_specialize_on_alignment`.
    Returns (signature, constexprs, attrs keyed by the argument's path (index,), hints: {"divisible_by_16":
    names, "equal_to_1": names})."""
    from triton.backends.compiler import BaseBackend

    native = _specialize_impl()
    backend = backend or BaseBackend
    sig, const, attrs = {}, {}, {}
    hints = {"divisible_by_16": [], "equal_to_1": []}
    for i, p in enumerate(fn.params):
        v = bound.get(p.name, p.default if p.has_default else None)
        if p.is_constexpr:
            sig[p.name], const[p.name] = "constexpr", v
            attrs[(i,)] = backend.parse_attr("")  # as the JIT's (empty) attributes of a constexpr
            continue
        specialize, align = not p.do_not_specialize, not p.do_not_specialize_on_alignment
        try:
            ty, spec = (native(backend, v, getattr(p, "is_const", False), specialize, align) if native is not None
                        else _specialize_rule(v, getattr(p, "is_const", False), specialize, align))
        except (TypeError, KeyError):
            raise TypeError(f"{fn.fn.__name__}: argument {p.name} of type {type(v).__name__}") from None
        annotated = getattr(p, "annotation_type", None)
        if isinstance(annotated, str) and annotated:  # an annotated type replaces the argument's own; the JIT
            ty = annotated                            # does not specialize non-constexpr floats and bools
            if annotated == "u1" or annotated[:2] in ("fp", "bf"):
                spec = None
        if ty == "constexpr":
            sig[p.name], const[p.name], attrs[(i,)] = "constexpr", spec, backend.parse_attr("")
            if spec == 1 and not isinstance(spec, bool):
                hints["equal_to_1"].append(p.name)
            continue
        sig[p.name] = ty
        if isinstance(spec, str):
            attrs[(i,)] = backend.parse_attr(spec)
            if ["tt.divisibility", 16] in attrs[(i,)]:
                hints["divisible_by_16"].append(p.name)
    return sig, const, attrs, hints


def compile_launch(fn, bound: dict, target="sm_90", options=None, *, _specialized=None):
    """Compile the launch of the JITFunction `fn` with the arguments `bound` (parameter name -> value, the
    constexprs among them) for `target` as a GPU's JIT would: the launch's specialization (`_signature`)
    applied. Returns the compiled kernel (`asm["ttir"|"ttgir"|"ptx"|"cubin"]`, `metadata`)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    gpu = GPUTarget("cuda", TARGETS[target][0], 32)
    sig, const, attrs = _specialized or _signature(fn, bound, make_backend(gpu))[:3]
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs), target=gpu,
                          options=dict(options or {}))


def _autotune_tables(module) -> dict:
    tables = {}
    for name in sorted(vars(module)):
        if name.endswith("_AUTOTUNE") and isinstance(getattr(module, name), dict):
            tables.update(getattr(module, name))
    return tables


def report(spec, *, target="sm_90", dk=64, dv=64, dtype="bfloat16", T=256, chunk=None, algorithms=None,
           heads=2, which="all", on_row=None) -> list[Row]:
    """Compile, for `target`, every kernel the module of `spec` (a path or spec text) launches with
    backend="triton" for each algorithm it has, forward and backward, at head sizes dk/dv.
    which="all": every configuration of each autotuning space; "extremes": only the first and the last
    configuration the resource model keeps (the spaces are ordered from the safest, smallest tiles, to
    the one nearest the limits), which is what a quick check of the model and of spills needs."""
    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("mirasc kernels compiles for a GPU: unset TRITON_INTERPRET before triton is imported")
    import torch
    from triton.runtime.jit import JITFunction

    from ..compiler import compile_spec

    module = compile_spec(spec)  # (the process's one module of this spec: what is set on it below is undone)
    tracer = _Tracer(module, target, which, on_row)
    saved_run = JITFunction.run
    JITFunction.run = lambda kernel, *args, **kwargs: tracer.intercept(kernel, *args, **kwargs)
    # the module refuses backend='triton' on CPU tensors outside the interpreter; here no kernel runs (each launch
    # is intercepted), so its device check stands aside for the traced calls; and its chunk kernels refuse on the
    # CPU what a GPU of `target` would
    settings = {name: value for name, value in (("_check_triton_device", lambda *args: None),
                                                ("FIT_SMEM_LIMIT", tracer.smem_limit)) if hasattr(module, name)}
    saved = {name: getattr(module, name) for name in settings}
    for name, value in settings.items():
        setattr(module, name, value)
    try:
        for algorithm in algorithms or _algorithms(module):
            q, k, v, gates, kw = _inputs(module, T, heads, dk, dv, getattr(torch, dtype), chunk)
            tracer.direction = "fwd"
            try:
                if hasattr(module, "WEIGHTS"):
                    o, _ = module.apply(q, k, v, gates, backend="triton", algorithm=algorithm, **kw)
                else:  # a nonparametric memory (attention)
                    o = module.apply(q, k, v, gates, backend="triton")
                    o = o[0] if isinstance(o, tuple) else o
                tracer.direction = "bwd"
                o.float().sum().backward()
            except (RuntimeError, ValueError) as err:  # the module refuses: no kernel for it, or not at this size
                msg = str(err).splitlines()[0] if str(err) else type(err).__name__
                if msg.startswith("no Triton kernel"):
                    raise NoKernels(msg) from None
                if msg.startswith(("no chunked Triton kernel", "no fused recurrent Triton kernel")):
                    continue  # this algorithm runs on torch: nothing to compile
                tracer.add(Row(kernel=f"({algorithm} {tracer.direction}: refused)", config={}, error=msg,
                               direction=tracer.direction))
    finally:
        JITFunction.run = saved_run
        for name, value in saved.items():
            setattr(module, name, value)
    return tracer.rows


def _inputs(module, T, heads, dk, dv, torch_dtype, chunk):
    """Random q, k, v, gates (and key inputs such as κ) of one batch row, as the module's apply takes them."""
    import torch

    g = torch.Generator().manual_seed(0)
    sub = [module.STEPS] if hasattr(module, "STEPS") else []  # multi-step learners: n pairs (and η) per token
    q = torch.randn(1, T, heads, dk, generator=g).to(torch_dtype).requires_grad_()
    k = torch.randn(1, T, heads, *sub, dk, generator=g).to(torch_dtype).requires_grad_()
    v = torch.randn(1, T, heads, *sub, dv, generator=g).to(torch_dtype).requires_grad_()
    channels = getattr(module, "GATE_CHANNELS", {})
    gates = {n: torch.rand(1, T, heads, *(sub if n == "eta" else []),
                           *([dk if channels[n] == "k" else dv] if n in channels else []),
                           generator=g).requires_grad_() for n in getattr(module, "GATES", ())}
    kw = {} if chunk is None else {"chunk_size": chunk}
    extras = {n: torch.randn(1, T, heads, *sub, dk, generator=g).to(torch_dtype).requires_grad_()
              for n in getattr(module, "EXTRAS", ())}  # key inputs besides q, k (κ)
    if extras:
        kw["extras"] = extras
    return q, k, v, gates, kw


class _Tracer:
    """Stands in for every Triton launch of one module: compiles the launch (each configuration of an autotuned
    kernel's space, or its two ends) for the target with the launch's specialization, and keeps a Row per
    distinct compile."""

    def __init__(self, module, target, which, on_row):
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        arch, self.smem_limit = TARGETS[target]
        self.target, self.which, self.on_row = target, which, on_row
        self.backend = make_backend(GPUTarget("cuda", arch, 32))  # the specialization a launch on that GPU applies
        self.tables = _autotune_tables(module)
        self.rows: list[Row] = []
        self.seen = set()
        self.direction = "fwd"

    def add(self, row: Row) -> None:
        self.rows.append(row)
        if self.on_row:
            self.on_row(row)

    def compile_one(self, fn, bound, options, config_label, kept):
        sig, const, attrs, hints = _signature(fn, bound, self.backend)
        key = (fn.fn.__name__, json.dumps(sig, sort_keys=True), repr(sorted(const.items(), key=str)),
               repr(sorted(attrs.items())), repr(sorted(options.items())))
        if key in self.seen:
            return
        self.seen.add(key)
        row = Row(kernel=fn.fn.__name__, config=config_label, kept=kept, direction=self.direction, specialized=hints)
        t0 = _cpu_seconds()
        try:
            k = compile_launch(fn, bound, self.target, options, _specialized=(sig, const, attrs))
            row.registers, row.spill_bytes = _cubin_resources(k.asm["cubin"])
            row.shared_bytes = int(k.metadata.shared)
            row.ok = True
            row.fits = row.shared_bytes <= self.smem_limit
            row.mma = _sass_mma_kinds(k.asm["cubin"])
            row.tensor_cores = bool(row.mma)
        except Exception as err:  # a compile error or out of resources: reported, not raised
            lines = [ln for ln in str(err).splitlines() if ln.strip() and not ln.startswith((".", "/", "$"))]
            row.error = (lines[0] if lines else type(err).__name__)[:200]
        row.compile_s = round(_cpu_seconds() - t0, 2)
        self.add(row)

    def intercept(self, kernel, *args, grid=None, warmup=False, **kwargs):
        """What JITFunction.run does while tracing: compile the launch of `kernel`, run nothing."""
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in OPTIONS}
        bound = dict(zip([p.name for p in kernel.params], args))
        bound.update(kwargs)
        name = kernel.fn.__name__
        if name not in self.tables:
            label = {p.name: bound[p.name] for p in kernel.params if p.is_constexpr and isinstance(
                bound.get(p.name), (bool, int))}
            label.update(warps=options.get("num_warps", 4), stages=options.get("num_stages", 3))
            self.compile_one(kernel, bound, options, label, None)
            return None
        full = self.tables[name](bound, None)  # the whole space, unpruned
        kept_list = self.tables[name](bound, self.smem_limit)
        kept = {json.dumps([c.kwargs, c.num_warps, c.num_stages], sort_keys=True) for c in kept_list}
        if self.which == "extremes":
            full = kept_list[:1] + kept_list[1:][-1:]
        for c in full:
            b = dict(bound)
            b.update(c.kwargs)
            label = dict(c.kwargs, warps=c.num_warps, stages=c.num_stages)
            self.compile_one(kernel, b, {"num_warps": c.num_warps, "num_stages": c.num_stages}, label,
                             json.dumps([c.kwargs, c.num_warps, c.num_stages], sort_keys=True) in kept)
        return None


def _algorithms(module) -> list[str]:
    """The algorithms a module runs on the Triton backend (each may launch different kernels)."""
    if not hasattr(module, "WEIGHTS"):
        return ["auto"]
    return ["chunked", "recurrent"] if getattr(module, "CHUNKED", False) else ["recurrent"]


def summarize(rows: list[Row]) -> list[dict]:
    """Per kernel: how many configurations were compiled, kept, fit; the kept one with the least spill
    and most tensor-core use; the slowest compile."""
    out = []
    for name in dict.fromkeys(r.kernel for r in rows):
        rs = [r for r in rows if r.kernel == name]
        if name.endswith(": refused)"):  # the module refused these sizes before any launch: nothing compiled
            out.append({"kernel": name, "direction": rs[0].direction, "configs": 0, "kept": 0, "kept_fit": 0,
                        "kept_not_fit": 0, "best": None, "max_compile_s": 0.0, "refused": rs[0].error})
            continue
        kept = [r for r in rs if r.kept is not False]
        fitting = [r for r in kept if r.ok and r.fits]
        best = min(fitting, key=lambda r: (r.spill_bytes, -r.tensor_cores, r.registers), default=None)
        kinds = sorted({mma_text(r.mma) for r in kept if r.ok})
        out.append({"kernel": name, "direction": rs[0].direction, "configs": len(rs), "kept": len(kept),
                    "kept_fit": len(fitting), "kept_not_fit": len(kept) - len(fitting),
                    "best": None if best is None else asdict(best), "mma_kept": kinds,
                    "max_compile_s": max(r.compile_s for r in rs)})
    return out


def format_rows(rows: list[Row]) -> str:
    lines = [f"{'kernel':<28} {'dir':<4} {'config':<42} {'kept':<5} {'regs':>4} {'spill':>6} {'smem KB':>8} "
             f"{'fits':<5} {'matrix units':<22} {'compile s':>9}  specialized (div 16 | = 1)"]
    for r in rows:
        cfg = " ".join(f"{k}={v}" for k, v in r.config.items())
        kept = "-" if r.kept is None else ("yes" if r.kept else "no")
        if not r.ok:
            lines.append(f"{r.kernel:<28} {r.direction:<4} {cfg:<42} {kept:<5} FAILED: {r.error}")
            continue
        lines.append(f"{r.kernel:<28} {r.direction:<4} {cfg:<42} {kept:<5} {r.registers:>4} {r.spill_bytes:>6} "
                     f"{r.shared_bytes / 1024:>8.1f} {'yes' if r.fits else 'NO':<5} "
                     f"{mma_text(r.mma):<22} {r.compile_s:>9.1f}  {_hints_text(r.specialized)}")
    return "\n".join(lines)


def _hints_text(hints: dict) -> str:
    return (",".join(hints.get("divisible_by_16", [])) or "-") + " | " + (",".join(hints.get("equal_to_1", [])) or "-")


def format_summary(summary: list[dict]) -> str:
    lines = [f"{'kernel':<28} {'dir':<4} {'configs':>7} {'kept':>5} {'kept&fit':>8}  best kept config "
             "(regs / spill B / smem KB / matrix units)   kept configs' units   max compile s"]
    for s in summary:
        b = s["best"]
        best = "refused (below)" if s.get("refused") else "none fits" if b is None else (
            " ".join(f"{k}={v}" for k, v in b["config"].items())
            + f"  ({b['registers']} / {b['spill_bytes']} / {b['shared_bytes'] / 1024:.1f} / "
              f"{mma_text(b['mma'])})")
        lines.append(f"{s['kernel']:<28} {s['direction']:<4} {s['configs']:>7} {s['kept']:>5} {s['kept_fit']:>8}  "
                     f"{best}   {','.join(s.get('mma_kept', [])) or '-'}   {s['max_compile_s']:.1f}")
    return "\n".join(lines)
