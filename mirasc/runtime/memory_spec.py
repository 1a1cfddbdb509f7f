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
STEPS = 2  # inner gradient steps per token of a multi-step learner
