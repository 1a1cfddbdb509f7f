"""The synthetic benchmarks of `mirasc.lab.tasks`: well-formed, deterministic, and every scored target
derivable from its causal prefix (an independent oracle recovers it)."""

import dataclasses
import re

import pytest
import torch

from mirasc.lab import tasks as T

MQAR_CONFIGS = [T.MQARConfig(), T.MQARConfig(seq_len=128, num_kv_pairs=16, num_queries=5),
                T.MQARConfig(seq_len=40, num_kv_pairs=10, random_non_queries=True)]


@pytest.mark.parametrize("cfg", MQAR_CONFIGS, ids=["default", "subset", "random-fill"])
def test_mqar_oracle_keys_and_masks(cfg):
    x, y, m = T.generate_mqar(cfg, 32, seed=3)
    T.check_mqar(cfg, x, y, m)                 # raises on any violation
    N, Q = cfg.num_kv_pairs, cfg.num_queries or cfg.num_kv_pairs
    # independent restatement of the layout
    assert x.shape == y.shape == m.shape == (32, cfg.seq_len) and x.dtype == y.dtype == m.dtype == torch.int64
    assert ((x >= 0) & (x < 256)).all()
    for b in range(32):
        keys = x[b, 0:2 * N:2].tolist()
        values = x[b, 1:2 * N:2].tolist()
        assert len(set(keys)) == N                                   # keys unique
        assert m[b, : 2 * N].sum() == 0 and m[b].sum() == Q          # scored only in the query region
        for t in m[b].nonzero().flatten().tolist():
            k = x[b, t].item()
            assert k in keys and y[b, t].item() == values[keys.index(k)]     # the target is the key's value
        assert (y[b][m[b] == 0] == T.IGNORE).all()
        asked = [x[b, t].item() for t in m[b].nonzero().flatten().tolist()]
        assert len(set(asked)) == Q                                  # each queried key asked once
    oracle = T.oracle_mqar(x, m)
    assert torch.equal(oracle[m.bool()], y[m.bool()])


def test_mqar_deterministic_and_seeded():
    cfg = T.MQARConfig()
    a, b, c = T.generate_mqar(cfg, 8, seed=1), T.generate_mqar(cfg, 8, seed=1), T.generate_mqar(cfg, 8, seed=2)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_mqar_power_law_prefers_short_gaps():
    cfg = T.MQARConfig(seq_len=256, num_kv_pairs=8)
    _, _, m = T.generate_mqar(cfg, 64, seed=0)
    pos = m.nonzero()[:, 1].float() - 2 * cfg.num_kv_pairs
    assert pos.mean() < (cfg.seq_len - 2 * cfg.num_kv_pairs) / 2 * 0.8


def test_checks_catch_corruption():
    """The checks are not vacuous: a wrong target, a duplicated key, a misplaced mask all fail."""
    cfg = T.MQARConfig()
    x, y, m = T.generate_mqar(cfg, 4, seed=0)
    t = m[0].nonzero()[0, 0]
    y_bad = y.clone()
    y_bad[0, t] = y[0, t] + 1 if y[0, t] + 1 in cfg.value_range() else y[0, t] - 1
    with pytest.raises(AssertionError, match="oracle disagrees"):
        T.check_mqar(cfg, x, y_bad, m)
    x_bad = x.clone()
    x_bad[0, 2] = x[0, 0]
    with pytest.raises(AssertionError):
        T.check_mqar(cfg, x_bad, y, m)
    m_bad, y_bad = m.clone(), y.clone()
    m_bad[0, 1], y_bad[0, 1] = 1, x[0, 2]
    with pytest.raises(AssertionError):
        T.check_mqar(cfg, x, y_bad, m_bad)
    xn, yn, mn = T.generate_noisy(T.NoisyConfig(), 2, seed=0)
    t = mn[0].nonzero()[0, 0]
    yn[0, t] = next(v for v in T.NoisyConfig().value_range() if v != yn[0, t])
    with pytest.raises(AssertionError, match="oracle disagrees"):
        T.check_noisy(T.NoisyConfig(), xn, yn, mn)


@pytest.mark.parametrize("needle", ["passkey", "number", "word"])
@pytest.mark.parametrize("haystack", ["noise", "words"])
def test_niah_answer_derivable(needle, haystack):
    cfg = T.NIAHConfig(seq_len=200, needle=needle, haystack=haystack)
    x, y, m = T.generate_niah(cfg, 16, seed=5)
    T.check_niah(cfg, x, y, m)
    for b in range(16):
        text = bytes(x[b].tolist()).decode("ascii")
        answer = bytes(y[b][m[b] == 1].tolist()).decode("ascii")
        assert answer and answer in text[: m[b].nonzero()[0, 0]]      # the answer is in the prompt
        if needle != "word":
            assert re.fullmatch(rf"\d{{{cfg.value_digits}}}", answer)
        assert text.count("Remember it." if needle == "passkey" else "The magic") == 1   # exactly one needle
    assert all(torch.equal(u, v) for u, v in zip((x, y, m), T.generate_niah(cfg, 16, seed=5)))
    assert not torch.equal(x, T.generate_niah(cfg, 16, seed=6)[0])


