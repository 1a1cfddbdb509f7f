"""The chunked Triton path of the linear memories whose update is affine in the state (a runtime piece: an emitted
module's `_chunked_triton` is a two-line call of `_chunk_path` with its family's preparation, copied in by
mirasc.codegen.triton_chunked). Every chunk of n tokens is handed to the chunk kernels as (1)-(2) of docs/kernels.md:
the log-decays g, the keys K the kernels write along, Wk and U with u = Wk W_0ᵀ - U; a family's chunk-local
preparation of Wk and U is torch (differentiable: autograd carries the kernels' dWk, dU, dK, dg through it) and is
the only part that differs between the families:

  Hebbian write (dot bias)        Wk = 0, U = η V
  delta rule (l2 bias, exact)     (I + L) [Wk | U] = [β a K | β V], L_ts = β_t Σ_j k_tj w_sj e^{x_tj - g_sj} (s < t)
  generalized delta transition    (I + A^b) [Wk | U'] = [κ ∘ e^{x} | A^w V] (read=kappa / erase=kappa)
  mini-batch l2                   Wk = η K, U = η V (gradients at the chunk's anchor W_0)

Where a chunk is one tile, a family with a one-op path (mirasc.runtime.chunk_ops) runs it instead, reading q, k, v in
place. The decay layout's pieces (`_chunk_decays`, `_pair_scores`, `_scores_preparation`) are
mirasc.runtime.chunk_host's (one log-decay per head) or chunk_channel_host's (a decay over key channels)."""

import torch

from .chunk_host import (
    _CHUNK_OP,
    _ROWS_PER_TOKEN,
    CH_DECAY,
    ETA_K,
    IMPLICIT,
    LQ_SCALE,
    _check_chunk_fits,
    _chunk_decays,
    _o_dtype,
    _pair_scores,
    _read_exponents,
    _scores_preparation,
    _tile_rows,
)


