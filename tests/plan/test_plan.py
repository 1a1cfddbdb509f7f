"""The Plan (mirasc/plan.py; docs/kernels.md, "Which kernels run a spec"): which torch chunked algorithm and which
Triton kernels compute every bundled spec, the reason of every absent path, and the emitted module agreeing with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mirasc import compile_spec
from mirasc.compiler import compile_text as compile_parts

SPECS = Path(__file__).resolve().parents[2] / "specs"
# spec: (torch chunked algorithm, Triton kernels, how a parametric memory's kernels multiply 16-bit dots)
BUNDLED = {
    "atlas": ("muon", "none", ""),
    "bahdanau": ("query_blocks", "none", ""),
    "based": ("minibatch", "recurrent + chunked hebbian", "input_split"),
    "comba": ("gdelta", "recurrent + chunked gdelta", "input"),
    "custom_cauchy": ("none", "recurrent", "ieee"),
    "deltanet": ("delta", "recurrent + chunked delta", "input"),
    "deltaproduct": ("delta", "recurrent + chunked delta", "input"),
    "forgetting_transformer": ("query_blocks", "flash", ""),
    "gated_deltanet": ("delta", "recurrent + chunked delta", "input"),
    "gated_deltaproduct": ("delta", "recurrent + chunked delta", "input"),
    "gla": ("minibatch", "recurrent + chunked hebbian", "input"),
    "hedgehog": ("minibatch", "recurrent + chunked hebbian", "input_split"),
    "hgrn2": ("minibatch", "recurrent + chunked hebbian", "input"),
    "huber_kl_momentum": ("minibatch", "recurrent", "ieee"),
    "hyperbolic_mirror": ("minibatch", "recurrent", "ieee"),
    "kda": ("delta", "recurrent + chunked delta", "input"),
    "linear_attention": ("minibatch", "recurrent + chunked hebbian", "input"),
    "linear_attention_elu": ("minibatch", "recurrent + chunked hebbian", "input_split"),
    "longhorn": ("delta", "recurrent + chunked delta", "input"),
    "mamba2": ("minibatch", "recurrent + chunked hebbian", "input"),
    "memn2n": ("query_blocks", "none", ""),
    "memora": ("minibatch", "mini-batch per chunk", "split"),
    "memora_token": ("minibatch", "recurrent", "ieee"),
    "momentum_deltanet": ("momentum_delta", "recurrent + chunked momentum", "input"),
    "moneta": ("minibatch", "mini-batch per chunk", "split"),
    "moneta_token": ("minibatch", "recurrent", "ieee"),
    "mta": ("query_blocks", "none", ""),
    "omega_yaad": ("minibatch", "recurrent + mini-batch", "split"),
    "precond_gated_deltanet": ("delta", "recurrent + chunked delta", "input"),
    "precond_kda": ("delta", "recurrent + chunked delta", "input"),
    "retnet": ("minibatch", "recurrent + chunked hebbian", "input"),
    "rwkv7": ("gdelta", "recurrent + chunked gdelta", "input"),
    "sink_attention": ("query_blocks", "flash", ""),
    "sliding_window": ("query_blocks", "flash", ""),
    "sparse_lp": ("minibatch", "recurrent", "ieee"),
    "stickbreaking": ("query_blocks", "stickbreaking", ""),
    "titans": ("minibatch", "recurrent + mini-batch", "split"),
    "transformer": ("query_blocks", "flash", ""),
    "ttt_linear": ("minibatch", "recurrent + chunked minibatch", "input"),
    "ttt_mlp": ("minibatch", "recurrent + mini-batch", "split"),
    "yaad": ("minibatch", "recurrent + mini-batch", "split"),
}


def compiled(name):
    path = SPECS / f"{name}.miras"
    return compile_parts(path.read_text(encoding="utf-8"), str(path))


def test_every_bundled_spec_has_a_row():
    assert sorted(p.stem for p in SPECS.glob("*.miras")) == sorted(BUNDLED)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_the_plan_of_a_bundled_spec(name):
    c = compiled(name)
    plan = c.plan
    assert tuple(plan.summary().values()) == BUNDLED[name]
    # a reason exactly where a path is absent
    assert bool(plan.no_chunk_form) == (plan.chunk_form is None)
    assert bool(plan.no_triton) == (not plan.triton)
    assert bool(plan.no_chunk_family) == (plan.triton and c.spec.parametric and plan.chunk_family is None)
    assert bool(plan.no_v_tiles) == (plan.triton and c.spec.parametric and not plan.v_tiles)
    if plan.triton and c.spec.parametric:  # the emitted recurrent kernels tile as the Plan says
        assert f"_V_TILES = {plan.v_tiles}" in c.source
    assert not (plan.minibatch and plan.chunk_family)
    # the emitted module says the same
    if plan.chunk_form is None and c.spec.parametric:  # (the message is built from it, mirasc.runtime.routes._route)
        assert f"NO_CHUNK_REASON = {plan.no_chunk_form!r}" in c.source
    if not plan.triton:
        assert plan.no_triton.replace('"', "'") in c.source
    if c.spec.parametric:
        assert f"CHUNKED = {plan.chunk_form is not None}" in c.source
        assert (f'HALF_DOTS = "{plan.dots}"' in c.source) == plan.triton
        assert ("_chunked_triton" in c.source) == (plan.chunk_family is not None)


def test_a_function_without_a_triton_equivalent_leaves_the_plan_without_triton():
    """atan prints in torch but not in Triton: only printing finds that, and the Plan (and module) then say so."""
    text = (SPECS / "custom_cauchy.miras").read_text(encoding="utf-8").replace("log(1 + e^2/2)", "atan(e)^2")
    c = compile_parts(text)
    assert not c.plan.triton and c.plan.chunk_family is None and not c.plan.minibatch
    assert "atan" in c.plan.no_triton and c.plan.no_triton in c.source
    assert c.plan.summary()["triton"] == "none"
    assert "_fused_recurrent_fwd" not in c.source and "_fused_recurrent_fwd" in compiled("custom_cauchy").source
    assert not hasattr(compile_spec(text), "_fused_recurrent_fwd")


def test_describe_gives_every_reason():
    lines = compiled("atlas").plan.describe()
    assert lines[0] == "chunked algorithm: muon"
    assert lines[1].startswith("Triton kernels: none (") and "Newton–Schulz" in lines[1]
    lines = compiled("gated_deltanet").plan.describe()
    assert lines == ["chunked algorithm: delta", "Triton kernels: recurrent + chunked delta",
                     "recurrent kernels: the value rows split over programs, BV rows each",
                     "16-bit dots: 16-bit operands on the tensor cores, fp32 accumulation",
                     "16-bit q, k, v: read in place by one op (as the [B, T, H, D] tensors given, T a whole number "
                     "of chunks)"]
    assert not any(line.startswith("16-bit q, k, v") for line in compiled("titans").plan.describe())


def model(*fields: str) -> str:
    return "model m {\n" + "".join(f"    {f}\n" for f in fields) + "}\n"


@pytest.mark.parametrize("fields, reason", [
    (("memory = mlp", "bias = l2", "learner = gd(lr=gate)", "parallel = minibatch(16)"),
     "the chunked kernels run a linear memory's rank-1 updates; this memory is mlp"),
    (("memory = linear", "bias = l2", "retention = decay(alpha=gate(v))", "learner = gd(lr=gate)"),
     "the channel-wise alpha runs on the recurrent kernel only"),
    (("memory = linear", "bias = huber", "retention = decay(alpha=gate)", "learner = gd(lr=gate)"),
     "the chunked families compute the dot bias with gd; the delta chunk form"),
    (("memory = linear", "bias = l2(window=4, gamma=gate)", "learner = gd(lr=gate)"),
     "the Omega rule runs on them as c kernel rows per token only with gradients that do not move"),
    (("memory = linear", "bias = l2", "retention = lq(q=4, alpha=gate)", "learner = gd(lr=gate)",
      "parallel = minibatch(16, readout=chunk)"), "lq's chunk readout scales weight i's updates by 1/n_i"),
], ids=["mlp", "value-side", "huber", "omega-exact", "lq-chunk"])
def test_the_plan_says_why_no_chunked_family_runs(fields, reason):
    """Each chunked family is asked whether it covers the spec; where none does the Plan says why, and `mirasc
    explain` prints it."""
    plan = compile_parts(model(*fields)).plan
    assert plan.triton and plan.chunk_family is None
    assert plan.no_chunk_family.startswith(reason)
    assert f"chunked Triton family: none ({plan.no_chunk_family})" in plan.describe()


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_at_most_one_chunked_family_covers_a_spec(name):
    """The families are disjoint, so the order they are asked in is not a choice the Plan makes silently."""
    from mirasc.plan import CHUNK_FAMILIES, chunk_kernels_reason

    plan = compiled(name).plan
    if plan.kernels is None or chunk_kernels_reason(plan.kernels.spec):
        return
    covering = [f.name for f in CHUNK_FAMILIES if f.covers(plan.kernels.spec, plan.chunk_form)]
    assert len(covering) <= 1, covering
    assert plan.chunk_family in (None, *covering)


def test_a_feature_map_splits_the_fp32_operands_on_every_chunk_family():
    """A feature map hands the memory 16-bit features and takes its output in fp32 whichever chunk family runs it:
    the dots policy follows the composite, not the family (here the mini-batch family of an ℓ2 write)."""
    text = "model m {\n memory = linear(feature=elu1)\n bias = l2\n learner = gd(lr=gate)\n parallel = minibatch(16)\n}"
    plan = compile_parts(text).plan
    assert plan.chunk_family == "minibatch" and plan.dots == "input_split"
