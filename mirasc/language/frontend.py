"""Front end: `.miras` text -> validated `Spec`, or a located `SpecError`.

Every error is `path:line:col: what is wrong; what would be right`. No input, however malformed,
may escape as a Python traceback: lark errors, pydantic errors and sympy errors are all mapped here.
"""

from __future__ import annotations

import difflib
import math
import typing
from dataclasses import dataclass
from pathlib import Path

from lark import Lark, Token, Tree, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from pydantic import ValidationError

from ..runtime.layer_options import layer_combination_problems
from . import spec as S
from .expressions import build_expression
from .legality import Rejection, check_combination
from .messages import SpecError, one_of, suggest

# cache=True keeps lark's grammar analysis in a temporary file: later runs load it in milliseconds
_PARSER = Lark.open("grammar/miras.lark", rel_to=__file__, parser="lalr", propagate_positions=True, strict=True,
                    cache=True)


@dataclass(frozen=True)
class Pos:
    line: int
    col: int


def _pos(node) -> Pos:
    if isinstance(node, Token):
        return Pos(node.line or 1, node.column or 1)
    meta = node.meta
    return Pos(getattr(meta, "line", 1) or 1, getattr(meta, "column", 1) or 1)


TOKEN_NAMES = {"NAME": "a name", "NUMBER": "a number", "LBRACE": "`{`", "RBRACE": "`}`", "LPAR": "`(`",
               "RPAR": "`)`", "EQUAL": "`=`", "COMMA": "`,`", "_SEP": "`;` or `,`", "MODEL": "`model`",
               "$END": "end of file", "PLUS": "`+`", "MINUS": "`-`", "STAR": "`*`", "SLASH": "`/`", "_POW": "`^`"}


def _describe_expected(expected) -> str:
    names = sorted({TOKEN_NAMES.get(t, t) for t in expected})
    return ", ".join(names)


def parse_text(text: str, path: str = "<spec>") -> S.Spec:
    """Parse and validate spec text. Raises SpecError."""
    try:
        tree = _PARSER.parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, path) from None
    return _Builder(path, text).build(tree)


def parse_file(path: str | Path) -> S.Spec:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(str(path), 1, 1, f"cannot read spec file: {err.__class__.__name__}: {err}") from None
    return parse_text(text, str(path))


def read_spec(text_or_path: str | Path) -> tuple[str, str]:
    """(text, path) of a spec given as text or as a path to a .miras file."""
    if isinstance(text_or_path, Path) or _looks_like_path(str(text_or_path)):
        p = Path(text_or_path)
        if not p.exists():
            twin = p.with_name(p.name + ".miras") if p.suffix != ".miras" else None
            hint = f" (did you mean {twin}?)" if twin is not None and twin.is_file() else ""
            raise SpecError(str(p), 1, 1, f"cannot read spec file: no such file{hint}")
        if p.is_dir():
            raise SpecError(str(p), 1, 1, "cannot read spec file: it is a directory (a spec is a .miras file)")
        try:
            return p.read_text(encoding="utf-8"), str(p)
        except (OSError, UnicodeDecodeError) as err:
            raise SpecError(str(p), 1, 1, f"cannot read spec file: {err}") from None
    return str(text_or_path), "<spec>"


def _looks_like_path(s: str) -> bool:
    """Spec text always has `{`; a one-line string without one that names a .miras file, has a path separator or
    names an existing file is a path."""
    if "{" in s or "\n" in s or not s.strip():
        return False
    return s.endswith(".miras") or "/" in s or "\\" in s or Path(s).exists()


