"""Which runtime pieces (mirasc/runtime/) a parametric memory's module carries, by template slot: the op and its
state, the route, the torch chunked algorithm of the spec's form with its entry, the variants' own pieces (the Layer's
decoding hooks, a multi-step learner's, a composite memory's, the preconditioner's) and the Triton family's run.
The choices come from the spec, its flags (mirasc.codegen.torch_backend._flags) and the Plan (mirasc/plan.py).
"""

from __future__ import annotations

from ..language import spec as S
from ..plan import Plan
from .standalone import quoted, runtime_constants, runtime_functions, runtime_names, runtime_source

# The Layer's decoding hooks (mirasc.runtime.layer has a plain memory's) and the runtime module of each variant that
# defines some of its own, which that variant's section of the emitted module carries
LAYER_HOOKS = ("_layer_cache", "_layer_read", "_layer_keep")


def layer_variant(spec: S.Spec) -> str | None:
    """The runtime module whose Layer hooks the spec's module carries (None: the plain memory's). The language
    rejects every pair of these variants (mirasc.language.legality), so at most one applies."""
    variants = [name for name, on in (("nonparametric", not spec.parametric), ("multistep", spec.steps > 1),
                                      ("composite", spec.composite), ("precond", spec.precond)) if on]
    if len(variants) > 1:
        raise AssertionError(f"the Layer's hooks of {' and '.join(variants)} in one module (a missing legality rule)")
    return variants[0] if variants else None


def _variant_names(spec: S.Spec) -> set[str]:
    """The names the spec's variant module defines for itself (none for a plain memory): the hooks whose defaults the
    module does not carry."""
    variant = layer_variant(spec)
    return runtime_names(variant) if variant else set()


def default_layer_hooks(spec: S.Spec) -> list[str]:
    """The Layer hooks the spec's module takes from mirasc.runtime.layer (those its variant does not define)."""
    return [h for h in LAYER_HOOKS if h not in _variant_names(spec)]


# The memory's op (mirasc/runtime/memory_api.py), and the run backend='triton' takes with each Triton family
MEMORY_API = ("_packed_per_sequence", "_packed_on_kernels", "_packed_on_chunk_kernels", "_packed_padded_apply",
              "_apply_memory", "apply", "init_state", "init_params", "_initial_state", "_preconditioned")
ONE_LAUNCH = {"_packed_on_kernels", "_packed_on_chunk_kernels", "_packed_padded_apply"}  # (packed sequences: PACKED)
TRITON_RUNS = {"chunk_readout": "_run_chunk_readout", "chunk": "_run_chunk_kernels",
               "minibatch": "_run_minibatch_kernels", "recurrent": "_run_recurrent_kernel"}
RULE = "# " + "-" * 94
# The torch chunked algorithm's sections in file order: the flag that keeps one, its banner (in the spec's decay
# order where it says {order}) and its slots; "dual_form" is the mini-batch form's dual form, which a per-token
# readout does without.
CHUNK_SECTIONS = (
    ("chunk_minibatch", "Chunked algorithm (mini-batch / dual form): every gradient of a chunk is taken at the chunk's "
     "anchor, each\naccumulator a decay-weighted prefix sum of rank-1 terms (_minibatch_chunks, the readout's step).",
     ("CHUNK_MATRICES", "dual_form", "MINIBATCH_CHUNKS")),
    ("omega", None, ("OMEGA_CHUNKS",)),
    ("chunk_muon", "Chunked algorithm for muon (Atlas §5.1): the mini-batch chunks (_minibatch_chunks) with muon's "
     "step\n(_muon_chunk: every momentum of a chunk materialised and orthogonalised at once).", ("MINIBATCH_CHUNKS",)),
    ("chunk_delta", "Chunked algorithm for the delta family (linear memory, l2 bias, decay order {order}): "
     "mirasc.runtime.chunk_forms.", ("CHUNK_FORM",)),
    ("chunk_momentum_delta", "Chunked algorithm for the momentum delta rule (linear memory, l2 bias, momentum, decay "
     "order {order}):\nmirasc.runtime.chunk_forms.", ("CHUNK_FORM",)),
    ("channel_chunks", None, ("CHANNEL_DECAY",)),
    ("channel_minibatch", "Chunked algorithm (mini-batch / dual form) with channel-wise decays, linear memory W [Dv, "
     "Dk]: the mini-batch\nchunks (_minibatch_chunks) with the channel-wise form's step (_channel_chunk, or the chunk "
     "readout's on _chunk_run).", ("CHANNEL_CHUNK_FORM", "CHANNEL_CHUNKS", "channel_constants", "MINIBATCH_CHUNKS")),
    ("channel_delta", "Chunked algorithm for the delta family with channel-wise gates (linear memory, l2 bias, decay "
     "order {order};\nKimi Delta Attention is α over key channels with order=pre): mirasc.runtime.chunk_forms.",
     ("CHUNK_FORM",)),
    ("chunk_gdelta", "Chunked algorithm for the generalized delta transition (l2 with read=kappa or erase=kappa, decay "
     "order {order}):\nmirasc.runtime.chunk_forms.", ("CHUNK_FORM",)),
)


