"""What an emitted module's `apply` would run for given head sizes, dtype and device, without running it: its
`launch_plan` (a runtime piece: its body is copied into every emitted module by mirasc.codegen.standalone;
docs/module-api.md, "launch_plan"). The spec-dependent parts come in as the module's hooks: `route` (which backend
and algorithm, and why backend='auto' leaves the Triton kernels out), `kernels` (each kernel's configurations at
these sizes), `precision` (how the dots multiply) and `widths` (the widths the memory itself reads)."""

import torch

from .gpu_limits import _GPUTarget


def _plan_device(device):
    """A torch device, or a _GPUTarget for a compute capability named "sm_XY" (no GPU needed)."""
    if isinstance(device, str) and device.startswith("sm_"):
        return _GPUTarget(device)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be a torch device or a GPU target such as 'sm_90', not {device!r}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} is not available here; name a GPU by its compute capability (such as "
                         "'sm_90') to plan for one")
    return device


def _auto_reason(triton, device, algorithm="auto"):
    """Why backend='auto' leaves the Triton kernels out whatever the sizes, or None (then the sizes decide, where they
    do): they need triton (the module, or None where it is not importable), CUDA inputs, and the chunked algorithm
    (the nonparametric memories' flash kernels take either)."""
    if triton is None:
        return "backend='auto' takes the Triton kernels where triton is importable; it is not importable here"
    if device.type != "cuda":
        return f"backend='auto' takes the Triton kernels for CUDA inputs (these are on {device.type})"
    if algorithm == "recurrent":
        return "algorithm='recurrent': backend='auto' runs torch (backend='triton' runs the fused recurrent kernel)"
    return None


def _config_dict(config):
    """A triton.Config (or a dict of launch arguments) as a plain dict: its meta-parameters, then num_warps,
    num_stages and maxnreg where set."""
    if isinstance(config, dict):
        return dict(config)
    out = dict(config.kwargs)
    out.update(num_warps=config.num_warps, num_stages=config.num_stages)
    if getattr(config, "maxnreg", None):
        out["maxnreg"] = config.maxnreg
    return out


def _plan(route, kernels, precision, widths, d_k, d_v, dtype, device, backend, algorithm, chunk_size):
    """The launch plan of a call with heads of d_k x d_v and `dtype` inputs on `device`, from the module's hooks:
    widths(d_k, d_v) -> the widths the memory reads (a feature map's, the normaliser's row); route(Dk, Dv, dtype,
    device, backend, algorithm, chunk_size) -> (backend, chunked, chunk, why), decided as the call decides (and
    raising what it raises); precision(dtype) -> how the Triton dots multiply; kernels(Dk, Dv, prec, device,
    chunked, chunk) -> {kernel name: its configurations} on a GPU (raising where one has none)."""
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float16, torch.bfloat16, torch.float32,
                                                          torch.float64):
        raise ValueError(f"dtype must be torch.float16, bfloat16, float32 or float64, not {dtype!r}")
    for name, size in (("d_k", d_k), ("d_v", d_v)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be an int >= 1, not {size!r}")
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', not {backend!r}")
    if algorithm not in ("auto", "recurrent", "chunked"):
        raise ValueError(f"algorithm must be 'auto', 'recurrent' or 'chunked', not {algorithm!r}")
    device = _plan_device(device)
    Dk, Dv = widths(d_k, d_v)
    backend, chunked, chunk, why = route(Dk, Dv, dtype, device, backend, algorithm, chunk_size)
    plan = {"backend": backend, "algorithm": "chunked" if chunked else "recurrent", "chunk": chunk if chunked else None,
            "precision": None, "kernels": {}, "reason": why}
    if backend == "triton":
        plan["precision"] = precision(dtype)
        if device.type == "cuda":
            plan["kernels"] = {name: [_config_dict(c) for c in configs]
                               for name, configs in kernels(Dk, Dv, plan["precision"], device, chunked, chunk).items()}
    return plan
