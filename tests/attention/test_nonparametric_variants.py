"""Variants of the nonparametric memory against references written out here, query by query,
in float64: additive (Bahdanau) and polynomial kernels, cross-attention, MemN2N hops with both tyings
and temporal encoding, Multi-Token Attention (key-query convolution, head mixing, head norm).
Also: recurrent == chunked (small query blocks), state carried across calls, Layer step == forward."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import mirasc

SPECS = Path(__file__).resolve().parents[2] / "specs"
D = torch.float64


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def compile_np(args: str):
    return mirasc.compile_spec(f"model m {{ memory = nonparametric({args})\n bias = l2 }}")


def inputs(B=2, T=13, H=2, Dk=6, Dv=6, Tk=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    Tk = Tk or T
    return (torch.randn(B, T, H, Dk, generator=g, dtype=D), torch.randn(B, Tk, H, Dk, generator=g, dtype=D),
            torch.randn(B, Tk, H, Dv, generator=g, dtype=D))


def random_params(mod, H, Dk, Dv, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {n: p + 0.3 * torch.randn(p.shape, generator=g, dtype=D) for n, p in
            mod.init_params(H, Dk, Dv, dtype=D).items()}


# ------------------------------------------------------------------ references, one query at a time
def nw(weights, values):
    return (weights[:, None] * values).sum(0) / weights.sum()


def ref_read(kind, q, k, v, p, *, scale, causal=True, window=0, degree=2):
    """q [T, Dk], k [Tk, Dk], v [Tk, Dv] of one (batch, head); p the head's params."""
    out = []
    for t in range(q.shape[0]):
        idx = [s for s in range(k.shape[0]) if not causal or (s <= t and (not window or t - s < window))]
        kk, vv = k[idx], v[idx]
        if kind == "softmax":
            logit = scale * kk @ q[t]
            w = torch.exp(logit - logit.max())
        elif kind == "additive":
            w = torch.exp(torch.tanh(p["additive_q"] @ q[t] + kk @ p["additive_k"].T) @ p["additive_w"])
        else:
            x = scale * kk @ q[t]
            w = sum(x**i / math.factorial(i) for i in range(degree + 1))
        out.append(nw(w, vv))
    return torch.stack(out)


def per_head(fn, q, k, v, params, **kw):
    B, T, H, _ = q.shape
    o = torch.empty(B, T, H, v.shape[-1], dtype=D)
    for b in range(B):
        for h in range(H):
            ph = {n: (t[:, h] if n == "hop_value" else t[h]) for n, t in params.items()}
            o[b, :, h] = fn(q[b, :, h], k[b, :, h], v[b, :, h], ph, **kw)
    return o


@pytest.mark.parametrize("args,kind,kw", [
    ("kernel=additive", "additive", {}),
    ("kernel=additive, causal=false", "additive", {"causal": False}),
    ("kernel=poly, degree=4, scale=0.5", "poly", {"degree": 4, "scale": 0.5}),
    ("kernel=softmax, window=4", "softmax", {"window": 4}),
    ("kernel=softmax, causal=false, scale=0.7", "softmax", {"causal": False, "scale": 0.7}),
])
@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
def test_kernels(args, kind, kw, algorithm):
    mod = compile_np(args)
    Tk = 9 if kw.get("causal") is False else None
    q, k, v = inputs(Tk=Tk)
    params = random_params(mod, 2, 6, 6)
    kw = {"scale": 1 / math.sqrt(6), **kw}
    for t in (q, k, v, *params.values()):
        t.requires_grad_(True)
    o, _ = mod.apply(q, k, v, params=params, algorithm=algorithm, chunk_size=5)
    ref = per_head(lambda *a, **x: ref_read(kind, *a, **x), q, k, v, params, **kw)
    assert rel(o, ref) < 1e-12
    leaves = (q, k, v, *params.values())
    ga = torch.autograd.grad(o.square().sum(), leaves, allow_unused=True)
    gb = torch.autograd.grad(ref.square().sum(), leaves, allow_unused=True)
    for a, b in zip(ga, gb):
        assert (a is None) == (b is None) and (a is None or rel(a, b) < 1e-10)


def ref_memn2n(q, k, v, p, *, hops, tying, temporal):
    """Cross-attention MemN2N: temporal index d = Tk-1-s (latest memory first)."""
    Tk = k.shape[0]
    d = torch.arange(Tk - 1, -1, -1)
    inside = (d < temporal).to(D)[:, None] if temporal else None
    u, keys, values = q, k, v
    for h in range(hops):
        kk, vv = keys, values
        if temporal:
            kk = kk + inside * p["temporal_key"][d.clamp_max(temporal - 1)]
            vv = vv + inside * p["temporal_value"][d.clamp_max(temporal - 1)]
        o = torch.stack([nw(torch.softmax(kk @ u[t], 0), vv) for t in range(u.shape[0])])
        if tying == "adjacent":
            u = u + o
            if h < hops - 1:
                keys, values = values, values @ p["hop_value"][h]
        else:
            u = u @ p["hop_query"] + o
    return u - q