def pieces(outer: S.Spec, spec: S.Spec, flags: dict[str, bool], the_plan: Plan) -> dict[str, str]:
    """The template slots that runtime pieces fill, for the spec (`outer`: as written; `spec`: the memory's, the
    inner spec of a precond learner), its flags and its Plan."""
    subs = {"SEGMENTS": runtime_source("segments"), "CHANNEL_DECAY": runtime_source("channel_decay"),
            "MULTISTEP": runtime_source("multistep"),
            "GPU_LIMITS": runtime_source("gpu_limits"), "LAUNCH_PLAN": runtime_source("launch_plan"),
            "INPUTS": runtime_source("inputs"),
            "MEMORY_STATE": runtime_functions("memory_state", ["_state_shapes", "_start", "_finish",
                                                               "_initial_weights", "_init_memory_state"]),
            "CHUNK_MATRICES": runtime_functions("chunk_forms", ["_chunk_matrices"]),
            "DUAL_FORM": runtime_functions("chunk_forms", ["_dual_form"]),
            "CHANNEL_CHUNK_FORM": runtime_functions("chunk_forms", ["_channel_chunk_form"]),
            "ROUTE_FNS": runtime_functions("routes", ["_chunk_length", "_route"]),
            "LAUNCH_PLAN_FNS": runtime_functions("routes", ([] if spec.composite else ["_memory_widths"])
                                                 + ["launch_plan"])}  # (a composite memory's widths are its own)
    forms = (("chunk_delta", "_delta_chunks"), ("chunk_momentum_delta", "_momentum_delta_chunks"),
             ("channel_delta", "_channel_delta_chunks"), ("chunk_gdelta", "_gdelta_chunks"))
    form = next((f for flag, f in forms if flags[flag]), None)  # (and its entry, `_..._chunked`)
    subs["CHUNK_FORM"] = runtime_functions("chunk_forms", ["_chunks", "_solve_unit_lower", form,
                                                          form[:-1] + "ed"]) if form else ""
    subs["COMPOSITE"] = runtime_functions("composite", ["feature_dim", "_features", "init_params", "_memory_state",
                                                        "_public_state", "_public_shapes", "init_state", "apply",
                                                        "_memory_widths", "_layer_cache", "_layer_read"])
    readout_fn = "_lq_on_kernels" if flags["chunk_lq"] else "_kl_on_kernels"  # (a chunk readout on the kernels)
    subs.update(CHUNK_READOUT_FN=readout_fn, CHUNK_READOUT_KERNELS=runtime_functions("chunk_readouts", [readout_fn]))
    subs.update(_routes(flags))
    subs.update(_memory_ops(flags))
    subs.update(_minibatch_chunks(flags))
    subs["CHUNK_ENTRY"] = _chunk_entry(spec, flags, subs)
    subs["CHUNK_SECTIONS"] = _chunk_sections(spec, flags, subs)
    own = _variant_names(outer)
    subs.update(_memory_api(own, the_plan))
    subs["COEFFICIENTS"] = runtime_functions("coefficients", [n for n in ("_coefficients", "_substep_coefficients")
                                                              if n not in own])  # (a multi-step learner's: its own)
    return subs


