"""Which path runs a call of a parametric memory's op, and launch_plan (a runtime piece: copied into every emitted
memory module by mirasc.codegen.torch_backend; docs/module-api.md, "launch_plan"). `_route` is the one home of the
decision: the algorithm and its chunk length, then the backend by the module's Triton family, `_family_route`, one of
the functions below (the chunked families, the mini-batch kernels, the fused recurrent kernel alone, or no Triton
kernel): each takes the call's backend and algorithm as _route resolved them and returns (backend, chunked, why):
backend "auto" resolved, whether the chunked algorithm runs, and why backend='auto' leaves the Triton kernels out;
each raises where a path does not exist. Beside each, the kernels launch_plan lists for that family, and how the
Triton dots multiply. The spec's choices are the module's (mirasc.runtime.memory_spec has examples)."""

import torch
import triton

from .chunk_host import _chunk_fit_reason, _chunk_plan
from .launch_plan import _auto_reason, _plan
from .memory_spec import CHUNK_READOUT, CHUNKED, DEFAULT_CHUNK, HALF_DOTS, MINIBATCH, NO_CHUNK_REASON, NO_TRITON_REASON
from .minibatch_host import _mb_plan, _mb_window_error, _mb_window_fits, _minibatch_fit_reason
from .recurrent_host import _recurrent_plan


def _dot_precision(dtype):
    """How this call's Triton dots multiply (docs/semantics.md "Numerics"), by the inputs' dtype and the kernel
    family (HALF_DOTS): fp32/fp64 inputs always exactly ("ieee"); fp16/bf16 inputs with 16-bit operands on the
    tensor cores ("bf16"/"fp16", fp32 accumulation) where the family's kernels take them ("input"), as TF32 when a
    user opts in (HALF_DOTS = "tf32"), fp32 operands as two bf16 parts ("bf16x3") in the MLP memories'
    mini-batch kernels ("split"), 16-bit operands as they are and fp32 ones as two bf16 parts ("bf16x2") under a
    feature map or normaliser ("input_split"), else exactly. On an H200 with Triton 3.6 (2026-12-04,
    benchmarks/RESULTS.md "GPU") the TF32 builds of the per-head chunk kernels hit an out-of-range shared-memory
    access at Dk = 128 (delta rule) or did not finish (Hebbian), and the chunk-readout kernels' dv was off by 0.51
    for Memora at D = 128; the key-channel chunk kernels and the momentum delta scans were within 2.5e-3 of the
    float64 reference, as were every family's exact fp32 builds."""
    if dtype not in (torch.float16, torch.bfloat16) or HALF_DOTS == "ieee":
        return "ieee"
    if HALF_DOTS == "tf32":
        return "tf32"
    if HALF_DOTS == "split":
        return "bf16x3"
    if HALF_DOTS == "input_split":
        return "bf16x2"
    return "bf16" if dtype == torch.bfloat16 else "fp16"


def _chunk_route(Dk, Dv, dtype, device, backend, algorithm, chunked, chunk):
    """The chunked families: on a GPU their Triton kernels are the default where every one of them has a configuration
    that fits the device at these sizes (else torch: a feature map can widen the key beyond what their tiles hold)."""
    why = None
    if backend == "auto":
        why = _auto_reason(triton, device, algorithm) or _chunk_fit_reason(Dk, Dv, chunk, _dot_precision(dtype), device)
        backend = "torch" if why else "triton"
    return backend, chunked, why


def _minibatch_route(Dk, Dv, dtype, device, backend, algorithm, chunked, chunk):
    """The mini-batch kernels: on a GPU the default where their resource model admits the size (every mini-batch C:
    chunks are padded to a tile); an Omega window's C·c-row tile beyond a GPU's is refused (algorithm='chunked') or left
    to the fused recurrent kernel, one window step at a time (algorithm='auto')."""
    why = None
    if backend == "auto":
        why = _auto_reason(triton, device, algorithm) or _minibatch_fit_reason(Dk, Dv)
        backend = "torch" if why else "triton"
    if backend == "triton" and chunked and not _mb_window_fits(chunk, device):
        if algorithm == "chunked":
            raise RuntimeError(_mb_window_error(chunk))
        chunked, why = False, _mb_window_error(chunk)
    return backend, chunked, why


def _recurrent_route(Dk, Dv, dtype, device, backend, algorithm, chunked, chunk):
    """The fused recurrent kernel alone: backend='triton' runs it; backend='auto' runs torch."""
    if backend == "triton" and algorithm == "chunked":
        raise RuntimeError("no chunked Triton kernel for this memory (they exist for linear memories with dot "
                           "or l2 bias, gd/implicit learner, none/decay retention, gates per head or over key "
                           "channels, and for mini-batch memories with none/decay retention, a gd/momentum "
                           "learner and α, θ per head); backend='triton' runs the fused recurrent kernel "
                           "(algorithm='recurrent' or 'auto')")
    if backend == "auto":
        return "torch", chunked, ("backend='auto' takes the Triton kernels where chunk kernels cover the spec; this "
                                  "one has the fused recurrent kernel only, which backend='triton' runs")
    return backend, chunked, None


