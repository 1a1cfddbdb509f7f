"""Compiled modules (docs/module-api.md) against the independent float64 reference of docs/semantics.md: parametric
memories.

For every spec in specs/: the recurrent algorithm against tests/reference.py (outputs, final state and
gradients, float64), the chunked algorithm against the recurrent one, gradcheck on tiny shapes, and
float32 runs against the float64 reference.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from reference import (
    REF_CONFIGS,
    declared_gates,
    make_inputs,
    make_state,
    needs_positive_weights,
    reference_apply,
    state_keys,
)

mirasc = pytest.importorskip("mirasc")

SPECS = Path(__file__).resolve().parents[2] / "specs"
# Parametric specs (docs/semantics.md: parametric memories); nonparametric memories (§5) are tested in
# test_attention.py.
SPEC_NAMES = sorted(p.stem for p in SPECS.glob("*.miras") if mirasc.parse_file(p).parametric)
f64, f32 = torch.float64, torch.float32
B, H, D = 2, 2, 8
EXACT_T, EXACT_CHUNK = 37, 16  # T not a multiple of the chunk
SEED = 1

params = pytest.mark.parametrize("name", SPEC_NAMES, ids=SPEC_NAMES)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@functools.cache
def module(name: str):
    return mirasc.compile_spec(str(SPECS / f"{name}.miras"))


def seq_len(name: str) -> int:
    C = REF_CONFIGS[name]["parallel"]
    return EXACT_T if C is None else (5 * C) // 2  # 2.5 chunks: the last one partial


def chunk_size(name: str, algorithm: str):
    return EXACT_CHUNK if (algorithm == "chunked" and REF_CONFIGS[name]["parallel"] is None) else None


def make_case(name: str, dtype=f64, T: int | None = None, Dk: int = D, Dv: int = D, b: int = B, h: int = H):
    """Fresh (q, k, v, gates, state) drawn in float64 and cast; momentum buffers are made nonzero."""
    T = seq_len(name) if T is None else T
    q, k, v, gates = make_inputs(name, b, T, h, Dk, Dv, f64, SEED)
    state = make_state(name, b, h, Dk, Dv, f64, SEED)
    gen = torch.Generator().manual_seed(SEED + 100)
    for key in state:
        if key.startswith("S_"):  # exercise the initial momentum buffer, not only zeros
            state[key] = 0.01 * torch.randn(state[key].shape, generator=gen, dtype=f64)
    cast = lambda x: x.to(dtype).clone()  # noqa: E731
    return cast(q), cast(k), cast(v), {n: cast(x) for n, x in gates.items()}, {n: cast(x) for n, x in state.items()}


def loss_weights(o: torch.Tensor, final: dict[str, torch.Tensor]):
    gen = torch.Generator().manual_seed(SEED + 200)
    w_o = torch.randn(o.shape, generator=gen, dtype=f64)
    w_s = {key: torch.randn(final[key].shape, generator=gen, dtype=f64) for key in sorted(final)}
    return w_o, w_s


def scalar_loss(o, final, weights):
    w_o, w_s = weights
    return (o * w_o.to(o.dtype)).sum() + sum((final[key] * w.to(final[key].dtype)).sum() for key, w in w_s.items())


def run(name: str, fn, *, dtype=f64, grad: bool = False):
    """fn(q, k, v, gates, state) -> (o, final); returns (o, final, grads or None), grads keyed by input name."""
    q, k, v, gates, state = make_case(name, dtype)
    leaves = {"q": q, "k": k, "v": v, **{f"gate:{n}": x for n, x in gates.items()}}
    leaves.update({f"state:{n}": x for n, x in state.items()})
    if grad:
        for x in leaves.values():
            x.requires_grad_(True)
    o, final = fn(q, k, v, gates, state)
    grads = None
    if grad:
        loss = scalar_loss(o, final, loss_weights(o, final))
        gs = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        grads = {n: (torch.zeros_like(x) if g is None else g) for (n, x), g in zip(leaves.items(), gs)}
        o, final = o.detach(), {key: x.detach() for key, x in final.items()}
    return o, final, grads


def split_extras(mod, gates):
    """The reference keeps the op's key inputs (EXTRAS, e.g. κ) with the gates; the module takes them apart."""
    extras = {n: x for n, x in gates.items() if n in mod.EXTRAS}
    return {n: x for n, x in gates.items() if n not in mod.EXTRAS}, {"extras": extras} if extras else {}


def compiled(name: str, algorithm: str):
    mod = module(name)

    def fn(q, k, v, gates, state):
        gates, extras = split_extras(mod, gates)
        return mod.apply(q, k, v, gates, state=state, backend="torch", algorithm=algorithm,
                         chunk_size=chunk_size(name, algorithm), **extras)

    return fn


