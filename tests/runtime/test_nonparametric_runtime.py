"""The nonparametric memories' torch path (mirasc.runtime.nonparametric) as a unit, and the emitted modules that carry
it: each sets every spec choice the path reads in its own header (docs/semantics.md, nonparametric memories)."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
import torch

from mirasc.codegen.standalone import runtime_source
from mirasc.compiler import compile_text
from mirasc.runtime import nonparametric as npm

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
D64 = torch.float64


def _spec_choices() -> list[str]:
    """The spec's choices (constants) the path imports from mirasc.runtime.attention_spec."""
    tree = ast.parse((ROOT / "mirasc" / "runtime" / "nonparametric.py").read_text(encoding="utf-8"))
    return [a.name for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == "attention_spec"
            for a in node.names if a.name.isupper()]


def _softmax_attention(q, k, v):
    """Causal softmax attention written out, [B, H, T, D], scale 1/sqrt(Dk)."""
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def test_every_nonparametric_module_sets_the_choices_its_path_reads():
    names = _spec_choices()
    assert len(names) == 15 and "KERNEL" in names and "DECAY" in names
    modules = 0
    for path in sorted(SPECS.glob("*.miras")):
        src = compile_text(path.read_text()).source
        if "def _hops(" not in src:
            continue  # (a parametric memory)
        modules += 1
        assert src.count(runtime_source("nonparametric")) == 1, path.stem
        head = src[:src.index(runtime_source("nonparametric"))]
        missing = [n for n in names if not re.search(rf"^{n} = ", head, re.M)]
        assert missing == [], (path.stem, missing)
        assert "\ndef _coefficients(" in src, path.stem  # the module's own, which the path's layer read calls
    assert modules >= 5


@pytest.mark.parametrize("block", [1, 3, 16])
def test_causal_softmax_recurrent_and_chunked_match_attention_written_out(block):
    """With the defaults (causal softmax attention): the token-by-token reference and the query blocks against the
    cache both equal softmax attention in float64, from an empty cache and continuing a filled one."""
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 3, 11, 8
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=D64) for _ in range(3))
    params = npm.init_params(H, D, D, dtype=D64)
    state = npm.init_state(B, H, D, D, dtype=D64)
    want = _softmax_attention(q, k, v)
    o_rec, carry = npm._recurrent(q, k, v, state, params, {})
    o_chk, cache = npm._chunked(q, k, v, state, params, block, {})
    assert torch.allclose(o_rec, want, rtol=1e-12, atol=1e-13)
    assert torch.allclose(o_chk, want, rtol=1e-12, atol=1e-13)
    assert torch.equal(carry["K"], k) and torch.equal(cache["V"], v)
    first, _ = npm._chunked(q[:, :, :5], k[:, :, :5], v[:, :, :5], state, params, block, {})
    _, half = npm._recurrent(q[:, :, :5], k[:, :, :5], v[:, :, :5], state, params, {})
    rest, _ = npm._chunked(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], half, params, block, {})
    assert torch.allclose(torch.cat([first, rest], dim=2), want, rtol=1e-12, atol=1e-13)


def test_a_sliding_window_reads_only_the_last_pairs(monkeypatch):
    """The constants are the spec's: with WINDOW = 3 query t reads pairs t-2..t."""
    monkeypatch.setattr(npm, "WINDOW", 3)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 9, 4, generator=g, dtype=D64) for _ in range(3))
    params, state = npm.init_params(1, 4, 4, dtype=D64), npm.init_state(1, 1, 4, 4, dtype=D64)
    o, _ = npm._chunked(q, k, v, state, params, 4, {})
    for t in range(9):
        s0 = max(0, t - 2)
        w = torch.softmax((q[:, :, t:t + 1] @ k[:, :, s0:t + 1].transpose(-1, -2)) / 2.0, dim=-1)  # 1/sqrt(4)
        assert torch.allclose(o[:, :, t:t + 1], w @ v[:, :, s0:t + 1], rtol=1e-12), t


def test_the_forget_gate_reaches_the_algorithms_as_log_alpha(monkeypatch):
    """_coefficients: no decay, none; the gate α as log α [B, H, T], floored at the dtype's smallest normal number
    where α = 0 (never −inf); a per-head constant and a constant α as the same log per head or everywhere."""
    B, T, H = 2, 5, 3
    like = torch.zeros(B, T, H, 4, dtype=D64)
    assert npm._coefficients({}, like) == {}
    alpha = torch.rand(B, T, H, dtype=D64)
    alpha[0, 2, 1] = 0.0
    monkeypatch.setattr(npm, "DECAY", "gate")
    got = npm._coefficients({"alpha": alpha}, like)["log_alpha"]
    floor = torch.finfo(D64).tiny
    assert got.shape == (B, H, T) and torch.equal(got, torch.log(alpha.clamp_min(floor)).transpose(1, 2))
    assert torch.isfinite(got).all() and got[0, 1, 2] == torch.log(torch.tensor(floor, dtype=D64))
    monkeypatch.setattr(npm, "DECAY", "per_head")
    monkeypatch.setattr(npm, "_per_head_coefficients",
                        lambda n, device: {"alpha": torch.tensor([0.5, 0.9, 0.0], dtype=D64)[:n]})
    got = npm._coefficients({}, like)["log_alpha"]
    assert got.shape == (B, H, T) and torch.allclose(got[1, :2, 3], torch.log(torch.tensor([0.5, 0.9], dtype=D64)))
    assert torch.isfinite(got).all()
    monkeypatch.setattr(npm, "DECAY", 0.25)
    got = npm._coefficients({}, like)["log_alpha"]
    assert got.shape == (B, H, T) and torch.allclose(got, torch.full((B, H, T), math.log(0.25), dtype=D64))
