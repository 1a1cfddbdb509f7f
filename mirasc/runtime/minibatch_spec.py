"""The names of an emitted module that the mini-batch kernels' host side (mirasc.runtime.minibatch_host) reads, with
stand-ins: the kernels printed from the spec's IR (mirasc.codegen.triton_minibatch), the weights' shapes, the scratch
sizes and the spec's choices. Every emitted module defines its own; this module only lets the host side be imported and
its schedule and resource model be tested as they are (the launches run through emitted modules)."""

import types

WEIGHTS = ("W1", "W2")  # the memory's weights (here a two-layer MLP's)
MINIBATCH = 16  # semantics: the gradients of each MINIBATCH tokens are taken at the chunk's anchor
OP_ID = "0123456789ab"  # the ops' names: mirasc::<kind>_<OP_ID>, the spec's hash
_COEF_ORDER = ["alpha", "eta", "theta"]  # the per-token coefficients, in the kernels' order
_VECTOR_COEFS = {}  # channel-wise coefficients (name -> side), passed to the kernels as vectors
_MOMENTUM = True  # learner=momentum: a momentum S per weight
_MB_DECAY = True  # retention=decay: α per token (else none)
_WINDOW = 1  # the Omega rule's c (1: none): kernel rows per token


def _kernel_weight_shapes(Dk, Dv):
    """The weights' [rows, cols] at key width Dk: an MLP with a hidden width of 4 Dk."""
    return [(4 * Dk, Dk), (Dv, 4 * Dk)]


def _kernel_key_width(Dk):
    """The kernels' key width for heads the memory reads at width Dk (a feature map's where one widens them)."""
    return Dk


def _mb_scratch_fwd(Nk, Nv, Ne, BC):
    """Floats of scratch per program of the streamed forward (printed per spec)."""
    return 0


def _mb_scratch_bwd(Nk, Nv, Ne, BC):
    """Floats of scratch per program of the streamed backward (printed per spec)."""
    return 0


def _printed(name):
    """Stands for a kernel the emitted module prints (a triton.jit function there; here only its name)."""
    return types.SimpleNamespace(fn=types.SimpleNamespace(__name__=name))


_minibatch_fwd = _printed("_minibatch_fwd")
_minibatch_bwd = _printed("_minibatch_bwd")
_minibatch_stream_fwd = _printed("_minibatch_stream_fwd")
_minibatch_stream_fwd_end = _printed("_minibatch_stream_fwd_end")
_minibatch_stream_bwd_a = _printed("_minibatch_stream_bwd_a")
_minibatch_stream_bwd_b = _printed("_minibatch_stream_bwd_b")