def _chunk_sections(spec: S.Spec, flags: dict[str, bool], subs: dict[str, str]) -> str:
    """The torch chunked algorithm's pieces the spec's form needs, each section under its banner."""
    order = spec.retention.order if spec.retention.kind == "decay" else "none"
    channel_constants = "\n".join(runtime_constants("memory_spec", {  # (the channel-wise chunked form's choices)
        "CHANNEL_K_FAST": repr(flags["channel_k_fast"]),
        "CHANNEL_READ": "_token_read" if flags["token_readout"] else "None"}))
    sections = []
    for flag, banner, slots in CHUNK_SECTIONS:
        if not flags[flag]:
            continue
        parts = [channel_constants if slot == "channel_constants" else subs["DUAL_FORM"] if slot == "dual_form"
                 else subs[slot] for slot in slots if slot != "dual_form" or not flags["token_readout"]]
        head = "" if banner is None else "".join(f"# {line}\n" for line in banner.format(order=order).splitlines())
        sections.append("\n\n" + (f"{RULE}\n{head}{RULE}\n" if head else "") + "\n\n\n".join(parts))
    return "".join(f"{section}\n" for section in sections)  # (each on its lines: none leaves no blank line)


def _memory_api(own: set[str], the_plan: Plan) -> dict[str, str]:
    """The op's pieces, less those the spec's variant writes itself (`own`: a multi-step learner's or a composite
    memory's apply, a preconditioned learner's _preconditioned), and its Triton family's run."""
    family = (None if not the_plan.triton else "chunk_readout" if the_plan.chunk_readout
              else "chunk" if the_plan.chunk_family is not None else "minibatch" if the_plan.minibatch
              else "recurrent")
    names = [n for n in MEMORY_API if n not in own and (the_plan.packed or n not in ONE_LAUNCH)]
    names += [TRITON_RUNS[family]] if family else []
    return {"MEMORY_API": runtime_functions("memory_api", names), "TRITON_RUN": TRITON_RUNS.get(family, "None"),
            "PACKED_APPLY": "_packed_on_kernels" if the_plan.packed else "_packed_per_sequence",
            "PACKING": runtime_functions("packing", ["_packed"] + (["_packed_padded"] if the_plan.packed else [])),
            "HALF_IN_PLACE": repr(the_plan.half_in_place), "PACKED": repr(the_plan.packed),
            "REST_KERNELS": "_chunked_triton" if the_plan.chunk_family is not None else "_minibatch_triton"}


def _routes(flags: dict[str, bool]) -> dict[str, str]:
    """Which backend runs a call (mirasc/runtime/routes.py): the route and launch_plan's kernels of the module's Triton
    family (the chunked families, the mini-batch kernels, the fused recurrent kernel alone), or torch's."""
    family = ("chunk" if flags["triton_chunked"] else "minibatch" if flags["triton_minibatch"]
              else "recurrent" if flags["triton"] else None)
    if family is None:
        return {"ROUTE": "_torch_route", "KERNEL_PLAN": "None", "ROUTES": runtime_functions("routes", ["_torch_route"])}
    names = ["_dot_precision", f"_{family}_route", f"_{family}_kernel_plan"]
    return {"ROUTE": names[1], "KERNEL_PLAN": names[2], "ROUTES": runtime_functions("routes", names)}


def _minibatch_chunks(flags: dict[str, bool]) -> dict[str, str]:
    """The mini-batch form's chunked algorithm (mirasc/runtime/minibatch_chunks.py, and channel_chunks.py with
    channel-wise decays): the chunk loop, the step it runs (muon's, a chunk readout's, the channel-wise form's, or
    the readout's) and the Omega window's pieces."""
    readout = "_lq_chunk" if flags["chunk_lq"] else "_kl_chunk" if flags["chunk_kl"] else None  # a chunk readout
    channel = []
    if flags["channel_minibatch"]:
        step = readout or "_channel_chunk"
        channel = (["_token_read"] if flags["token_readout"] else []) + (["_chunk_run"] if readout else [step])
        loop = ["_minibatch_chunks"] + ([readout] if readout else [])
    else:
        step = ("_muon_chunk" if flags["chunk_muon"] else readout
                or ("_token_chunk" if flags["token_readout"] else "_identity_chunk"))
        loop = ["_minibatch_chunks"] + ([] if flags["chunk_muon"] else ["_coefs_of"]) + (
            ["_chunk_run"] if readout else []) + [step]
    return {"MINIBATCH_CHUNKS": runtime_functions("minibatch_chunks", loop),
            "CHANNEL_CHUNKS": runtime_functions("channel_chunks", channel) if channel else "",
            "MB_STEP": step, "MB_WINDOW": "(_omega_sequence, _omega_factors)" if flags["omega"] else "None",
            "OMEGA_CHUNKS": runtime_functions("minibatch_chunks", ["_omega_sequence", "_omega_factors"])}


