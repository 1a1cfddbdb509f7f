"""Synthetic recall benchmarks, generated on the fly (no downloads), for `mirasc explore`.

Three tasks, each a frozen dataclass config, a seeded generator and an oracle:

- **MQAR** (multi-query associative recall, Zoology, Arora et al. 2023): N key-value pairs, then
  queries of (a subset of) the keys at power-law distributed gaps; the target at a query is its value.
- **NIAH** (single needle in a haystack, in the style of RULER's S-NIAH, Hsieh et al. 2024): a
  byte-level text of a configurable length holding one needle (a pass key, a magic number or a magic
  word for a key word) in a haystack (RULER's repeated noise sentences, or random words); the question
  comes at the end and the answer bytes are scored.
- **noisy** (noisy-key recall): multi-token keys written several times, a minority of the copies with
  an outlier (wrong) value, noise tokens between records, and at query time keys corrupted by noise
  tokens; the target is the majority value of the nearest key. A task where robust attentional biases
  (lp, Huber) may matter.

Every generator is `generate_<task>(cfg, n, seed) -> (inputs, targets, mask)`: int64 tensors of shape
[n, seq_len]; `targets[b, t]` is the token to predict after reading `inputs[b, :t+1]` where `mask` is 1
and `IGNORE` (-100, `F.cross_entropy`'s ignore index) elsewhere. All tokens are < `VOCAB` = 256, so
`mirasc.lab.models.LanguageModel` (byte vocabulary) takes them directly. `oracle_<task>` recomputes every
scored target from the causal prefix `inputs[b, :t+1]` alone and `check_<task>` asserts that it agrees.
Generation is deterministic: the same (cfg, n, seed) gives the same tensors on every machine.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

IGNORE = -100
VOCAB = 256
FILLER = 0


def _as_tensors(rows_in, rows_tg, rows_mask):
    return (torch.tensor(rows_in, dtype=torch.int64), torch.tensor(rows_tg, dtype=torch.int64),
            torch.tensor(rows_mask, dtype=torch.int64))


def _sample_without_replacement(rng: random.Random, weights: list[float], k: int) -> list[int]:
    """k distinct indices, drawn with probabilities proportional to `weights` (Efraimidis-Spirakis)."""
    import math

    keyed = sorted(range(len(weights)), key=lambda i: -math.log(1.0 - rng.random()) / weights[i])
    return keyed[:k]


# ================================================================================================
# MQAR
# ================================================================================================
@dataclass(frozen=True)
class MQARConfig:
    """Zoology MQAR. Token layout: 0 filler, keys in [1, 1+K), values in [1+K, 1+2K), K = (vocab-1)//2.

    The sequence is `k1 v1 k2 v2 ... kN vN` followed by the query region, in which each queried key
    sits at an even offset 2·g, g drawn without replacement with P(g) ∝ g^(power_a - 1) (short gaps
    favoured); the target at a query position is that key's value. Other query-region positions hold
    the filler, or random *value* tokens with `random_non_queries` (never key tokens, so queries stay
    unambiguous)."""

    seq_len: int = 64
    num_kv_pairs: int = 8
    num_queries: int = 0          # 0: every key is queried (Zoology); else a random subset of this size
    vocab_size: int = VOCAB
    power_a: float = 0.01
    random_non_queries: bool = False

    @property
    def num_keys(self) -> int:
        return (self.vocab_size - 1) // 2

    def key_range(self) -> range:
        return range(1, 1 + self.num_keys)

    def value_range(self) -> range:
        return range(1 + self.num_keys, 1 + 2 * self.num_keys)

    def validate(self) -> None:
        n, q = self.num_kv_pairs, self.num_queries or self.num_kv_pairs
        if not 2 <= self.vocab_size <= VOCAB:
            raise ValueError(f"vocab_size must be in [2, {VOCAB}], got {self.vocab_size}")
        if not 1 <= n <= self.num_keys:
            raise ValueError(f"num_kv_pairs must be in [1, {self.num_keys}] (distinct keys), got {n}")
        if not 1 <= q <= n:
            raise ValueError(f"num_queries must be in [1, num_kv_pairs={n}] (0: all), got {self.num_queries}")
        slots = (self.seq_len - 2 * n + 1) // 2
        if slots < q:
            raise ValueError(f"seq_len={self.seq_len} is too short for {n} kv pairs and {q} queries; "
                             f"need seq_len >= {2 * n + 2 * q - 1}")


def generate_mqar(cfg: MQARConfig, n: int, seed: int = 0):
    cfg.validate()
    rng = random.Random(seed)
    N, T = cfg.num_kv_pairs, cfg.seq_len
    Q = cfg.num_queries or N
    keys_all, values_all = list(cfg.key_range()), list(cfg.value_range())
    slots = (T - 2 * N + 1) // 2
    weights = [cfg.power_a * g ** (cfg.power_a - 1) for g in range(1, slots + 1)]
    rows_in, rows_tg, rows_mask = [], [], []
    for _ in range(n):
        keys, values = rng.sample(keys_all, N), rng.sample(values_all, N)
        inputs = [FILLER] * T
        targets = [IGNORE] * T
        mask = [0] * T
        for i in range(N):
            inputs[2 * i], inputs[2 * i + 1] = keys[i], values[i]
        if cfg.random_non_queries:
            for t in range(2 * N, T):
                inputs[t] = rng.choice(values_all)
        gaps = _sample_without_replacement(rng, weights, Q)
        asked = rng.sample(range(N), Q)
        for g, i in zip(gaps, asked):
            p = 2 * N + 2 * g
            inputs[p], targets[p], mask[p] = keys[i], values[i], 1
        rows_in.append(inputs)
        rows_tg.append(targets)
        rows_mask.append(mask)
    return _as_tensors(rows_in, rows_tg, rows_mask)


def oracle_mqar(inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """For every masked position t: the token after the first earlier occurrence of inputs[t]
    (the key), read from inputs[:t+1] only. IGNORE elsewhere, or where no earlier occurrence exists."""
    out = torch.full_like(inputs, IGNORE)
    for b, t in mask.nonzero().tolist():
        prefix = inputs[b, : t + 1].tolist()
        key = prefix[-1]
        for j in range(t - 1):
            if prefix[j] == key:
                out[b, t] = prefix[j + 1]
                break
    return out


def check_mqar(cfg: MQARConfig, inputs, targets, mask) -> None:
    """Raise AssertionError unless the batch is well formed and every target is derivable from its prefix."""
    _check_shapes(cfg.seq_len, inputs, targets, mask)
    N = cfg.num_kv_pairs
    Q = cfg.num_queries or N
    for b in range(inputs.shape[0]):
        ctx = inputs[b, : 2 * N].tolist()
        ks, vs = ctx[0::2], ctx[1::2]
        assert len(set(ks)) == N, "keys in the context are not unique"
        assert all(k in cfg.key_range() for k in ks) and all(v in cfg.value_range() for v in vs)
        assert int(mask[b].sum()) == Q, f"example {b}: {int(mask[b].sum())} scored positions, expected {Q}"
        for t in mask[b].nonzero().flatten().tolist():
            assert t >= 2 * N and inputs[b, t].item() in ks, "a scored position is not a query of a context key"
        rest = inputs[b, 2 * N:][mask[b, 2 * N:] == 0].tolist()
        assert not any(x in cfg.key_range() for x in rest), "a key token outside the context and the queries"
    _agree(oracle_mqar(inputs, mask), targets, mask)


# ================================================================================================
# NIAH
# ================================================================================================
# RULER's noise haystack (niah_single_1) and a small word list for word haystacks, keys and word needles.
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
WORDS = (
    "apple river stone cloud garden silver window forest candle bridge orange violet winter summer "
    "copper rabbit falcon marble meadow harbor island valley desert planet rocket pencil "
    "ladder mirror basket jacket lemon tiger zebra dolphin cactus pepper walnut cherry maple cedar "
    "anchor barrel castle dragon engine feather glacier hammer jungle kettle lantern magnet needle "
    "oyster parrot quartz saddle tunnel velvet wizard yogurt puzzle button carpet donkey eagle fossil "
    "guitar helmet igloo jigsaw koala lizard mango nickel orbit pirate quiver ribbon sphinx turtle "
    "umbrella vortex walrus pixel banjo comet dune ember fable grove haiku ivory jade kayak lotus"
).split()
NEEDLES = {
    # needle sentence, question (the answer follows it directly)
    "passkey": ("The pass key is {v}. Remember it. {v} is the pass key. ",
                "What is the pass key? The pass key is "),
    "number": ("The magic number for {k} is {v}. ", "What is the magic number for {k}? It is "),
    "word": ("The magic word for {k} is {v}. ", "What is the magic word for {k}? It is "),
}


@dataclass(frozen=True)
class NIAHConfig:
    """RULER S-NIAH-style, byte level. The sequence (bytes, exactly seq_len+1 of them before the shift)
    is haystack-with-needle + question + answer; `inputs` are its first seq_len bytes and `targets` the
    next byte, scored (mask 1) on the answer bytes only."""

    seq_len: int = 256
    needle: str = "passkey"       # passkey | number | word
    haystack: str = "noise"       # noise: RULER's repeated sentences; words: random words
    value_digits: int = 5         # digits of a pass key / magic number
    depth: float = -1.0           # needle position as a fraction of the haystack; < 0: uniform at random

    def validate(self) -> None:
        if self.needle not in NEEDLES:
            raise ValueError(f"needle must be one of {sorted(NEEDLES)}, got {self.needle!r}")
        if self.haystack not in ("noise", "words"):
            raise ValueError(f"haystack must be noise or words, got {self.haystack!r}")
        if not 1 <= self.value_digits <= 18:
            raise ValueError(f"value_digits must be in [1, 18], got {self.value_digits}")
        if self.depth > 1:
            raise ValueError(f"depth must be <= 1 (or < 0 for random), got {self.depth}")
        longest = max(len(w) for w in WORDS)
        needle, question = NEEDLES[self.needle]
        v = max(self.value_digits, longest)
        minimum = len(needle.format(k="x" * longest, v="9" * v)) + len(question.format(k="x" * longest)) + v
        if self.seq_len + 1 < minimum:
            raise ValueError(f"seq_len={self.seq_len} is too short for a {self.needle} needle and its question; "
                             f"need seq_len >= {minimum - 1}")


def _haystack(cfg: NIAHConfig, rng: random.Random, length: int) -> str:
    if cfg.haystack == "noise":
        text = NOISE * (length // len(NOISE) + 1)
    else:
        parts, size = [], 0
        while size < length:
            sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + ". "
            parts.append(sentence)
            size += len(sentence)
        text = "".join(parts)
    return text[:length]


def niah_text(cfg: NIAHConfig, rng: random.Random) -> tuple[str, str]:
    """One example as text: (prompt ending with the question, answer)."""
    key = rng.choice(WORDS)
    if cfg.needle == "word":
        value = rng.choice([w for w in WORDS if w != key])
    else:
        value = str(rng.randint(10 ** (cfg.value_digits - 1), 10 ** cfg.value_digits - 1))
    needle_t, question_t = NEEDLES[cfg.needle]
    needle, question = needle_t.format(k=key, v=value), question_t.format(k=key)
    size = cfg.seq_len + 1 - len(needle) - len(question) - len(value)
    hay = _haystack(cfg, rng, size)
    depth = rng.random() if cfg.depth < 0 else cfg.depth
    at = round(depth * size)
    boundaries = [0] + [m.end() for m in re.finditer(r"\. ", hay)]   # insert between sentences
    at = min(boundaries, key=lambda b: (abs(b - at), b))
    return hay[:at] + needle + hay[at:] + question, value


def generate_niah(cfg: NIAHConfig, n: int, seed: int = 0):
    cfg.validate()
    rng = random.Random(seed)
    rows_in, rows_tg, rows_mask = [], [], []
    for _ in range(n):
        prompt, answer = niah_text(cfg, rng)
        data = list((prompt + answer).encode("ascii"))
        assert len(data) == cfg.seq_len + 1
        start = len(prompt) - 1                      # position whose next byte is the first answer byte
        rows_in.append(data[:-1])
        rows_tg.append([IGNORE] * start + data[start + 1:])
        rows_mask.append([0] * start + [1] * len(answer))
    return _as_tensors(rows_in, rows_tg, rows_mask)


_QUESTION = re.compile(r"What is the (pass key)\? The pass key is $"
                       r"|What is the magic (number|word) for (\w+)\? It is $")


def oracle_niah(inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Read the question at the end of the prompt, find its needle in the prompt, return the answer
    bytes at the scored positions (the answer's earlier bytes are part of the causal prefix)."""
    out = torch.full_like(inputs, IGNORE)
    for b in range(inputs.shape[0]):
        pos = mask[b].nonzero().flatten().tolist()
        if not pos:
            continue
        prompt = bytes(inputs[b, : pos[0] + 1].tolist()).decode("ascii")
        q = _QUESTION.search(prompt)
        if q is None:
            continue
        if q.group(1):
            pattern = r"The pass key is (\d+)\. Remember it\. \1 is the pass key\. "
        else:
            pattern = rf"The magic {q.group(2)} for {q.group(3)} is (\w+)\. "
        found = re.findall(pattern, prompt[: q.start()])
        if len(found) != 1:
            continue                                 # no needle, or an ambiguous one: nothing derivable
        answer = found[0].encode("ascii")
        for i, t in enumerate(pos[: len(answer)]):
            out[b, t] = answer[i]
    return out