def _syntax_error(err: UnexpectedInput, text: str, path: str) -> SpecError:
    line, col = getattr(err, "line", 1) or 1, getattr(err, "column", 1) or 1
    if line < 1 or col < 1:  # lark reports -1 at end of input
        lines = text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
    if isinstance(err, UnexpectedCharacters):
        ch = text[err.pos_in_stream] if 0 <= err.pos_in_stream < len(text) else "?"
        return SpecError(path, line, col, f"unexpected character {ch!r}; a spec uses names, numbers, "
                         "`= ( ) { } , ;` and the operators `+ - * / ^` inside expressions")
    if isinstance(err, UnexpectedEOF):
        return SpecError(path, line, col, "unexpected end of file; expected "
                         f"{_describe_expected(err.expected)} (is a `}}` or `)` missing?)")
    if not _strip_comments(text).strip():
        return SpecError(path, 1, 1, "the file is empty (or only comments); a spec is `model NAME { memory = "
                         "linear; bias = l2 }` with the fields memory, bias, retention, learner, parallel")
    if isinstance(err, UnexpectedToken) and err.token.type == "$END":
        body = text.rstrip()
        line = body.count("\n") + 1
        col = len(body) - (body.rfind("\n") + 1) + 1  # just after the last character
        return SpecError(path, line, col, "unexpected end of file; expected "
                         f"{_describe_expected(err.expected)} (is a closing `}}` or `)` missing?)")
    if isinstance(err, UnexpectedToken):
        tok = err.token
        got = "end of file" if tok.type == "$END" else f"`{tok}`"
        hint = ""
        if tok.type == "$END":
            hint = " (is a closing `}` missing?)"
        elif not text.lstrip().startswith("model") and line == _first_code_line(text):
            hint = "; a spec starts with `model NAME {`"
        return SpecError(path, line, col, f"unexpected {got}; expected {_describe_expected(err.expected)}{hint}")
    return SpecError(path, line, col, f"syntax error: {err}")


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def _first_code_line(text: str) -> int:
    for i, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if s and not s.startswith("#"):
            return i
    return 1