def _chunk_path(q, k, v, c, state, chunk, prec, prepare, on_kernels=None):
    """The chunked path of a family: q, k, v [B, H, T, D], the per-token coefficients c, the state {"W"}; `chunk`
    kernel rows per chunk. prepare(qc, kc, vc, wc, c, eta, g, chunks, prec) -> (qc, wc, wk, u, g), each
    [B, H, NT, rows, ...] (wk None: zero), is the family's preparation; on_kernels, where the family has one, its
    one-op path for chunks that are one tile."""
    if _CHUNK_OP is None:
        raise RuntimeError("backend='triton' needs the triton package (and torch.library.custom_op)")
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    _check_chunk_fits(Dk, Dv, chunk, prec, q.device)  # before any launch (forward and backward kernels)
    # tokens per chunk: erase=kappa presents each token as two kernel rows (erase, write), chunk // 2 tokens a chunk
    n = max(1, chunk // _ROWS_PER_TOKEN)
    pad = (-T) % n
    NT = (T + pad) // n

    def chunks(x):  # [B, H, T, ...] -> [B, H, NT, n, ...], zero-padded at the end (a view where T needs no pad)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
        return x.unflatten(2, (NT, n))

    eta = chunks(c["eta"].float())
    if LQ_SCALE:
        eta = eta * chunks(c["lqs0"].float())  # readout=chunk, lq: the chunk's updates in weight space are η / n_c
    g = _chunk_decays(c, chunks, B, H, NT, n, q.device)
    if on_kernels is not None and _tile_rows(n) == n:  # a chunk is one tile: one op reading q, k, v in place
        return on_kernels(q, k, v, c, state, eta, g, chunks, prec)
    q32, k32, v32 = (t.float() for t in (q, k, v))
    kc, vc = chunks(k32), chunks(v32)
    # the written key: η ⊙ k under lr=gate(k) (the kernels' K), else the read key
    wc = kc * chunks(c["eta_ch"].float()) if ETA_K else kc
    qc, wc, wk, u, g = prepare(chunks(q32), kc, vc, wc, c, eta, g, chunks, prec)
    # Each chunk becomes one tile of BT rows (a power of two >= 16, tl.dot's minimum): rows past the chunk's
    # rows have zero k, Wk and U (they write nothing) and keep the chunk's last log-decay (α = 1).
    rows = qc.shape[3]
    BT = _tile_rows(rows)

    def tile(x, last=False):  # [B, H, NT, rows, ...] -> [B, H, NT·BT, ...]
        if BT > rows:
            fill = x[:, :, :, -1:].expand(*x.shape[:3], BT - rows, *x.shape[4:]) if last else \
                x.new_zeros(*x.shape[:3], BT - rows, *x.shape[4:])
            x = torch.cat([x, fill], dim=3)
        return x.reshape(B, H, NT * BT, *x.shape[4:]).contiguous()

    o, w_final = _CHUNK_OP(tile(qc), tile(wc), None if wk is None else tile(wk), tile(u), tile(g, last=True),
                           state["W"].float().contiguous(), BT, prec)[:2]
    # the output rows: every row, or the write rows of erase=kappa's row pairs
    o = o.view(B, H, NT, BT, Dv)[:, :, :, _ROWS_PER_TOKEN - 1:rows:_ROWS_PER_TOKEN].reshape(B, H, NT * n, Dv)
    return o[:, :, :T].to(_o_dtype(q)), {"W": w_final.to(state["W"].dtype)}


def _unit_lower_solves(lower, rights):
    """(I + lower)⁻¹ x for each x of `rights`: two solves with one matrix, each result contiguous (no concatenated
    right side, no copies of its slices)."""
    eye = torch.eye(lower.shape[-1], dtype=torch.float32, device=lower.device)
    return tuple(torch.linalg.solve_triangular(eye + lower, x, upper=False, unitriangular=True) for x in rights)


def _decayed(x, a):
    """e^{x_t} ⊙ a_t: x [B, H, NT, n] (a log-decay per head) or [B, H, NT, n, Dk] (per key channel)."""
    return torch.exp(x if CH_DECAY else x.unsqueeze(-1)) * a


def _hebbian_preparation(qc, kc, vc, wc, c, eta, g, chunks, prec):
    """The Hebbian write (dot bias): Wk = 0, U = η V (where a chunk is one tile, U is formed in the scan from v as
    given: one op, _HEBBIAN_OP)."""
    return qc, wc, None, eta.unsqueeze(-1) * vc, g


def _minibatch_preparation(qc, kc, vc, wc, c, eta, g, chunks, prec):
    """Mini-batch l2: the gradient of every token is taken at the chunk's anchor W_0, Wk = η K, U = η V (with
    lr=gate(k) the per-token η is 1 and the written key η ⊙ k carries the channel rates)."""
    return qc, wc, eta.unsqueeze(-1) * kc, eta.unsqueeze(-1) * vc, g


def _delta_preparation(qc, kc, vc, wc, c, eta, g, chunks, prec):
    """The delta rule (l2 bias, exact): u_t = β_t (a_t W_0 k_t - Σ_{s<t} m_ts (k_t·w_s) u_s - v_t), so
    (I + L) [Wk | U] = [β a K | β V] with L_ts = β_t Σ_j k_tj w_sj e^{x_tj - g_sj} (s < t), one unit-triangular
    solve; x = g for order=pre, g one row back for post (`_read_exponents`), w the written key (η ⊙ k under
    lr=gate(k)), a_t = e^{x_t} (a vector over key channels with a key-channel decay). Where a chunk is one tile, a
    decay per head runs this preparation as kernels inside its one op (_DELTA_OP), a key-channel decay on the scores
    kernels' P (_scores_preparation: _WY_OP, or with order=pre and the written key the read key, the one op
    _CHANNEL_DELTA_OP, which runs the scores too)."""
    beta = eta / (1 + eta * (kc * kc).sum(-1)) if IMPLICIT else eta  # proximal step: β = η / (1 + η‖k‖²)
    x = _read_exponents(g)
    scores = _pair_scores(kc, wc, x, g, prec)
    prepared = _scores_preparation(scores, kc, x, vc, beta, prec)  # (kernels where a chunk is one tile)
    if prepared is None:
        b = beta.unsqueeze(-1)
        prepared = _unit_lower_solves(b * scores, (b * _decayed(x, kc), b * vc))
    wk, u = prepared
    return qc, wc, wk, u, g


def _gdelta_preparation(qc, kc, vc, wc, c, eta, g, chunks, prec):
    """The generalized delta transition (l2 with read=kappa / erase=kappa, docs/semantics.md): per token
    W_t = W_{t-1} D_t - u_t b_tᵀ + v_t w_tᵀ with u_t = W_{t-1} P_t κ_t the read at the regression key (P_t = D_t for
    order=pre, else I), b the erase direction and w the write key: b = w = η ⊙ k for read=kappa, b = η ⊙ κ and w = k
    for erase=kappa. Unrolled from W_0 (x = g for pre, g one row back for post; A^b_ts = Σ_j κ_tj b_sj e^{x_tj - g_sj},
    A^w likewise, s < t):
        u_t = (W_0 (κ_t ∘ e^{x_t})) + Σ_{s<t} A^w_ts v_s - Σ_{s<t} A^b_ts u_s,
    so (I + A^b) [Wk | U'] = [κ ∘ e^{x} | A^w V], u = Wk W_0ᵀ + U': the WY/UT form of the chunk's product of
    transitions, one unit-triangular solve per chunk. read=kappa has one direction, b = w: with ũ = u - v,
    (I + A^b) ũ = (κ ∘ e^{x}) W_0ᵀ - V, which is (1) with K = η ⊙ k and [Wk | U] the solution of
    (I + A^b) [Wk | U] = [κ ∘ e^{x} | V]. erase=kappa has two directions per token, so each token is presented to the
    kernels as two rows with the same g_t: row 2t erases (K = η ⊙ κ, Wk = Wk_t, U = -U'_t: the kernels' u is the read
    u_t) and row 2t+1 writes (K = k, Wk = 0, U = v_t: the kernels' -u kᵀ is +v kᵀ); q sits on the write row (zero on
    the erase row), whose output is o_t. Autograd carries the kernels' dWk, dU, dK, dg through the solve, the scores
    and the gates (dκ too)."""
    kap = chunks(c["kappa"].to(kc.dtype))  # (fp32 in the path)
    x = _read_exponents(g)  # the erase reads the decayed state W_{t-1} D_t (order=pre), else W_{t-1}
    a_k = _decayed(x, kap)
    if _ROWS_PER_TOKEN == 1:  # read=kappa: the error read at κ is stepped along η ⊙ k (the kernels' K)
        erase = eta.unsqueeze(-1) * wc
        wk, u = _unit_lower_solves(_pair_scores(kap, erase, x, g, prec), (a_k, vc))
        return qc, erase, wk, u, g
    rate = eta.unsqueeze(-1)
    if ETA_K:
        rate = rate * chunks(c["eta_ch"].to(kc.dtype))
    erase = rate * kap  # the erase direction η ⊙ κ; v is written along k at unit rate
    wk, u = _unit_lower_solves(_pair_scores(kap, erase, x, g, prec), (a_k, _pair_scores(kap, kc, x, g, prec) @ vc))
    B, H, NT, n = eta.shape

    def pair(e, w):  # two [B, H, NT, n, ...] -> [B, H, NT, 2n, ...]: row 2t from e (erase), 2t+1 from w (write)
        return torch.stack([e, w], dim=4).reshape(B, H, NT, 2 * n, *e.shape[4:])

    return (pair(torch.zeros_like(kc), qc), pair(erase, kc), pair(wk, torch.zeros_like(wk)), pair(-u, vc),
            pair(g, g))
