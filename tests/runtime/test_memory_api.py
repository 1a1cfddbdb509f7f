"""A parametric memory's op (mirasc/runtime/memory_api.py), imported as it is over the example memory of
mirasc.runtime.memory_hooks (a linear memory with the l2 bias: the delta rule): the torch recurrence and chunk form
against the example's own token loop, the checks at the door, the state, packed sequences, the hooks, and which run
backend='triton' takes. Every bundled spec's op is tested through its emitted module (tests/module,
tests/triton_backend)."""

import pytest
import torch

from mirasc.runtime import memory_api, memory_hooks, precond


def data(B=2, T=11, H=2, Dk=4, Dv=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, Dk, generator=g, dtype=torch.float64) for _ in range(2))
    k = k / k.norm(dim=-1, keepdim=True)  # (a stable delta rule: η‖k‖² < 2)
    v = torch.randn(B, T, H, Dv, generator=g, dtype=torch.float64)
    eta = torch.rand(B, T, H, generator=g, dtype=torch.float64)
    return q, k, v, {"eta": eta}


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
def test_torch_paths_match_the_token_loop(algorithm):
    q, k, v, gates = data()
    W0 = torch.randn(2, 2, 3, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    o, final = memory_api._apply_memory(q, k, v, gates, state={"W": W0}, backend="torch", algorithm=algorithm,
                                        chunk_size=4)
    ref, ref_final = memory_hooks._apply_memory(q, k, v, gates, state={"W": W0})
    assert o.dtype == torch.float64 and set(final) == {"W"}
    assert torch.allclose(o, ref, atol=1e-12) and torch.allclose(final["W"], ref_final["W"], atol=1e-12)


def test_a_plain_memory_s_apply_and_init_state_are_its_memory_s():
    assert memory_api.apply is memory_api._apply_memory
    assert memory_api.init_state is memory_hooks._init_memory_state


def test_16_bit_inputs_compute_in_float32_and_come_back_in_their_dtype():
    q, k, v, gates = data()
    q, k, v, gates = q.bfloat16(), k.bfloat16(), v.bfloat16(), {"eta": gates["eta"].bfloat16()}
    o, final = memory_api._apply_memory(q, k, v, gates, backend="torch")
    assert o.dtype == torch.bfloat16 and final["W"].dtype == torch.float32
    o, _ = memory_api._apply_memory(q, k, v, gates, backend="torch", _out=torch.float32)
    assert o.dtype == torch.float32  # (a composite memory takes its memory's output in fp32)


def test_an_empty_sequence_leaves_the_state_as_it_was():
    q, k, v, gates = data(T=0)
    W0 = torch.ones(2, 2, 3, 4, dtype=torch.float64)
    o, final = memory_api._apply_memory(q, k, v, gates, state={"W": W0})
    assert o.shape == (2, 0, 2, 3) and torch.equal(final["W"], W0)


@pytest.mark.parametrize("kwargs,error,message", [
    ({"backend": "cuda"}, ValueError, "backend must be 'auto', 'torch' or 'triton'"),
    ({"algorithm": "fast"}, ValueError, "algorithm must be 'auto', 'recurrent' or 'chunked'"),
    ({"params": {"w": torch.ones(1)}}, ValueError, r"takes no params, got \['w'\]"),
    ({"state": {"S": torch.ones(1)}}, ValueError, r"state is missing \['W'\]"),
    ({"state": {"W": torch.ones(2, 2, 4, 3)}}, ValueError, r"state\['W'\] has shape \(2, 2, 4, 3\), expected"),
    ({"chunk_size": 0, "algorithm": "chunked"}, ValueError, "chunk_size must be >= 1"),
])
def test_bad_calls_are_refused_with_the_reason(kwargs, error, message):
    q, k, v, gates = data()
    with pytest.raises(error, match=message):
        memory_api._apply_memory(q, k, v, gates, **kwargs)


def test_bad_shapes_and_types_are_refused():
    q, k, v, gates = data()
    with pytest.raises(ValueError, match=r"expected q, k \[B, T, H, Dk\]"):
        memory_api._apply_memory(q, k[:, :-1], v, gates)
    with pytest.raises(TypeError, match="k must be a tensor"):
        memory_api._apply_memory(q, k.tolist(), v, gates)
    with pytest.raises(TypeError, match="gates must be a dict"):
        memory_api._apply_memory(q, k, v, [gates["eta"]])


def test_positive_weights_and_a_residual_memory_s_widths_are_checked(monkeypatch):
    q, k, v, gates = data()
    W0 = torch.ones(2, 2, 3, 4, dtype=torch.float64)
    monkeypatch.setattr(memory_api, "POSITIVE_WEIGHTS", True)
    memory_api._apply_memory(q, k, v, gates, state={"W": W0})
    with pytest.raises(ValueError, match="initial weights must be > 0"):
        memory_api._apply_memory(q, k, v, gates, state={"W": W0 - 2})
    monkeypatch.setattr(memory_api, "RESIDUAL", True)
    with pytest.raises(ValueError, match=r"residual=true needs Dk == Dv \(got Dk=4, Dv=3\)"):
        memory_api._apply_memory(q, k, v, gates, state={"W": W0})


def test_packed_sequences_are_the_sequences_run_alone():
    q, k, v, gates = data(B=1, T=13)
    cu = torch.tensor([0, 5, 5, 13])
    state = {"W": torch.randn(3, 2, 3, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)}
    assert not memory_api._packed_on_chunk_kernels(q, v, "torch", "auto", None)
    assert memory_api._packed_apply is memory_api._packed_per_sequence  # (PACKED is False: one call per sequence)
    o, final = memory_api._apply_memory(q, k, v, gates, state=state, cu_seqlens=cu, algorithm="chunked",
                                        chunk_size=2)
    for i, (a, b) in enumerate(((0, 5), (5, 5), (5, 13))):
        if a == b:  # (an empty sequence: its state as it was)
            assert o[:, a:b].numel() == 0 and torch.equal(final["W"][i], state["W"][i])
            continue
        one, one_final = memory_hooks._apply_memory(q[:, a:b], k[:, a:b], v[:, a:b], {"eta": gates["eta"][:, a:b]},
                                                    state={"W": state["W"][i:i + 1]})
        assert torch.allclose(o[:, a:b], one, atol=1e-12) and torch.allclose(final["W"][i:i + 1], one_final["W"])


def test_padding_tokens_are_no_ops():
    """The pad mask the one-launch packed path passes: a padded row's output and final state are its real tokens'."""
    q, k, v, gates = data(B=1, T=9)
    mask = torch.arange(9)[None] < 6
    o, final = memory_api._apply_memory(q, k * mask[..., None, None], v * mask[..., None, None], gates,
                                        backend="torch", _pad_mask=mask)
    ref, ref_final = memory_hooks._apply_memory(q[:, :6], k[:, :6], v[:, :6], {"eta": gates["eta"][:, :6]})
    assert torch.allclose(o[:, :6], ref, atol=1e-12) and torch.allclose(final["W"], ref_final["W"], atol=1e-12)


def test_the_preconditioner_hook_runs_before_the_memory_and_returns_its_statistic(monkeypatch):
    q, k, v, gates = data()
    seen = {}

    def preconditioned(c, kh, state, compute, pad_mask=None):
        seen.update(k=kh, compute=compute)
        return {**c, "eta": c["eta"] * 0}, state, torch.full((2, 2, 4), 7.0)

    monkeypatch.setattr(memory_api, "_preconditioned", preconditioned)
    o, final = memory_api._apply_memory(q, k, v, gates)
    assert torch.equal(seen["k"], k.transpose(1, 2)) and seen["compute"] == torch.float64
    assert torch.equal(o, torch.zeros_like(o)) and torch.equal(final["A"], torch.full((2, 2, 4), 7.0))


def test_the_preconditioned_learner_s_hook():
    """precond._preconditioned: η ⊙ m(a_t) on the key channels, the memory's state without "A", and a_T."""
    B, H, T, Dk = 1, 2, 5, 3
    k = torch.randn(B, H, T, Dk, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    c = {n: torch.full((B, H, T), x, dtype=torch.float64) for n, x in (("eta", 0.5), ("nu", 0.9), ("rho", 0.1))}
    state = {"W": torch.zeros(B, H, 2, Dk), "A": torch.zeros(B, H, Dk)}
    c2, rest, stat = precond._preconditioned(c, k.float(), state, torch.float64)
    assert set(rest) == {"W"} and set(c2) == {"eta", "eta_ch"}
    assert torch.equal(c2["eta"], torch.ones(B, H, T, dtype=torch.float64))
    a = torch.zeros(B, H, Dk, dtype=torch.float64)
    for t in range(T):
        a = 0.9 * a + 0.1 * k.float().double()[:, :, t] ** 2
    assert torch.allclose(stat, a) and torch.allclose(c2["eta_ch"][:, :, -1], 0.5 * precond._multiplier(a))


def test_the_triton_runs_dispatch_by_algorithm(monkeypatch):
    """Each family's run: the chunk kernels or the fused recurrent kernel by the route's algorithm; a padded row's
    validity reaches the chunk kernels (the momentum family's no-op needs it), its lengths the mini-batch kernels."""
    calls = []
    monkeypatch.setattr(memory_api, "_recurrent_triton", lambda *a: calls.append("recurrent") or ("o", "s"))
    monkeypatch.setattr(memory_api, "_on_chunk_kernels",
                        lambda fn, q, k, v, c, s, chunk, **kw: calls.append((fn, sorted(c), sorted(kw))) or ("o", "s"))
    q = torch.zeros(1, 1, 4, 2)
    c, mask = {"eta": torch.ones(1, 1, 4)}, torch.tensor([[True, True, False, False]])
    memory_api._run_chunk_kernels(q, q, q, c, {}, False, None, "ieee", None)
    memory_api._run_chunk_kernels(q, q, q, c, {}, True, 2, "ieee", mask)
    memory_api._run_minibatch_kernels(q, q, q, c, {}, True, 2, "ieee", mask)
    memory_api._run_chunk_readout(q, q, q, c, {}, True, 2, "ieee", None)
    memory_api._run_recurrent_kernel(q, q, q, c, {}, False, None, "ieee", None)
    assert calls == ["recurrent", (memory_api._chunked_triton, ["eta", "valid"], ["prec"]),
                     (memory_api._minibatch_triton, ["eta"], ["lengths", "prec"]),
                     (memory_api._chunk_readout_triton, ["eta"], ["prec"]), "recurrent"]
