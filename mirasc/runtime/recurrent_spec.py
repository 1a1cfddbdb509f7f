"""The names of an emitted module that the fused recurrent kernels' host side (mirasc.runtime.recurrent_host) reads,
with stand-ins: the kernels printed from the spec's IR (mirasc.codegen.triton_recurrent_fwd/_bwd), the memory's
weights and torch recurrence, and the spec's choices (here a linear memory, l2 bias, gd). Every emitted module
defines its own; this module only lets the host side be imported and its plan be tested as it is."""

import types

import torch

# The recurrent section's constants (every Triton section follows it), printed into an emitted module from these
# declarations with the spec's values (mirasc.codegen.triton_backend); here a linear memory, l2 bias, gd.

OP_ID = "0123456789ab"  # this module's Triton ops: mirasc::<kind>_<OP_ID>, the spec's hash
_COEF_ORDER = ("eta",)  # the per-token coefficients (and key inputs), in the kernels' argument order
_VECTOR_COEFS = {}  # channel-wise coefficients (name -> side), passed to the kernel as vectors
_STORE_ACC = False  # the retention keeps an accumulator A apart from W (in the state)
_MOMENTUM = False  # learner=momentum: a momentum S per weight
# The backward kernel's per-token state and its checkpoint interval (a schedule choice).
_BWD_STATE = ("w0",)
_BWD_STATE_WEIGHT = (0,)  # which weight each of those tiles belongs to
_BWD_SEGMENT = 32
# Mini-batch C when each mini-batch's gradient factors are one tile computation (tl.dot) at its start,
# kept in scratch (0: one token at a time), and the (rows, cols) dimension names of each weight.
_FACTOR_BLOCK = 0
_FACTOR_DIMS = (("v", "k"),)
# V tiles: True when every value row of the memory updates on its own, so the kernels run on a grid
# (cdiv(Dv, BV), B·H) of programs that each own BV rows of the state; else why the rows are coupled
# (one program per (batch, head)). _TILES_*: the [rows, cols] fp32 tiles each kernel keeps live per weight
# (state and temporaries; the resource model of _tile_config).
_V_TILES = True
_V_TILE_REASON = ""
_TILES_FWD = 3
_TILES_BWD = 7
# The Omega rule (1: none): the kernels read each step's window from sequences with the carried c − 1 tokens in
# front ([B, H, c − 1 + T, ·]: keys, values, and the coefficients _WINDOW_COEFS stacked), built by the host.
_WINDOW = 1
_WINDOW_COEFS = ()
# feature=poly on a linear memory: every Triton kernel runs the plain linear memory on φ_p(q), φ_p(k) (mapped in
# torch before the launch, so the kernels' key width is φ_p's, 1 + Dk + … + Dk^p).
_FEATURES = False

# Stand-ins for the names of the module's torch part that the host side reads (the torch header declares them:
# mirasc.runtime.memory_spec), and for the functions the module prints.
WEIGHTS = ("W",)
CONSTANTS = {}  # coefficients that are constants in the spec


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