class _Builder:
    """Walks the parse tree into pydantic forms, reporting every problem at its position."""

    def __init__(self, path: str, text: str = ""):
        self.path, self.text = path, text

    def err(self, node, message: str) -> SpecError:
        p = _pos(node)
        return SpecError(self.path, p.line, p.col, message)

    def build(self, tree: Tree) -> S.Spec:
        model = tree.children[0]
        name_tok, *fields = model.children
        seen: dict[str, Tree] = {}
        values: dict[str, S.Form] = {}
        # Each field is checked on its own, so one run reports every bad field of the file; the
        # combination rules need all fields and run only when every field is good.
        errors: list[SpecError] = []
        failed: set[str] = set()
        for f in fields:
            try:
                self._field(f, seen, values)
            except SpecError as err:
                errors.extend(err.all)  # a layer block reports each of its bad settings
                name = str(f.children[0])
                # a misspelt field name stands for the field it resembles: do not also call that one missing
                failed.update([name, *difflib.get_close_matches(name, S.FIELDS, n=1, cutoff=0.6)])
        for key in S.FIELDS:
            if key in values or key in failed:
                continue
            if key == "bias" and "memory" in failed:
                continue  # whether a bias is needed depends on the memory, which is wrong itself
            parametric = values.get("memory", S.Linear()).parametric
            if key in ("memory", "bias") and not (key == "bias" and not parametric):
                errors.append(self.err(model.children[0], f"model `{name_tok}` has no `{key}` field; add e.g. "
                                       f"`{key} = {'linear' if key == 'memory' else 'l2'}`"))
                continue
            if key == "bias":
                values[key] = S.L2()
            elif not parametric and key == "learner":
                values[key] = S.NonparametricLearner()
            else:
                values[key] = S.FIELD_DEFAULTS[key]
        if errors:
            raise SpecError.several(errors)
        spec = S.Spec(name=str(name_tok), **values)
        try:
            check_combination(spec)
        except Rejection as rej:
            node = seen.get(rej.field)
            target = node.children[1] if node is not None else model.children[0]
            if node is not None and rej.param:
                target = self._find_arg(node.children[1], rej.param) or target
            raise self.err(target, f"illegal combination: {rej.message}") from None
        return spec

    def _field(self, f: Tree, seen: dict, values: dict) -> None:
        if f.data == "block":
            if "layer" in values:
                raise self.err(f.children[0], "block `layer` given twice")
            values["layer"] = self.layer_block(f)
            return
        key_tok, form = f.children
        key = str(key_tok)
        if key not in S.VOCABULARY:
            raise self.err(key_tok, f"unknown field `{key}`{suggest(key, S.FIELDS)}; "
                           f"fields are {one_of(S.FIELDS)}")
        if key in seen:
            p = _pos(seen[key])
            raise self.err(key_tok, f"field `{key}` given twice (first at line {p.line})")
        seen[key] = f
        values[key] = self.form(key, form)

    def layer_block(self, node: Tree) -> S.LayerOptions:
        name_tok, *settings = node.children
        if str(name_tok) != "layer":
            raise self.err(name_tok, f"unknown block `{name_tok}`{suggest(str(name_tok), ['layer'])}; the only "
                           "block is `layer { ... }` (fields are written `name = form`)")
        params = S.params_of(S.LayerOptions)
        kwargs, where, errors = {}, {}, []
        for st in settings:  # every bad setting is reported, in file order
            key_tok, expr = st.children
            key = str(key_tok)
            try:
                if key not in params:
                    raise self.err(key_tok, f"`layer` has no option `{key}`{suggest(key, params)}; options: "
                                   f"{one_of(params)}")
                if key in where:
                    raise self.err(key_tok, f"layer option `{key}` given twice")
                where[key] = expr
                value = self.value("layer", "layer", key, expr)
                self._check_kind(S.LayerOptions, "layer", key, value, expr)
                kwargs[key] = value
            except SpecError as err:
                errors.append(err)
        try:
            options = S.LayerOptions(**kwargs)
        except ValidationError as ve:
            for e in ve.errors():
                key = str(e.get("loc", ("",))[0])
                errors.append(self.err(where.get(key, name_tok), f"bad value for layer option `{key}`: "
                                       f"{_explain(S.LayerOptions, key, e)}"))
        else:
            for problem in layer_combination_problems(dict(options)):  # located at the first option it names
                named = [key for key in where if f"'{key}'" in problem]
                errors.append(self.err(where[named[0]] if named else name_tok, problem))
        if errors:
            errors.sort(key=lambda e: (e.line, e.col))
            raise SpecError.several(errors)
        return options

    @staticmethod
    def _find_arg(form: Tree, param: str):
        if form.data != "call_form":
            return None
        for a in form.children[1:]:
            if a is not None and a.data == "kwarg" and str(a.children[0]) == param:
                return a
        return None

    def form(self, field: str, node: Tree) -> S.Form:
        name_tok = node.children[0]
        name = str(name_tok)
        forms = S.VOCABULARY[field]
        if name not in forms:
            raise self.err(name_tok, f"unknown {field} `{name}`{suggest(name, forms)}; "
                           f"accepted: {one_of(forms)}")
        cls = forms[name]
        params = S.params_of(cls)
        kwargs: dict[str, object] = {}
        where: dict[str, object] = {}
        args = [a for a in node.children[1:] if a is not None] if node.data == "call_form" else []
        positional_done = False
        for i, a in enumerate(args):
            if a.data == "kwarg":
                positional_done = True
                key_tok, expr = a.children
                key = str(key_tok)
                if key not in params:
                    accepted = one_of(params) if params else "none"
                    raise self.err(key_tok, f"`{name}` has no parameter `{key}`{suggest(key, params)}; "
                                   f"its parameters: {accepted}")
            else:
                if positional_done:
                    raise self.err(a, "a positional argument cannot follow a keyword argument")
                positional = S.positional_params(cls)
                if i >= len(positional):
                    raise self.err(a, f"`{name}` takes at most {len(positional)} argument(s) by position "
                                   f"({one_of(positional) if positional else 'none'})")
                key, expr = positional[i], a.children[0]
            if key in kwargs:
                raise self.err(a, f"parameter `{key}` of `{name}` given twice")
            kwargs[key] = self.value(field, name, key, expr)
            where[key] = expr
            self._check_kind(cls, name, key, kwargs[key], expr)
        try:
            return cls(**kwargs)
        except ValidationError as ve:
            first = ve.errors()[0]
            loc = first.get("loc", ())
            key = str(loc[0]) if loc else ""
            target = where.get(key, name_tok)
            if first.get("type") == "missing":
                raise self.err(name_tok, f"`{name}` needs parameter `{key}`, e.g. `{name}({key}=...)`") from None
            raise self.err(target, f"bad value for `{name}({key}=...)`: {_explain(cls, key, first)}") from None

    def _check_kind(self, cls, form: str, key: str, value, node) -> None:
        """Booleans only where a flag is expected, numbers never there (pydantic would coerce both)."""
        annotation = str(cls.model_fields[key].annotation)
        is_flag = cls.model_fields[key].annotation is bool
        if isinstance(value, bool) and not is_flag:
            raise self.err(node, f"`{form}({key}=...)` takes {_expected_kind(annotation)}, not `{str(value).lower()}`")
        if is_flag and not isinstance(value, bool):
            raise self.err(node, f"`{form}({key}=...)` takes true or false")
        words = _literal_words(cls.model_fields[key].annotation)
        if isinstance(value, str) and value not in words:
            if not words or "gate" in words:  # a number (or gate) is expected: never parse words as numbers
                raise self.err(node, f"`{form}({key}=...)` takes {_expected_kind(annotation)}, not "
                               f"`{value}`{suggest(value, words)}")
        if key in S.GATE_OF_PARAM and isinstance(value, float) and not _coef_ok(key, value):
            raise self.err(node, f"bad value for `{form}({key}=...)`: {S.COEF_RANGE[key][2]}, or `gate`")

    def value(self, field: str, form: str, param: str, expr: Tree):
        """A literal argument: number, identifier, true/false, or (for expression params) an expression."""
        symbol = S.EXPRESSION_PARAMS.get((field, form, param))
        if symbol is not None:
            return self.expression(expr, symbol)
        if expr.data == "number" or (expr.data == "neg" and expr.children[0].data == "number"):
            value = float(expr.children[0]) if expr.data == "number" else -float(expr.children[0].children[0])
            if not math.isfinite(value):
                raise self.err(expr, f"`{form}({param}=...)` must be a finite number")
            return value
        if expr.data == "tuple":
            items = []
            for child in expr.children:
                if child.data != "number":
                    raise self.err(child, f"`{form}({param}=(...))` takes a tuple of numbers")
                items.append(float(child.children[0]))
            return tuple(items)
        if expr.data == "name":
            word = str(expr.children[0])
            if word in ("true", "false"):
                return word == "true"
            return word
        if expr.data == "func" and str(expr.children[0]) == "gate":
            side = expr.children[1]
            if param not in S.GATE_OF_PARAM:
                raise self.err(expr, f"`{form}({param}=...)` is not a coefficient; `gate(k)`/`gate(v)` are accepted "
                               f"for {one_of(sorted(S.GATE_OF_PARAM))}")
            if side.data != "name" or str(side.children[0]) not in ("k", "v"):
                raise self.err(side, "a channel-wise gate is `gate(k)` (one value per key channel) or `gate(v)` "
                               "(one per value channel)")
            return f"gate({side.children[0]})"
        if param in S.GATE_OF_PARAM:
            return self.per_head(form, param, expr)
        raise self.err(expr, f"`{form}({param}=...)` takes a number, a name, `gate` or true/false, "
                       "not an expression")

    def per_head(self, form: str, param: str, node: Tree):
        """A coefficient written as an expression: a constant (folded to a number) or a per-head constant in the
        head index h = 0..H-1 and the head count H, checked against the coefficient's range for every head of
        every H up to PER_HEAD_CHECK_HEADS (the op checks the H it runs with again)."""
        expr = self.expression(node, S.HEAD_SYMBOLS)
        lo, hi, what = S.COEF_RANGE[param]
        if not expr.free_symbols:
            value = _number(expr)
            if value is None:
                raise self.err(node, f"`{form}({param}=...)` is not a finite real number")
            if not (lo(value) and hi(value)):
                raise self.err(node, f"bad value for `{form}({param}=...)`: {what} (it is {value:g}), or `gate`")
            return value
        at = _head_evaluator(expr)
        counts = range(1, PER_HEAD_CHECK_HEADS + 1) if "H" in {x.name for x in expr.free_symbols} \
            else (PER_HEAD_CHECK_HEADS,)
        for heads in counts:
            for head in range(heads):
                value = at(head, heads)
                if value is None or not (lo(value) and hi(value)):
                    shown = "not a finite real number" if value is None else f"{value:g}"
                    where = f"h = {head} of H = {heads}" if len(counts) > 1 else f"h = {head}"
                    raise self.err(node, f"bad per-head `{form}({param}=...)`: at head {where} it "
                                   f"is {shown}; {what} for every head h = 0..H-1")
        return S.PerHead(expr=expr)

    def expression(self, node: Tree, symbol: str | tuple[str, ...]):
        return build_expression(node, self.text, symbol, self.err)


