"""Sequences packed along time (batch 1, `cu_seqlens` offsets as flash-linear-attention packs them), run one after
another or as the rows of one padded batch (a runtime piece: its body is copied into every emitted module by
mirasc.codegen; docs/module-api.md, `apply`'s cu_seqlens)."""

import torch

from .inputs import _offsets


def _packed(run, q, k, v, gates, state, cu_seqlens, extras=None):
    """Variable-length sequences packed along time (B = 1), run one after another: sequence i is tokens
    cu_seqlens[i]:cu_seqlens[i+1] and starts from row i of `state` (N rows). run(q, k, v, gates, state, extras)
    runs one sequence and returns (o, final state or None); extras (a dict of per-token inputs, or None) are cut
    like the gates."""
    bounds = _offsets(q, cu_seqlens)
    outs, finals = [], []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        seg_state = None if state is None else {n: t[i:i + 1] for n, t in state.items()}
        seg_extras = None if extras is None else {n: x[:, a:b] for n, x in extras.items()}
        o, final = run(q[:, a:b], k[:, a:b], v[:, a:b], {n: g[:, a:b] for n, g in (gates or {}).items()}, seg_state,
                       seg_extras)
        outs.append(o)
        finals.append(final)
    final = None if finals[0] is None else {n: torch.cat([f[n] for f in finals], 0) for n in finals[0]}
    return torch.cat(outs, dim=1), final


def _packed_padded(run_rows, run, initial_state, q, k, v, gates, state, cu_seqlens, extras=None):
    """N packed sequences in one launch: sequence i becomes row i of an [N, T_max] batch, padded at its end, and
    run_rows(q, k, v, gates, state, valid, extras) runs the batch, `valid` [N, T_max] False at the padding (the
    kernels must make those tokens no-ops, so that each row's outputs and final state are those of its sequence run
    alone); outputs are scattered back to the packed layout. With every sequence empty the sequences go one by one
    through `run` (as `_packed`'s). initial_state(n_rows) is the state a sequence starts from when `state` is None."""
    bounds = _offsets(q, cu_seqlens)
    lens = torch.tensor([b - a for a, b in zip(bounds, bounds[1:])], device=q.device)
    t_max = int(lens.max()) if len(lens) else 0
    if t_max == 0:
        return _packed(run, q, k, v, gates, state, cu_seqlens, extras)
    steps = torch.arange(t_max, device=q.device)
    valid = steps[None, :] < lens[:, None]  # [N, T_max]
    starts = torch.tensor(bounds[:-1], device=q.device)
    index = (starts[:, None] + steps[None, :]).clamp(max=q.shape[1] - 1)  # [N, T_max], padding repeats a token

    def rows(x):  # [1, T, ...] -> [N, T_max, ...] with padding zeroed
        x = x[0][index]
        return x * valid.view(*valid.shape, *([1] * (x.dim() - 2))).to(x.dtype)

    if state is None:  # every sequence starts from the default state, as when each runs alone
        state = initial_state(len(lens))
    o, final = run_rows(rows(q), rows(k), rows(v), {n: rows(g) for n, g in (gates or {}).items()}, state, valid,
                        None if extras is None else {n: rows(x) for n, x in extras.items()})
    return o[valid].unsqueeze(0), final