def check_niah(cfg: NIAHConfig, inputs, targets, mask) -> None:
    _check_shapes(cfg.seq_len, inputs, targets, mask)
    for b in range(inputs.shape[0]):
        pos = mask[b].nonzero().flatten().tolist()
        assert pos and pos == list(range(pos[0], cfg.seq_len)), "the answer must be the scored tail of the sequence"
        assert all(inputs[b, t + 1] == targets[b, t] for t in pos[:-1]), "answer bytes are not teacher-forced"
    _agree(oracle_niah(inputs, mask), targets, mask)


# ================================================================================================
# Noisy-key recall
# ================================================================================================
@dataclass(frozen=True)
class NoisyConfig:
    """Noisy-key recall. Token layout: 0 filler; key tokens [1, 1+K); values [1+K, 1+2K); noise tokens
    [1+2K, vocab), K = 3(vocab-1)//8.

    A record is `key_len` key tokens then a value token. Each of the N pairs is written `repeats` times
    (records shuffled); with probability `outlier_prob` a pair has (repeats-1)//2 of its copies carrying
    an outlier value (a random wrong value), so the true value is the strict majority. Keys differ from
    each other at every position. Queries come after the context: `key_len` tokens, of which
    `query_noise` are replaced by noise tokens, then a filler; the target at the query's last token is
    the majority value of the context key that matches it at the most positions (unique by
    construction). All slack up to seq_len is filled with noise tokens at random record boundaries."""

    seq_len: int = 128
    num_kv_pairs: int = 8
    key_len: int = 2
    repeats: int = 3
    outlier_prob: float = 0.5
    query_noise: int = 1
    num_queries: int = 0          # 0: every key is queried
    vocab_size: int = VOCAB

    @property
    def num_keys(self) -> int:
        return 3 * (self.vocab_size - 1) // 8

    def key_range(self) -> range:
        return range(1, 1 + self.num_keys)

    def value_range(self) -> range:
        return range(1 + self.num_keys, 1 + 2 * self.num_keys)

    def noise_range(self) -> range:
        return range(1 + 2 * self.num_keys, self.vocab_size)

    def min_len(self) -> int:
        return (self.num_kv_pairs * self.repeats + (self.num_queries or self.num_kv_pairs)) * (self.key_len + 1)

    def validate(self) -> None:
        n, q = self.num_kv_pairs, self.num_queries or self.num_kv_pairs
        if not 16 <= self.vocab_size <= VOCAB:
            raise ValueError(f"vocab_size must be in [16, {VOCAB}], got {self.vocab_size}")
        if not 2 <= n <= self.num_keys:
            raise ValueError(f"num_kv_pairs must be in [2, {self.num_keys}], got {n}")
        if not 1 <= q <= n:
            raise ValueError(f"num_queries must be in [1, num_kv_pairs={n}] (0: all), got {self.num_queries}")
        if self.key_len < 1 or not 0 <= self.query_noise < self.key_len:
            raise ValueError(f"need key_len >= 1 and 0 <= query_noise < key_len, got key_len={self.key_len}, "
                             f"query_noise={self.query_noise}")
        if self.repeats < 1 or not 0 <= self.outlier_prob <= 1:
            raise ValueError("need repeats >= 1 and outlier_prob in [0, 1]")
        if self.outlier_prob > 0 and self.repeats < 3:
            raise ValueError("outliers need repeats >= 3 (the true value must stay the strict majority)")
        if self.seq_len < self.min_len():
            raise ValueError(f"seq_len={self.seq_len} is too short; this configuration needs >= {self.min_len()}")


