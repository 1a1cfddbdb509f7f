"""The chunked Triton kernel families (their kernels: mirasc/runtime/kernels/; the host side:
templates/triton_chunked.py.tmpl), forward and backward: linear
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

Nothing here is printed from the IR: the kernels are fixed, real modules, and `chunk_kernels_source` picks those a
family launches.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..language import spec as S
from ..plan import one_chunk_op
from .directives import preprocess
from .standalone import kernels_source, runtime_source

CHUNK_TEMPLATE = (Path(__file__).parent / "templates" / "triton_chunked.py.tmpl").read_text()


def emit_chunked(spec: S.Spec, family: str, lq_scale: bool = False, features: bool = False) -> str:
    """Source of the chunked Triton section (kernels and the torch preparation) for a chunk family. lq_scale: the
    mini-batch family run by a chunk readout of lq retention (docs/semantics.md: chunk readouts), whose updates in
    weight space are η/n_c
    with the chunk's normaliser n_c passed as the coefficient `lqs0`."""
    r = spec.retention
    sides = spec.gate_channels()
    flags = {"chunk_hebbian": family == "hebbian", "chunk_delta": family == "delta",
             "chunk_gdelta": family == "gdelta", "chunk_momentum": family == "momentum",
             "gdelta_write": spec.generalized_delta == "erase",
             "chunk_scores": family in ("delta", "gdelta"),
             "implicit": spec.learner.kind == "implicit", "has_alpha": r.kind == "decay",
             "pre_decay": r.kind == "decay" and r.order == "pre", "minibatch": spec.parallel.kind == "minibatch",
             "ch_alpha": sides.get("alpha") == "k", "ch_eta": sides.get("eta") == "k", "lq_scale": lq_scale,
             "wy_kernels": family == "delta" and sides.get("alpha") != "k",  # the preparation as kernels
             "wy_scores": family == "delta" and sides.get("alpha") == "k",  # (on the scores kernels' P)
             # a key-channel decay's scores, preparation and scan as one op (plan.one_chunk_op)
             "wy_fused": family == "delta" and sides.get("alpha") == "k" and one_chunk_op(spec, family),
             "one_op": one_chunk_op(spec, family),  # (the helpers those paths share)
             "features": features,  # a feature=poly linear memory's plain copy, run on φ_p(q), φ_p(k)
             "composite": spec.composite}  # (a feature map or normaliser around the memory: o returned in fp32)
    op_id = hashlib.sha256(spec.canonical().encode()).hexdigest()[:12]
    return (preprocess(CHUNK_TEMPLATE, flags).replace("{{OP_ID}}", op_id)
            .replace("{{CHUNK_SPACE}}", runtime_source("chunk_space"))
            .replace("{{CHUNK_DOTS}}\n", kernels_source("dots") + "\n")
            .replace("{{CHUNK_KERNELS}}\n", chunk_kernels_source(family, flags) + "\n"))


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
