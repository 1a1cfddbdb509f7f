"""The choices of a nonparametric memory's spec that its torch path (mirasc.runtime.nonparametric) reads, with the
values of causal softmax attention. Every emitted module sets its own in its header (mirasc.codegen.attention_backend,
docs/semantics.md: nonparametric memories); this module only lets the torch path be imported and tested as it is."""

KERNEL = "softmax"  # the similarity: "softmax", "additive", "poly", "stickbreaking"
SCALE = None  # None: 1/sqrt(Dk)
DEGREE = 2  # poly kernel degree
WINDOW = 0  # attend to the last WINDOW tokens including the current one (0: all)
CAUSAL = True  # False: cross-attention, q and (k, v) may have different lengths
HOPS = 1
TYING = "adjacent"  # MemN2N weight tying across hops
TEMPORAL = 0  # temporal encoding over this many relative positions (0: off)
SCORE_CONV = None  # (query width, key width) of the MTA key-query convolution, or None
HEAD_MIX = 1  # MTA head-mixing group size (1: off)
HEAD_NORM = False  # per-head RMS norm of the output
REMAINDER = "none"  # stick-breaking: where the stick left over goes
ATTEND_CURRENT = False  # stick-breaking: whether query t reads its own pair
SINK = False  # a learned logit per head in every read's denominator
DECAY = None  # forget gate on the stored pairs: None, "gate", "per_head" or a constant α
GATES = ()  # the op's gates (a decaying memory: "alpha")
DEFAULT_CHUNK = 64  # schedule: the torch path's query block
NO_TRITON_REASON = "an example"  # why the memory has no Triton kernel (None: it has)
OP_ID = "0123456789ab"  # the Triton ops' names: mirasc::<kind>_<OP_ID>, the spec's hash



def _per_head_coefficients(H, device):
    """The spec's per-head constants, each [H] in float64 (the emitted module prints its own; here: none)."""
    return {}
