"""The host side of the fused recurrent kernels (a runtime piece: copied into every emitted module with Triton
kernels by mirasc.codegen.triton_backend; the kernels themselves are printed from the spec's IR there): the Omega
window's and the feature map's folding into the chunk kernels' inputs, the launches of the forward and of the
generated reverse sweep (or autograd through the torch recurrence where there is none), the op that wraps them, and
launch_plan's kernels. The spec's own names it reads come from the emitted module; mirasc.runtime.recurrent_spec has
stand-ins so that these pieces import."""

import torch
import triton

from .custom_ops import _register_op
from .recurrent_space import _check_fits, _config_for, _fit_error, _recurrent_space, _RecurrentLayout
from .recurrent_spec import (
    _BWD_SEGMENT,
    _BWD_STATE,
    _BWD_STATE_WEIGHT,
    _COEF_ORDER,
    _FACTOR_BLOCK,
    _FACTOR_DIMS,
    _FEATURES,
    _MOMENTUM,
    _STORE_ACC,
    _TILES_BWD,
    _TILES_FWD,
    _V_TILE_REASON,
    _V_TILES,
    _VECTOR_COEFS,
    _WINDOW,
    _WINDOW_COEFS,
    CONSTANTS,
    OP_ID,
    WEIGHTS,
    _fused_recurrent_bwd,
    _fused_recurrent_fwd,
    _kernel_key_width,
    _recurrent,
    _triton_features,
    _weight_shapes,
)


def _kernel_weight_shapes(Dk, Dv):
    """The weights' [rows, cols] the kernels hold at their key width Dk (with _FEATURES already φ_p's width)."""
    return [(Dv, Dk)] if _FEATURES else _weight_shapes(Dk, Dv)


def _on_chunk_kernels(fn, q, k, v, c, state, chunk, **kw):
    """A call of the chunk kernels `fn(q, k, v, c, state, chunk, **kw)` with the Atlas pieces folded into its inputs:
    φ_p(q), φ_p(k) with _FEATURES; with an Omega window (gradients that do not read the state, or are taken at the
    mini-batch anchor; gd, or momentum on the mini-batch kernels) token t becomes _WINDOW kernel rows j = 0..c−1,
    row j writing window token i = t − c + 1 + j: key k_i, value v_i and the coefficients the bias reads from token
    i, η_t γ_i as its rate, α_t (and the momentum's θ_t) on row 0 only (1 on the others), and q_t on the last row
    only (zeros elsewhere), whose output is token t's; a chunk of n tokens is n·c rows, so every row of a mini-batch
    takes its gradient at the same anchor. (With momentum, the mini-batch kernels' preparation adds S to W on a
    step's last row only.)"""
    if _WINDOW == 1:
        q, k = _triton_features(q, k)
        return fn(q, k, v, c, state, chunk, **kw)
    B, H, T = q.shape[:3]
    n = _WINDOW
    kraw, vw = torch.cat([state["win_k"], k], dim=2), torch.cat([state["win_v"], v], dim=2)
    cws = {m: torch.cat([state["win_" + m], c[m].unsqueeze(-1) if c[m].dim() == 3 else c[m]], dim=2)
           for m in _WINDOW_COEFS}
    q, kf = _triton_features(q, kraw)
    idx = (torch.arange(T, device=q.device)[:, None] + torch.arange(n, device=q.device)[None, :]).flatten()
    j = torch.arange(n, device=q.device)

    def rows(x, first=None, last=None):  # a per-token [B, H, T, ...] as [B, H, T·c, ...]
        x = x.unsqueeze(3).expand(*x.shape[:3], n, *x.shape[3:])
        sel = first if first is not None else last
        if sel is not None:
            mask = sel.view(1, 1, 1, n, *([1] * (x.dim() - 4)))
            x = torch.where(mask, x, torch.ones_like(x) if first is not None else torch.zeros_like(x))
        return x.flatten(2, 3)

    rc = {m: rows(x) for m, x in c.items() if m not in _WINDOW_COEFS}
    rc.update({m: x[:, :, idx].squeeze(-1) for m, x in cws.items()})  # (γ_i too: a coefficient the kernels list)
    rc["eta"] = rows(c["eta"]) * cws["gamma"][:, :, idx, 0]
    for m in ("alpha", "theta"):  # the retention's α_t and the momentum's θ_t act once per step: on row 0
        if m in c:
            rc[m] = rows(c[m], first=j == 0)
    st = {m: x for m, x in state.items() if not m.startswith("win_")}
    o, final = fn(rows(q, last=j == n - 1), kf[:, :, idx], vw[:, :, idx], rc, st, chunk * n, **kw)
    final = {**final, "win_k": kraw[:, :, T:], "win_v": vw[:, :, T:],
             **{"win_" + m: x[:, :, T:] for m, x in cws.items()}}
    return o[:, :, n - 1::n], final


