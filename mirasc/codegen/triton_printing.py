"""Printing helpers shared by every Triton kernel family: dimension names and their blocks, pointers into
the scratch buffers, the kernel header, and `graph_lines`, which prints an IR graph as straight-line
Triton code (one token, or a block of BC tokens with the matmuls given by the caller).

Conventions of the printed code (every family follows them): a dimension is named k (keys, Nk at run time,
padded block BK), v (values: Nv, BV) or e (the hidden width of an MLP memory: Ne, BE); `r<dim>` is a
program's index range along it and `m<dim>` the mask of its real (unpadded) lanes; `bh` is the
(batch, head) index, `t` the token, `BC` the rows of a block of tokens.
"""

from __future__ import annotations

from .. import ir
from ..printers import print_triton_block


class Unsupported(Exception):
    """The spec has no kernel of this family; the message says why (the module then runs on torch)."""


BLOCK = {"k": "BK", "v": "BV", "e": "BE"}  # the block (padded size) of each dimension name
SIZE = {"k": "Nk", "v": "Nv", "e": "Ne"}  # the runtime size of each dimension name


def state_tile(wdims, base: str, i: int) -> str:
    """Pointers to this program's [rows, cols] tile of weight i in a [B·H, N_rows, N_cols] state tensor."""
    rows_, cols = wdims[i]
    return f"{base} + bh * {SIZE[rows_]} * {SIZE[cols]} + r{rows_}[:, None] * {SIZE[cols]} + r{cols}[None, :]"


def jit_kernel(name: str, params: str, lines: list[str]) -> str:
    """A `@triton.jit` kernel (indented under the module's `if triton is not None:`) with body `lines`."""
    return (f"    @triton.jit\n    def {name}(" + params + "):  # noqa: C901\n"
            + "\n".join("        " + line for line in lines) + "\n")


def indent(lines: list[str], depth: int = 1) -> list[str]:
    """`lines` nested `depth` blocks deeper (4 spaces each)."""
    return ["    " * depth + line for line in lines]


def tile_matmul(dot):
    """The `matmul` printer of `graph_lines` for [BC, n] token tiles: layer/linear (h ↦ h Wᵀ) and
    linear_t (d ↦ d W) as `dot(a, b)`, the kernel family's product."""
    def matmul(op, i, w, h):
        rhs = f"tl.trans({w})" if op in ("layer", "linear") else w
        return dot(h, rhs)
    return matmul


# ---- pointers into per-token scratch buffers

def row(base: str, dim: str, tok: str = "t") -> str:
    """Pointer to row `tok` of a [B·H, T, N_dim] scratch buffer."""
    return f"{base} + (bh * T + {tok}) * {SIZE[dim]} + r{dim}"


def rows(base: str, dim: str) -> str:
    """Pointers to rows ctok of a [B·H, T, N_dim] scratch buffer."""
    return f"{base} + (bh * T + ctok[:, None]) * {SIZE[dim]} + r{dim}[None, :]"


def part_row(base: str, dim: str, tok: str = "t") -> str:
    """Pointer to row `tok` of this program's slice of a [NV, B·H, T, N_dim] buffer of per-V-tile partial
    sums (program pid = iv·B·H + bh; the launcher sums over the NV tiles)."""
    return f"{base} + (pid * T + {tok}) * {SIZE[dim]} + r{dim}"


def part_rows(base: str, dim: str) -> str:
    """Pointers to rows ctok of this program's slice of a [NV, B·H, T, N_dim] partial-sum buffer."""
    return f"{base} + (pid * T + ctok[:, None]) * {SIZE[dim]} + r{dim}[None, :]"


def ring_row(base: str, dim: str) -> str:
    """Pointer to token t's row of this program's ring of BC rows in a [NV·B·H, BC, N_dim] buffer (the
    factor cotangents of the mini-batch the reverse walk is in; read back at the mini-batch start)."""
    return f"{base} + (pid * BC + t % BC) * {SIZE[dim]} + r{dim}"


