"""The launch plan of one forward and one backward, mirasc against flash-linear-attention, modelled on an H100.

    python benchmarks/launch_plan.py [--cases gdn gla kda attn] [--only mirasc|fla] [--seq-len T] [--out DIR] [--md]

No GPU needed. A case is a pair called as benchmarks/gpu_suite.py calls it (B=8, T=4096, H=16, D=128, bf16 inputs, loss
o.float().sum()): gdn = gated_deltanet vs FLA chunk_gated_delta_rule, gla vs chunk_gla, kda vs chunk_kda, attn =
transformer vs parallel_attn. Every Triton launch and every torch op between launches is listed with FLOPs, bytes and
a roofline time, from two passes per side, each a process of this script:
  compile  each launch is intercepted (nothing runs) and compiled for sm_90 by mirasc/lab/kernel_report.py in the
           configuration a GPU autotuner is taken to pick from the kernel's space (mirasc's *_AUTOTUNE tables, FLA's
           autotune configs): largest tile volume, then 4 warps, then 2 stages, the first that compiles, fits 227 KB
           of shared memory and does not spill, else the least spill; registers, spill, shared memory and the SASS's
           tensor-core kind are kept. FLA runs on a faked H100 (torch.cuda and Triton's driver say sm_90).
  count    the same call under TRITON_INTERPRET=1 in those configurations: per launch tl.dot FLOPs by operand type
           (bf16 products as a GPU compiles them), the distinct bytes each tensor argument touches (compulsory HBM
           traffic) and all load/store traffic; every torch op (bytes in + out, matmul FLOPs; views, allocations free).
Traced at B=1, H=2, scaled by B·H; T traced whole (--seq-len T: traced and reported at T). A launch takes max(FLOPs /
peak of the unit its SASS shows: BF16 HGMMA/HMMA 989 TF/s, TF32 495, none = FP32 FMA 67; compulsory bytes / 3.35 TB/s;
2 µs), a torch op max(bytes / 3.35 TB/s, matmul FLOPs / peak, 2 µs): H100 SXM peaks; "with the L2 bound" adds each
launch's traffic / 7 TB/s. A MODEL of a lower bound, not a measurement. Each pass writes DIR/SIDE_CASE.PASS.json (and
.log) and is skipped when that file exists (a run resumes; tables re-print). At T=4096 a pass takes up to about
seven minutes on one core (the count pass interprets every program); the four pairs about half an hour.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]  # this checkout's mirasc; gpu_suite's inputs
SPECS = {"gdn": "gated_deltanet", "gla": "gla", "kda": "kda", "attn": "transformer"}
FLA_OPS = {"gdn": "chunk_gated_delta_rule", "gla": "chunk_gla", "kda": "chunk_kda", "attn": "parallel_attn"}
FULL_B, FULL_H, FULL_T, HEAD_DIM, TRACE_B, TRACE_H = 8, 16, 4096, 128, 1, 2
SMEM = 232448  # shared memory per block an sm_90 kernel may opt into (bytes)
PEAK = {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12}  # H100 SXM dense FLOP/s by unit
HBM_BW, L2_BW, FLOOR = 3.35e12, 7e12, 2e-6
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "ir_override")  # launch options, not arguments
FREE_OPS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "lift_fresh", "alias",
            "_unsafe_view", "view", "as_strided", "set_", "resize_", "_local_scalar_dense", "is_same_size"}
WRITE_ONLY_OPS = {"zero_", "fill_", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros",
                  "new_ones", "new_full", "arange", "scalar_tensor"}


def build(side, case, B, T, H, D, patch=setattr):
    """(forward callable returning the output, the mirasc module or None) for one side of a case, on inputs made as
    benchmarks/gpu_suite.py makes them (q, k L2-normalised bf16; fp32 gates, a key-channel decay for gla and kda).
    The mirasc module is the process's one module of its spec: its settings are changed through `patch`, which
    trace() undoes."""
    from gpu_suite import make_inputs

    gates = {"gdn": ("eta", "alpha"), "kda": ("eta",)}.get(case, ())
    q, k, v, gs = make_inputs(B, T, H, D, torch.bfloat16, "cpu", gates)
    if case in ("gla", "kda"):
        g = torch.Generator().manual_seed(2)
        gs["alpha"] = (0.9 + 0.1 * torch.rand(B, T, H, D, generator=g)).requires_grad_()
    if side == "mirasc":
        import mirasc

        m = mirasc.compile_spec(str(ROOT / "specs" / f"{SPECS[case]}.miras"))
        if hasattr(m, "_check_triton_device"):  # the compile pass runs no kernel on its CPU tensors
            patch(m, "_check_triton_device", lambda *args: None)
        if hasattr(m, "_launch_prec"):  # count the bf16 products as a GPU launch compiles them (not widened)
            patch(m, "_launch_prec", lambda prec: prec)
        if hasattr(m, "FIT_SMEM_LIMIT"):  # refuse and fit as on an sm_90 GPU
            patch(m, "FIT_SMEM_LIMIT", SMEM)
        if case == "attn":
            return (lambda: m.apply(q, k, v, backend="triton")[0]), m
        return (lambda: m.apply(q, k, v, gs, backend="triton", algorithm="chunked")[0]), m
    import fla.ops as fops
    from fla.ops.attn import parallel_attn

    a, dt = gs.get("alpha"), q.dtype
    calls = {"gdn": lambda: fops.chunk_gated_delta_rule(q, k, v, g=a.log(), beta=gs["eta"], scale=1.0)[0],
             "gla": lambda: fops.chunk_gla(q, k, v, g=a.log().to(dt), scale=1.0)[0],
             "kda": lambda: fops.chunk_kda(q, k, v, g=a.log().to(dt), beta=gs["eta"].to(dt), scale=1.0)[0],
             "attn": lambda: parallel_attn(q, k, v, scale=D ** -0.5)}
    return calls[case], None


def fake_h100():
    """Make FLA (imported after this) see one H100: torch.cuda's capability and properties, Triton's active driver
    and FLA's shared-memory check (asked with a CPU tensor's device index, None) all say sm_90 with 227 KB."""
    from collections import defaultdict

    import triton
    from triton.backends.compiler import GPUTarget

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                            shared_memory_per_block_optin=SMEM, shared_memory_per_block=49152, total_memory=80 << 30)
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: props.name
    torch.cuda.get_device_properties = lambda *a, **k: props
    torch.cuda.device_count, torch.cuda.current_device = (lambda: 1), (lambda: 0)
    dev = {"max_shared_mem": SMEM, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}
    triton.runtime.driver.set_active(SimpleNamespace(
        utils=SimpleNamespace(get_device_properties=lambda i=0: dev), is_active=lambda: True,
        get_current_target=lambda: GPUTarget("cuda", 90, 32), get_current_device=lambda: 0,
        get_active_torch_device=lambda: torch.device("cpu")))
    import fla.utils.hardware as hw

    hw.get_all_max_shared_mem = lambda: defaultdict(lambda: SMEM)
    hw.check_shared_mem.cache_clear()


def choose(configs, compile_one):
    """(config, compile row) by the fixed rule: in the order largest tile volume (product of the integer B*/T*
    constexprs), then 4 warps, then 2 stages, the first that compiles, fits and does not spill, else the fitting one
    with the least spill, else the first."""
    def order(c):
        volume = math.prod(v for k, v in c.kwargs.items() if k[:1] in "BT" and type(v) is int)
        return -volume, abs(math.log2(c.num_warps / 4)), abs((c.num_stages or 1) - 2)
    configs, rows = sorted(configs, key=order), []
    for c in configs:
        rows.append(compile_one(c))
        if rows[-1]["ok"] and rows[-1]["fits"] and rows[-1]["spill"] <= 0:
            return c, rows[-1]
    fitting = [i for i, r in enumerate(rows) if r["ok"] and r["fits"]]
    i = min(fitting, key=lambda j: rows[j]["spill"]) if fitting else 0
    return configs[i], rows[i]


def compile_row(tr, fn, bound, options):
    """Registers, spill, shared memory and tensor-core kinds of one launch compiled for sm_90 (cached)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    from mirasc.lab import kernel_report as kr

    sig, const, attrs, _ = kr._signature(fn, bound, make_backend(GPUTarget("cuda", 90, 32)))
    key = repr((fn.fn.__name__, sorted(sig.items()), sorted(const.items(), key=str), sorted(attrs.items()),
                sorted(options.items())))
    if key not in tr.compiled:
        try:
            k = kr.compile_launch(fn, bound, "sm_90", options, _specialized=(sig, const, attrs))
            regs, spill = kr._cubin_resources(k.asm["cubin"])
            tr.compiled[key] = {"ok": True, "regs": regs, "spill": spill, "smem": int(k.metadata.shared),
                                "fits": int(k.metadata.shared) <= SMEM, "mma": kr._sass_mma_kinds(k.asm["cubin"])}
        except Exception as err:  # a compile error or out of resources: the next configuration is tried
            tr.compiled[key] = {"ok": False, "fits": False, "spill": -1, "error": str(err).strip()[:200]}
    return tr.compiled[key]


