"""The constants of a nonparametric memory's emitted module: what each means, with the values of causal softmax
attention. Every emitted module sets its own in its header, printed from these declarations with the spec's values
(mirasc.codegen.standalone `runtime_constants`, called by mirasc.codegen.attention_backend; docs/semantics.md:
nonparametric memories); the torch path (mirasc.runtime.nonparametric) and the Triton reads' host side import these
examples, so that they can be imported and tested as they are."""

SPEC = """\
memory = softmax"""
GATES = ()  # the op's gates (a decaying memory: "alpha")
EXTRAS = ()  # no key inputs besides q, k
GATE_CHANNELS = {}
WEIGHTS = ()
CONSTANTS = {}
CHUNKED = True
DEFAULT_CHUNK = 64  # schedule: query block of the torch path (bounds the score memory to 64 x T)
KERNEL = "softmax"  # the similarity: "softmax", "additive", "poly", "stickbreaking"
SCALE = None  # None: 1/sqrt(Dk)
DEGREE = 2  # poly kernel degree
WINDOW = 0  # attend to the last WINDOW tokens including the current one (0: all)
CAUSAL = True  # False: cross-attention, q and (k, v) may have different lengths
HOPS = 1  # MemN2N hops: u^{h+1} = u^h + o^h, the read o^h of query u^h (1: one read)
TYING = "adjacent"  # MemN2N weight tying across hops
TEMPORAL = 0  # temporal encoding over this many relative positions (0: off)
SCORE_CONV = None  # (query width, key width) of the MTA key-query convolution, or None
HEAD_MIX = 1  # MTA head-mixing group size (1: off)
HEAD_NORM = False  # per-head RMS norm of the output, weight initialised with the depth scale
# Stick-breaking read: where the stick left over goes ("none", "current": the query's own value, "bias": a learned
# vector per head), and whether query t reads its own pair (False: only the pairs stored before it).
REMAINDER = "none"
ATTEND_CURRENT = False

NO_TRITON_REASON = "an example"  # why this memory has no Triton kernel (None: it has)
# Attention sink (softmax): a learned logit per head in every read's denominator, with no value (params["sink"])
SINK = False

# Forget gate on the stored pairs (retention = decay): None (off), "gate" (the input gate alpha, [B, T, H]) or a
# constant α. The pair stored at s weighs Π_{s<l≤t} α_l when query t reads it, kept in log space: a sum of log α,
# never a product of many α.
DECAY = None

OP_ID = "0123456789ab"  # this module's ops: mirasc::<kind>_<OP_ID>, the spec's hash


def _per_head_coefficients(H, device):
    """The spec's per-head constants, each [H] in float64 (the emitted module prints its own; here: none)."""
    return {}
