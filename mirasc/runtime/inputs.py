"""The checks at `apply`'s door that every memory module shares, parametric or not: tensors where tensors belong,
floating-point dtypes, a Triton backend with somewhere to run, packed-sequence offsets (a runtime piece: its body is
copied into every emitted module by mirasc.codegen; docs/module-api.md, `apply`)."""

import torch


def _check_types(q, k, v, gates, extras=None):
    """Tensors where tensors belong, and dicts of them for gates and extras (a TypeError naming the argument)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, not {type(x).__name__}")
    for arg, group in (("gates", gates), ("extras", extras)):
        if group is None:
            continue
        if not isinstance(group, dict):
            raise TypeError(f"{arg} must be a dict of name -> tensor, not {type(group).__name__}")
        for name, x in group.items():
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{arg}[{name!r}] must be a tensor of per-token values, not {type(x).__name__} (a "
                                "coefficient constant over tokens is written in the spec, e.g. `lr = 0.5`)")


def _check_dtypes(q, k, v, gates=None, extras=None):
    """q, k, v, the gates and the extras must be floating-point tensors (docs/module-api.md, "apply"): the torch
    backend computes float32 and float64 in their own dtype, bf16 and fp16 in float32."""
    named = [("q", q), ("k", k), ("v", v)]
    named += [(f"gate {n!r}", g) for n, g in (gates.items() if isinstance(gates, dict) else ())]
    named += [(f"extra input {n!r}", x) for n, x in (extras.items() if isinstance(extras, dict) else ())]
    for name, x in named:
        if torch.is_tensor(x) and not x.is_floating_point():
            raise TypeError(f"apply: {name} has dtype {x.dtype}; the memory takes floating-point tensors (float32 or "
                            "float64; bf16 and fp16 are computed in float32)")


def _check_triton_device(x, triton):
    """backend='triton' launches Triton kernels: they need triton (the module, or None where it is not importable),
    and CUDA tensors or Triton's CPU interpreter. Checked when called eagerly (a graph torch.compile traces holds no
    such Python check)."""
    if torch.compiler.is_compiling():
        return
    if triton is None:
        raise RuntimeError("backend='triton' needs the triton package, which is not importable here; use "
                           "backend='torch'")
    knobs = getattr(triton, "knobs", None)  # (a Triton without knobs is not checked here)
    interpreting = getattr(getattr(knobs, "runtime", None), "interpret", knobs is None)
    if not x.is_cuda and not interpreting:
        raise RuntimeError(f"backend='triton' runs its kernels on CUDA tensors and these are on {x.device.type}; "
                           "use backend='torch', move the inputs to a GPU, or set TRITON_INTERPRET=1 before triton "
                           "is imported to run the kernels in Triton's CPU interpreter")


def _offsets(q, cu_seqlens):
    """The checked offsets of sequences packed along time (B = 1), as flash-linear-attention packs them."""
    bounds = [int(x) for x in cu_seqlens]
    if q.shape[0] != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 (sequences packed along time), got {q.shape[0]}")
    if bounds[0] != 0 or bounds[-1] != q.shape[1] or any(a > b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to T = {q.shape[1]}, got {bounds}")
    return bounds