def record(tr, name, grid, bound, **fields):
    """Append one launch (its grid as three integers) to the trace and print a progress line."""
    g = [int(x) for x in (grid(bound) if callable(grid) else grid)]
    tr.launches.append({"name": name, "phase": tr.phase, "grid": g + [1] * (3 - len(g)), **fields})
    print(f"[{len(tr.launches) - 1}] {tr.phase} {name} grid={tr.launches[-1]['grid']}", flush=True)


def compile_hooks(tr):
    """(JITFunction.run, Autotuner.run) of the compile pass: compile the chosen configuration, launch nothing."""
    def jit_run(self, *args, grid=None, warmup=False, **kwargs):
        opts = {k: kwargs.pop(k) for k in list(kwargs) if k in OPTIONS}
        opts.pop("ir_override", None)
        bound = {**{p.name: p.default for p in self.params if p.has_default},
                 **dict(zip([p.name for p in self.params], args)), **kwargs}
        if tr.probe:  # FLA's autotuner asks how one of its configurations compiles
            return compile_row(tr, self, bound, opts)
        if self.fn.__name__ in tr.tables:  # mirasc: the GPU's autotuning space (the CPU launch carries small tiles)
            cfg, row = choose(tr.tables[self.fn.__name__](bound, SMEM), lambda c: compile_row(
                tr, self, {**bound, **c.kwargs}, {"num_warps": c.num_warps, "num_stages": c.num_stages}))
            bound, config = {**bound, **cfg.kwargs}, {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps,
                                                      "num_stages": cfg.num_stages}
        else:
            row = compile_row(tr, self, bound, opts)
            config = {"kwargs": tr.pending or {}, "num_warps": opts.get("num_warps", 4),
                      "num_stages": opts.get("num_stages", 3)}
        record(tr, self.fn.__name__, grid, bound, config=config, **{k: v for k, v in row.items() if k != "fits"})

    def autotuner_run(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        configs = self.prune_configs(kwargs) if len(self.configs) > 1 else self.configs

        def probe(c):
            tr.probe = True
            try:
                return self.fn.run(*args, **kwargs, **c.all_kwargs())
            finally:
                tr.probe = False
        cfg, _ = choose(configs, probe)
        tr.pending = dict(cfg.kwargs)
        try:
            return self.fn.run(*args, **kwargs, **cfg.all_kwargs())
        finally:
            tr.pending, self.nargs = None, None

    return jit_run, autotuner_run


def count_hooks(tr, orig_run):
    """(InterpretedFunction.run, Autotuner.run) of the count pass: run each kernel under the interpreter in the
    chosen configuration while the builder hooks count its dots and memory accesses."""
    def jit_run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return None
        chosen = tr.chosen.get(len(tr.launches))
        if chosen and self.fn.__name__ in tr.tables:
            kwargs.update(chosen["kwargs"])
        kwargs = {k: v for k, v in kwargs.items() if k not in OPTIONS}
        if kwargs.get("WIDEN_"):  # mirasc's flash kernels widen bf16 products under the interpreter only
            kwargs["WIDEN_"] = False
        params = inspect.signature(self.fn).parameters.values()
        bound = {**{p.name: p.default for p in params if p.default is not p.empty},
                 **dict(zip([p.name for p in params], args)), **kwargs}
        tensors = {n: t for n, t in bound.items() if isinstance(t, torch.Tensor) and t.numel()}
        tr.counter = {"dots": {}, "mem": {}, "args": [  # (name, first address, end of the last element)
            (n, t.data_ptr(), t.data_ptr() + (1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())))
             * t.element_size()) for n, t in tensors.items()]}
        tr.depth += 1
        try:
            orig_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            tr.depth -= 1
            c, tr.counter = tr.counter, None
        record(tr, self.fn.__name__, grid, bound, dots=c["dots"], mem={
            n: {"read_unique": int(r.sum()) * s, "write_unique": int(w.sum()) * s, "read_traffic": rt,
                "write_traffic": wt} for n, (r, w, rt, wt, s) in c["mem"].items()})

    def autotuner_run(self, *args, **kwargs):
        chosen = tr.chosen.get(len(tr.launches)) or {"kwargs": self.configs[0].kwargs}
        return self.fn.run(*args, **kwargs, **chosen["kwargs"])

    return jit_run, autotuner_run


