"""The chunked Triton kernel families (their kernels: mirasc/runtime/kernels/; their host side:
mirasc/runtime/chunk_host.py, chunk_channel_host.py, chunk_ops.py, chunk_path.py, momentum_host.py;
templates/triton_chunked.py.tmpl only sets the spec's choices and names the pieces), forward and backward: linear
memories whose update is affine in the state — Hebbian (dot bias), the delta rule (l2 bias, gd or implicit
step, exact), the generalized delta transition (l2 with read=kappa / erase=kappa: Comba, RWKV-7) and mini-batch
l2 — with none/decay retention. One set of kernels serves all four (a state
scan over chunks per Dv tile and an output kernel parallel over chunks; their reverse); the families differ
only in the chunk-local preparation: kernels for the delta rule, U = η v formed in the scan for the Hebbian
write (each of these paths one op that reads 16-bit inputs in place: plan.one_chunk_op), torch that autograd
differentiates for the others. A decay over key channels (alpha=gate(k): GLA, HGRN2, KDA) selects a variant of
the same kernels with the log-decay per key channel (its cumulative sums from the kernels _log_decay_fwd/_bwd):
the chunk's scores computed once in 16-row sub-blocks, never evaluating an exponent above 0;
lr=gate(k) only scales the written key in the preparation. The generalized delta transition solves its chunk's
WY/UT system in the preparation too; erase=kappa, whose erase (η ⊙ κ) and write (k) directions differ, presents
each token to the kernels as two rows, an erase row and a write row with the same decay (the template's header).
The momentum delta rule (l2, momentum, gates per head) is the exception: its state [W, S] mixes W and S through a
2x2 factor per token that no diagonal decay expresses, so it has its own scan kernels over (W, S) and computes the
chunk-parallel parts (outputs, gradients) as torch matmuls on the chunk states they store (the kernels and the
recurrence: mirasc/runtime/kernels/momentum.py).

Nothing here is printed from the IR: the kernels and their host side are fixed, real modules;
`chunk_kernels_source` picks the kernels a family launches, `chunk_host_source`, `chunk_family_source` and
`chunk_path_source` the host functions it calls.
"""

from __future__ import annotations

from ..language import spec as S
from ..plan import one_chunk_op
from .slots import TEMPLATES, fill_lines, section
from .standalone import kernels_source, runtime_constants, runtime_doc, runtime_functions, runtime_source, runtime_value

CHUNK_TEMPLATE = (TEMPLATES / "triton_chunked.py.tmpl").read_text()


def emit_chunked(spec: S.Spec, family: str, lq_scale: bool = False, features: bool = False) -> str:
    """Source of the chunked Triton section (kernels and the torch preparation) for a chunk family. lq_scale: the
    mini-batch family run by a chunk readout of lq retention (docs/semantics.md: chunk readouts), whose updates in
    weight space are η/n_c
    with the chunk's normaliser n_c passed as the coefficient `lqs0`."""
    r = spec.retention
    sides = spec.gate_channels()
    flags = {"chunk_hebbian": family == "hebbian", "chunk_delta": family == "delta",
             "gdelta_write": spec.generalized_delta == "erase",
             "chunk_scores": family in ("delta", "gdelta"),
             "implicit": spec.learner.kind == "implicit", "has_alpha": r.kind == "decay",
             "pre_decay": r.decays_first,
             "ch_alpha": sides.get("alpha") == "k", "ch_eta": sides.get("eta") == "k",
             "wy_kernels": family == "delta" and sides.get("alpha") != "k",  # the preparation as kernels
             "wy_scores": family == "delta" and sides.get("alpha") == "k",  # (on the scores kernels' P)
             # a key-channel decay's scores, preparation and scan as one op (plan.one_chunk_op)
             "wy_fused": family == "delta" and sides.get("alpha") == "k" and one_chunk_op(spec, family),
             "one_op": one_chunk_op(spec, family),  # (the helpers those paths share)
             "features": features,  # a feature=poly linear memory's plain copy, run on φ_p(q), φ_p(k)
             "composite": spec.composite}  # (a feature map or normaliser around the memory: o returned in fp32)
    momentum = family == "momentum"  # (its own scans and run: no chunk path, no _chunk_space kernels)
    header = {name: repr(value) for name, value in {  # (what each means: mirasc.runtime.chunk_host)
        "CH_DECAY": flags["ch_alpha"], "DECAY": flags["has_alpha"], "ETA_K": flags["ch_eta"],
        "IMPLICIT": flags["implicit"], "PRE_DECAY": flags["pre_decay"], "LQ_SCALE": lq_scale,
        "COMPOSITE": flags["composite"], "_ROWS_PER_TOKEN": 2 if flags["gdelta_write"] else 1}.items()}
    if not momentum:  # the five chunk kernels (chunk_host's declaration), and the delta rule's preparation
        header["_CHUNK_KERNELS"] = repr(runtime_value("chunk_host", "_CHUNK_KERNELS")
                                        + (("_wy_fwd", "_wy_bwd") if family == "delta" else ()))
    text = fill_lines(CHUNK_TEMPLATE, {
        "FAMILY_NOTE": runtime_doc("kernels/momentum" if momentum else "kernels/chunk"),
        "HEADER": runtime_constants("chunk_host", header),
        "CHUNK_RUN": [] if momentum else section("chunk_run")})
    text = text.replace("{{KEY_WIDTH}}", _key_width(flags))
    return (text.replace("{{CHUNK_SPACE}}", runtime_source("chunk_space"))
            .replace("{{CHUNK_HOST}}", chunk_host_source(family, flags))
            .replace("{{CHUNK_FAMILY}}", chunk_family_source(family, flags))
            .replace("{{CHUNK_PATH}}", chunk_path_source(family))
            .replace("{{PREPARATION}}", PREPARATION.get(family, "")).replace("{{ON_KERNELS}}", on_kernels(flags))
            .replace("{{CHUNK_DOTS}}\n", kernels_source("dots") + "\n")
            .replace("{{CHUNK_KERNELS}}\n", chunk_kernels_source(family, flags) + "\n"))


