"""Property tests (hypothesis): no input, however malformed, escapes the front end as anything but a
`SpecError` (docs/language.md), and the CLI answers 0 or 2, never 1 (internal error), without a traceback.

Inputs are (a) random sequences of the spec language's own tokens, with and without a `model m { ... }`
frame, (b) small fields assembled from the vocabulary with random arguments, and (c) character-level
mutations (deletions, insertions, swaps of neighbours) of every real spec in specs/.
`compile_text` runs the whole pipeline (parse, derive, IR, emit), so deeper stages are exercised too.

Crashes found this way once (huge exponents such as `e^1e308`, LambertW Bregman inverses) have their own
located-error tests in test_frontend.py; the vocabulary here keeps such numbers in.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirasc import SpecError, compile_text
from mirasc.cli import main
from mirasc.language import spec as S

ROOT = Path(__file__).resolve().parents[2]
SPEC_TEXTS = {p.stem: p.read_text(encoding="utf-8") for p in sorted((ROOT / "specs").glob("*.miras"))}



def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

WORDS = sorted(
    {"model", "layer", "gate", "true", "false", "e", "w", "pi", "x", "default", "inf", "nan"}
    | set(S.FIELDS)
    | {name for forms in S.VOCABULARY.values() for name in forms}
    | {p for forms in S.VOCABULARY.values() for cls in forms.values() for p in S.params_of(cls)}
    | {"gelu", "silu", "relu", "tanh", "identity", "layernorm", "none", "softmax", "mixture", "coordinate",
       "pre", "post"}
    | {"abs", "exp", "log", "sqrt", "tanh", "sin", "cos", "cosh", "sinh", "atan", "erf", "sigmoid", "softplus",
       "sign"}
)
NUMBERS = ["0", "1", "2", "3", "4", "0.5", "1.5", "2.5", ".5", "3.", "1e-6", "1E2", "16", "64", "100", "4096",
           "1e308", "1e999"]
PUNCT = ["{", "}", "(", ")", "=", ",", ";", "+", "-", "*", "/", "^", "**", "\n", " ", "# comment\n", "\t"]
TOKENS = st.sampled_from(WORDS) | st.sampled_from(NUMBERS) | st.sampled_from(PUNCT)


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "fuzz.miras"


def run_cli(path: Path, text: str) -> tuple[int, str]:
    path.write_text(text, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", str(path)])
    return code, err.getvalue()


def check(text: str, path: Path) -> None:
    """compile_text accepts or raises SpecError; the CLI agrees with exit code 0 or 2 and no traceback."""
    try:
        compile_text(text, "fuzz.miras")
        compiled = True
    except SpecError as err:
        compiled = False
        assert str(err).startswith(f"fuzz.miras:{err.line}:{err.col}: ")
        assert err.line >= 1 and err.col >= 1
        assert err.line <= max(1, text.count("\n") + 1)
        assert err.message.strip()
    code, stderr = run_cli(path, text)
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    assert code == (0 if compiled else 2), (code, stderr)


@fuzz(500)
@given(st.lists(TOKENS, max_size=40), st.booleans())
def test_random_tokens(spec_file, tokens, framed):
    body = " ".join(tokens)
    check(f"model m {{ {body} }}" if framed else body, spec_file)


def _value():
    return st.sampled_from(["gate", "true", "false", "gelu", "relu", "none", "pre", "post", "mixture", "softmax",
                            "layernorm", "foo", "e", "w", *NUMBERS, "-1", "-0.5"])


def _expression(symbol: str):
    leaf = st.sampled_from([symbol, symbol, "1", "2", "0.5", "pi", "1e-6", "0", "1e308"])
    funcs = ["abs", "exp", "log", "sqrt", "tanh", "sin", "cos", "cosh", "atan", "erf", "sigmoid", "softplus", "sign"]
    return st.recursive(leaf, lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "^"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(funcs), inner).map(lambda t: f"{t[0]}({t[1]})"),
        inner.map(lambda s: f"-{s}"),
    ), max_leaves=5)


@st.composite
def _field(draw, field: str):
    forms = S.VOCABULARY[field]
    name = draw(st.sampled_from(sorted(forms)))
    params = S.params_of(forms[name])
    chosen = draw(st.lists(st.sampled_from(params), unique=True)) if params else []
    args = []
    for p in chosen:
        symbol = S.EXPRESSION_PARAMS.get((field, name, p))
        value = draw(_expression(symbol) if symbol else _value())
        args.append(value if draw(st.booleans()) and not args else f"{p}={value}")
    return f"{field} = {name}" + (f"({', '.join(args)})" if args or draw(st.booleans()) else "")


@fuzz(400)
@given(st.fixed_dictionaries({"memory": _field("memory"), "bias": _field("bias")},
                             optional={f: _field(f) for f in ("retention", "learner", "parallel")}),
       st.sampled_from(["\n    ", "; ", " "]))
def test_vocabulary_fields(spec_file, fields, sep):
    check("model m {" + sep + sep.join(fields.values()) + "\n}\n", spec_file)


ALPHABET = list("abcdefghijklmnopqrstuvwxyzCLPW0123456789_ (){}=,;#+-*/^.\n\t\"'@$é\x00")


def _mutate(text: str, ops) -> str:
    s = text
    for op, i, ch in ops:
        if not s:
            break
        i %= len(s)
        if op == "delete":
            s = s[:i] + s[i + 1:]
        elif op == "insert":
            s = s[:i] + ch + s[i:]
        else:  # swap neighbours
            j = min(i + 1, len(s) - 1)
            chars = list(s)
            chars[i], chars[j] = chars[j], chars[i]
            s = "".join(chars)
    return s


MUTATIONS = st.lists(st.tuples(st.sampled_from(["delete", "insert", "swap"]), st.integers(0, 10**6),
                               st.sampled_from(ALPHABET)), min_size=1, max_size=4)


@fuzz(400)
@given(st.sampled_from(sorted(SPEC_TEXTS)), MUTATIONS)
def test_mutated_specs(spec_file, name, ops):
    check(_mutate(SPEC_TEXTS[name], ops), spec_file)


@pytest.mark.parametrize("name", sorted(SPEC_TEXTS))
def test_every_spec_survives_single_deletions(spec_file, name):
    """Every single-character deletion inside the model body of a real spec (deterministic, exhaustive
    over positions on a stride so it stays fast)."""
    text = SPEC_TEXTS[name]
    start = text.index("model")
    for i in range(start, len(text), 7):
        check(text[:i] + text[i + 1:], spec_file)


def test_check_helper_catches_internal_errors(spec_file, monkeypatch):
    """The property above can fail: an internal error makes the CLI answer 1 with a traceback."""
    import mirasc.language.frontend as frontend

    def boom(*args, **kwargs):
        raise RuntimeError("simulated internal error")

    monkeypatch.setattr(frontend, "parse_text", boom)   # what `mirasc check` runs first
    code, stderr = run_cli(spec_file, SPEC_TEXTS["deltanet"])
    assert code == 1
    assert "Traceback" in stderr and "internal error" in stderr
