"""The constants of a parametric memory's emitted module: what each means, with example values. Every emitted module
sets its own in its header, printed from this module's declarations with the spec's values
(mirasc.codegen.standalone `runtime_constants`, called by mirasc.codegen.torch_backend); the torch pieces
(mirasc.runtime.memory_ops, token_step, ...) import these examples, so that they can be imported and tested as they
are."""

SPEC = """\
memory = linear
bias = l2
learner = gd(lr=gate)"""
GATES = ("eta", "alpha")  # the gates apply takes: apply(..., gates={name: tensor})
# Channel-wise gates (docs/semantics.md: channel-wise gates): name -> "k" ([B, T, H, Dk], key channels) or "v"
# ([B, T, H, Dv]); the others are [B, T, H].
GATE_CHANNELS: dict[str, str] = {}
# Per-token inputs that are keys, not coefficients ([B, T, H, Dk] each): apply(..., extras={name: tensor}).
# kappa: the regression key κ of l2(read=kappa) / l2(erase=kappa), where the memory is read (and erased).
EXTRAS = ()

WEIGHTS = ("W",)  # the memory's weights, in the order of its lists (the state's keys)
# Coefficients that are constants in the spec (undeclared ones: eta = 1, alpha = 1, theta = 0).
CONSTANTS = {"theta": 0.5}

CHUNKED = True  # whether algorithm="chunked" exists for this spec
NO_CHUNK_REASON = None  # why it does not (None: it does)
POSITIVE_WEIGHTS = False  # the retention works with log W: a given state's weights must be > 0
RESIDUAL = False  # the memory adds its input (residual=true): Dk == Dv
DEFAULT_CHUNK = 64  # schedule: chunk length of the chunked algorithm
HALF_IN_PLACE = False  # 16-bit q, k, v reach the Triton chunk op as they are (its kernels read them in place)
PACKED = False  # packed sequences (cu_seqlens) run in one launch of the Triton chunk kernels, as a padded batch
MINIBATCH = None  # semantics: gradients of each MINIBATCH tokens are taken at the chunk's anchor (None: none)
CHUNK_READOUT = False  # readout=chunk on the Triton kernels: the chunk kernels only, no fused recurrent one
ERASE_WRITE = False  # l2(erase=kappa): each step also writes v kᵀ at unit rate after erasing along κ
# The state beside the weights: the retention's accumulators A_<weight>, momentum buffers S_<weight>, the
# preconditioner's statistic A, and the Omega window's last WINDOW − 1 tokens (WINDOW_STATE, empty without one).
ACCUMULATORS = True
MOMENTUM_BUFFERS = True
STATISTIC = False

WEIGHT_INIT = "normal"  # a weight's default initial value: "zeros", "normal" (N(0, 1/fan_in)) or "softmax"
POSITIVE_SCALE = 1.0  # (the rows of "softmax": c·softmax(3·N(0, 1)), c = POSITIVE_SCALE)
WINDOW = 3  # the Omega rule's c: each step's loss sums the last WINDOW tokens' losses, token i weighted by γ_i
WINDOW_COEFS = ("gamma", "eta")  # the per-token coefficients a window token keeps (γ and those its loss reads)
WINDOW_STATE = ("win_k", "win_v", "win_gamma", "win_eta")  # state keys of the carried window

# The constants of some choices only (each module has those of its spec's).

# Inner gradient steps per token (a multi-step learner): k, v, η and the EXTRAS come STEPS per token
# ([B, T, H, STEPS, ...]); the memory runs them as T·STEPS sub-steps, the retention's α at each token's first
# sub-step only, and reads the query after the last (see `substeps`).
STEPS = 2

HALF_DOTS = "input"  # schedule: how fp16/bf16 inputs' Triton dots multiply (see _dot_precision)

NO_TRITON_REASON = "an example"  # why this module has no Triton kernel (a module with one has no NO_TRITON_REASON)