# A per-head constant is checked at compile time for every head of every head count up to this many heads.
PER_HEAD_CHECK_HEADS = 64


def _head_evaluator(expr):
    """expr(h, H) as a fast numeric function (mpmath: no overflow, complex results stay visible) returning a float,
    or None where the value is not finite and real."""
    import mpmath
    import sympy as sp

    from .primitives import apow, relu, sigmoid, spow

    fns = {apow.__name__: lambda x, a: abs(x) ** a, spow.__name__: lambda x, a: mpmath.sign(x) * abs(x) ** a,
           sigmoid.__name__: lambda x: 1 / (1 + mpmath.exp(-x)), relu.__name__: lambda x: max(x, 0),
           "sign": mpmath.sign}
    f = sp.lambdify([sp.Symbol(n, real=True) for n in S.HEAD_SYMBOLS], expr, modules=[fns, "mpmath"])

    def at(head: int, heads: int) -> float | None:
        try:
            val = complex(f(mpmath.mpf(head), mpmath.mpf(heads)))
        except Exception:  # a domain error, an overflow converting to float
            return None
        if not (math.isfinite(val.real) and abs(val.imag) < 1e-12):
            return None
        return val.real

    return at


def _number(expr) -> float | None:
    """The value of a constant SymPy expression as a float, or None when it is not finite and real."""
    try:
        val = complex(expr.evalf())
    except Exception:  # overflow in mpmath, a non-numeric result
        return None
    if not (math.isfinite(val.real) and abs(val.imag) < 1e-12):
        return None
    return val.real


