"""The chunk families' one-op paths (a runtime piece: the functions an emitted module's chunked Triton section names
are copied into it by mirasc.codegen.triton_chunked): where a chunk is one tile, the Hebbian write, the delta rule with
one decay per head and the delta rule with a key-channel decay each run as one op whose kernels read q, k, v in their
dtype and in place; only the per-token gates are torch. Also the key-channel delta rule's preparation op on its
scores (_WY_OP), for chunks that do not tile."""

import torch
import triton

from .chunk_channel_host import _chunk_scores_bwd, _scores_bk, _scores_fwd
from .chunk_host import (
    CH_DECAY,
    ETA_K,
    IMPLICIT,
    OP_ID,
    _chunk_bwd,
    _chunk_fwd,
    _chunk_kernel,
    _in_place,
    _launch_prec,
    _o_dtype,
    _o_written,
    _out_dtype,
    _proximal_beta,
    _read_exponents,
    _rows,
    _scan_cotangents,
    _scores_fake,
    _split,
    _tile_rows,
)
from .chunk_space import SUB
from .custom_ops import _register_op
from .kernels.chunk_head import _wy_bwd, _wy_fwd


def _one_op_context(ctx, inputs, output, n_saved):
    """A one-op path's autograd context: its first n_saved inputs and the intermediates it returns after o and the
    final state, and the chunk, precision and layout (its last three inputs)."""
    ctx.save_for_backward(*inputs[:n_saved], *output[2:])
    ctx.chunk, ctx.prec, ctx.tf = inputs[-3:]
    ctx.set_materialize_grads(False)  # the saved intermediates are not read: no zero cotangents for them


def _qkv_grads_fake(q, k, v, gate, g, dw_final):
    """The gradients' fake of a one-op path on (q, k, v, a per-token gate, g, W_0): q, k, v's in their layout and
    16-bit dtype, the rest fp32."""
    f32 = dict(dtype=torch.float32)
    return [torch.empty_like(q, dtype=_out_dtype(q)), torch.empty_like(k, dtype=_out_dtype(k)),
            torch.empty_like(v, dtype=_out_dtype(v)), torch.empty_like(gate, **f32), torch.empty_like(g, **f32),
            dw_final.new_empty(dw_final.shape, **f32)]


