"""Expressions in a spec (a custom loss, a Bregman potential, a per-head coefficient): the parse tree built into a
SymPy expression in the symbols the field allows, with located errors (docs/language.md, "Expressions")."""

from __future__ import annotations

from lark import Tree

from . import spec as S
from .messages import SpecError, one_of, plain_failure, suggest

# Deeper expressions would exhaust Python's recursion in SymPy; no loss or potential needs them.
MAX_EXPRESSION_DEPTH = 64


def build_expression(node: Tree, text: str, symbol: str | tuple[str, ...], err):
    """The SymPy expression of `node` (source `text`) in `symbol` (or the per-head symbols); `err(node, message)`
    makes the located SpecError."""
    import sympy as sp

    from .primitives import apow

    depth = max(_depth(node), _paren_depth(text, node))
    if depth > MAX_EXPRESSION_DEPTH:
        raise err(node, f"expression nested {depth} levels deep; at most {MAX_EXPRESSION_DEPTH} levels "
                  "of parentheses, functions and operators are accepted")
    try:
        expr = _Builder(symbol, err).walk(node)
    except SpecError:
        raise
    except Exception as failure:  # sympy can fail in many ways on extreme input (huge powers, ...)
        raise err(node, f"cannot build this expression: {plain_failure(failure)}") from None
    # One spelling per function, so canonical() text parses back to the same expression.
    expr = expr.replace(sp.Abs, lambda arg: apow(arg, sp.Integer(1)))
    if expr.has(sp.zoo, sp.nan, sp.oo, -sp.oo):
        raise err(node, "expression is not finite")
    return expr


class _Builder:
    """Walks an expression tree into SymPy: `walk` per node, `fold` for a long chain of one operator family."""

    def __init__(self, symbol: str | tuple[str, ...], err):
        import sympy as sp  # here, not at import: `mirasc check` of a spec without expressions never loads SymPy

        from .primitives import EXPRESSION_FUNCTIONS, apow

        self.sp, self.functions, self.apow = sp, EXPRESSION_FUNCTIONS, apow
        self.names = (symbol,) if isinstance(symbol, str) else symbol
        self.per_head = self.names == S.HEAD_SYMBOLS
        self.symbols = {n: sp.Symbol(n, real=True) for n in self.names}
        self.err = err

    def walk(self, n):
        sp, EXPRESSION_FUNCTIONS, apow = self.sp, self.functions, self.apow
        d = n.data
        if d == "number":
            return sp.Float(str(n.children[0])) if any(c in str(n.children[0]) for c in ".eE") \
                else sp.Integer(str(n.children[0]))
        if d == "name":
            word = str(n.children[0])
            if word in self.symbols:
                return self.symbols[word]
            if word == "pi":
                return sp.pi
            raise self.err(n, f"unknown name `{word}` in expression{suggest(word, [*self.names, 'pi'])}; "
                           f"the expression may use {one_of(self.names)}, numbers, `pi` and the functions "
                           f"{one_of(sorted(EXPRESSION_FUNCTIONS))}")
        if d == "func":
            fn = str(n.children[0])
            if fn not in EXPRESSION_FUNCTIONS:
                raise self.err(n, f"unknown function `{fn}`{suggest(fn, EXPRESSION_FUNCTIONS)}; "
                               f"accepted: {one_of(sorted(EXPRESSION_FUNCTIONS))}")
            return EXPRESSION_FUNCTIONS[fn](self.walk(n.children[1]))
        if d in _CHAIN:  # a chain a ± b ± c ... (or a */ b */ c ...) is built iteratively, however long
            return self.fold(n)
        a = [self.walk(c) for c in n.children]
        if d == "add":
            return a[0] + a[1]
        if d == "sub":
            return a[0] - a[1]
        if d == "mul":
            return a[0] * a[1]
        if d == "div":
            if a[1] == 0:
                raise self.err(n, "division by zero in expression")
            return a[0] / a[1]
        if d == "neg":
            return -a[0]
        if d == "pow":
            base, exponent = a
            if exponent.free_symbols and not self.per_head:  # (a loss or potential is differentiated in its symbol)
                raise self.err(n, "exponents must be constants")
            # |x|^p is written with a primitive whose derivative p*sign(x)|x|^(p-1) is finite at 0.
            if isinstance(base, apow):
                return apow(base.args[0], base.args[1] * exponent)
            return base ** exponent
        raise self.err(n, f"unsupported expression form `{d}`")

    def fold(self, n):
        sp = self.sp
        family, ops = _CHAIN[n.data], []
        while isinstance(n, Tree) and _CHAIN.get(n.data) == family:
            ops.append((n.data, n.children[1], n))
            n = n.children[0]
        total = self.walk(n)
        if family == "sum":
            terms = [total] + [self.walk(c) if op == "add" else -self.walk(c) for op, c, _ in reversed(ops)]
            return sp.Add(*terms)
        for op, c, at in reversed(ops):
            value = self.walk(c)
            if op == "div" and value == 0:
                raise self.err(at, "division by zero in expression")
            total = total * value if op == "mul" else total / value
        return total


# Operators whose chains are one level: a + b − c + ... is one sum, a·b/c·... one product, however many terms.
_CHAIN = {"add": "sum", "sub": "sum", "mul": "product", "div": "product"}


def _depth(node: Tree) -> int:
    """Nesting depth of an expression tree, counted without recursion (the input may be very deep): functions,
    powers, negations and each change between a sum and a product add a level; a chain of one operator family
    is one level."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        family = _CHAIN.get(n.data)
        stack.extend((c, d if family is not None and _CHAIN.get(c.data) == family else d + 1)
                     for c in n.children if isinstance(c, Tree))
    return deepest


def _paren_depth(text: str, node: Tree) -> int:
    """The deepest nesting of parentheses in the expression's source text (redundant ones included, which leave
    no trace in the tree; a function's own parentheses count too)."""
    start, end = getattr(node.meta, "start_pos", None), getattr(node.meta, "end_pos", None)
    if not text or start is None or end is None:
        return 0
    while start > 0 and (text[start - 1] == "(" or text[start - 1].isspace()):  # parentheses around the whole
        start -= 1
    while end < len(text) and (text[end] == ")" or text[end].isspace()):
        end += 1
    deepest = level = 0
    for ch in text[start:end]:
        if ch == "(":
            level += 1
            deepest = max(deepest, level)
        elif ch == ")":
            level -= 1
    return deepest