def ring_rows(base: str, dim: str) -> str:
    """All BC rows of this program's ring (at a mini-batch start t % BC == 0, row j is token t + j)."""
    return f"{base} + (pid * BC + rc[:, None]) * {SIZE[dim]} + r{dim}[None, :]"


# ---- an IR graph as straight-line code

class _Form:
    """How vectors look in the printed code: one token (1-D tiles, per-token scalars are scalars) or, with
    `matmul`, a block of BC tokens ([BC, n] tiles, per-token scalars [BC, 1], reductions along axis 1)."""

    def __init__(self, matmul):
        self.matmul = matmul
        self.tile = matmul is not None

    def red(self, x: str) -> str:  # a reduction over a vector's lanes
        return f"tl.sum({x}, axis=1)[:, None]" if self.tile else f"tl.sum({x}, axis=0)"

    def lanes(self, n: str) -> str:  # the mask of a dimension's real (unpadded) lanes
        return f"m{n}[None, :]" if self.tile else f"m{n}"


def graph_lines(gr: ir.Graph, prefix: str, weights: list[str], scalars: dict[str, str], inputs: dict[str, str],
                dims_of_weight: list[tuple[str, str]],
                matmul=None) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Print an IR graph as straight-line Triton code. Returns (lines, outputs, dims).

    Without `matmul`: one token, vectors are 1-D tiles and per-token scalars are scalars. With
    `matmul(op, i, weight, h)` (a Triton expression for layer/linear/linear_t on weight i): a block of
    BC tokens, vectors are [BC, n] tiles, per-token scalars [BC, 1], reductions run along axis 1."""
    form = _Form(matmul)
    names, dims, lines, outputs = {}, {}, [], {}
    for nid in gr.order():
        op, srcs = gr.node(nid), gr.srcs(nid)
        a = [names[s] for s in srcs]
        da = [dims[s] for s in srcs]
        var = f"{prefix}{op.name}"
        if op.op == "input":
            names[nid], dims[nid] = inputs[op.arg] if op.arg in inputs else (scalars[op.arg], "s")
            continue
        if op.op == "weight":
            names[nid], dims[nid] = weights[op.arg], "w"
            continue
        if op.op == "output":
            outputs[op.arg] = a[0]
            continue
        if op.op in ("linear", "layer", "linear_t"):
            new, dims[nid] = _print_matmul(form, var, op, a, weights, dims_of_weight)
        elif op.op in _OP_PRINTERS:
            new, dims[nid] = _OP_PRINTERS[op.op](form, var, op, a, da)
        else:
            raise Unsupported(f"no Triton printer for IR op {op.op}")
        lines += new
        names[nid] = var
    return lines, outputs, dims


def _print_matmul(form: _Form, var, op, a, weights, dims_of_weight):
    """layer/linear: h ↦ W h (rows of W out); linear_t: d ↦ Wᵀ d (columns out)."""
    if op.op == "linear_t":
        line = (f"{var} = {form.matmul(op.op, op.arg, a[0], a[1])}" if form.tile else
                f"{var} = tl.sum({a[0]} * {a[1]}[:, None], axis=0)")
        return [line], dims_of_weight[op.arg][1]
    w, h = (weights[op.arg], a[0]) if op.op == "layer" else (a[0], a[1])
    line = f"{var} = {form.matmul(op.op, op.arg, w, h)}" if form.tile else f"{var} = tl.sum({w} * {h}[None, :], axis=1)"
    return [line], dims_of_weight[op.arg][0]


def _print_ew(form: _Form, var, op, a, da):
    """An elementwise SymPy expression of its sources (a constant vector when it has none)."""
    expr, syms = op.arg
    tensor_dims = [d for d in da if d != "s"]
    dim = tensor_dims[0] if tensor_dims else "v"
    if not a:
        full = f"tl.full([BC, {BLOCK[dim]}], {float(expr)!r}, tl.float32)" if form.tile else repr(float(expr))
        return [f"{var} = tl.where({form.lanes(dim)}, {full}, 0.0)"], dim
    lines = print_triton_block({var: expr}, dict(zip(syms, a)), prefix=f"_{var}_")
    if tensor_dims:  # keep padded lanes at zero
        lines.append(f"{var} = tl.where({form.lanes(dim)}, {var}, 0.0)")
    return lines, dim


def _print_reduction(form: _Form, var, op, a, da):
    """rownorm, rowsumsq, rowsum: a per-token scalar."""
    if op.op == "rownorm":
        return [f"{var} = tl.sqrt({form.red(f'{a[0]} * {a[0]}')})"], "s"
    if op.op == "rowsumsq":
        return [f"{var} = {form.red(f'{a[0]} * {a[0]}')}"], "s"
    return [f"{var} = {form.red(a[0])}"], "s"


def _print_layernorm(form: _Form, var, op, a, da):
    n, red, lanes = da[0], form.red, form.lanes
    return [f"{var}_c = tl.where({lanes(n)}, {a[0]} - {red(a[0])} / N{n}, 0.0)",
            f"{var} = {var}_c * tl.rsqrt({red(f'{var}_c * {var}_c')} / N{n} + 1e-5)"], n


def _print_layernorm_bwd(form: _Form, var, op, a, da):
    """The LayerNorm's vector-Jacobian product at z for the cotangent dy."""
    n, red, lanes = da[0], form.red, form.lanes
    return [f"{var}_c = tl.where({lanes(n)}, {a[0]} - {red(a[0])} / N{n}, 0.0)",
            f"{var}_r = tl.rsqrt({red(f'{var}_c * {var}_c')} / N{n} + 1e-5)",
            f"{var}_h = {var}_c * {var}_r",
            f"{var} = tl.where({lanes(n)}, {var}_r * ({a[1]} - {red(a[1])} / N{n} - {var}_h * "
            f"{red(f'{a[1]} * {var}_h')} / N{n}), 0.0)"], n