def reference(name: str):
    return lambda q, k, v, gates, state: reference_apply(name, q, k, v, gates, state)


@functools.cache
def reference_result(name: str):
    return run(name, reference(name), grad=True)


@functools.cache
def recurrent_result(name: str):
    return run(name, compiled(name, "recurrent"), grad=True)


def has_chunked(name: str) -> bool:
    flag = module(name).CHUNKED
    assert isinstance(flag, bool)
    return flag


def compare(got, want, tol: float, what: str):
    """Relative errors of outputs and every final-state tensor; asserts all < tol, listing them all."""
    o, final = got[0], got[1]
    o_ref, final_ref = want[0], want[1]
    assert set(final) == set(final_ref), f"{what}: state keys {sorted(final)} != {sorted(final_ref)}"
    errs = {"o": rel(o, o_ref)} | {f"state:{key}": rel(final[key], final_ref[key]) for key in sorted(final_ref)}
    bad = {key: f"{e:.3e}" for key, e in errs.items() if not e < tol}
    everything = {key: f"{e:.1e}" for key, e in errs.items()}
    assert not bad, f"{what}: relative errors above {tol:g}: {bad} (all: {everything})"


def compare_grads(got: dict, want: dict, tol: float, what: str):
    assert set(got) == set(want)
    errs = {key: rel(got[key], want[key]) for key in want}
    bad = {key: f"{e:.3e}" for key, e in errs.items() if not e < tol}
    assert not bad, f"{what}: gradient relative errors above {tol:g}: {bad}"


# ------------------------------------------------------------------------------------------ layout


def test_ref_configs_match_specs():
    assert SPEC_NAMES
    assert set(REF_CONFIGS) == set(SPEC_NAMES)


@params
def test_gates_and_init_state(name):
    mod = module(name)
    assert isinstance(mod.GATES, tuple)
    assert set(mod.GATES) == declared_gates(name) and len(mod.GATES) == len(set(mod.GATES))
    assert isinstance(mod.CHUNKED, bool)
    st = mod.init_state(B, H, D, D, dtype=f64, generator=torch.Generator().manual_seed(0))
    ref = make_state(name, B, H, D, D, f64, 0)
    assert set(st) == set(state_keys(name))
    for key in ref:
        assert st[key].shape == ref[key].shape, key
        assert st[key].dtype == f64, key
        assert torch.isfinite(st[key]).all(), key
    if needs_positive_weights(name):
        for key in st:
            if not key.startswith("S_"):
                assert (st[key] > 0).all(), f"{key} must be strictly positive for {name}"


# ------------------------------------------------------------------------------------------ float64


@params
def test_recurrent_matches_reference(name):
    compare(recurrent_result(name), reference_result(name), 1e-10, f"{name} recurrent vs reference")


@params
def test_chunked_matches_recurrent(name):
    fn = compiled(name, "chunked")
    if not has_chunked(name):
        with pytest.raises(ValueError):
            run(name, fn)
        return
    compare(run(name, fn), recurrent_result(name), 1e-9, f"{name} chunked vs recurrent")


@params
def test_gradients_recurrent_vs_reference(name):
    compare_grads(recurrent_result(name)[2], reference_result(name)[2], 1e-9, f"{name} recurrent vs reference")


@params
def test_gradients_chunked_vs_recurrent(name):
    if not has_chunked(name):
        pytest.skip("no chunked algorithm for this spec")
    got = run(name, compiled(name, "chunked"), grad=True)
    compare(got, recurrent_result(name), 1e-9, f"{name} chunked vs recurrent (forward, grad mode)")
    compare_grads(got[2], recurrent_result(name)[2], 1e-9, f"{name} chunked vs recurrent")


# ------------------------------------------------------------------------------------------ float32


@params
@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
def test_float32_matches_float64_reference(name, algorithm):
    if algorithm == "chunked" and not has_chunked(name):
        pytest.skip("no chunked algorithm for this spec")
    with torch.no_grad():
        got = run(name, compiled(name, algorithm), dtype=f32)
    assert torch.isfinite(got[0]).all()
    compare(got, reference_result(name), 1e-4, f"{name} {algorithm} float32 vs float64 reference")


# ------------------------------------------------------------------------------------------ gradcheck


def _titans_c2():
    text = (SPECS / "titans.miras").read_text()
    assert "minibatch(64)" in text and "model titans " in text
    return text.replace("minibatch(64)", "minibatch(2)").replace("model titans ", "model titans_c2 ")