def _key_width(flags: dict[str, bool]) -> str:
    """`_key_width`'s feature map and its width function: a composite module's feature map (feature_dim, none for the
    identity), else φ_p's (_feature_width) under feature=poly, else none."""
    feature, to_width = ("FEATURE", '(feature_dim if FEATURE != "identity" else None)') if flags["composite"] \
        else ('"identity"', "None")
    if flags["features"]:
        to_width = "_feature_width" if to_width == "None" else f"{to_width} or _feature_width"
    return f"{feature}, {to_width}"


# the Triton functions of each part of a family's path, by their module under mirasc/runtime/kernels/
SCANS = ("_row", "_log_decay_rows", "_chunk_state_fwd", "_chunk_state_bwd", "_store_du")  # both decays' (chunk.py)
HEAD = ("_chunk_du_local_bwd", "_chunk_grads_bwd")
CHANNEL = HEAD + ("_log_decay_fwd", "_log_decay_bwd", "_chunk_scores_fwd", "_store_score_rows")
HEAD_PREPARATION = ("_wy_scores", "_wy_decay", "_wy_fwd", "_wy_bwd")  # the delta rule's, per-head decay
CHANNEL_PREPARATION = ("_wy_fwd", "_wy_bwd")  # on the key-channel scores


def chunk_kernels_source(family: str, flags: dict[str, bool]) -> str:
    """The Triton kernels a chunk family launches (and the functions they call), each defined once: the delta
    family's inverse; the momentum scans, or the state scans (one kernel each for both decays), one decay
    variant's chunk-parallel backward (with the scores kernels and the preparation where the family has them) and
    the output kernel."""
    parts = [("chunk", ("_unit_lower_inverse",))] if flags["chunk_delta"] else []
    if family == "momentum":
        return "\n".join(kernels_source(m, f) for m, f in parts + [("momentum", None)])
    parts.append(("chunk", SCANS))
    if flags["ch_alpha"]:
        parts.append(("chunk_channel", CHANNEL + (("_chunk_scores_bwd",) if flags["chunk_scores"] else ())
                      + (CHANNEL_PREPARATION if flags["wy_scores"] else ())))
    else:
        parts.append(("chunk_head", HEAD + (HEAD_PREPARATION if flags["wy_kernels"] else ())))
    parts.append(("chunk", ("_chunk_output_fwd",)))
    return "\n".join(kernels_source(m, f) for m, f in parts)


# the host functions of a family's path, by their module under mirasc/runtime/ (copied in this order)
FIT = ("_CHUNK_TUNED", "FIT_SMEM_LIMIT", "_chunk_fit_limit", "_chunk_fit_error", "_chunk_tile", "_check_chunk_fits",
       "_chunk_launch_sizes", "_chunk_fit_reason", "_chunk_plan", "_launch_prec", "_tile_rows")
LAUNCH = ("_chunk_kernel", "_CHUNK_AUTOTUNE", "_CHUNK_LAUNCHED", "_sub_blocks", "_sub", "_out_dtype", "_o_dtype",
          "_o_written", "_layout", "_read_exponents")