def _factor_scratch(q, v, Ne, names, n_v=1):
    """Float32 scratch per weight for each of `names` (rows- or cols-sized), or placeholders: the factors
    FDL, FX of every token, [B·H, T, n]; their cotangents CTD, CTX as a ring of one mini-batch per program,
    [n_v·B·H, C, n] (each V tile holds its own partial sums)."""
    B, H, T, Dk = q.shape
    size = {"k": Dk, "v": v.shape[-1], "e": Ne}
    out = []
    for rows, cols in _FACTOR_DIMS:
        for name in names:
            n = size[rows] if name in ("FDL", "CTD") else size[cols]
            shape = (B * H, T, n) if name in ("FDL", "FX") else (n_v * B * H, _FACTOR_BLOCK, n)
            out.append(torch.empty(*shape, dtype=torch.float32, device=q.device) if _FACTOR_BLOCK else q)
    return out


_LAYOUT = _RecurrentLayout(_V_TILES, _V_TILE_REASON, _FACTOR_BLOCK, _FACTOR_DIMS, _FEATURES)
# kernel name -> its autotuning space at a launch's arguments (read by `mirasc kernels`)
_RECURRENT_AUTOTUNE = {"_fused_recurrent_fwd": _recurrent_space(_LAYOUT, _TILES_FWD),
                       "_fused_recurrent_bwd": _recurrent_space(_LAYOUT, _TILES_BWD)}


def _recurrent_plan(Dk, Dv):
    """launch_plan's kernels of the fused recurrent path on a GPU: both kernels with the configurations the first
    launch times at these head sizes (Dk the memory's key width); the refusal where one has none (_fit_error)."""
    Dk = _kernel_key_width(Dk)
    Ne = _kernel_weight_shapes(Dk, Dv)[0][0] if len(WEIGHTS) > 1 else 1
    for tiles, backward in ((_TILES_FWD, False), (_TILES_BWD, True)):
        msg = _fit_error(_LAYOUT, Dk, Dv, Ne, tiles, backward)
        if msg is not None:
            raise RuntimeError(msg)
    return {name: space({"Nk": Dk, "Nv": Dv, "Ne": Ne}, None) for name, space in _RECURRENT_AUTOTUNE.items()}


def _state_keys():
    keys = []
    for n in WEIGHTS:
        keys.append(n)
        if _STORE_ACC:
            keys.append("A_" + n)
        if _MOMENTUM:
            keys.append("S_" + n)
    return keys


def _window_args(window):
    """The kernels' window arguments: keys, values, stacked coefficients (fp32, contiguous) and their width."""
    if _WINDOW == 1:
        return []
    kw, vw, cw = window
    return [kw.float().contiguous(), vw.float().contiguous(), cw.float().contiguous(), cw.shape[-1]]


def _launch_recurrent(q, k, v, c, state, window=()):
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    Ne = _kernel_weight_shapes(Dk, Dv)[0][0] if len(WEIGHTS) > 1 else 1  # the hidden width of an MLP memory
    scalars = [n for n in _COEF_ORDER if n not in _VECTOR_COEFS]
    coefs = torch.stack([c[n].float() for n in scalars], dim=-1).contiguous() if scalars else \
        torch.zeros(B, H, T, 1, device=q.device)
    o = torch.empty(B, H, T, Dv, dtype=q.dtype, device=q.device)
    args = [q.contiguous(), k.contiguous(), v.contiguous(), coefs,
            *[c[n].float().contiguous() for n in _VECTOR_COEFS], o]  # channel-wise: [B, H, T, D] each
    args += _window_args(window)
    final = {}
    for key in _state_keys():
        src = state[key].float().contiguous()
        final[key] = torch.empty_like(src)
        args += [src, final[key]]
    args += _factor_scratch(q, v, Ne, ("FDL", "FX"))
    _check_fits(_LAYOUT, Dk, Dv, Ne, _TILES_FWD, False)
    # tl.dot (batched factors) needs every dimension >= 16; padded lanes are masked to zero
    low = 16 if _FACTOR_BLOCK else 1

    def launch(cfg):
        bv, warps = cfg
        _fused_recurrent_fwd[(triton.cdiv(Dv, bv) if _V_TILES else 1, B * H)](
            *args, T, Dk, Dv, Ne, NC=max(1, len(scalars)), BK=max(low, triton.next_power_of_2(Dk)), BV=bv,
            BE=max(low, triton.next_power_of_2(Ne)), BC=_FACTOR_BLOCK or 16, num_warps=warps)

    launch(_config_for(_LAYOUT, "fwd", q, Dk, Dv, Ne, _TILES_FWD, launch))
    return o, final