def builder_hooks(tr, builder):
    """The interpreter builder's masked load, masked store and dot, counting for the launch being run."""
    load, store, dot = builder.create_masked_load, builder.create_masked_store, builder.create_dot

    def touch(ptrs, mask, size, write):
        if tr.counter is None:
            return
        sel = (ptrs[np.broadcast_to(mask, ptrs.shape)] if mask is not None else ptrs.ravel()).astype(np.int64)
        for name, lo, hi in tr.counter["args"]:
            if sel.size and lo <= sel.flat[0] < hi:  # the argument the first address falls in
                n = (hi - lo) // size + 1
                m = tr.counter["mem"].setdefault(name, [np.zeros(n, bool), np.zeros(n, bool), 0, 0, size])
                idx = (sel - lo) // size
                m[write][idx[(idx >= 0) & (idx < n)]] = True
                m[2 + write] += sel.size * size
                return

    def counted_load(self, ptrs, mask, other, cache_policy, is_volatile):
        touch(ptrs.data, None if mask is None else mask.data, ptrs.get_element_ty().primitive_bitwidth // 8, 0)
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    def counted_store(self, ptrs, value, mask, cache_policy):
        touch(ptrs.data, None if mask is None else mask.data, value.data.dtype.itemsize, 1)
        return store(self, ptrs, value, mask, cache_policy)

    def counted_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tr.counter is not None:
            key = f"{a.dtype.scalar}x{b.dtype.scalar}:{str(input_precision).split('.')[-1].lower()}"
            sa, sb = a.data.shape, b.data.shape
            tr.counter["dots"][key] = tr.counter["dots"].get(key, 0) + 2 * math.prod(sa) * sb[-1]
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    return {"create_masked_load": counted_load, "create_masked_store": counted_store, "create_dot": counted_dot}


def torch_mode(tr):
    """A TorchDispatchMode recording every torch op outside the kernels (mirasc's custom ops are entered, so the ops
    of their bodies are seen): bytes read and written, matmul and triangular-solve FLOPs."""
    from torch._library.custom_ops import OPDEFS
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs, name = kwargs or {}, func._schema.name
            if func.namespace not in ("aten", "prim", "prims") and name in OPDEFS and not tr.depth:
                with self:
                    return OPDEFS[name]._init_fn(*args, **kwargs)
            out, op = func(*args, **kwargs), name.split("::")[-1]
            ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if tr.depth or op in FREE_OPS or (getattr(func, "is_view", False) and {
                    t.untyped_storage().data_ptr() for t in outs} <= {t.untyped_storage().data_ptr() for t in ins}):
                return out  # inside a kernel launch, an allocation, or a view of its input's storage
            ins = ins[1:2] if op == "copy_" else ins[:1] if getattr(func, "is_view", False) else ins
            flops = 0
            if op in ("mm", "bmm", "addmm", "baddbmm"):
                flops = 2 * math.prod(ins[-2].shape) * ins[-1].shape[-1]
            elif op == "linalg_solve_triangular":
                flops = math.prod(ins[1].shape) * ins[0].shape[-1]
            unique = {(t.data_ptr(), tuple(t.shape), tuple(t.stride())): t for t in ins}.values()
            tr.ops.append({"phase": tr.phase, "op": op, "slot": len(tr.launches), "flops": flops,
                           "read": 0 if op in WRITE_ONLY_OPS else sum(t.nbytes for t in unique),
                           "write": sum(t.nbytes for t in outs), "dtype": str(ins[0].dtype)[6:] if ins else ""})
            return out

    return Recorder()


def trace(pass_, side, case, *, B=TRACE_B, T=FULL_T, H=TRACE_H, D=HEAD_DIM, out=None, chosen=None):
    """One pass ("compile" or "count") of one side of a case at [B, T, H, D]: its launches and torch ops (also written
    to `out`). `chosen`: the compile pass's launches, whose configurations the count pass forces. The count pass
    needs TRITON_INTERPRET=1 set before triton was imported; the compile pass needs it unset."""
    import triton.runtime.autotuner as autotuner

    if side == "fla":
        os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"  # FLA's own Triton kernels
        fake_h100()
    tr = SimpleNamespace(launches=[], ops=[], phase="fwd", depth=0, tables={}, probe=False, pending=None,
                         counter=None, compiled={}, chosen={i: r["config"] for i, r in enumerate(chosen or [])})
    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    try:
        fwd, module = build(side, case, B, T, H, D, patch)
        if module is not None:
            from mirasc.lab.kernel_report import _autotune_tables
            tr.tables = _autotune_tables(module)
        if pass_ == "compile":
            from triton.runtime.jit import JITFunction
            run, tuned_run = compile_hooks(tr)
            patch(JITFunction, "run", run)
        else:
            import triton.runtime.interpreter as interp
            run, tuned_run = count_hooks(tr, interp.InterpretedFunction.run)
            patch(interp.InterpretedFunction, "run", run)
            for name, fn in builder_hooks(tr, interp.InterpreterBuilder).items():
                patch(interp.InterpreterBuilder, name, fn)
            if side == "fla":  # FLA calls .to() on loop counters, which the interpreter keeps as Python ints
                prepare = interp.FunctionRewriter._prepare_source
                patch(interp.FunctionRewriter, "_prepare_source", lambda self, lines: re.sub(
                    r"(?<![\w.)\]])([A-Za-z_]\w*)\.to\(", r"tl.cast(\1, ", prepare(self, lines)))
        patch(autotuner.Autotuner, "run", tuned_run)
        if side == "fla":
            from fla.ops.utils.cache import CachedAutotuner
            if "run" in vars(CachedAutotuner):
                patch(CachedAutotuner, "run", tuned_run)
        with torch_mode(tr) if pass_ == "count" else contextlib.nullcontext():
            o = fwd()
            tr.phase = "loss"
            loss = o.float().sum()
            tr.phase = "bwd"
            loss.backward()
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
    res = {"side": side, "case": case, "pass": pass_, "B": B, "T": T, "H": H, "D": D, "launches": tr.launches,
           "torch_ops": tr.ops}
    if out:
        Path(out).write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    return res


def model(compiled, counted, scale):
    """Rows of the plan, launches and torch ops in order (loss ops left out), FLOPs and bytes times `scale`: per launch
    the tensor-core kind from the compile pass (None: FMA only) and the dots and bytes from the count pass, FLOPs by
    unit, compulsory HBM bytes, traffic and the modelled seconds t (t_l2 with the L2 bound)."""
    if compiled is not None and [r["name"] for r in compiled["launches"]] != [r["name"] for r in counted["launches"]]:
        raise ValueError(f"{counted['side']} {counted['case']}: the two passes launched different kernels")
    rows = []
    for i, c in enumerate(counted["launches"]):
        k = compiled["launches"][i] if compiled is not None else {}
        units = {"tf32" if m.endswith("TF32") else "bf16" for m in k.get("mma", {})}
        f = {"bf16": 0.0, "tf32": 0.0, "fp32": 0.0}
        for key, n in c["dots"].items():
            types, prec = key.split(":")
            if "fp32" not in types and "fp64" not in types:  # 16-bit operands: tensor cores if the SASS has them
                f["bf16" if units else "fp32"] += n * scale
            elif prec == "ieee" or "tf32" not in units:
                f["fp32"] += n * scale
            else:
                f["tf32"] += n * scale * (3 if prec == "tf32x3" else 1)
        hbm = sum(m["read_unique"] + m["write_unique"] for m in c["mem"].values()) * scale
        traffic = sum(m["read_traffic"] + m["write_traffic"] for m in c["mem"].values()) * scale
        t = max(sum(f[u] / PEAK[u] for u in f), hbm / HBM_BW, FLOOR)
        rows.append({"phase": c["phase"], "kind": "triton", "name": c["name"], "slot": i,
                     "programs": int(math.prod(c["grid"]) * scale), "config": k.get("config"), "regs": k.get("regs"),
                     "spill": k.get("spill"), "smem": k.get("smem"), "tc": "+".join(k.get("mma", {})) or "FMA",
                     "flops": f, "bytes": hbm, "traffic": traffic, "t": t, "t_l2": max(t, traffic / L2_BW)})
    for o in counted["torch_ops"]:
        unit = "bf16" if o["dtype"] in ("bfloat16", "float16") else "fp32"
        fl, by = o["flops"] * scale, (o["read"] + o["write"]) * scale
        t = max(fl / PEAK[unit], by / HBM_BW, FLOOR) if (fl or by) else 0.0
        if o["phase"] != "loss":
            rows.append({"phase": o["phase"], "kind": "torch", "name": o["op"], "slot": o["slot"] - 0.5,
                         "flops": {unit: fl}, "bytes": by, "traffic": by, "t": t, "t_l2": t})
    return sorted(rows, key=lambda r: (r["phase"] != "fwd", r["slot"]))


def totals(rows, phase=None):
    """Seconds (t, t_l2), launches, torch ops that cost time, HBM bytes and FLOPs of one phase (None: both)."""
    sel = [r for r in rows if phase in (None, r["phase"])]
    return {"t": sum(r["t"] for r in sel), "t_l2": sum(r["t_l2"] for r in sel),
            "launches": sum(r["kind"] == "triton" for r in sel), "ops": sum(r["kind"] == "torch" and r["t"] > 0
                                                                            for r in sel),
            "bytes": sum(r["bytes"] for r in sel), "flops": sum(sum(r["flops"].values()) for r in sel)}


def table(header, rows, md):
    """Print rows as a markdown table or as aligned columns."""
    if md:
        print("\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                        + ["| " + " | ".join(r) + " |" for r in rows]))
        return
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    for r in [header, *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())


def print_case(label, rows, md):
    """The per-launch table of one side of a case, then its totals."""
    print(f"\n### {label}  (MODEL, not a measurement: H100 SXM roofline per launch)\n")
    out = []
    for r in rows:
        num = [f"{sum(r['flops'].values()) / 1e9:.1f}", f"{r['bytes'] / 1e6:.1f}", f"{r['traffic'] / 1e6:.1f}",
               f"{r['t'] * 1e6:.1f}"]
        if r["kind"] == "torch" and r["t"] > 0:
            out.append([r["phase"], "torch." + r["name"]] + [""] * 6 + num)
        elif r["kind"] == "triton":
            cfg = r["config"] or {}
            tiles = " " + ",".join(f"{k}={v}" for k, v in cfg.get("kwargs", {}).items())
            out.append([r["phase"], r["name"] + tiles.rstrip(), str(r["programs"]),
                        f"{cfg.get('num_warps', '')}/{cfg.get('num_stages', '')}", str(r["regs"]), str(r["spill"]),
                        f"{(r['smem'] or 0) / 1024:.0f}", r["tc"]] + num)
    table(["phase", "kernel", "programs", "warps/stages", "regs", "spill B", "smem KB", "tensor cores", "GFLOP",
           "HBM MB", "L2 MB", "µs"], out, md)
    for phase in ("fwd", "bwd", None):
        t = totals(rows, phase)
        print(f"{phase or 'fwd+bwd'}: {t['t'] * 1e3:.3f} ms ({t['t_l2'] * 1e3:.3f} with the L2 bound), "
              f"{t['launches']} launches, {t['ops']} torch ops, {t['flops'] / 1e9:.0f} GFLOP, "
              f"HBM {t['bytes'] / 1e9:.2f} GB" + ("  " if md else ""))


def print_summary(summary, cases, T, md):
    """Per pair: fwd and fwd+bwd ms with the ratio mirasc / FLA, launches, torch ops and HBM GB (mirasc / FLA)."""
    print(f"\nSummary (MODEL, not a measurement: H100 SXM roofline, B={FULL_B} T={T} H={FULL_H} D={HEAD_DIM}; "
          "each cell mirasc / FLA)\n")
    rows = []
    for case in cases:
        m, f = summary.get((case, "mirasc")), summary.get((case, "fla"))
        cells = [f"{SPECS[case]} vs {FLA_OPS[case]}"]
        for phase, key, fmt in (("fwd", "t", "{:.3f}"), (None, "t", "{:.3f}"), ("fwd", "launches", "{}"),
                                ("bwd", "launches", "{}"), (None, "ops", "{}"), (None, "bytes", "{:.2f}")):
            unit = {"t": 1e3, "bytes": 1e-9}.get(key, 1)
            cells.append(" / ".join(fmt.format(s[phase][key] * unit) if s else "—" for s in (m, f)))
            if key == "t":
                cells.append(f"{m[phase]['t'] / f[phase]['t']:.2f}" if m and f else "—")
        rows.append(cells)
    table(["pair", "fwd ms", "ratio", "fwd+bwd ms", "ratio", "launches fwd", "launches bwd", "torch ops", "HBM GB"],
          rows, md)


def run_pass(pass_, side, case, T, out_dir):
    """The JSON of one pass, run in a fresh process of this script unless its file exists (None if it failed)."""
    path = out_dir / f"{side}_{case}.{pass_}.json"
    if not path.exists():
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update({"TRITON_INTERPRET": "1"} if pass_ == "count" else {})
        print(f"{side} {case}: {pass_} pass (log {path.with_suffix('.log')})", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--pass", pass_, "--only", side, "--cases", case, "--seq-len", str(T),
               "--out", str(out_dir)]
        with open(path.with_suffix(".log"), "w") as log:
            if subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode:
                print(f"{side} {case}: the {pass_} pass failed, see {path.with_suffix('.log')}", file=sys.stderr)
                return None
    return json.loads(path.read_text(encoding="utf-8"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(SPECS), help="pairs: " + " ".join(SPECS))
    ap.add_argument("--only", choices=("mirasc", "fla"), help="one side of each pair")
    ap.add_argument("--seq-len", type=int, default=FULL_T, help="tokens per sequence, traced and reported")
    ap.add_argument("--out", help="folder of the passes' JSON (default: a new temporary folder)")
    ap.add_argument("--md", action="store_true", help="markdown tables")
    ap.add_argument("--pass", dest="pass_", choices=("compile", "count"), help=argparse.SUPPRESS)  # a pass's process
    a = ap.parse_args(argv)
    unknown = [c for c in a.cases if c not in SPECS]
    if unknown or a.seq_len <= 0 or a.seq_len % 64:
        print(f"launch_plan: unknown case {unknown[0]!r} (known: {' '.join(SPECS)})" if unknown else
              f"launch_plan: --seq-len must be a positive multiple of 64, not {a.seq_len}", file=sys.stderr)
        return 2
    out_dir = Path(a.out or tempfile.mkdtemp(prefix="launch-plan-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    if a.pass_:  # the process of one pass (run_pass)
        compiled = out_dir / f"{a.only}_{a.cases[0]}.compile.json"
        trace(a.pass_, a.only, a.cases[0], T=a.seq_len, out=out_dir / f"{a.only}_{a.cases[0]}.{a.pass_}.json",
              chosen=json.loads(compiled.read_text())["launches"] if a.pass_ == "count" else None)
        return 0
    sides = [a.only] if a.only else ["mirasc", "fla"]
    if "fla" in sides and importlib.util.find_spec("fla") is None:
        print("launch_plan: flash-linear-attention (fla) is not importable" + ("" if a.only else
              ": the mirasc side only"), file=sys.stderr)
        if a.only:
            return 2
        sides = ["mirasc"]
    print(f"launch plan, B={FULL_B} T={a.seq_len} H={FULL_H} D={HEAD_DIM} bf16, passes in {out_dir}", flush=True)
    summary, failed = {}, False
    for case in a.cases:
        for side in sides:
            compiled = run_pass("compile", side, case, a.seq_len, out_dir)
            counted = compiled and run_pass("count", side, case, a.seq_len, out_dir)
            if counted is None:
                failed = True
                continue
            rows = model(compiled, counted, FULL_B * FULL_H / (TRACE_B * TRACE_H))
            print_case(f"mirasc {SPECS[case]}" if side == "mirasc" else f"FLA {FLA_OPS[case]}", rows, a.md)
            summary[case, side] = {p: totals(rows, p) for p in ("fwd", "bwd", None)}
    print_summary(summary, a.cases, a.seq_len, a.md)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
