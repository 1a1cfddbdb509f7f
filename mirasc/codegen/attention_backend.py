"""Emitter for nonparametric memories (docs/semantics.md, nonparametric memories): the Nadaraya–Watson read with the
softmax, additive (Bahdanau) or polynomial kernel; windows, cross-attention, MemN2N hops with weight
tying and temporal encoding, Multi-Token Attention; a flash-style Triton kernel where it applies."""

from __future__ import annotations

from ..derive import Derivation
from ..explain import equations
from ..language import spec as S
from ..plan import Plan
from .slots import TEMPLATES, fill_lines
from .standalone import kernels_source, quoted, runtime_constants, runtime_doc, runtime_functions, runtime_source
from .torch_backend import layer_source, per_head_source
from .triton_backend import op_id

TEMPLATE = (TEMPLATES / "attention_module.py.tmpl").read_text()
TRITON = (TEMPLATES / "attention_triton.py.tmpl").read_text()
STICKBREAKING = (TEMPLATES / "stickbreaking_triton.py.tmpl").read_text()
# the host functions of the Triton reads, by their module under mirasc/runtime/ (copied in this order)
SHARED_HOST = ("_attention_backend", "_triton_apply", "_flash_interpreted", "_dot_options", "_packed_offsets",
               "_flash_delta", "_flash_rows")
FLASH_HOST = ("_TUNED", "_autotuned", "_flash_kernel", "_flash_launch_configs", "_ATTENTION_AUTOTUNE",
              "_triton_kernels", "_head_tiles", "_strides", "_rows_last", "_like_rows", "_flash_forward",
              "_flash_backward", "_register_ops", "_FLASH_OP", "_flash_attention", "_triton_read")
STICKBREAKING_HOST = ("_SB_KERNELS", "_sb_config", "_sb_space", "_STICKBREAKING_AUTOTUNE", "_triton_kernels",
                      "_sb_launch_options", "_sb_forward", "_sb_backward", "_register_ops", "_SB_OP",
                      "_stickbreaking_attention", "_with_remainder", "_triton_read")
# the op (mirasc/runtime/attention_api.py), and where the memory has no Triton kernel, its refusals
API = ("apply", "_route", "_precision", "_widths", "launch_plan")
NO_TRITON = ("_attention_backend", "_triton_apply", "_triton_kernels")


def _decay(r) -> str:
    """The forget gate on stored pairs: None (no decay), 'gate' (the per-token input alpha), 'per_head' (a constant
    per head, from _per_head_coefficients) or a constant α."""
    if r.kind != "decay":
        return "None"
    if isinstance(r.alpha, S.PerHead):
        return repr("per_head")
    return repr(r.alpha) if r.alpha in S.GATE_FORMS else repr(float(r.alpha))


def emit(spec: S.Spec, d: Derivation, the_plan: Plan) -> tuple[str, Plan]:
    m = spec.memory
    has_triton, reason = the_plan.triton, the_plan.no_triton
    eqs = "\n".join("    " + line for line in equations(spec, d))
    spec_text = "\n".join("    " + line for line in spec.canonical().splitlines())
    flash = ("flash-style kernels (key tiles newest first, the stick carried per row)" if m.kernel == "stickbreaking"
             else "a flash-style kernel (online softmax, tiled)")
    triton_line = (f"backend='triton' = {flash}, forward and backward" if has_triton
                   else f"no Triton kernel: {reason}")
    read = ("the stick-breaking read (Tan et al. 2024)" if m.kernel == "stickbreaking"
            else "Miras: the l2 bias solved by Nadaraya–Watson")
    doc = (f'"""mirasc-generated memory `{spec.name}` — standalone: imports only torch (and triton if present).\n\n'
           f"Spec:\n\n{spec_text}\n\nNonparametric memory ({read}):\n\n{eqs}\n\n"
           "Algorithms: recurrent = one query at a time over the growing cache (reference); chunked = blocks of\n"
           f"queries against the whole cache (scores bounded to block x T); {triton_line}.\n"
           '"""\n')
    header = {  # (what each means: mirasc.runtime.attention_spec; None: the same in every module)
        "SPEC": f'"""\\\n{spec.canonical()}"""', "GATES": repr(spec.gates), "EXTRAS": None, "GATE_CHANNELS": None,
        "WEIGHTS": None, "CONSTANTS": None, "CHUNKED": None, "DEFAULT_CHUNK": None, "KERNEL": repr(m.kernel),
        "SCALE": "None" if m.scale is None else repr(float(m.scale)), "DEGREE": str(m.degree),
        "WINDOW": str(m.window), "CAUSAL": repr(m.causal), "HOPS": str(m.hops), "TYING": repr(m.tying),
        "TEMPORAL": str(m.temporal), "SCORE_CONV": repr(m.score_conv), "HEAD_MIX": str(m.head_mix),
        "HEAD_NORM": repr(m.head_norm), "REMAINDER": repr(m.remainder), "ATTEND_CURRENT": repr(m.attend_current),
        "NO_TRITON_REASON": "None" if has_triton else repr(reason), "SINK": repr(m.sink),
        "DECAY": _decay(spec.retention)}
    subs = {
        "PER_HEAD": per_head_source(spec, none=True),
        "NONPARAMETRIC": runtime_source("nonparametric"),
        "INPUTS": runtime_source("inputs"), "LAUNCH_PLAN": runtime_source("launch_plan"),
        "ATTENTION_API": runtime_functions("attention_api", list(API) + ([] if has_triton else list(NO_TRITON))),
        "OP_ID_CONSTANT": "\n".join(runtime_constants("attention_spec", {
            "OP_ID": quoted(op_id(spec))})),
        "GPU_LIMITS": runtime_source("gpu_limits"), "CUSTOM_OPS": runtime_source("custom_ops"),
        "FLASH_SPACE": runtime_source("flash_space"),
        # the kernels (mirasc/runtime/kernels/): what flash and stick-breaking share, then the read's own
        "ATTENTION_KERNELS": kernels_source("attention") + ("\n" + kernels_source("flash") if m.kernel == "softmax"
                                                            else ""),
        "STICKBREAKING_KERNELS": kernels_source("stickbreaking"),
        # the host side (mirasc/runtime/): the helpers both reads share, then the read's own
        "ATTENTION_HOST": runtime_functions("attention_host", list(SHARED_HOST) + (
            list(FLASH_HOST) if m.kernel == "softmax" else [])),
        "STICKBREAKING_HOST": runtime_functions("stickbreaking_host", list(STICKBREAKING_HOST)),
    }
    body = fill_lines(TEMPLATE, {"HEADER": runtime_constants("attention_spec", header)})
    if has_triton:
        softmax = m.kernel == "softmax"
        body += fill_lines(TRITON, {"READ_NOTE": runtime_doc("kernels/flash" if softmax else "kernels/stickbreaking"),
                                    "FLASH_SPACE": subs.pop("FLASH_SPACE").split("\n") + ["", ""] if softmax else []})
        if m.kernel == "stickbreaking":
            body += STICKBREAKING
    for key, val in subs.items():
        body = body.replace("{{" + key + "}}", val)
    return doc + "\n" + body + layer_source(spec, d), the_plan