def _launch_recurrent_bwd(q, k, v, coefs, state, grads_out, window=()):
    """The generated reverse sweep: gradients of q, k, v, every coefficient and the initial state (and of the
    Omega window's sequences)."""
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    Ne = _kernel_weight_shapes(Dk, Dv)[0][0] if len(WEIGHTS) > 1 else 1
    f32 = dict(dtype=torch.float32, device=q.device)
    do = grads_out[0]
    named = dict(zip(_COEF_ORDER, coefs))
    scalars = [n for n in _COEF_ORDER if n not in _VECTOR_COEFS]
    coef = torch.stack([named[n].float() for n in scalars], dim=-1).contiguous() if scalars else \
        torch.zeros(B, H, T, 1, **f32)
    args = [q.float().contiguous(), k.float().contiguous(), v.float().contiguous(), coef,
            *[named[n].float().contiguous() for n in _VECTOR_COEFS], do.float().contiguous()]
    args += _window_args(window)
    d_init = [torch.empty(s.shape, **f32) for s in state]
    for s, g, out in zip(state, grads_out[1:], d_init):
        args += [s.float().contiguous(), g.float().contiguous(), out]
    n_ck = triton.cdiv(T, _BWD_SEGMENT)
    shapes = _kernel_weight_shapes(Dk, Dv)
    args += [torch.empty(B * H, n_ck + _BWD_SEGMENT, *shapes[i], **f32) for i in _BWD_STATE_WEIGHT]
    _check_fits(_LAYOUT, Dk, Dv, Ne, _TILES_BWD, True)
    low = 16 if _FACTOR_BLOCK else 1
    dv = torch.empty(B, H, T, Dv, **f32)

    def launch(cfg):
        bv, warps = cfg
        n_v = triton.cdiv(Dv, bv) if _V_TILES else 1
        # dq, dk and the coefficients' gradients sum over the value rows: each V tile writes its partial sums
        dq, dk = torch.empty(n_v, B, H, T, Dk, **f32), torch.empty(n_v, B, H, T, Dk, **f32)
        dc = torch.empty(n_v, B, H, T, max(1, len(scalars)), **f32)
        # channel-wise: over key channels per-V-tile partial sums like dq; over value channels each tile's rows
        dg = {n: torch.empty(n_v, B, H, T, Dk, **f32) if side == "k" else torch.empty(B, H, T, Dv, **f32)
              for n, side in _VECTOR_COEFS.items()}
        # the Omega window's cotangents: keys and coefficients per-V-tile partial sums, values each tile's rows
        dwin = [] if _WINDOW == 1 else [torch.empty(n_v, B, H, T + _WINDOW - 1, Dk, **f32),
                                        torch.empty(B, H, T + _WINDOW - 1, Dv, **f32),
                                        torch.empty(n_v, B, H, T + _WINDOW - 1, len(_WINDOW_COEFS), **f32)]
        _fused_recurrent_bwd[(n_v, B * H)](*args, dq, dk, dv, dc, *dg.values(), *dwin,
                                           *_factor_scratch(q, v, Ne, ("FDL", "FX", "CTD", "CTX"), n_v),
                                           T, Dk, Dv, Ne, n_ck, n_ck + _BWD_SEGMENT, NC=max(1, len(scalars)),
                                           BK=max(low, triton.next_power_of_2(Dk)), BV=bv,
                                           BE=max(low, triton.next_power_of_2(Ne)), BC=_FACTOR_BLOCK or 16,
                                           num_warps=warps)
        return dq, dk, dc, dg, dwin

    dq, dk, dc, dg, dwin = launch(_config_for(_LAYOUT, "bwd", q, Dk, Dv, Ne, _TILES_BWD, launch))
    dq, dk, dc = dq.sum(0), dk.sum(0), dc.sum(0)
    grads = {n: dc[..., j] for j, n in enumerate(scalars)}
    grads.update({n: g.sum(0) if _VECTOR_COEFS[n] == "k" else g for n, g in dg.items()})
    dcoefs = [grads[n].to(named[n].dtype, copy=True) for n in _COEF_ORDER]  # copies: outputs may not alias
    dwin = [] if _WINDOW == 1 else [dwin[0].sum(0).to(window[0].dtype), dwin[1].to(window[1].dtype),
                                    dwin[2].sum(0).to(window[2].dtype)]
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dcoefs, [g.to(s.dtype) for g, s in zip(d_init, state)],
            dwin)


