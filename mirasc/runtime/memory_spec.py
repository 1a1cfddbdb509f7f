"""The choices of a parametric memory's spec that its torch pieces (mirasc.runtime.memory_ops) read, with example
values. Every emitted module sets its own in its header (mirasc.codegen.torch_backend); this module only lets the
pieces be imported and tested as they are."""

# Channel-wise gates (docs/semantics.md: channel-wise gates): name -> "k" (key channels) or "v" (value channels).
GATE_CHANNELS: dict[str, str] = {}
NS_STEPS = 5  # Newton–Schulz iterations of muon's orthogonalisation
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic's (a, b, c) of Muon (Jordan et al. 2024)
POLY_DEGREE = 2  # p of the memory's polynomial feature map φ_p
# The preconditioned learner's multiplier: its transform ("rms" or "atk") and constants (docs/semantics.md,
# "Preconditioned learner").
PRECOND = {"transform": "rms", "eps": 1e-6}
GATES = ("eta", "alpha")  # the spec's gates: apply(..., gates={name: tensor})
CONSTANTS = {"theta": 0.5}  # coefficients that are constants in the spec (undeclared: η = 1, α = 1, θ = 0)
STEPS = 2  # inner gradient steps per token of a multi-step learner
CHUNKED = True  # whether algorithm="chunked" exists for the spec
NO_CHUNK_REASON = None  # why it does not (None: it does)
DEFAULT_CHUNK = 64  # schedule: chunk length of the chunked algorithm
MINIBATCH = None  # semantics: gradients of each MINIBATCH tokens taken at the chunk's anchor (None: token by token)
CHUNK_READOUT = False  # readout=chunk on the Triton kernels: the chunk kernels only, no fused recurrent kernel
ERASE_WRITE = False  # l2(erase=kappa): each step also writes v kᵀ at unit rate
KL_C = 1.0  # kl's c: its weights' rows sum to c
# Facts of the plan that apply reads: the retention keeps W > 0 (a given state is checked), the memory adds its input
# (Dk == Dv), 16-bit inputs reach the chunk op in place, packed sequences run in one launch of the chunk kernels.
POSITIVE_WEIGHTS = False
RESIDUAL = False
HALF_IN_PLACE = False
PACKED = False
# The state beside the weights (mirasc.runtime.memory_state): the retention's accumulators A_<weight>, momentum buffers
# S_<weight>, the preconditioner's statistic A (and the Omega window: memory_hooks).
ACCUMULATORS = True
MOMENTUM_BUFFERS = True
STATISTIC = False
WEIGHT_INIT = "normal"  # a weight's default initial value: "zeros", "normal" or "softmax"
POSITIVE_SCALE = 1.0  # (the sum of each row of "softmax")
EXTRAS = ()  # key inputs besides q, k (κ of l2(read=kappa | erase=kappa)): apply(..., extras={name: tensor})
# The Layer's (mirasc.runtime.layer): the spec's layer block over the family defaults, each option's type and range
# (mirasc.language.layer_options), how learned initial weights are kept positive ("softmax", "exp" or None) and the
# softmax rows' sum, the state entries not learned, the inner steps per token.
LAYER_DEFAULTS = {"conv": 4, "key_shift": 0.0, "gate_rank": 16, "eta_max": 1.0, "alpha_bias": 3.0, "alpha_spread": 0.0,
                  "gate_head_term": False, "alpha_min": 0.0, "alpha_act": "sigmoid", "eta_bias": -2.0,
                  "theta_bias": 0.0, "delta_bias": 0.5, "gamma_bias": 3.0, "nu_bias": 5.0, "rho_bias": 0.0,
                  "qk_norm": "l2", "v_norm": "none", "out_norm": "rms", "out_gate": True, "gate_lr": 1.0, "head_dim": 0}
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
_POSITIVE = None
_POSITIVE_SCALE = 1.0
_UNREAD = ()
_LAYER_STEPS = 1
