"""The chunk readouts (docs/semantics.md: chunk readouts) on a chunk kernel path (a runtime piece, copied into the
emitted modules of such specs that have Triton kernels, by mirasc.codegen.torch_backend): one launch of the kernels
`run(q, k, v, c, state, chunk, prec=)` (the chunked or the mini-batch Triton path) per chunk, since each chunk's anchor
needs the previous chunk's end; differentiable end to end (the kernels' custom op has its backward). The memory's own
names (WEIGHTS, _lq_norm, _lag_step, _finish, _MOMENTUM) are the emitted module's; mirasc.runtime.memory_hooks has
examples."""

import torch

from .memory_hooks import _finish, _lag_step, _lq_norm
from .memory_ops import _token_coefs
from .memory_spec import WEIGHTS
from .recurrent_spec import _MOMENTUM


def _lq_on_kernels(q, k, v, c, state, chunk, prec, run):
    """lq: chunk s..e is the dual form of a decay retention in weight space, anchored at W_{s-1} = A_{s-1} / n_c, with
    weight i's updates scaled by 1/n_i (the kernels' gradient factors δ_i times the coefficient lqs<i>):
    W_t = A_t / n_c; the chunk's end gives A_e = n_c W_e (and momentum S = n_c S')."""
    W, A = [state[n] for n in WEIGHTS], [state["A_" + n] for n in WEIGHTS]
    S = [state["S_" + n] for n in WEIGHTS] if _MOMENTUM else None
    outs = []
    T = q.shape[2]
    for c0 in range(0, T, chunk):
        c1 = min(c0 + chunk, T)
        norm = [_lq_norm(a) for a in A]  # n_i = ‖A_i‖_q^(q-2), [B, H, 1, 1]
        anchor = {n: a / m for n, a, m in zip(WEIGHTS, A, norm)}
        if S is not None:
            anchor.update({"S_" + n: s / m for n, s, m in zip(WEIGHTS, S, norm)})
        cc = {name: val[:, :, c0:c1] for name, val in c.items()}
        cc.update({f"lqs{i}": (1.0 / m)[..., 0].expand(-1, -1, c1 - c0) for i, m in enumerate(norm)})
        o, final = run(q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], cc, anchor, chunk, prec=prec)
        outs.append(o)
        W = [final[n] for n in WEIGHTS]
        A = [w * m for w, m in zip(W, norm)]
        if S is not None:
            S = [final["S_" + n] * m for n, m in zip(WEIGHTS, norm)]
    return torch.cat(outs, dim=2), _finish({"W": W, "Y": A, "S": S})


def _kl_on_kernels(q, k, v, c, state, chunk, prec, run):
    """kl: the lag token as one dense torch step (_lag_step), then tokens s+1..e, decay steps in weight space with
    gradients at W_s, through the dual-form kernels of that decay form, anchored at W_s."""
    W = [state[n] for n in WEIGHTS]
    S = [state["S_" + n] for n in WEIGHTS] if _MOMENTUM else None
    outs = []
    T = q.shape[2]
    for c0 in range(0, T, chunk):
        c1 = min(c0 + chunk, T)
        g1 = _token_coefs(c, c0, c0 + 1)
        o, W, S = _lag_step(W, S, q[:, :, c0:c0 + 1], k[:, :, c0:c0 + 1], v[:, :, c0:c0 + 1], g1)
        outs.append(o)
        if c1 - c0 > 1:
            anchor = {n: w for n, w in zip(WEIGHTS, W)}
            if S is not None:
                anchor.update({"S_" + n: s for n, s in zip(WEIGHTS, S)})
            rest = {name: val[:, :, c0 + 1:c1] for name, val in c.items()}
            o, final = run(q[:, :, c0 + 1:c1], k[:, :, c0 + 1:c1], v[:, :, c0 + 1:c1], rest, anchor, chunk - 1,
                           prec=prec)
            outs.append(o)
            W = [final[n] for n in WEIGHTS]
            if S is not None:
                S = [final["S_" + n] for n in WEIGHTS]
    return torch.cat(outs, dim=2), _finish({"W": W, "Y": None, "S": S})
