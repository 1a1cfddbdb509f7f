"""Variable-length sequences packed along time with cu_seqlens (flash-linear-attention's convention):
packed == each sequence run on its own, outputs, final states and gradients, for every spec kind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mirasc

SPECS = Path(__file__).resolve().parents[2] / "specs"
CU = [0, 5, 5, 17, 23]  # includes an empty sequence


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("name,algorithm", [("gated_deltanet", "chunked"), ("titans", "chunked"),
                                            ("moneta", "recurrent"), ("memora", "chunked"),
                                            ("custom_cauchy", "auto"), ("kda", "chunked"), ("gla", "chunked")])
def test_packed_equals_separate(name, algorithm):
    mod = mirasc.compile_spec(SPECS / f"{name}.miras")
    g = torch.Generator().manual_seed(0)
    T, H, D, N = CU[-1], 2, 4, len(CU) - 1
    q, k = (torch.nn.functional.normalize(torch.randn(1, T, H, D, generator=g, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(1, T, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    gates = {n: (0.2 + 0.7 * torch.rand(1, T, H, *([D] if n in mod.GATE_CHANNELS else []), generator=g,
                                        dtype=torch.float64)) for n in mod.GATES}
    state = mod.init_state(N, H, D, D, dtype=torch.float64, generator=g)
    o, final = mod.apply(q, k, v, gates, state=state, algorithm=algorithm, cu_seqlens=torch.tensor(CU))
    for i, (a, b) in enumerate(zip(CU, CU[1:])):
        if a == b:
            continue
        o_i, f_i = mod.apply(q[:, a:b], k[:, a:b], v[:, a:b], {n: x[:, a:b] for n, x in gates.items()},
                             state={n: t[i:i + 1] for n, t in state.items()}, algorithm=algorithm)
        assert rel(o[:, a:b], o_i) < 1e-12
        for n in f_i:
            assert rel(final[n][i:i + 1], f_i[n]) < 1e-12
    # the empty sequence passes its state through unchanged
    for n in final:
        assert torch.equal(final[n][1], state[n][1])
    assert torch.autograd.grad(o.square().sum(), v)[0].abs().sum() > 0


def test_packed_attention_reads_only_its_own_sequence():
    mod = mirasc.compile_spec(SPECS / "transformer.miras")
    q, k, v = (torch.randn(1, CU[-1], 2, 8, dtype=torch.float64) for _ in range(3))
    o, caches = mod.apply(q, k, v, cu_seqlens=CU)
    for i, (a, b) in enumerate(zip(CU, CU[1:])):
        if a < b:
            assert rel(o[:, a:b], mod.apply(q[:, a:b], k[:, a:b], v[:, a:b])[0]) < 1e-12
            assert caches[i]["K"].shape[2] == b - a


def test_bad_offsets_are_rejected():
    mod = mirasc.compile_spec(SPECS / "deltanet.miras")
    x = torch.randn(1, 6, 1, 4)
    with pytest.raises(ValueError, match="cu_seqlens"):
        mod.apply(x, x, x, {"eta": torch.ones(1, 6, 1)}, cu_seqlens=[0, 4, 3, 6])
    with pytest.raises(ValueError, match="batch must be 1"):
        mod.apply(x.expand(2, -1, -1, -1), x.expand(2, -1, -1, -1), x.expand(2, -1, -1, -1),
                  {"eta": torch.ones(2, 6, 1)}, cu_seqlens=[0, 6])
