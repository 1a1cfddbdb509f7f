"""The names of an emitted module that the fused recurrent kernels' host side (mirasc.runtime.recurrent_host) reads,
with stand-ins: the kernels printed from the spec's IR (mirasc.codegen.triton_recurrent_fwd/_bwd), the memory's
weights and torch recurrence, and the spec's choices (here a linear memory, l2 bias, gd). Every emitted module
defines its own; this module only lets the host side be imported and its plan be tested as it is."""

import types

import torch

WEIGHTS = ("W",)
CONSTANTS = {}  # coefficients that are constants in the spec
OP_ID = "0123456789ab"  # the ops' names: mirasc::<kind>_<OP_ID>, the spec's hash
_COEF_ORDER = ("eta",)  # the per-token coefficients, in the kernels' order
_VECTOR_COEFS = {}  # channel-wise coefficients (name -> side), passed to the kernels as vectors
_STORE_ACC = False  # the retention keeps an accumulator A apart from W
_MOMENTUM = False  # learner=momentum: a momentum S per weight
_BWD_STATE = ("w0",)  # the generated backward's per-token state (empty: no generated backward)
_BWD_STATE_WEIGHT = (0,)  # which weight each of those tiles belongs to
_BWD_SEGMENT = 32  # its checkpoint interval
_FACTOR_BLOCK = 0  # the mini-batch C of batched gradient factors (0: one token at a time)
_FACTOR_DIMS = (("v", "k"),)  # each weight's (rows, cols) dimension names
_V_TILES = True  # every value row updates on its own: programs over V tiles
_V_TILE_REASON = ""  # else why the rows are coupled
_TILES_FWD, _TILES_BWD = 3, 7  # the [rows, cols] fp32 tiles each kernel keeps live per weight
_WINDOW = 1  # the Omega rule's c (1: none)
_WINDOW_COEFS = ()  # the coefficients a window token keeps
_FEATURES = False  # feature=poly on a linear memory: the kernels run on φ_p(q), φ_p(k)
HALF_DOTS = "input"  # schedule: how fp16/bf16 inputs' Triton dots multiply (mirasc.runtime.routes._dot_precision)
NO_TRITON_REASON = "an example"  # why a spec has no Triton kernel (where it has none)


def _weight_shapes(Dk, Dv):
    """The memory's weights' [rows, cols] at heads of Dk x Dv."""
    return [(Dv, Dk)]


def _kernel_key_width(Dk):
    """The kernels' key width for heads the memory reads at width Dk (φ_p's under feature=poly)."""
    return Dk


def _triton_features(q, k):
    """q, k as the kernels read them (φ_p(q), φ_p(k) under feature=poly)."""
    return q, k


def _recurrent(q, k, v, c, state):
    """The torch recurrence (the reference): here the l2 bias with gd, W_t = W_{t-1} − η_t (W_{t-1} k_t − v_t) k_tᵀ."""
    W, outs = state["W"], []
    for t in range(q.shape[2]):
        k_t, v_t, eta = k[:, :, t], v[:, :, t], c["eta"][:, :, t, None, None]
        W = W - eta * ((W @ k_t[..., None] - v_t[..., None]) @ k_t[..., None, :])
        outs.append((W @ q[:, :, t, :, None])[..., 0])
    return torch.stack(outs, 2), {"W": W}


def _printed(name):
    """Stands for a kernel the emitted module prints (a triton.jit function there; here only its name)."""
    return types.SimpleNamespace(fn=types.SimpleNamespace(__name__=name))


_fused_recurrent_fwd = _printed("_fused_recurrent_fwd")
_fused_recurrent_bwd = _printed("_fused_recurrent_bwd")