def generate_noisy(cfg: NoisyConfig, n: int, seed: int = 0):
    cfg.validate()
    rng = random.Random(seed)
    N, L, R = cfg.num_kv_pairs, cfg.key_len, cfg.repeats
    Q = cfg.num_queries or N
    key_tokens, value_tokens, noise_tokens = list(cfg.key_range()), list(cfg.value_range()), list(cfg.noise_range())
    rows_in, rows_tg, rows_mask = [], [], []
    for _ in range(n):
        columns = [rng.sample(key_tokens, N) for _ in range(L)]      # distinct at every position
        keys = [[columns[j][i] for j in range(L)] for i in range(N)]
        values = rng.sample(value_tokens, N)
        records = []
        for i in range(N):
            copies = [values[i]] * R
            if rng.random() < cfg.outlier_prob:
                for c in rng.sample(range(R), (R - 1) // 2):
                    copies[c] = rng.choice([v for v in value_tokens if v != values[i]])
            records += [(keys[i] + [c], None) for c in copies]
        rng.shuffle(records)
        for i in rng.sample(range(N), Q):
            key = list(keys[i])
            for j in rng.sample(range(L), cfg.query_noise):
                key[j] = rng.choice(noise_tokens)
            records.append((key + [FILLER], values[i]))
        # slack: noise tokens at random record boundaries (before, between and after records)
        slack = cfg.seq_len - cfg.min_len()
        cuts = sorted(rng.randint(0, len(records)) for _ in range(slack))
        inputs, targets = [], []
        r = 0
        for cut in cuts + [None]:
            while r < len(records) and (cut is None or r < cut):
                toks, answer = records[r]
                inputs += toks
                targets += [IGNORE] * (L - 1) + [IGNORE if answer is None else answer, IGNORE]
                r += 1
            if cut is not None:
                inputs.append(rng.choice(noise_tokens))
                targets.append(IGNORE)
        rows_in.append(inputs)
        rows_tg.append(targets)
        rows_mask.append([int(t != IGNORE) for t in targets])
    return _as_tensors(rows_in, rows_tg, rows_mask)


def oracle_noisy(cfg: NoisyConfig, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """For a query ending at t: parse the records (key_len key tokens + a value token) of inputs[:t+1],
    take the record key(s) matching the query's tokens at the most positions — they must be one key —
    and return the strict-majority value of its copies. IGNORE where no unique answer exists."""
    L, keys, vals = cfg.key_len, cfg.key_range(), cfg.value_range()
    out = torch.full_like(inputs, IGNORE)
    for b, t in mask.nonzero().tolist():
        prefix = inputs[b, : t + 1].tolist()
        query = prefix[t - L + 1:]
        copies: dict[tuple, list[int]] = {}
        for i in range(t - L):
            if all(x in keys for x in prefix[i: i + L]) and prefix[i + L] in vals:
                copies.setdefault(tuple(prefix[i: i + L]), []).append(prefix[i + L])
        if not copies:
            continue
        score = {k: sum(a == c for a, c in zip(k, query)) for k in copies}
        best = max(score.values())
        winners = [k for k, s in score.items() if s == best]
        if best == 0 or len(winners) != 1:
            continue
        votes = copies[winners[0]]
        top = max(set(votes), key=votes.count)
        if 2 * votes.count(top) > len(votes):
            out[b, t] = top
    return out


def check_noisy(cfg: NoisyConfig, inputs, targets, mask) -> None:
    _check_shapes(cfg.seq_len, inputs, targets, mask)
    Q = cfg.num_queries or cfg.num_kv_pairs
    assert all(int(m.sum()) == Q for m in mask), f"every example must score {Q} queries"
    _agree(oracle_noisy(cfg, inputs, mask), targets, mask)


# ================================================================================================
# shared
# ================================================================================================
def _check_shapes(seq_len, inputs, targets, mask) -> None:
    for t in (inputs, targets, mask):
        assert t.dtype == torch.int64 and t.dim() == 2 and t.shape == inputs.shape, "int64 [n, seq_len] tensors"
    assert inputs.shape[1] == seq_len, f"sequence length {inputs.shape[1]} != seq_len {seq_len}"
    assert ((inputs >= 0) & (inputs < VOCAB)).all(), f"tokens must be in [0, {VOCAB})"
    assert ((mask == 0) | (mask == 1)).all()
    assert ((targets == IGNORE) == (mask == 0)).all(), "targets must be IGNORE exactly where mask is 0"


def _agree(predicted, targets, mask) -> None:
    m = mask.bool()
    wrong = (predicted[m] != targets[m]).sum().item()
    assert wrong == 0, f"the oracle disagrees with {wrong} of {int(m.sum())} targets (not derivable from the prompt)"


@dataclass(frozen=True)
class Task:
    name: str
    config: type
    generate: Callable
    check: Callable
    length_fields: Callable   # (cfg, seq_len) -> the fields to change for that sequence length


def _mqar_at(cfg: MQARConfig, seq_len: int) -> dict:
    # Zoology scales the number of pairs with the length; keep the kv-pairs-per-token ratio (capped).
    n = max(1, min(cfg.num_keys, round(cfg.num_kv_pairs * seq_len / cfg.seq_len)))
    q = min(n, round(cfg.num_queries * seq_len / cfg.seq_len)) if cfg.num_queries else 0
    n = min(n, (seq_len + 1) // 4)
    return {"seq_len": seq_len, "num_kv_pairs": n, "num_queries": min(q, n)}


TASKS: dict[str, Task] = {
    "mqar": Task("mqar", MQARConfig, generate_mqar, check_mqar, _mqar_at),
    "niah": Task("niah", NIAHConfig, generate_niah, check_niah, lambda cfg, n: {"seq_len": n}),
    "noisy": Task("noisy", NoisyConfig, generate_noisy, check_noisy, lambda cfg, n: {"seq_len": n}),
}


def make_config(task: str, **options):
    """The task's config from keyword options (unknown names raise with the accepted ones)."""
    t = TASKS[task]
    names = {f.name for f in dataclasses.fields(t.config)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(f"unknown {task} option(s) {unknown}; options: {sorted(names)}")
    cfg = t.config(**options)
    cfg.validate()
    return cfg


def at_length(task: str, cfg, seq_len: int):
    """The same task at another sequence length (MQAR scales the number of pairs with it)."""
    cfg = dataclasses.replace(cfg, **TASKS[task].length_fields(cfg, seq_len))
    cfg.validate()
    return cfg


def chance(task: str, cfg) -> float:
    """The accuracy (scored tokens) of the best guess that does not read the context: at each answer
    position, the answer token that is most likely a priori. A model scoring near it has learnt nothing
    about recall. MQAR and noisy recall: the value of a pair is uniform over the value tokens, so
    1/num_keys. NIAH: the answer is a number (first digit 1-9, the others 0-9) or a word (uniform over
    WORDS: the needle's value is drawn from the words other than its uniformly drawn key), guessed byte by
    byte: the most frequent byte at each answer position."""
    if task in ("mqar", "noisy"):
        return 1.0 / cfg.num_keys
    if task == "niah":
        if cfg.needle != "word":
            d = cfg.value_digits
            return (1 / 9 + (d - 1) / 10) / d
        longest = max(len(w) for w in WORDS)
        hits = sum(max(Counter(w[i] for w in WORDS if i < len(w)).values()) for i in range(longest))
        return hits / sum(len(w) for w in WORDS)
    raise ValueError(f"unknown task {task!r}")


def generate(task: str, cfg, n: int, seed: int = 0):
    return TASKS[task].generate(cfg, n, seed)


def check(task: str, cfg, inputs, targets, mask) -> None:
    TASKS[task].check(cfg, inputs, targets, mask)
