"""The host side of a decay over key channels (alpha=gate(k): GLA, HGRN2, KDA; a runtime piece, copied into the
emitted modules whose chunk kernels take a log-decay per key channel by mirasc.codegen.triton_chunked): the
log-decays' cumulative sums per chunk and the chunk's scores P_ts = Σ_j a_tj b_sj e^{x_tj - y_sj}, each one op whose
kernels (mirasc/runtime/kernels/chunk_channel.py) never evaluate an exponent above 0."""

import torch
import triton

from .chunk_host import OP_ID, _launch_prec, _out_dtype, _tile_rows
from .chunk_space import SUB
from .custom_ops import _register_op
from .kernels.chunk_channel import _chunk_scores_bwd, _chunk_scores_fwd, _log_decay_bwd, _log_decay_fwd


def _log_decay_launch(alpha, n, NT, bwd_dg=None):
    """_log_decay_fwd (bwd_dg None: g [B, H, NT·n, Dk] fp32) or _log_decay_bwd (dα, laid out as α)."""
    B, H, T, Dk = alpha.shape
    BT, BK = _tile_rows(n), min(64, max(16, triton.next_power_of_2(Dk)))
    grid = (triton.cdiv(Dk, BK), NT, B * H)
    if bwd_dg is None:
        g = torch.empty(B, H, NT * n, Dk, dtype=torch.float32, device=alpha.device)
        _log_decay_fwd[grid](alpha, g, T, Dk, n, *alpha.stride(), H, BT=BT, BK=BK, num_warps=4)
        return g
    da = torch.empty_like(alpha)
    _log_decay_bwd[grid](alpha, bwd_dg, da, T, Dk, n, *alpha.stride(), *da.stride(), H, BT=BT, BK=BK, num_warps=4)
    return da