def _literal_words(annotation) -> set[str]:
    """Every word a field's type accepts (the values of its Literal parts)."""
    if typing.get_origin(annotation) is typing.Literal:
        return {a for a in typing.get_args(annotation) if isinstance(a, str)}
    out: set[str] = set()
    for arg in typing.get_args(annotation):
        out |= _literal_words(arg)
    return out


def _expected_kind(annotation: str) -> str:
    if "gate" in annotation:
        return "a number, `gate`, `gate(k)` or `gate(v)`"
    if "Literal" in annotation:
        return "one of the listed words"
    return "a number"


def _coef_ok(key: str, value: float) -> bool:
    lo, hi, _ = S.COEF_RANGE[key]
    return lo(value) and hi(value)


def _explain(cls, key: str, err: dict) -> str:
    field = cls.model_fields.get(key)
    msg = err.get("msg", "invalid value")
    if field is not None and "gate" in str(field.annotation):
        return f"{msg.replace('Input should be', 'expected')}; write a number, `gate`, `gate(k)` or `gate(v)`"
    if err.get("type") == "literal_error" and field is not None:
        return f"{msg}"
    constraints = []
    if field is not None:
        for m in field.metadata:
            for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                if getattr(m, attr, None) is not None:
                    constraints.append(f"{sym} {getattr(m, attr)}")
    rng = f" (accepted: {' and '.join(constraints)})" if constraints else ""
    return f"{msg}{rng}"