def _print_layernorm_bwd2(form: _Form, var, op, a, da):
    """∂/∂z ⟨g, LN'(z)ᵀ dy⟩, with c = z - mean z, r = rstd, a = dy - mean dy."""
    n, red, lanes = da[0], form.red, form.lanes
    z, dy, g = a
    return [f"{var}_c = tl.where({lanes(n)}, {z} - {red(z)} / N{n}, 0.0)",
            f"{var}_r = tl.rsqrt({red(f'{var}_c * {var}_c')} / N{n} + 1e-5)",
            f"{var}_a = tl.where({lanes(n)}, {dy} - {red(dy)} / N{n}, 0.0)",
            f"{var}_mac = {red(f'{var}_a * {var}_c')} / N{n}",
            f"{var}_ga = {red(f'{g} * {var}_a')}",
            f"{var}_gc = {red(f'{g} * {var}_c')}",
            f"{var}_r3 = {var}_r * {var}_r * {var}_r",
            f"{var}_x = {var}_r3 * ((3.0 * {var}_r * {var}_r * {var}_mac * {var}_gc - {var}_ga) * {var}_c "
            f"/ N{n} - {var}_gc * {var}_a / N{n} - {var}_mac * {g})",
            f"{var}_x = tl.where({lanes(n)}, {var}_x, 0.0)",
            f"{var} = tl.where({lanes(n)}, {var}_x - {red(f'{var}_x')} / N{n}, 0.0)"], n


# IR op -> printer(form, var, op, sources, source dims) -> (lines, dim of the result)
_OP_PRINTERS = {"ew": _print_ew, "rownorm": _print_reduction, "rowsumsq": _print_reduction,
                "rowsum": _print_reduction, "layernorm": _print_layernorm, "layernorm_bwd": _print_layernorm_bwd,
                "layernorm_bwd2": _print_layernorm_bwd2}