def _torch_route(Dk, Dv, dtype, device, backend, algorithm, chunked, chunk):
    """No Triton kernel for this spec (NO_TRITON_REASON): torch."""
    if backend == "triton":
        raise RuntimeError(f"no Triton kernel for this spec: {NO_TRITON_REASON}; use backend='torch'")
    if backend == "auto":
        return "torch", chunked, f"no Triton kernel for this spec: {NO_TRITON_REASON}"
    return backend, chunked, None


def _chunk_kernel_plan(Dk, Dv, prec, device, chunked, chunk):
    """launch_plan's kernels of a chunked family: the chunk kernels, or the fused recurrent ones."""
    return _chunk_plan(Dk, Dv, chunk, prec, device) if chunked else _recurrent_plan(Dk, Dv)


def _minibatch_kernel_plan(Dk, Dv, prec, device, chunked, chunk):
    """launch_plan's kernels of the mini-batch family: the mini-batch kernels, or the fused recurrent ones."""
    return _mb_plan(Dk, Dv, chunk, device) if chunked else _recurrent_plan(Dk, Dv)


def _recurrent_kernel_plan(Dk, Dv, prec, device, chunked, chunk):
    """launch_plan's kernels of the fused recurrent path."""
    return _recurrent_plan(Dk, Dv)


_family_route = _chunk_route  # (the module's own names its family's route)
_triton_kernels = _chunk_kernel_plan  # (the module's own names its family's kernels, or None)


def _chunk_length(chunk_size):
    """The tokens per chunk of the chunked algorithm for a `chunk_size` argument; refuses one that is not. Under
    minibatch(C) it is the spec's C, which changes what is computed: no other size is taken."""
    if MINIBATCH is not None:
        if chunk_size not in (None, MINIBATCH):
            raise ValueError(f"chunk_size is the spec's mini-batch size here (minibatch({MINIBATCH})); it "
                             f"changes what is computed, so it cannot be {chunk_size}")
        return MINIBATCH
    chunk = DEFAULT_CHUNK if chunk_size is None else int(chunk_size)
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, not {chunk_size}")
    return chunk


def _route(Dk, Dv, dtype, device, backend, algorithm, chunk_size):
    """The path a call takes with heads of Dk x Dv (the widths the memory reads), `dtype` inputs on `device`:
    (backend, chunked, chunk, why) — backend "auto" resolved, whether the chunked algorithm runs and its tokens per
    chunk, and why backend='auto' leaves the Triton kernels out (None where it takes them, or where the backend is
    given). Raises what the call raises for a path that does not exist. The one home of this decision: apply, packed
    sequences and launch_plan ask it."""
    if algorithm == "chunked" and not CHUNKED:
        raise ValueError(f"no chunked algorithm for this spec: {NO_CHUNK_REASON}; use algorithm='recurrent'")
    chunked = algorithm == "chunked" or (algorithm == "auto" and CHUNKED)
    chunk = _chunk_length(chunk_size) if chunked else None
    backend, chunked, why = _family_route(Dk, Dv, dtype, device, backend, algorithm, chunked, chunk)
    if CHUNK_READOUT and backend == "triton" and not chunked:
        raise RuntimeError("no fused recurrent Triton kernel for readout=chunk (docs/semantics.md: chunk readouts): "
                           "backend='triton' runs the chunk kernels (algorithm='chunked' or 'auto'); "
                           "algorithm='recurrent' is torch's")
    return backend, chunked, chunk, why


def _memory_widths(d_k, d_v):
    """The widths the memory reads for heads of d_k x d_v (launch_plan; a composite memory's are its own)."""
    return d_k, d_v


def launch_plan(d_k, d_v, *, dtype=torch.float32, device="sm_90", backend="auto", algorithm="auto", chunk_size=None):
    """What `apply` would run for heads of d_k x d_v, `dtype` inputs on `device`, without running it
    (docs/module-api.md, "launch_plan"): a torch device, or a GPU named by its compute capability ("sm_80", "sm_90",
    ...; none needed).
    Returns {"backend": "triton" | "torch", "algorithm": "chunked" | "recurrent", "chunk": tokens per chunk (None for
    the recurrent algorithm), "precision": how the Triton dots multiply (None on torch), "kernels": {kernel name:
    the configurations a GPU's autotuner may try at these sizes} (on a GPU), "reason": why backend='auto' leaves the
    Triton kernels out (None where it takes them)}. Raises what apply raises for a path that does not exist, or
    sizes a path's kernels cannot take on that device."""
    return _plan(_route, _triton_kernels, _dot_precision, _memory_widths, d_k, d_v, dtype, device, backend, algorithm,
                 chunk_size)
