"""The mini-batch form's chunks with channel-wise decays, linear memory W [Dv, Dk] (a runtime piece, copied into the
emitted modules of such specs by mirasc.codegen.torch_backend; the loop and the chunk readouts' steps are
mirasc.runtime.minibatch_chunks'). Inside a chunk every update is rank one at the anchor, U_r = -η_r δ_r x_rᵀ, and the
decays scale the CHANNEL_SIDE of W (k: columns, v: rows), so each accumulator is
    Y_t = Y_0∘Γ_t + S_0∘B_t + Σ_{r<=t} K[t, r] ∘ (δ_r x_rᵀ),   K[t, r, j] = Σ_u D[t, u, j] M[u, r, j] (-η_r)
with D the retention's and M the momentum's channel segment products (∘ broadcasts over the side;
mirasc.runtime.chunk_forms._channel_chunk_form)."""

from .chunk_forms import _channel_chunk_form
from .memory_hooks import _memory_forward, _memory_grad, _readout
from .memory_ops import _per_token
from .memory_spec import CHANNEL_K_FAST, CHANNEL_READ, CHANNEL_SIDE


def _token_read(acc, qc):
    """A nonlinear readout from each token's accumulator acc [B, H, n, Dv, Dk]: the chunk's outputs, and the weights
    at its end."""
    return _memory_forward(_per_token([_readout(acc)]), qc), [_readout(acc[:, :, -1])]


def _channel_chunk(W, Y, S, qc, kc, vc, cc, g, omega=None):
    """One chunk with the gradients at the anchor W; Y (None: W) and S the accumulator and the momentum at its start,
    read as CHANNEL_READ says (the identity, or each token's accumulator through the readout). Returns
    (o [B, H, n, Dv], W, Y, S) at its end."""
    ((delta, x),) = _memory_grad(W, kc, vc, g)
    return _channel_chunk_form(W, Y, S, qc, delta, x, cc["eta"], cc.get("alpha"), cc.get("theta"), CHANNEL_SIDE,
                               fast=CHANNEL_K_FAST, read=CHANNEL_READ)


def _chunk_run(anchor, Y0, S, qc, kc, vc, cc, g, scale=None):
    """The identity-readout chunk a chunk readout runs (mirasc.runtime.minibatch_chunks' _lq_chunk, _kl_chunk):
    gradients at `anchor`, the accumulator Y0 (and momentum S) stepped, every read W_t = Y_t·scale (the one weight's
    scale, or 1). Returns (o, Y, S) at the chunk's end."""
    ((delta, x),) = _memory_grad(anchor, kc, vc, g)
    o, Y, _, S = _channel_chunk_form(anchor, Y0, S, qc, delta, x, cc["eta"], cc.get("alpha"), cc.get("theta"),
                                     CHANNEL_SIDE, fast=CHANNEL_K_FAST)
    return (o if scale is None else o * scale[0]), Y, S