def _chunk_entry(spec: S.Spec, flags: dict[str, bool], subs: dict[str, str]) -> str:
    """`_chunked`: the entry of the spec's chunk form with the spec's choices bound (mirasc/runtime/chunk_forms.py, or
    the mini-batch form's chunk loop with its step and Omega window); "None" without a chunked algorithm."""
    sides = {name: quoted(side) if side else "None" for name, side in spec.gate_channels().items()}
    features = {"features": "_poly_features"} if flags["poly_features"] else {}
    if flags["chunk_minibatch"] or flags["chunk_muon"] or flags["channel_minibatch"]:
        window = "None" if flags["channel_minibatch"] else subs["MB_WINDOW"]
        entry, args = "_minibatch_chunks", {"step": subs["MB_STEP"], "window": window}
    elif flags["chunk_delta"]:
        entry, args = "_delta_chunked", {"implicit": flags["implicit"], "pre_decay": flags["pre_decay"], **features}
    elif flags["chunk_momentum_delta"]:
        entry, args = "_momentum_delta_chunked", {"pre_decay": flags["pre_decay"]}
    elif flags["channel_delta"]:
        entry, args = "_channel_delta_chunked", {"eta_side": sides.get("eta", "None"), "alpha_side":
                                                 sides.get("alpha", "None"), "implicit": flags["implicit"],
                                                 "pre_decay": flags["pre_decay"], **features}
    elif flags["chunk_gdelta"]:
        entry, args = "_gdelta_chunked", {"eta_side": sides.get("eta", "None"), "erase_kappa": flags["gdelta_write"],
                                          "pre_decay": flags["pre_decay"]}
    else:
        return "None"
    lines, line = [], f"functools.partial({entry}"
    for arg in (f"{name}={value}" for name, value in args.items()):
        if len("_chunked = ") + len(line) + len(arg) + 3 > 120:
            lines.append(line + ",")
            line = " " * len("functools.partial(") + arg
        else:
            line += ", " + arg
    return "\n".join(lines + [line + ")"]).replace("\n" + " " * len("functools.partial("),
                                                   "\n" + " " * len("_chunked = functools.partial("))


def _memory_ops(flags: dict[str, bool]) -> dict[str, str]:
    """The pieces of mirasc/runtime/memory_ops.py the module needs, for their two slots: how weights are applied (and
    an MLP's LayerNorm), and the token step's helpers (muon's Newton–Schulz, the polynomial features, the coefficients'
    layout); the token recurrence (mirasc/runtime/token_step.py); the preconditioned learner (precond.py)."""
    reads = ["_dense", "_per_token"] + (["_layernorm", "_layernorm_backward"] if flags["layernorm"] else [])
    steps = (["_newton_schulz"] if flags["muon"] else []) \
        + (["_poly_features", "_feature_width"] if flags["poly_features"] else []) + ["_token_coefs", "_on_weight"]
    factors = "_window_factors" if flags["omega"] else "_token_grad"
    token_step = ["_per_row", factors, "_token_step", "_recurrent", "_read_tokens"] + (
        ["_kl_step", "_lag_step"] if flags["chunk_kl"] else [])  # (a chunk readout's lag token: kl's)
    return {"MEMORY_READS": runtime_functions("memory_ops", reads),
            "MEMORY_STEPS": runtime_functions("memory_ops", steps),
            "TOKEN_STEP": runtime_functions("token_step", token_step), "TOKEN_FACTORS": factors,
            "PRECONDITIONER": runtime_source("precond")}
