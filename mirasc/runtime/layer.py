"""The Layer around a memory op: [B, T, d_model] -> [B, T, d_model], with token-by-token decoding (a runtime piece:
mirasc.codegen.torch_backend copies the Layer and the hooks below into every emitted module; docs/module-api.md,
"Layer"). The Layer calls its module's op (apply, init_state, init_params, launch_plan) and, to decode, three hooks:
_layer_cache (a cache for a state), _layer_read (one token through the memory) and _layer_keep (a step with padding
rows). This module has the hooks of a plain memory; a multi-step learner (mirasc.runtime.multistep), a composite memory
(composite), the preconditioned learner (memory_ops) and a nonparametric memory (nonparametric) define their own.
The spec's choices and the module's functions are the emitted module's (mirasc.runtime.memory_spec and memory_hooks
have examples)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .inputs import _extra_inputs
from .layer_gates import _gate_projection, _gate_values, _GateLayout
from .layer_options import layer_combination_problems, layer_option_problems, layer_size_problems
from .layer_state import _compute_dtype, _constrained, _keep_rows, _state_dtype, _unconstrained
from .layer_streams import _conv_weight, _per_step, _streams
from .memory_hooks import _coefficients, _start, apply, init_params, init_state, launch_plan
from .memory_spec import (
    _LAYER_STEPS,
    _POSITIVE,
    _POSITIVE_SCALE,
    _UNREAD,
    EXTRAS,
    GATE_CHANNELS,
    GATES,
    LAYER_DEFAULTS,
    LAYER_SCHEMA,
)
from .token_step import _read_tokens


class Layer(nn.Module):
    """x -> q, k, v projections -> short depthwise causal conv (SiLU) -> ℓ2-normalised q, k (and an RMS-normalised
    v with v_norm=rms); gates from x through low-rank projections (η = eta_max·σ, α = alpha_min + (1 −
    alpha_min)·σ, θ = σ, δ = softplus > 0; trained at gate_lr times the outer learning rate, see
    mirasc.lab.trainloop.param_groups;
    a channel-wise gate gets head_dim values per head, as RWKV-7/GLA project their decays; alpha_act=exp gives
    α = alpha_min + (1 − alpha_min)·exp(−e^{−·}), RWKV-7's decay form); the key inputs in EXTRAS from their own
    projection (κ, the regression/erase key of l2(read=kappa | erase=kappa): κ = ℓ2-normalised W_κ x per head, as
    RWKV-7 normalises its erase key; no conv, so that step needs no extra history);
    the memory op over num_heads heads; per-head RMS norm; sigmoid output gate; output projection.
    A multi-step learner (_LAYER_STEPS = STEPS > 1): STEPS keys and values per token from the same projection
    (keys normalised per step), STEPS learning rates per head, and STEPS of each key input; step() runs the token's
    STEPS inner steps.

    forward(x) runs the whole sequence (algorithm="auto": chunked where it exists); step(x_t, cache)
    decodes one token with O(1) memory for parametric memories and equals forward on the same tokens
    (under minibatch(C) the cache keeps the chunk's anchor state). The memory's initial weights are
    parameters (learned in the outer loop); where the retention needs them positive they are learned through
    their logits (`_POSITIVE`)."""

    def __init__(self, d_model, num_heads, *, algorithm="auto", layer_idx=0, **options):
        super().__init__()
        unknown = sorted(set(options) - set(LAYER_DEFAULTS))
        if unknown:
            problems = layer_option_problems({k: options[k] for k in unknown}, LAYER_SCHEMA)
            raise TypeError("; ".join(problems))
        opt = {**LAYER_DEFAULTS, **options}
        head_dim = opt["head_dim"] if isinstance(opt["head_dim"], int) else 0  # a bad one is reported below
        problems = layer_size_problems(d_model, num_heads, head_dim) + layer_option_problems(options, LAYER_SCHEMA)
        if "key_shift" in options:  # asked for here (a default shift is dropped where the conv has no tap to shift)
            problems += layer_combination_problems(opt)
        if algorithm not in ("auto", "recurrent", "chunked"):
            problems.append(f"algorithm must be 'auto', 'recurrent' or 'chunked', not {algorithm!r}")
        if problems:
            raise ValueError("; ".join(problems))
        self.d_model, self.num_heads, self.algorithm = d_model, num_heads, algorithm
        self.head_dim = opt["head_dim"] or d_model // num_heads
        self.conv_size, self.eta_max, self.alpha_min = opt["conv"], opt["eta_max"], opt["alpha_min"]
        self.alpha_act = opt["alpha_act"]
        self.qk_norm, self.v_norm = opt["qk_norm"], opt["v_norm"]
        self.out_norm, self.use_out_gate = opt["out_norm"], opt["out_gate"]
        self.gate_lr = opt["gate_lr"]  # the gate projections' learning-rate factor (read by param_groups)
        inner, steps = num_heads * self.head_dim, _LAYER_STEPS
        # q, then `steps` keys and `steps` values per token (one pair per inner step)
        self.qkv_proj = nn.Linear(d_model, (1 + 2 * steps) * inner, bias=False)
        # one projection per key input of the op besides k (EXTRAS: κ) and inner step, normalised per head
        self.extra_proj = nn.Linear(d_model, len(EXTRAS) * steps * inner, bias=False) if EXTRAS else None
        if self.conv_size:  # the keys' tap one token back starts at key_shift
            self.conv_weight = _conv_weight((1 + 2 * steps) * inner, self.conv_size, slice(inner, (1 + steps) * inner),
                                            opt["key_shift"])
        # every gate's pre-activations from one projection of x (docs/semantics.md: channel-wise gates)
        self._gates = _GateLayout(GATES, GATE_CHANNELS, num_heads, self.head_dim, opt["gate_head_term"], steps)
        self.gate_proj = _gate_projection(d_model, self._gates, opt)
        self.out_gate = nn.Linear(d_model, inner, bias=False) if self.use_out_gate else None
        self.norm_weight = nn.Parameter(torch.ones(self.head_dim)) if self.out_norm == "rms" else None
        self.o_proj = nn.Linear(inner, d_model, bias=False)
        # Learned parameters of the read itself (kernels of nonparametric memories; none for parametric ones).
        self.read_params = nn.ParameterDict(init_params(num_heads, self.head_dim, self.head_dim, layer_idx=layer_idx))
        init = init_state(1, num_heads, self.head_dim, self.head_dim)
        # momentum buffers S_* and an Omega window win_* start empty; they are not learned
        self.initial = nn.ParameterDict({n: nn.Parameter(_unconstrained(n, t, _POSITIVE, _POSITIVE_SCALE),
                                                         requires_grad=not n.startswith(("S_", "win_"))
                                                         and n not in _UNREAD)
                                         for n, t in init.items() if t.numel() > 0})
        self._state_keys = tuple(init)

    # -- pieces shared by forward and step ------------------------------------------------------
    def _conv(self, u, history=None):
        """Depthwise causal conv over time with SiLU. u: [B, T, C]; history: the previous conv-1 inputs."""
        if not self.conv_size:
            return u, None
        if history is None:
            history = u.new_zeros(u.shape[0], self.conv_size - 1, u.shape[-1])
        if u.shape[1] == 0:  # an empty sequence: nothing to convolve, the history stays as it was
            return u, history
        window = torch.cat([history, u], dim=1)
        out = F.conv1d(window.transpose(1, 2), self.conv_weight.unsqueeze(1).to(u.dtype), groups=u.shape[-1])
        return F.silu(out.transpose(1, 2)), window[:, window.shape[1] - (self.conv_size - 1):]

    def _project(self, x, history=None, dtype=None):
        """q, k, v in the dtype of x; the gates' activations in `dtype` (the memory's, default that of x)."""
        B, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        qkv, history = self._conv(self.qkv_proj(x), history)
        q, k, v = _streams(qkv, H, D, _LAYER_STEPS)  # k, v: [B, T, H, STEPS, D] for a multi-step learner
        if self.qk_norm == "l2":
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        if self.v_norm == "rms":
            v = F.rms_norm(v, (D,), eps=1e-6)
        gates = {} if self.gate_proj is None else _gate_values(self.gate_proj(x), self._gates, dtype or x.dtype,
                                                               self.eta_max, self.alpha_act, self.alpha_min)
        return q, k, v, gates, history

    def _key_inputs(self, x):
        """The op's key inputs besides q, k (EXTRAS, e.g. κ): each its own projection of x, normalised per head."""
        if self.extra_proj is None:
            return {}
        parts = self.extra_proj(x).chunk(len(EXTRAS), dim=-1)
        return {n: F.normalize(_per_step(r, self.num_heads, self.head_dim, _LAYER_STEPS), dim=-1)
                for n, r in zip(EXTRAS, parts)}

    def _state(self, batch, dtype):
        """The memory's initial state for a batch: the learned initial weights, broadcast (no copy)."""
        state = {n: _constrained(n, p, _POSITIVE, _POSITIVE_SCALE).to(dtype).expand(batch, *p.shape[1:])
                 for n, p in self.initial.items()}
        if len(state) < len(self._state_keys):  # empty entries (a nonparametric cache) are made fresh
            for n, t in init_state(batch, self.num_heads, self.head_dim, self.head_dim, dtype=dtype).items():
                state.setdefault(n, t.to(self.qkv_proj.weight.device))
        return state

    def _out(self, x, o):
        if self.norm_weight is not None:
            o = F.rms_norm(o, (self.head_dim,), self.norm_weight.to(o.dtype), eps=1e-6)
        o = o.flatten(-2)
        if self.out_gate is not None:
            o = o * torch.sigmoid(self.out_gate(x))
        return self.o_proj(o)

    def _check_input(self, x, shape):
        """x must be a floating-point tensor of `shape` ("[B, T, d_model]" or "[B, d_model]") with d_model last, in
        the parameters' dtype (under autocast, any floating dtype: the projections cast it)."""
        dims = shape.count(",") + 1
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a tensor {shape}, got {type(x).__name__}")
        if x.dim() != dims or x.shape[-1] != self.d_model:
            raise ValueError(f"expected x of shape {shape} with d_model = {self.d_model}, got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"expected a floating-point x, got {x.dtype}")
        weights = self.qkv_proj.weight.dtype
        if x.dtype != weights and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(f"x is {x.dtype} but the Layer's parameters are {weights}: convert one to the other "
                            f"(layer.to({x.dtype}) or x.to({weights})), or run under torch.autocast")

    # -- public ---------------------------------------------------------------------------------
    def forward(self, x):
        self._check_input(x, "[B, T, d_model]")
        dtype = _compute_dtype(x.dtype)
        q, k, v, gates, _ = self._project(x, dtype=dtype)
        extras = self._key_inputs(x)
        params = {n: p.to(dtype) for n, p in self.read_params.items()}
        o, _ = apply(q, k, v, gates, state=self._state(x.shape[0], dtype), params=params, algorithm=self.algorithm,
                     **({"extras": extras} if extras else {}))
        return self._out(x, o.to(x.dtype))

    def launch_plan(self, device="sm_90", dtype=None):
        """What `forward` runs in the memory for inputs of `dtype` (default: the parameters') on `device` (a torch
        device, or a GPU such as "sm_90"): the module's launch_plan at this layer's head size and algorithm
        (docs/module-api.md, "launch_plan")."""
        return launch_plan(self.head_dim, self.head_dim, dtype=self.qkv_proj.weight.dtype if dtype is None else dtype,
                           device=device, algorithm=self.algorithm)

    def init_cache(self, batch_size, dtype=None):
        """Decoding cache: the memory's carry (weights, accumulators, momentum, anchor) and conv history. dtype: the
        memory state's, float32 or float64 (default: the parameters' dtype, float32 for bf16/fp16 parameters)."""
        if dtype is None:
            dtype = _compute_dtype(self.qkv_proj.weight.dtype)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"init_cache: the memory state is kept in float32 or float64, not {dtype} (bf16/fp16 "
                             "layers keep it in float32, the default)")
        return _layer_cache(self._state(batch_size, dtype))

    def step(self, x_t, cache, mask=None):
        """x_t: [B, d_model] -> (y_t [B, d_model], cache). The memory computes in the dtype of the cache's state.
        mask: optional [B] booleans, False where x_t is a padding token, which the cache skips (docs/module-api.md,
        "Layer"): each row reads only its own tokens, and a padding row's y_t means nothing."""
        self._check_input(x_t, "[B, d_model]")
        if not isinstance(cache, dict) or "carry" not in cache:
            raise TypeError("cache must be the dict init_cache(batch_size) returns (or the last step's)")
        x = x_t[:, None]
        keep = None
        if mask is not None:
            keep = torch.as_tensor(mask, device=x_t.device).to(torch.bool)
            if tuple(keep.shape) != (x_t.shape[0],):
                raise ValueError(f"step: mask must have one entry per row, shape [{x_t.shape[0]}], got "
                                 f"{tuple(keep.shape)}")
            keep = None if bool(keep.all()) else keep
        dtype = _state_dtype(cache)
        q, k, v, gates, history = self._project(x, cache["conv"], dtype)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        extras = {n: t.to(dtype) for n, t in self._key_inputs(x).items()}
        new, o_t = _layer_read(cache, q, k, v, gates, extras, self.read_params, keep)
        y = self._out(x, o_t.transpose(1, 2).to(x.dtype))
        new["conv"] = history
        if keep is None:
            return y[:, 0], new
        return _layer_keep(keep, y[:, 0], new, cache)


def _layer_cache(state):
    """A decoding cache from the memory's initial state: the recurrence's carry and an empty conv history."""
    return {"carry": _start(state), "conv": None}


def _layer_read(cache, q, k, v, gates, extras, read_params, keep=None):
    """One token through the memory for Layer.step: q, k, v [B, 1, H, D] and the token's gates and key inputs in the
    state's dtype, the Layer's read parameters; keep: the rows whose token is not padding (read by a memory that marks
    padding in its cache). Returns the cache's new entries but the conv history, and the read o_t [B, H, 1, Dv]."""
    c = _coefficients(gates, q, v.shape[-1])
    if extras:
        c.update(_extra_inputs(extras, q, EXTRAS))
    carry, o_t = _read_tokens(cache["carry"], q, k, v, c, {n: p.to(q.dtype) for n, p in read_params.items()})
    return {"carry": carry}, o_t


def _layer_keep(keep, y, new, cache):
    """Layer.step's output y [B, d_model] and cache where some rows' token is padding (keep [B] False there): those
    rows keep the cache they had."""
    return y, _keep_rows(keep, new, cache)