def _recompute_grads(q, k, v, coefs, state, grads_out):
    """The backward: rerun the torch recurrence on the saved inputs and differentiate it."""
    with torch.enable_grad():
        inputs = [t.detach().requires_grad_() for t in (q, k, v, *coefs, *state)]
        c = dict(zip(_COEF_ORDER, inputs[3:3 + len(coefs)]))
        c.update({n: torch.full_like(inputs[0][..., 0], val) for n, val in CONSTANTS.items() if n not in c})
        o, final = _recurrent(inputs[0], inputs[1], inputs[2], c, dict(zip(_state_keys(), inputs[3 + len(coefs):])))
        outs = [o] + [final[key] for key in _state_keys()]
        pairs = [(a, g) for a, g in zip(outs, grads_out) if g is not None]
        grads = torch.autograd.grad([a for a, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
    return grads[0], grads[1], grads[2], list(grads[3:3 + len(coefs)]), list(grads[3 + len(coefs):]), []


# torch.compile: a registered custom op with a fake (shape-only) implementation and an autograd formula whose
# backward (the generated reverse sweep) is an op of its own, so compiled graphs hold both without a graph break.
# The name is derived from the spec text.
def _register_recurrent_op():
    if triton is None:
        return None

    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, coefs: list[torch.Tensor],
           state: list[torch.Tensor], window: list[torch.Tensor]) -> list[torch.Tensor]:
        o, final = _launch_recurrent(q, k, v, dict(zip(_COEF_ORDER, coefs)), dict(zip(_state_keys(), state)), window)
        return [o] + [final[key].to(s.dtype) for key, s in zip(_state_keys(), state)]

    def op_fake(q, k, v, coefs, state, window):
        return [q.new_empty(*q.shape[:3], v.shape[-1])] + [torch.empty_like(s) for s in state]

    def backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, coefs: list[torch.Tensor],
                    state: list[torch.Tensor], grads_out: list[torch.Tensor],
                    window: list[torch.Tensor]) -> list[torch.Tensor]:
        dq, dk, dv, dc, ds, dw = _launch_recurrent_bwd(q, k, v, coefs, state, grads_out, window)
        return [dq, dk, dv, *dc, *ds, *dw]

    def backward_fake(q, k, v, coefs, state, grads_out, window):
        return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), *[torch.empty_like(c) for c in coefs],
                *[torch.empty_like(s) for s in state], *[torch.empty_like(w) for w in window]]

    def setup_context(ctx, inputs, output):
        q, k, v, coefs, state, window = inputs
        ctx.save_for_backward(q, k, v, *coefs, *state, *window)
        ctx.n_coef, ctx.n_state = len(coefs), len(state)

    def backward(ctx, backward_op, grads_out):
        saved = ctx.saved_tensors
        n, m = ctx.n_coef, ctx.n_state
        q, k, v = saved[:3]
        if not _BWD_STATE:  # no generated backward (the notes above): autograd through the torch recurrence
            return _recompute_grads(q, k, v, saved[3:3 + n], saved[3 + n:], grads_out)
        state = list(saved[3 + n:3 + n + m])
        grads_out = [q.new_zeros(*q.shape[:3], v.shape[-1]) if grads_out[0] is None else grads_out[0]] + \
            [torch.zeros_like(s) if g is None else g for g, s in zip(grads_out[1:], state)]
        outs = backward_op(q, k, v, list(saved[3:3 + n]), state, grads_out, list(saved[3 + n + m:]))
        return outs[0], outs[1], outs[2], list(outs[3:3 + n]), list(outs[3 + n:3 + n + m]), list(outs[3 + n + m:])

    return _register_op("recurrent", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


_RECURRENT_OP = _register_recurrent_op()


def _recurrent_triton(q, k, v, c, state):
    if _RECURRENT_OP is None:
        raise RuntimeError("backend='triton' needs the triton package (and torch.library.custom_op)")
    window, win_final = [], {}
    if _WINDOW > 1:  # the Omega window: the carried c − 1 tokens in front of the sequence; the final window is
        # its last c − 1 rows (a slice, so its gradient reaches the inputs and the initial window through torch)
        kraw, vw = torch.cat([state["win_k"], k], dim=2), torch.cat([state["win_v"], v], dim=2)
        kw = _triton_features(kraw, kraw)[1]  # (the window keeps raw keys; the kernels read their features)
        cws = {n: torch.cat([state["win_" + n], c[n].unsqueeze(-1)], dim=2) for n in _WINDOW_COEFS}
        window = [kw, vw, torch.cat([cws[n] for n in _WINDOW_COEFS], dim=-1)]
        T = q.shape[2]
        win_final = {"win_k": kraw[:, :, T:], "win_v": vw[:, :, T:],
                     **{"win_" + n: x[:, :, T:] for n, x in cws.items()}}
    q, k = _triton_features(q, k)
    outs = _RECURRENT_OP(q, k, v, [c[n] for n in _COEF_ORDER], [state[key] for key in _state_keys()], window)
    return outs[0], {**dict(zip(_state_keys(), outs[1:])), **win_final}