def test_niah_depth_and_length():
    for depth in (0.0, 0.5, 1.0):
        cfg = T.NIAHConfig(seq_len=400, needle="number", depth=depth)
        x, y, m = T.generate_niah(cfg, 4, seed=0)
        T.check_niah(cfg, x, y, m)
        at = bytes(x[0].tolist()).decode().index("The magic number for")
        assert abs(at / 400 - depth) < 0.25
    with pytest.raises(ValueError, match="too short"):
        T.NIAHConfig(seq_len=40).validate()


def test_niah_oracle_needs_the_needle():
    """Remove the needle from the prompt: the oracle can no longer answer, so check_niah fails."""
    cfg = T.NIAHConfig(seq_len=200, needle="number")
    x, y, m = T.generate_niah(cfg, 2, seed=0)
    text = bytes(x[0].tolist()).decode()
    i = text.index("The magic number for")
    x[0, i: i + 9] = torch.tensor(list(b"The tragi"))
    with pytest.raises(AssertionError, match="oracle disagrees"):
        T.check_niah(cfg, x, y, m)


@pytest.mark.parametrize("cfg", [T.NoisyConfig(), T.NoisyConfig(seq_len=200, key_len=3, query_noise=2, repeats=5,
                                                                 outlier_prob=1.0, num_queries=4),
                                 T.NoisyConfig(repeats=1, outlier_prob=0.0, query_noise=0)])
def test_noisy_derivable_and_deterministic(cfg):
    x, y, m = T.generate_noisy(cfg, 16, seed=7)
    T.check_noisy(cfg, x, y, m)
    assert all(torch.equal(u, v) for u, v in zip((x, y, m), T.generate_noisy(cfg, 16, seed=7)))
    assert not torch.equal(x, T.generate_noisy(cfg, 16, seed=8)[0])
    noise = set(cfg.noise_range())
    for b in range(16):
        for t in m[b].nonzero().flatten().tolist():
            query = x[b, t - cfg.key_len + 1: t + 1].tolist()
            assert sum(q in noise for q in query) == cfg.query_noise     # corrupted at query time
            assert x[b, t + 1] == T.FILLER                                  # queries end with a filler


def test_noisy_outliers_defeat_last_write():
    """With outliers, 'the last value written for the key' is often wrong, the majority never is."""
    cfg = T.NoisyConfig(outlier_prob=1.0, query_noise=0)
    x, y, m = T.generate_noisy(cfg, 32, seed=0)
    last_wrong = 0
    for b, t in m.nonzero().tolist():
        key = x[b, t - 1: t + 1].tolist()
        seq = x[b].tolist()
        writes = [seq[i + 2] for i in range(t - 2) if seq[i: i + 2] == key and seq[i + 2] in cfg.value_range()]
        assert len(writes) == cfg.repeats
        last_wrong += writes[-1] != y[b, t].item()
    assert last_wrong > 0.15 * int(m.sum())


def test_at_length_and_registry():
    for name, task in T.TASKS.items():
        cfg = T.make_config(name)
        for L in (cfg.seq_len, 2 * cfg.seq_len):
            c = T.at_length(name, cfg, L)
            x, y, m = T.generate(name, c, 4, seed=0)
            assert x.shape == (4, L)
            T.check(name, c, x, y, m)
        assert dataclasses.is_dataclass(task.config)
    assert T.at_length("mqar", T.MQARConfig(), 128).num_kv_pairs == 16
    with pytest.raises(ValueError, match="unknown mqar option"):
        T.make_config("mqar", kv_pairs=3)


@pytest.mark.parametrize("task,options", [("mqar", {"seq_len": 64, "num_kv_pairs": 8}), ("noisy", {}),
                                          ("niah", {"needle": "number", "value_digits": 3}),
                                          ("niah", {"needle": "word", "seq_len": 128})])
def test_chance_is_the_best_context_free_guess(task, options):
    """tasks.chance against generated data: the answers at scored positions take the assumed values, and the
    best guess per answer position (its most frequent target) scores what chance says, within sampling noise."""
    import collections
    import math

    cfg = T.make_config(task, **options)
    _, targets, mask = T.generate(task, cfg, 600, seed=5)
    p = T.chance(task, cfg)
    by_position = collections.defaultdict(collections.Counter)   # answer position (i-th scored token) -> counts
    for row_t, row_m in zip(targets.tolist(), mask.tolist()):
        answers = [t for t, m in zip(row_t, row_m) if m]
        for i, t in enumerate(answers):   # NIAH: the i-th answer byte; recall tasks: every answer alike
            by_position[i if task == "niah" else 0][t] += 1
    n = sum(sum(c.values()) for c in by_position.values())
    if task == "niah":
        best = sum(max(c.values()) for c in by_position.values()) / n
        assert best == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / n) + 0.01)
    else:   # each value token is equally likely: no guess beats 1/num_keys
        counts = by_position[0]
        assert set(counts) <= set(cfg.value_range()) and p == 1 / len(cfg.value_range())
        assert max(counts.values()) / n < p + 5 * math.sqrt(p / n)