ONE_OP = ("_in_place", "_rows", "_scan_cotangents", "_proximal_beta")  # the one-op paths' helpers
SCAN_OP = ("_chunk_fwd", "_scores_fake", "_chunk_bwd", "_register_chunk_op", "_CHUNK_OP")
CHANNEL_HOST = ("_log_decay_launch", "_register_log_decay_op", "_LOG_DECAY_OP", "_log_decays", "_scores_bk",
                "_scores_fwd", "_output_scores")
CHANNEL_SCORES = ("_scores_bwd", "_register_scores_op", "_SCORES_OP", "_channel_scores")  # the scores' backward
ONE_OP_HELPERS = ("_one_op_context", "_qkv_grads_fake")
HEBBIAN_OP = ("_register_hebbian_op", "_HEBBIAN_OP", "_hebbian_on_kernels")
DELTA_OP = ("_dims", "_wy_fwd_launch", "_wy_bwd_launch", "_register_delta_op", "_DELTA_OP", "_delta_on_kernels")
WY_OP = ("_register_wy_op", "_f32", "_WY_OP", "_scores_preparation")
CHANNEL_DELTA_OP = ("_register_channel_delta_op", "_CHANNEL_DELTA_OP", "_channel_delta_on_kernels")


PREPARATION = {"hebbian": "_hebbian_preparation", "delta": "_delta_preparation", "gdelta": "_gdelta_preparation",
               "minibatch": "_minibatch_preparation"}  # each family's chunk-local preparation (chunk_path.py)


def chunk_path_source(family: str) -> str:
    """The chunked path and the family's preparation (mirasc/runtime/chunk_path.py); none for the momentum delta
    rule, whose path is its own."""
    if family not in PREPARATION:
        return ""
    return runtime_functions("chunk_path", ["_chunk_path", "_unit_lower_solves", "_decayed", PREPARATION[family]])


def on_kernels(flags: dict[str, bool]) -> str:
    """The one-op path a family runs where a chunk is one tile (chunk_ops.py), or None."""
    if flags["chunk_hebbian"]:
        return "_hebbian_on_kernels"
    return "_delta_on_kernels" if flags["wy_kernels"] else "_channel_delta_on_kernels" if flags["wy_fused"] else "None"


def chunk_host_source(family: str, flags: dict[str, bool]) -> str:
    """The chunk kernels' host side a family's path calls (mirasc/runtime/chunk_host.py, and
    chunk_channel_host.py for a key-channel decay), each function once."""
    if family == "momentum":
        return runtime_functions("chunk_host", list(FIT))
    names = list(FIT + LAUNCH) + (["_split"] if flags["chunk_delta"] else [])
    names += list(ONE_OP) if flags["one_op"] else []
    # the decay layout's pieces: one log-decay per head (chunk_host.py) or over key channels (chunk_channel_host.py)
    layout = ["_chunk_decays"] + (["_pair_scores"] if flags["chunk_scores"] else [])
    if not flags["ch_alpha"]:
        layout += ["_output_scores"] + (["_scores_preparation"] if flags["chunk_delta"] else [])
        return runtime_functions("chunk_host", names + list(SCAN_OP) + layout)
    return runtime_functions("chunk_host", names + list(SCAN_OP)) + "\n\n\n" + runtime_functions(
        "chunk_channel_host", list(CHANNEL_HOST) + (list(CHANNEL_SCORES) if flags["chunk_scores"] else []) + layout)


def chunk_family_source(family: str, flags: dict[str, bool]) -> str:
    """A family's own host pieces: the one-op paths (mirasc/runtime/chunk_ops.py) or the momentum delta rule's
    path (mirasc/runtime/momentum_host.py)."""
    if family == "momentum":
        return runtime_functions("momentum_host", ["_mom_configs", "_mom_kernel", "_CHUNK_AUTOTUNE", "_CHUNK_LAUNCHED",
                                                   "_mom_fwd", "_mom_bwd", "_register_mom_op", "_MOM_OP",
                                                   "_chunked_triton"])
    ops = (HEBBIAN_OP if flags["chunk_hebbian"] and flags["one_op"] else ()) + (
        DELTA_OP if flags["wy_kernels"] else ()) + (WY_OP if flags["wy_scores"] else ()) + (
        CHANNEL_DELTA_OP if flags["wy_fused"] else ())
    names = (ONE_OP_HELPERS if set(ops) - set(WY_OP) else ()) + ops  # (the helpers the one-op paths share)
    return runtime_functions("chunk_ops", list(names)) if names else ""
