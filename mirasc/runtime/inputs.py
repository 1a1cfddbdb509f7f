"""The checks at `apply`'s door that every memory module shares, parametric or not: tensors where tensors belong,
floating-point dtypes, the gates and key inputs by name and shape, a Triton backend with somewhere to run,
packed-sequence offsets (a runtime piece: its body is
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


def _gate_list(names, channels):
    """The gates an op takes, in words: "eta [B, T, H], alpha [B, T, H, Dk]" (channels: name -> side)."""
    return ", ".join(f"{n} {'[B, T, H]' if n not in channels else f'[B, T, H, D{channels[n]}]'}" for n in names) \
        or "no gates"


def _check_gates(gates, like, d_v, names, channels):
    """Every gate in `names` present, none other, each [B, T, H] ([B, T, H, Dk] or [B, T, H, Dv] channel-wise).
    like: q [B, T, H, Dk]; d_v: the value width (gates over v channels); channels: name -> "k" or "v" for the
    channel-wise gates."""
    B, T, H = like.shape[0], like.shape[1], like.shape[2]
    gates = gates or {}
    unknown = sorted(set(gates) - set(names))
    if unknown:
        raise ValueError(f"unknown gate(s) {unknown}; this op takes {_gate_list(names, channels)}")
    for name in names:
        side = channels.get(name)
        want = (B, T, H) if side is None else (B, T, H, like.shape[3] if side == "k" else d_v)
        shape = "[B, T, H]" if side is None else f"[B, T, H, D{side}]"
        if name not in gates:
            raise ValueError(f"missing gate {name!r}; this op takes {_gate_list(names, channels)}")
        if tuple(gates[name].shape) != want:
            raise ValueError(f"gate {name!r} has shape {tuple(gates[name].shape)}, expected {shape} = {list(want)}")


def _checked_gates(gates, like, d_v, names, channels):
    """The gates, checked (`_check_gates`), as [B, H, T] ([B, H, T, D] channel-wise) in the compute dtype (float32
    for fp16/bf16 inputs, never rounded to 16 bits: docs/semantics.md "Numerics", a decay near 1 would move in
    steps of 2^-8 in bf16)."""
    _check_gates(gates, like, d_v, names, channels)
    dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
    return {name: gates[name].to(dtype).transpose(1, 2) for name in names}  # [B, H, T] or [B, H, T, D]


def _extra_inputs(extras, like, names):
    """The op's key inputs besides q, k (`names`: EXTRAS), checked, as [B, H, T, Dk]. like: q [B, T, H, Dk]."""
    extras = dict(extras or {})
    unknown = sorted(set(extras) - set(names))
    if unknown:
        raise ValueError(f"unknown extra input(s) {unknown}; this op takes "
                         f"{', '.join(f'{n} [B, T, H, Dk]' for n in names) or 'none'}")
    out = {}
    for name in names:
        if name not in extras:
            raise ValueError(f"missing extra input {name!r} [B, T, H, Dk]: pass it in apply(..., extras=...)")
        x = extras[name]
        if tuple(x.shape) != tuple(like.shape):
            raise ValueError(f"extra input {name!r} has shape {tuple(x.shape)}, expected [B, T, H, Dk] = "
                             f"{list(like.shape)}")
        out[name] = x.to(like.dtype).transpose(1, 2)
    return out