GRADCHECK = {
    "deltanet": (lambda: module("deltanet"), "deltanet", 2),  # linear memory, chunked with chunk 2
    # two steps per token, chunks of 3 sub-steps (boundaries inside tokens)
    "gated_deltaproduct": (lambda: module("gated_deltaproduct"), "gated_deltaproduct", 3),
    "titans": (lambda: module("titans"), "titans", None),  # mlp memory, one partial mini-batch
    "titans_c2": (lambda: mirasc.compile_spec(_titans_c2()), "titans", None),  # mlp, 3 mini-batches of 2
}


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
@pytest.mark.parametrize("case", sorted(GRADCHECK))
def test_gradcheck(case, algorithm):
    get_mod, ref_name, chunk = GRADCHECK[case]
    mod = get_mod()
    if algorithm == "chunked" and not mod.CHUNKED:
        pytest.skip("no chunked algorithm for this spec")
    q, k, v, gates, state = make_case(ref_name, f64, T=5, Dk=3, Dv=3, b=1, h=1)
    gnames, snames = list(gates), list(state)
    leaves = [x.requires_grad_(True) for x in (q, k, v, *gates.values(), *state.values())]

    def fn(*xs):
        g = dict(zip(gnames, xs[3 : 3 + len(gnames)]))
        s = dict(zip(snames, xs[3 + len(gnames) :]))
        o, final = mod.apply(
            xs[0], xs[1], xs[2], g, state=s, backend="torch", algorithm=algorithm,
            chunk_size=chunk if algorithm == "chunked" else None,
        )  # fmt: skip
        return (o, *(final[key] for key in snames))

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_titans_c2_matches_reference():
    """The mini-batch variant used by gradcheck, also against the reference (chunk boundaries at T=5)."""
    mod = mirasc.compile_spec(_titans_c2())
    cfg = dict(REF_CONFIGS["titans"], parallel=2)
    q, k, v, gates, state = make_case("titans", f64, T=5, Dk=3, Dv=3, b=1, h=1)
    want = reference_apply(cfg, q, k, v, gates, state)
    for algorithm in ("recurrent", "chunked") if mod.CHUNKED else ("recurrent",):
        got = mod.apply(q, k, v, gates, state=state, backend="torch", algorithm=algorithm)
        tol = 1e-10 if algorithm == "recurrent" else 1e-9
        compare(got, want, tol, f"titans minibatch(2) {algorithm} vs reference")


# ------------------------------------------------------------------------------------------ edge shapes


@params
def test_edge_lengths_and_unequal_dims(name):
    """T = 1, one full chunk, one chunk + 1; Dk != Dv where the memory allows it; B=1, H=3."""
    mod = module(name)
    cfg = REF_CONFIGS[name]
    mem = cfg["memory"]
    Dk, Dv = (5, 5) if mem["kind"] == "mlp" and mem["residual"] else (5, 3)
    C = cfg["parallel"]
    chunk = C if C is not None else 4
    algorithms = ("recurrent", "chunked") if mod.CHUNKED else ("recurrent",)
    for T in (1, chunk, chunk + 1):
        q, k, v, gates, state = make_case(name, f64, T=T, Dk=Dk, Dv=Dv, b=1, h=3)
        want = reference_apply(name, q, k, v, gates, state)
        gates, extras = split_extras(mod, gates)
        for algorithm in algorithms:
            got = mod.apply(
                q, k, v, gates, state=state, backend="torch", algorithm=algorithm,
                chunk_size=4 if (algorithm == "chunked" and C is None) else None, **extras,
            )  # fmt: skip
            assert got[0].shape == (1, T, 3, Dv)
            tol = 1e-10 if algorithm == "recurrent" else 1e-9
            compare(got, want, tol, f"{name} {algorithm} T={T} Dk={Dk} Dv={Dv} vs reference")


@params
def test_default_arguments(name):
    """backend/algorithm 'auto' compute the same function; state=None gives a state with the documented keys."""
    mod = module(name)
    q, k, v, gates, state = make_case(name, f64, T=9, b=1, h=2)
    want = reference_apply(name, q, k, v, gates, state)
    gates, extras = split_extras(mod, gates)
    compare(mod.apply(q, k, v, gates, state=state, **extras), want, 1e-9, f"{name} auto vs reference")
    o, final = mod.apply(q, k, v, gates, **extras)
    assert o.shape == (*v.shape[:3], v.shape[-1]) and torch.isfinite(o).all()  # (v: [B, T, H, STEPS, Dv] multi-step)
    assert set(final) == set(state_keys(name))
    for key in state:
        assert final[key].shape == state[key].shape, key