def _register_log_decay_op():
    if triton is None:
        return None

    def op(alpha: torch.Tensor, n: int, nt: int) -> torch.Tensor:
        return _log_decay_launch(alpha, n, nt)

    def op_fake(alpha, n, nt):
        B, H, _, Dk = alpha.shape
        return alpha.new_empty(B, H, nt * n, Dk, dtype=torch.float32)

    def backward_op(alpha: torch.Tensor, dg: torch.Tensor, n: int, nt: int) -> torch.Tensor:
        return _log_decay_launch(alpha, n, nt, dg)

    def backward_fake(alpha, dg, n, nt):
        return torch.empty_like(alpha)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.n, ctx.nt = inputs[1], inputs[2]

    def backward(ctx, backward_op, dg):
        return backward_op(ctx.saved_tensors[0], dg.float().contiguous(), ctx.n, ctx.nt), None, None

    return _register_op("log_decay", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


_LOG_DECAY_OP = _register_log_decay_op()


def _log_decays(alpha, n, NT):
    """g [B, H, NT, n, Dk]: the log-decays' cumulative sums inside each chunk of n tokens, log α clamped at the
    smallest normal float (α = 0), padded tokens α = 1; one kernel each way (_log_decay_fwd/_bwd) on α as it is
    laid out."""
    return _LOG_DECAY_OP(alpha, n, NT).unflatten(2, (NT, n))


def _scores_bk(x):
    """Dk block of the score kernels: 16 (32 spills 288 B in the forward at D = 64 on sm_90, fp32 dots)."""
    return 16


def _scores_fwd(a, b, x, y, bt, prec, tf=False, diag=False, dtype=torch.float32, q2=None):
    """P [B, H, NT, bt, bt] (s < t; diag: s <= t) in `dtype` from a, b ([B, T, H, Dk] for tf, else [B, H, T, Dk])
    and x, y [B, H, T, Dk]; with q2 (a's layout) also q2's scores against b (s <= t, exponents y_t - y_s) in q2's
    16-bit dtype or fp32 (the output's A, _chunk_fwd), from the same launch: (P, A)."""
    B, H, T, Dk = x.shape
    p = torch.empty(B, H, T // bt, bt, bt, dtype=dtype, device=a.device)
    p2 = p if q2 is None else torch.empty(p.shape, dtype=_out_dtype(q2), device=a.device)
    _chunk_scores_fwd[(T // bt * (bt // SUB), B * H)](
        a, b, x, y, p, a if q2 is None else q2, p2, T, Dk, H, BT=bt, BK=_scores_bk(a), BC=SUB,
        PREC=_launch_prec(prec), TF=tf, DIAG=diag, WITH_Q2=q2 is not None, num_warps=4)
    return p if q2 is None else (p, p2)


def _scores_bwd(a, b, x, y, dp, bt, prec):
    B, H, T, Dk = a.shape
    da, db, dx, dy = (torch.empty(B, H, T, Dk, dtype=torch.float32, device=a.device) for _ in range(4))
    bk = _scores_bk(a)
    _chunk_scores_bwd[(triton.cdiv(Dk, bk), T // bt * (bt // SUB), B * H)](
        a, b, x, y, dp, da, db, dx, dy, da, T, Dk, H, BT=bt, BK=bk, BC=SUB, PREC=_launch_prec(prec), TF=False,
        FUSED=False, num_warps=8)  # (4 warps spill on sm_80)
    return da, db, dx, dy


def _register_scores_op():
    if triton is None:
        return None

    def op(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor, bt: int, prec: str) -> torch.Tensor:
        return _scores_fwd(a, b, x, y, bt, prec)

    def op_fake(a, b, x, y, bt, prec):
        B, H, T, _ = a.shape
        return a.new_empty(B, H, T // bt, bt, bt)

    def backward_op(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor, dp: torch.Tensor,
                    bt: int, prec: str) -> list[torch.Tensor]:
        return list(_scores_bwd(a, b, x, y, dp, bt, prec))

    def backward_fake(a, b, x, y, dp, bt, prec):
        return [torch.empty_like(a) for _ in range(4)]

    def setup_context(ctx, inputs, output):
        a, b, x, y, bt, prec = inputs
        ctx.save_for_backward(a, b, x, y)
        ctx.bt, ctx.prec = bt, prec

    def backward(ctx, backward_op, dp):
        da, db, dx, dy = backward_op(*ctx.saved_tensors, dp.float().contiguous(), ctx.bt, ctx.prec)
        return da, db, dx, dy, None, None

    return _register_op("scores", OP_ID, op, op_fake, backward_op, backward_fake, setup_context, backward)


_SCORES_OP = _register_scores_op()


def _channel_scores(a, b, x, y, prec="ieee"):
    """P_ts = Σ_j a_tj b_sj e^{x_tj - y_sj} for s < t (0 elsewhere) of every chunk ([B, H, NT, n, Dk] each; y
    the cumulative log-decay, falling along the chunk, x <= y_s for s < t), differentiable: the score
    kernels (_chunk_scores_fwd/_bwd), which never evaluate an exponent above 0, on chunks padded to tiles
    of BT rows (zero a, b; x, y repeat y's last row)."""
    B, H, NT, n, Dk = a.shape
    bt = _tile_rows(n)
    if bt > n:
        fill = y[:, :, :, -1:].expand(B, H, NT, bt - n, Dk)
        a, b = (torch.nn.functional.pad(t, (0, 0, 0, bt - n)) for t in (a, b))
        x, y = torch.cat([x, fill], dim=3), torch.cat([y, fill], dim=3)
    flat = lambda t: t.reshape(B, H, NT * bt, Dk).contiguous()  # noqa: E731
    return _SCORES_OP(flat(a), flat(b), flat(x), flat(y), bt, prec)[..., :n, :n]


def _output_scores(q, k, g, chunk, prec, tf):
    """The scores A_ts (s <= t) of every chunk, once (sub-blocks), where the caller has none: the output kernel and
    the backward read them."""
    return _scores_fwd(q, k, g, g, chunk, prec, tf, diag=True, dtype=_out_dtype(q))


def _chunk_decays(c, chunks, B, H, NT, n, device):
    """The log-decays' cumulative sums g [B, H, NT, n, Dk] over key channels inside each chunk (_log_decays)."""
    return _log_decays(c["alpha"], n, NT)


def _pair_scores(a, b, x, y, prec="ieee"):
    """P_ts = Σ_j a_tj b_sj e^{x_tj - y_sj} for s < t of every chunk, on the score kernels (_channel_scores)."""
    return _channel_scores(a, b, x, y, prec)
