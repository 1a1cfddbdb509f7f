"""mirasc.runtime.layer_state, the Layer's spec-independent state handling every emitted module carries: the compute
dtype, a decoding cache's dtype, and a cache that keeps a padding row as it was (tensors, token counts, the conv
history that starts as None), each checked on hand-made caches."""

from __future__ import annotations

import torch

from mirasc.runtime.layer_state import _compute_dtype, _keep_rows, _state_dtype


def test_compute_dtype():
    assert [_compute_dtype(d) for d in (torch.float64, torch.float32, torch.bfloat16, torch.float16)] == \
        [torch.float64, torch.float32, torch.float32, torch.float32]


def test_state_dtype_is_the_first_floating_tensor_of_the_carry():
    carry = ({"t": 3, "idx": torch.zeros(2, dtype=torch.long)}, [torch.zeros(2, dtype=torch.float64)])
    assert _state_dtype({"carry": carry}) == torch.float64
    assert _state_dtype({"carry": {"t": 0}}) == torch.float32


def test_keep_rows_keeps_padding_rows_as_they_were():
    keep = torch.tensor([True, False, True])
    old = {"W": torch.zeros(3, 2, 2), "t": 4, "nested": [torch.zeros(3)], "tag": "x"}
    new = {"W": torch.ones(3, 2, 2), "t": 5, "nested": [torch.ones(3)], "tag": "y", "fresh": torch.ones(3)}
    out = _keep_rows(keep, new, old)
    assert out["W"][:, 0, 0].tolist() == [1.0, 0.0, 1.0] and out["nested"][0].tolist() == [1.0, 0.0, 1.0]
    assert out["t"].tolist() == [5, 4, 5]  # one token count per row from here on
    assert out["tag"] == "y" and torch.equal(out["fresh"], new["fresh"])  # not in the old cache: the new one
    history = _keep_rows(keep, torch.ones(3, 2, 4), None)  # the conv history starts as None: zeros
    assert history[:, 0, 0].tolist() == [1.0, 0.0, 1.0]


def test_positive_weights_are_learned_through_their_logits():
    from mirasc.runtime.layer_state import _constrained, _unconstrained

    torch.manual_seed(0)
    rows = torch.softmax(torch.randn(2, 3, 4, dtype=torch.float64), -1) * 4.0  # kl with c = 4: rows sum to 4
    logits = _unconstrained("W1", rows, "softmax", 4.0)
    assert torch.allclose(_constrained("W1", logits, "softmax", 4.0), rows)
    assert torch.allclose(_constrained("A_W1", _unconstrained("A_W1", rows, "exp"), "exp"), rows)
    assert torch.allclose(_unconstrained("W", rows, "exp"), rows.log())
    for name in ("S_W1", "win_k", "A"):  # carried as they are, any sign
        x = torch.randn(3)
        assert _unconstrained(name, x, "softmax", 4.0) is x and _constrained(name, x, "exp") is x
    x = torch.randn(3)
    assert _unconstrained("W", x, None) is x and _constrained("W", x, None) is x
