"""`mirasc verify`: passes on bundled specs, and fails on a module whose chunked path is broken in its output or
only in a gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mirasc import compiler, verify
from mirasc.cli import main

SPECS = Path(__file__).resolve().parents[1] / "specs"


def _module(name):
    path = SPECS / f"{name}.miras"
    compiled = compiler.compile_text(path.read_text(encoding="utf-8"), str(path))
    return compiler.load_source(compiled.source, compiled.spec.name)  # the object `mirasc verify` loads


@pytest.mark.parametrize("name, argv", [("forgetting_transformer", []), ("bahdanau", []),
                                        ("deltanet", ["--backend", "torch"]),
                                        ("ttt_linear", ["--backend", "torch", "--dtype", "float64"])])
def test_verify_passes_on_bundled_specs(name, argv, capsys):
    assert main(["verify", str(SPECS / f"{name}.miras"), *argv]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("PASS: ")
    assert "∂q" in out and "∂v" in out and "state" in out
    if not argv:
        assert "triton" in out


def test_verify_rows_cover_every_algorithm_backend_and_input():
    rows = verify.verify(_module("gated_deltanet"), backends=("torch",))
    assert {(r.algorithm, r.dtype) for r in rows} == {(a, d) for a in ("recurrent", "chunked")
                                                      for d in ("float64", "float32")}
    for r in rows:
        assert r.passed(), r
        assert set(r.errors) == {"o", "state", "∂q", "∂k", "∂v", "∂eta", "∂alpha"}
    chunked64 = next(r for r in rows if r.algorithm == "chunked" and r.dtype == "float64")
    assert 0 < max(chunked64.errors.values()) < 1e-12  # really another computation, equal to rounding


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward scales the gradient (a bug only a gradient check sees)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 1.001


@pytest.mark.parametrize("broken", ["output", "gradient of k"])
def test_verify_fails_on_a_broken_chunked_path(broken, monkeypatch, capsys):
    mod = _module("deltanet")
    apply = mod.apply

    def bad_apply(q, k, v, gates=None, *, algorithm="auto", **kw):
        if algorithm == "chunked" and broken == "gradient of k":
            k = _ScaleGrad.apply(k)
        o, state = apply(q, k, v, gates, algorithm=algorithm, **kw)
        if algorithm == "chunked" and broken == "output":
            o = o * 1.001
        return o, state

    monkeypatch.setattr(mod, "apply", bad_apply)
    assert main(["verify", str(SPECS / "deltanet.miras"), "--backend", "torch"]) == 3
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("FAIL: 2 of 4 checks")
    chunked = [line for line in out.splitlines() if line.startswith("chunked")]
    assert chunked and all(line.rstrip().endswith("FAIL") for line in chunked)
    recurrent = [line for line in out.splitlines() if line.startswith("recurrent")]
    assert recurrent and all(line.rstrip().endswith("ok") for line in recurrent)
    rows = verify.verify(mod, backends=("torch",))
    bad = next(r for r in rows if r.algorithm == "chunked" and r.dtype == "float32")
    tol = verify.TOLERANCE["float32"]
    if broken == "output":
        assert bad.errors["o"] > tol
    else:  # only ∂k is off: the output alone would have passed
        assert [q for q, e in bad.errors.items() if e > tol] == ["∂k"]


def test_verify_bad_spec_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.miras"
    bad.write_text("model m { memory = linear; bias = lp(p=0.5) }")
    assert main(["verify", str(bad)]) == 2
    assert "Traceback" not in capsys.readouterr().err
