"""mirasc.runtime.attention_api, the nonparametric memories' op, with the example choices of
mirasc.runtime.attention_spec (causal softmax attention, no decay, no Triton kernel): apply against softmax attention
written out, packed sequences against separate calls, the route and launch_plan, the refusals of backend='triton'."""

import pytest
import torch

from mirasc.runtime import attention_api as api

D64 = torch.float64


def _softmax_attention(q, k, v):
    """[B, T, H, D], causal, scale 1/sqrt(Dk)."""
    s = torch.einsum("bthd,bshd->bhts", q, k) / q.shape[-1] ** 0.5
    mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril()
    return torch.einsum("bhts,bshd->bthd", s.masked_fill(~mask, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("algorithm,chunk", [("recurrent", None), ("chunked", 3), ("auto", None)])
def test_apply_is_softmax_attention_and_continues_its_cache(algorithm, chunk):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 3, 4, generator=g, dtype=D64) for _ in range(3))
    o, cache = api.apply(q, k, v, algorithm=algorithm, chunk_size=chunk)
    torch.testing.assert_close(o, _softmax_attention(q, k, v))
    o1, c1 = api.apply(q[:, :5], k[:, :5], v[:, :5], algorithm=algorithm, chunk_size=chunk)
    o2, _ = api.apply(q[:, 5:], k[:, 5:], v[:, 5:], state=c1, algorithm=algorithm, chunk_size=chunk)
    torch.testing.assert_close(torch.cat([o1, o2], 1), o)


def test_packed_sequences_read_only_their_own_tokens():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 10, 2, 4, generator=g, dtype=D64) for _ in range(3))
    o, caches = api.apply(q, k, v, cu_seqlens=torch.tensor([0, 4, 10]))
    assert len(caches) == 2
    torch.testing.assert_close(o[:, :4], _softmax_attention(q[:, :4], k[:, :4], v[:, :4]))
    torch.testing.assert_close(o[:, 4:], _softmax_attention(q[:, 4:], k[:, 4:], v[:, 4:]))


def test_the_route_and_the_launch_plan_without_triton_kernels():
    cpu = torch.device("cpu")
    assert api._route(8, 8, torch.float32, cpu, "auto", "auto", None) == (
        "torch", True, api.DEFAULT_CHUNK, "no Triton kernel for this nonparametric memory: an example")
    assert api._route(8, 8, torch.float32, cpu, "torch", "recurrent", None)[:3] == ("torch", False, None)
    plan = api.launch_plan(64, 64, device="sm_90")
    assert plan == {"backend": "torch", "algorithm": "chunked", "chunk": api.DEFAULT_CHUNK, "precision": None,
                    "kernels": {}, "reason": "no Triton kernel for this nonparametric memory: an example"}
    with pytest.raises(RuntimeError, match="no Triton kernel for this nonparametric memory: an example"):
        api.apply(*(torch.randn(1, 2, 1, 4) for _ in range(3)), backend="triton")
    with pytest.raises(RuntimeError, match="use backend='torch'"):
        api._triton_apply(*(torch.randn(1, 2, 1, 4) for _ in range(3)), {}, {})


def test_bad_calls_are_refused():
    x = torch.randn(1, 3, 2, 4)
    with pytest.raises(ValueError, match="backend must be"):
        api.apply(x, x, x, backend="cuda")
    with pytest.raises(ValueError, match="algorithm must be"):
        api.apply(x, x, x, algorithm="fast")
    with pytest.raises(ValueError, match="expected q"):
        api.apply(x, x[:, :2], x[:, :2])