@pytest.mark.parametrize("tying", ["adjacent", "layerwise"])
@pytest.mark.parametrize("temporal", [0, 5])
def test_memn2n_hops(tying, temporal):
    mod = compile_np(f"scale=1, causal=false, hops=3, tying={tying}, temporal={temporal}")
    q, k, v = inputs(T=4, Tk=8)
    params = random_params(mod, 2, 6, 6)
    o, state = mod.apply(q, k, v, params=params)
    assert state is None
    ref = per_head(ref_memn2n, q, k, v, params, hops=3, tying=tying, temporal=temporal)
    assert rel(o, ref) < 1e-12


def ref_mta(q, k, v, theta, mix, norm_w, scale):
    """Full score matrices for all heads of one batch: q [T, H, Dk] -> o [T, H, Dv]."""
    T, H, _ = q.shape
    cq, ck = theta.shape[1:]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    a = torch.einsum("thd,shd->hts", q, k) * scale
    a = a.masked_fill(~causal, 0.0)
    conv = torch.zeros_like(a)
    for h in range(H):
        for t in range(T):
            for s in range(T):
                acc = 0.0
                for i in range(cq):
                    for j in range(-(ck // 2), ck // 2 + 1):
                        if t - i >= 0 and 0 <= s - j < T:
                            acc = acc + theta[h, cq - 1 - i, ck // 2 - j] * a[h, t - i, s - j]
                conv[h, t, s] = acc
    G = mix.shape[-1]
    mixed = torch.einsum("gij,gjts->gits", mix, conv.view(H // G, G, T, T)).reshape(H, T, T)
    w = torch.softmax(mixed.masked_fill(~causal, float("-inf")), -1)
    o = torch.einsum("hts,shd->thd", w, v)
    return F.rms_norm(o, (o.shape[-1],), eps=1e-6) * norm_w[None]


def test_multi_token_attention():
    mod = compile_np("kernel=softmax, score_conv=(3, 3), head_mix=2, head_norm=true")
    q, k, v = inputs(B=1, T=9, H=4)
    params = random_params(mod, 4, 6, 6)
    o_rec, _ = mod.apply(q, k, v, params=params, algorithm="recurrent")
    o_chk, _ = mod.apply(q, k, v, params=params, algorithm="chunked", chunk_size=4)
    ref = ref_mta(q[0], k[0], v[0], params["score_conv"], params["head_mix"], params["head_norm"],
                  1 / math.sqrt(6))[None]
    assert rel(o_rec, ref) < 1e-12 and rel(o_chk, ref) < 1e-12
    # carried across calls: the cache keeps the last cq-1 queries for the convolution
    a, cache = mod.apply(q[:, :5], k[:, :5], v[:, :5], params=params)
    b, _ = mod.apply(q[:, 5:], k[:, 5:], v[:, 5:], params=params, state=cache)
    assert rel(torch.cat([a, b], 1), ref) < 1e-12


def test_mta_identity_init_is_plain_attention():
    mod = compile_np("kernel=softmax, score_conv=(6, 11), head_mix=2")
    plain = compile_np("kernel=softmax")
    q, k, v = inputs(B=1, T=12, H=2)
    assert rel(mod.apply(q, k, v)[0], plain.apply(q, k, v)[0]) < 1e-12


@pytest.mark.parametrize("name", ["bahdanau", "memn2n", "mta"])
def test_bundled_specs_layer(name):
    mod = mirasc.compile_spec(SPECS / f"{name}.miras")
    torch.manual_seed(0)
    layer = mod.Layer(16, 2).double()
    x = torch.randn(2, 11, 16, dtype=D)
    y = layer(x)
    assert torch.isfinite(y).all()
    y.square().sum().backward()
    assert all(p.grad is not None for p in layer.read_params.values())
    if mod.CAUSAL:  # step == forward for causal memories
        cache = layer.init_cache(2)
        steps = []
        for t in range(11):
            y_t, cache = layer.step(x[:, t], cache)
            steps.append(y_t)
        assert rel(torch.stack(steps, 1), y) < 1e-12


def test_rejections():
    for bad, why in [("kernel=poly, degree=3", "even degree"), ("kernel=additive, score_conv=(2, 3)", "softmax"),
                     ("window=4, causal=false", "sliding window"), ("kernel=additive, temporal=4", "softmax")]:
        with pytest.raises(mirasc.SpecError, match=why):
            compile_np(bad)