CHANNEL_SIDE = "k"  # the weight side the channel-wise decays scale: "k" columns, "v" rows

CHANNEL_K_FAST = False  # α over key channels, no momentum, an identity read: log-space scores
CHANNEL_READ = None  # a nonlinear readout's per-token read (None: the identity, masked matmuls)

POLY_DEGREE = 2  # p of the memory's polynomial feature map φ_p

KL_C = 1.0  # kl's c: each row of the weights sums to c

LQ_Q = 4.0  # lq's q: the weights are the accumulator over its q-norm, A / ‖A‖_q^(q−2)

NS_STEPS = 5  # Newton–Schulz iterations of muon's orthogonalisation
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic's (a, b, c) of Muon (Jordan et al. 2024)

PRECOND = {"transform": "rms", "eps": 1e-6}  # the multiplier's transform ("rms" or "atk") and constants

# The Layer's (mirasc.runtime.layer), in every module.

LAYER_DEFAULTS = {"conv": 4, "key_shift": 0.0, "gate_rank": 16, "eta_max": 1.0, "alpha_bias": 3.0, "alpha_spread": 0.0,
                  "gate_head_term": False, "alpha_min": 0.0, "alpha_act": "sigmoid", "eta_bias": -2.0,
                  "theta_bias": 0.0, "delta_bias": 0.5, "gamma_bias": 3.0, "nu_bias": 5.0, "rho_bias": 0.0,
                  "qk_norm": "l2", "v_norm": "none", "out_norm": "rms", "out_gate": True, "gate_lr": 1.0,
                  "head_dim": 0}  # from the spec's `layer { ... }` block
# Each option's type and range, the layer block's own (docs/language.md, "The layer block"): Layer(...) refuses
# what a spec's block refuses, every bad value in one ValueError
LAYER_SCHEMA = {
    "conv": {"type": "int", "ge": 0, "le": 16}, "key_shift": {"type": "float", "ge": -4, "le": 4},
    "gate_rank": {"type": "int", "ge": 0, "le": 1024}, "eta_max": {"type": "float", "gt": 0, "le": 100},
    "alpha_bias": {"type": "float", "ge": -20, "le": 20}, "alpha_spread": {"type": "float", "ge": 0, "le": 20},
    "gate_head_term": {"type": "bool"}, "alpha_min": {"type": "float", "ge": 0, "lt": 1},
    "alpha_act": {"type": "choice", "choices": ("sigmoid", "exp")}, "eta_bias": {"type": "float", "ge": -20, "le": 20},
    "theta_bias": {"type": "float", "ge": -20, "le": 20}, "delta_bias": {"type": "float", "ge": -20, "le": 100},
    "gamma_bias": {"type": "float", "ge": -20, "le": 20}, "nu_bias": {"type": "float", "ge": -20, "le": 20},
    "rho_bias": {"type": "float", "ge": -20, "le": 20}, "qk_norm": {"type": "choice", "choices": ("l2", "none")},
    "v_norm": {"type": "choice", "choices": ("rms", "none")},
    "out_norm": {"type": "choice", "choices": ("rms", "none")},
    "out_gate": {"type": "bool"}, "gate_lr": {"type": "float", "gt": 0, "le": 1},
    "head_dim": {"type": "int", "ge": 0, "le": 4096},
}
# The retention needs positive weights: the initial weights are learned through an unconstrained form, "softmax"
# (kl: W_0 = c·softmax(Z_0) over each row, the simplex the retention keeps) or "exp" (W_0 = exp(Z_0)); None: as is.
_POSITIVE = None
_POSITIVE_SCALE = 1.0  # what each row of a "softmax" initial weight sums to (kl's c)
# State entries not learned: those the op never reads (lq under readout=chunk re-normalises W from A at every
# chunk) and the preconditioner's statistic "A" (a running sum of squares that starts at 0)
_UNREAD = ()

_LAYER_STEPS = 1  # inner steps per token: k, v, η and the key inputs come _LAYER_STEPS per token