def _register_hebbian_op():
    """The Hebbian write's chunked path as one op: q, k, v read in their dtype and in place ([B, T, H, D] as
    layers hand them over, tf, or [B, H, T, D]), U = η v formed in the scan; the backward writes dq, dk, dv in
    the inputs' layout and dtype, and dη, dg, dW_0."""
    if triton is None:
        return None

    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eta: torch.Tensor, g: torch.Tensor, w0: torch.Tensor,
           chunk: int, prec: str, tf: bool) -> list[torch.Tensor]:
        return list(_chunk_fwd(q, k, None, v, g, w0, chunk, prec, tf, eta=eta))

    def op_fake(q, k, v, eta, g, w0, chunk, prec, tf):
        B, H, T = eta.shape
        return [v.new_empty(v.shape, dtype=_o_written(q)), w0.new_empty(w0.shape),
                w0.new_empty(B, H, T // chunk, *w0.shape[2:], dtype=_out_dtype(q)),
                v.new_empty(B, H, T, v.shape[-1], dtype=_out_dtype(q)), _scores_fake(q, B, H, T, chunk)]

    def backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eta: torch.Tensor, g: torch.Tensor,
                    ckpt: torch.Tensor, uu: torch.Tensor, a: torch.Tensor, do: torch.Tensor, dw_final: torch.Tensor,
                    chunk: int, prec: str, tf: bool) -> list[torch.Tensor]:
        return list(_chunk_bwd(q, k, None, uu, g, ckpt, a, do, dw_final, chunk, prec, tf=tf, v=v, eta=eta))

    def backward_fake(q, k, v, eta, g, ckpt, uu, a, do, dw_final, chunk, prec, tf):
        return _qkv_grads_fake(q, k, v, eta, g, dw_final)

    def setup_context(ctx, inputs, output):
        _one_op_context(ctx, inputs, output, 5)  # q, k, v, η, g

    def backward(ctx, backward_op, grads_out):
        q, k, v, eta, g, ckpt, uu, a = ctx.saved_tensors
        do, dw_final = _scan_cotangents(grads_out, q, v, *eta.shape[:2], q.shape[-1])
        dq, dk, dv, deta, dg, dw0 = backward_op(q, k, v, eta, g, ckpt, uu, a, do, dw_final, ctx.chunk, ctx.prec,
                                                ctx.tf)
        return dq, dk, dv, deta, dg, dw0, None, None, None

    return _register_op("hebbian", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


_HEBBIAN_OP = _register_hebbian_op()


def _hebbian_on_kernels(q, k, v, c, state, eta, g, chunks, prec):
    """The Hebbian write on _HEBBIAN_OP: only the per-token gates (η [B, H, T], the log-decays g) are torch;
    k, v and q go to the kernels as they are (16-bit inputs stay 16-bit): views of [B, T, H, D] tensors (what
    apply passes for 16-bit inputs) are read in that layout, in place. A key width that is not a multiple of 16
    (Based's φ: 1 + D + D(D + 1)/2 = 153 at D = 16) is zero-padded to one, so that the kernels' rows are aligned
    (unaligned, their loads cannot be vectorised and the reverse scan spilled 168 B on sm_90, 512 B on sm_80;
    aligned 0 and 40): zero key columns write nothing and read nothing."""
    T, n, Dk = q.shape[2], g.shape[3], q.shape[-1]
    tf, flat = _in_place(q, g, chunks)
    # lr=gate(k): the written key is η ⊙ k (the kernels' K)
    kf = flat(k.float() * c["eta_ch"].float()) if ETA_K else flat(k)
    qf, w0, g = flat(q), state["W"].float(), _rows(g)
    pad = (-Dk) % 16
    if pad:  # (a key-channel log-decay of 0 on the padded columns: no decay of what is never written)
        qf, kf, w0 = (torch.nn.functional.pad(x, (0, pad)) for x in (qf, kf, w0))
        g = torch.nn.functional.pad(g, (0, pad)) if CH_DECAY else g
    o, w_final = _HEBBIAN_OP(qf, kf, flat(v), _rows(eta), g, w0.contiguous(), n, prec, tf)[:2]
    o = o.transpose(1, 2) if tf else o  # [B, H, T, Dv] (a view of [B, T, H, Dv] for tf)
    return o[:, :, :T].to(_o_dtype(q)), {"W": w_final[..., :Dk].to(state["W"].dtype)}


def _dims(x, tf):
    """B, H, T of a [B, T, H, ·] (tf) or [B, H, T, ·] tensor."""
    return (x.shape[0], x.shape[2], x.shape[1]) if tf else tuple(x.shape[:3])


def _wy_fwd_launch(k, w, v, beta, x, g, chunk, prec, tf=False):
    (B, H, T), Dk, Dv = _dims(k, tf), k.shape[-1], v.shape[-1]
    wk = torch.empty(B, H, T, Dk, dtype=_out_dtype(k), device=k.device)  # (only ever a dot operand: 16-bit as FLA)
    u = torch.empty(B, H, T, Dv, dtype=torch.float32, device=k.device)  # (fp32: the scan subtracts it from Wk W_0ᵀ)
    kernel, tile = _chunk_kernel(_wy_fwd, k, Dk, Dv, chunk, prec)
    kernel[(T // chunk, B * H)](k, k if w is None else w, v, beta, x, g, wk, u, T, Dk, Dv, H, BT=chunk,
                                SAME_W=w is None, PREC=_launch_prec(prec), PREC_A=_launch_prec(_split(prec)), TF=tf,
                                **tile)
    return wk, u


def _wy_bwd_launch(k, w, v, beta, x, g, wk, u, dwk, du, dkc, chunk, prec, tf=False):
    (B, H, T), Dk, Dv = _dims(k, tf), k.shape[-1], v.shape[-1]
    f32 = dict(dtype=torch.float32, device=k.device)
    dk = torch.empty(k.shape, dtype=_out_dtype(k), device=k.device)  # the keys' and values' last gradients
    dv = torch.empty(v.shape, dtype=_out_dtype(v), device=k.device)
    dw = dk if w is None else torch.empty(w.shape, dtype=_out_dtype(w), device=k.device)
    dbeta, dx, dg = (torch.empty(B, H, T, **f32) for _ in range(3))
    kernel, tile = _chunk_kernel(_wy_bwd, k, Dk, Dv, chunk, prec)
    kernel[(T // chunk, B * H)](k, k if w is None else w, v, beta, x, g, wk, u, dwk, du, dkc, dk, dw, dv, dbeta, dx, dg,
                                T, Dk, Dv, H, BT=chunk, SAME_W=w is None, PREC=_launch_prec(prec),
                                PREC_A=_launch_prec(_split(prec)), TF=tf, **tile)
    return dk, None if w is None else dw, dv, dbeta, dx, dg


def _register_delta_op():
    """The delta family's whole chunked path as one op: the preparation kernels (_wy_fwd) and the chunk scan,
    q, k, v read in their dtype and in place ([B, T, H, D] as layers hand them over, tf, or [B, H, T, D]); the
    backward runs the chunk kernels' backward and _wy_bwd and sums the key's gradients in fp32."""
    if triton is None:
        return None

    def op(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, v: torch.Tensor, beta: torch.Tensor,
           x: torch.Tensor, g: torch.Tensor, w0: torch.Tensor, chunk: int, prec: str, tf: bool) -> list[torch.Tensor]:
        wk, u = _wy_fwd_launch(k, w, v, beta, x, g, chunk, prec, tf)
        o, w_final, ckpt, uu = _chunk_fwd(q, k if w is None else w, wk, u, g, w0, chunk, prec, tf)[:4]
        return [o, w_final, ckpt, uu, wk, u]

    def op_fake(q, k, w, v, beta, x, g, w0, chunk, prec, tf):
        (B, H, T), Dk, Dv = _dims(k, tf), k.shape[-1], v.shape[-1]
        f32 = dict(dtype=torch.float32)
        return [v.new_empty(*v.shape[:3], Dv, dtype=_o_written(q)), w0.new_empty(w0.shape),
                w0.new_empty(B, H, T // chunk, *w0.shape[2:], dtype=_out_dtype(q)),
                v.new_empty(B, H, T, Dv, dtype=_out_dtype(q)),
                k.new_empty(B, H, T, Dk, dtype=_out_dtype(k)), v.new_empty(B, H, T, Dv, **f32)]

    def backward_op(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, v: torch.Tensor, beta: torch.Tensor,
                    x: torch.Tensor, g: torch.Tensor, ckpt: torch.Tensor, uu: torch.Tensor, wk: torch.Tensor,
                    u: torch.Tensor, do: torch.Tensor, dw_final: torch.Tensor, chunk: int,
                    prec: str, tf: bool) -> list[torch.Tensor]:
        dq, dkw, dwk, du, dg, dw0 = _chunk_bwd(q, k if w is None else w, wk, uu, g, ckpt, None, do, dw_final, chunk,
                                               prec, raw_du=True, tf=tf)
        dk, dw, dv, dbeta, dx, dg_prep = _wy_bwd_launch(k, w, v, beta, x, g, wk, u, dwk, du, dkw, chunk, prec, tf)
        dg += dg_prep
        return [dq, dk, dk.new_zeros(0) if dw is None else dw, dv, dbeta, dx, dg, dw0]

    def backward_fake(q, k, w, v, beta, x, g, ckpt, uu, wk, u, do, dw_final, chunk, prec, tf):
        f32 = dict(dtype=torch.float32)
        return [torch.empty_like(q, dtype=_out_dtype(q)), torch.empty_like(k, dtype=_out_dtype(k)),
                k.new_empty(0, **f32) if w is None else torch.empty_like(w, dtype=_out_dtype(w)),
                torch.empty_like(v, dtype=_out_dtype(v)),
                torch.empty_like(beta, **f32), torch.empty_like(x, **f32), torch.empty_like(g, **f32),
                dw_final.new_empty(dw_final.shape, **f32)]

    def setup_context(ctx, inputs, output):
        _one_op_context(ctx, inputs, output, 7)  # q, k, w, v, β, x, g

    def backward(ctx, backward_op, grads_out):
        q, k, w, v, beta, x, g, ckpt, uu, wk, u = ctx.saved_tensors
        do, dw_final = _scan_cotangents(grads_out, q, v, *g.shape[:2], k.shape[-1])
        dq, dk, dw, dv, dbeta, dx, dg, dw0 = backward_op(
            q, k, w, v, beta, x, g, ckpt, uu, wk, u, do, dw_final, ctx.chunk, ctx.prec, ctx.tf)
        return dq, dk, None if w is None else dw, dv, dbeta, dx, dg, dw0, None, None, None

    return _register_op("delta", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


_DELTA_OP = _register_delta_op()


def _delta_on_kernels(q, k, v, c, state, eta, g, chunks, prec):
    """The delta family on _DELTA_OP: only the per-token gates ([B, H, T]: β, the log-decays g and the
    exponents x) are torch; k, v and q go to the kernels as they are (16-bit inputs stay 16-bit): views of
    [B, T, H, D] tensors (what apply passes for 16-bit inputs) are read in that layout, in place."""
    T, n = q.shape[2], g.shape[3]
    tf, flat = _in_place(q, g, chunks)
    qf, kf, vf = flat(q), flat(k), flat(v)
    # the written key: η ⊙ k under lr=gate(k) (the kernels' K), else the read key (None)
    w = flat(k.float() * c["eta_ch"].float()) if ETA_K else None
    beta = _proximal_beta(eta, kf, tf) if IMPLICIT else eta
    x = _read_exponents(g)
    o, w_final = _DELTA_OP(qf, kf, w, vf, _rows(beta), _rows(x), _rows(g), state["W"].float().contiguous(), n, prec,
                           tf)[:2]
    o = o.transpose(1, 2) if tf else o  # [B, H, T, Dv] (a view of [B, T, H, Dv] for tf)
    return o[:, :, :T].to(_o_dtype(q)), {"W": w_final.to(state["W"].dtype)}




def _register_wy_op():
    """The key-channel delta rule's chunk preparation after its scores: (P, K, x, V, β) -> (Wk, U), fp32, with the
    backward as the kernel _wy_bwd (dP feeds the scores kernels' backward through autograd)."""
    if triton is None:
        return None

    def op(p: torch.Tensor, k: torch.Tensor, x: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
           prec: str) -> list[torch.Tensor]:
        B, H, T, Dk = k.shape
        Dv, bt = v.shape[-1], p.shape[-1]
        wk, u = torch.empty(B, H, T, Dk, **_f32(k)), torch.empty(B, H, T, Dv, **_f32(k))
        kernel, tile = _chunk_kernel(_wy_fwd, k, Dk, Dv, bt, prec)
        kernel[(T // bt, B * H)](p, k, x, v, beta, wk, u, T, Dk, Dv, H, BT=bt, PREC=_launch_prec(prec),
                                 PREC_A=_launch_prec(_split(prec)), TF=False, **tile)
        return [wk, u]

    def op_fake(p, k, x, v, beta, prec):
        return [torch.empty_like(k, dtype=torch.float32), torch.empty_like(v, dtype=torch.float32)]

    def backward_op(p: torch.Tensor, k: torch.Tensor, x: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                    wk: torch.Tensor, u: torch.Tensor, dwk: torch.Tensor, du: torch.Tensor,
                    prec: str) -> list[torch.Tensor]:
        B, H, T, Dk = k.shape
        Dv, bt = v.shape[-1], p.shape[-1]
        dp = torch.empty(p.shape, **_f32(k))
        dk, dx, dv = torch.empty(B, H, T, Dk, **_f32(k)), torch.empty(B, H, T, Dk, **_f32(k)), \
            torch.empty(B, H, T, Dv, **_f32(k))
        dbeta = torch.empty(B, H, T, **_f32(k))
        kernel, tile = _chunk_kernel(_wy_bwd, k, Dk, Dv, bt, prec)
        kernel[(T // bt, B * H)](p, k, x, v, beta, wk, u, dwk, du, dp, dk, dx, dv, dbeta, T, Dk, Dv, H, BT=bt,
                                 PREC=_launch_prec(prec), PREC_A=_launch_prec(_split(prec)), TF=False, FUSED=False,
                                 **tile)
        return [dp, dk, dx, dv, dbeta]

    def backward_fake(p, k, x, v, beta, wk, u, dwk, du, prec):
        f32 = dict(dtype=torch.float32)
        return [torch.empty_like(p, **f32), torch.empty_like(k, **f32), torch.empty_like(k, **f32),
                torch.empty_like(v, **f32), torch.empty_like(beta, **f32)]

    def setup_context(ctx, inputs, output):
        p, k, x, v, beta, prec = inputs
        ctx.save_for_backward(p, k, x, v, beta, *output)
        ctx.prec = prec

    def backward(ctx, backward_op, grads):
        p, k, x, v, beta, wk, u = ctx.saved_tensors
        dwk, du = grads
        dwk = torch.zeros_like(wk) if dwk is None else dwk.float().contiguous()
        du = torch.zeros_like(u) if du is None else du.float().contiguous()
        dp, dk, dx, dv, dbeta = backward_op(p, k, x, v, beta, wk, u, dwk, du, ctx.prec)
        return dp, dk, dx, dv, dbeta, None

    return _register_op("wy", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


def _f32(like):
    return dict(dtype=torch.float32, device=like.device)


_WY_OP = _register_wy_op()


def _scores_preparation(scores, k, x, v, beta, prec):
    """The key-channel delta rule's preparation (Wk, U) on _WY_OP where a chunk is one tile, else None (torch solves
    it): scores [B, H, NT, n, n], the others [B, H, NT, n, ...]."""
    NT, n = k.shape[2:4]
    if _WY_OP is None or _tile_rows(n) != n:
        return None
    rows = lambda t: t.flatten(2, 3).contiguous()  # noqa: E731
    return tuple(t.unflatten(2, (NT, n)) for t in _WY_OP(scores.contiguous(), rows(k), rows(x), rows(v), rows(beta),
                                                        prec))


def _register_channel_delta_op():
    """The key-channel delta rule's chunked path as one op (a = b = k, x = g: order=pre, the written key the read
    key): the scores kernels, the preparation kernels (_wy_fwd) and the chunk scan, q, k, v read in their dtype and
    in place ([B, T, H, D] as layers hand them over, tf, or [B, H, T, D]); the backward runs the scan's backward,
    _wy_bwd and the scores' backward, which add up the key's and g's gradients in fp32 inside the kernels."""
    if triton is None:
        return None

    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor, w0: torch.Tensor,
           chunk: int, prec: str, tf: bool) -> list[torch.Tensor]:
        B, H, T, Dk = g.shape
        Dv = v.shape[-1]
        p, a = _scores_fwd(k, k, g, g, chunk, prec, tf, q2=q)  # the preparation's scores and the output's
        wk = torch.empty(B, H, T, Dk, dtype=_out_dtype(k), device=k.device)  # (a dot operand only)
        u = torch.empty(B, H, T, Dv, dtype=torch.float32, device=k.device)  # (the scan subtracts it from Wk W_0ᵀ)
        kernel, tile = _chunk_kernel(_wy_fwd, k, Dk, Dv, chunk, prec)
        kernel[(T // chunk, B * H)](p, k, g, v, beta, wk, u, T, Dk, Dv, H, BT=chunk, PREC=_launch_prec(prec),
                                    PREC_A=_launch_prec(_split(prec)), TF=tf, **tile)
        o, w_final, ckpt, uu, a = _chunk_fwd(q, k, wk, u, g, w0, chunk, prec, tf, a=a)
        return [o, w_final, ckpt, uu, wk, u, p, a]

    def op_fake(q, k, v, beta, g, w0, chunk, prec, tf):
        B, H, T, Dk = g.shape
        Dv = v.shape[-1]
        f32 = dict(dtype=torch.float32)
        return [v.new_empty(v.shape, dtype=_o_written(q)), w0.new_empty(w0.shape),
                w0.new_empty(B, H, T // chunk, *w0.shape[2:], dtype=_out_dtype(q)),
                v.new_empty(B, H, T, Dv, dtype=_out_dtype(q)), k.new_empty(B, H, T, Dk, dtype=_out_dtype(k)),
                v.new_empty(B, H, T, Dv, **f32), g.new_empty(B, H, T // chunk, chunk, chunk, **f32),
                _scores_fake(q, B, H, T, chunk)]

    def backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
                    ckpt: torch.Tensor, uu: torch.Tensor, wk: torch.Tensor, u: torch.Tensor, p: torch.Tensor,
                    a: torch.Tensor, do: torch.Tensor, dw_final: torch.Tensor, chunk: int, prec: str,
                    tf: bool) -> list[torch.Tensor]:
        B, H, T, Dk = g.shape
        Dv = v.shape[-1]
        # the scan's backward: dq (final), the key's and g's parts in fp32 [B, H, T, Dk] (added to below), du
        dq, dkw, dwk, du, dg, dw0 = _chunk_bwd(q, k, wk, uu, g, ckpt, a, do, dw_final, chunk, prec, raw_du=True,
                                               tf=tf)
        dp = torch.empty(p.shape, dtype=torch.float32, device=k.device)
        dv = torch.empty(v.shape, dtype=_out_dtype(v), device=k.device)
        dbeta = torch.empty(B, H, T, dtype=torch.float32, device=k.device)
        kernel, tile = _chunk_kernel(_wy_bwd, k, Dk, Dv, chunk, prec)
        kernel[(T // chunk, B * H)](p, k, g, v, beta, wk, u, dwk, du, dp, dkw, dg, dv, dbeta, T, Dk, Dv, H, BT=chunk,
                                    PREC=_launch_prec(prec), PREC_A=_launch_prec(_split(prec)), TF=tf, FUSED=True,
                                    **tile)
        dk = torch.empty(k.shape, dtype=_out_dtype(k), device=k.device)
        bk = _scores_bk(k)
        _chunk_scores_bwd[(triton.cdiv(Dk, bk), T // chunk * (chunk // SUB), B * H)](
            k, k, g, g, dp, dk, dk, dk, dg, dkw, T, Dk, H, BT=chunk, BK=bk, BC=SUB, PREC=_launch_prec(prec), TF=tf,
            FUSED=True, num_warps=8)
        return [dq, dk, dv, dbeta, dg, dw0]

    def backward_fake(q, k, v, beta, g, ckpt, uu, wk, u, p, a, do, dw_final, chunk, prec, tf):
        return _qkv_grads_fake(q, k, v, beta, g, dw_final)

    def setup_context(ctx, inputs, output):
        _one_op_context(ctx, inputs, output, 5)  # q, k, v, β, g

    def backward(ctx, backward_op, grads_out):
        q, k, v, beta, g, ckpt, uu, wk, u, p, a = ctx.saved_tensors
        do, dw_final = _scan_cotangents(grads_out, q, v, *g.shape[:2], g.shape[-1])
        dq, dk, dv, dbeta, dg, dw0 = backward_op(q, k, v, beta, g, ckpt, uu, wk, u, p, a, do, dw_final, ctx.chunk,
                                                 ctx.prec, ctx.tf)
        return dq, dk, dv, dbeta, dg, dw0, None, None, None

    return _register_op("channel_delta", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


_CHANNEL_DELTA_OP = _register_channel_delta_op()


def _channel_delta_on_kernels(q, k, v, c, state, eta, g, chunks, prec):
    """The key-channel delta rule on _CHANNEL_DELTA_OP: only the per-token β [B, H, T] and the log-decays g are
    torch; q, k, v go to the kernels as they are (16-bit inputs stay 16-bit): views of [B, T, H, D] tensors (what
    apply passes for 16-bit inputs) are read in that layout, in place."""
    T, n = q.shape[2], g.shape[3]
    tf, flat = _in_place(q, g, chunks)
    kf = flat(k)
    beta = _proximal_beta(eta, kf, tf) if IMPLICIT else eta
    o, w_final = _CHANNEL_DELTA_OP(flat(q), kf, flat(v), _rows(beta), _rows(g), state["W"].float().contiguous(), n,
                                   prec, tf)[:2]
    o = o.transpose(1, 2) if tf else o  # [B, H, T, Dv] (a view of [B, T, H, Dv] for tf)
    return o[:, :, :T].to(_o_dtype(q)), {"W": w_final.to(state["W"].dtype)}
