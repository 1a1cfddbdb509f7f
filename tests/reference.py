"""An independent float64 reference of docs/semantics.md: parametric memories (parametric memories).

Written from the contract text only; it does not import ``mirasc``. Everything is a plain token loop
over t, vectorised over batch and heads, and the memory gradient g_t is always taken with
``torch.autograd.grad`` of the written-out loss (``create_graph=True``), so the whole reference is
differentiable with respect to q, k, v, the gates and the initial state.

Config format (one hand-written dict per spec file in ``specs/``)::

    dict(memory=dict(kind="linear"[, feature="elu1" | "taylor", normalize=eps])
                | dict(kind="mlp", depth, expansion, act, residual, norm),
         bias=dict(kind="dot" | "l2" | "lp"(p, eps) | "huber"(delta, mode) | "custom"(f)),
         retention=dict(kind="none" | "decay"(alpha, order) | "lq"(q, alpha) | "kl"(c, alpha)
                        | "elastic"(lam, alpha) | "box"(radius, alpha)
                        | "bregman"(phi_prime, phi_prime_inv, positive=False)),
         learner=dict(kind="gd"(lr) | "momentum"(lr, theta) | "implicit"(lr) | "precond"(lr, nu, rho, transform, ...)),
         parallel=None | C,
         readout="token" | "chunk",   # optional; "chunk": docs/semantics.md, chunk readouts (lq, kl; minibatch(C))
         steps=n)                     # optional; a multi-step learner (gd(steps=n), implicit(steps=n))

A coefficient is a callable ``f(h, H)`` (a per-head constant: f at head h of H, the same at every token), or
the string ``"gate"`` (read from the gates dict under its role name: ``eta``
for lr, ``alpha`` for retention, ``theta`` for momentum, ``delta`` for Huber), ``"gate(k)"`` /
``"gate(v)"`` (docs/semantics.md: channel-wise gates: a vector per token over the key / value channels, [B, T, H,
Dk|Dv]) or a number.
Channel-wise gates are written out as the contract states them: α, θ scale the columns (k) or rows (v)
of W and S; ``lr=gate(v)`` weights the loss per output channel, ℓ = Σᵢ ηᵢ ℓ(eᵢ); ``lr=gate(k)`` gives
U = -g·diag(η); ``delta=gate(v)`` is a Huber threshold per output channel.
Optional ``gate_ranges`` only steers :func:`make_inputs` (it is not part of the semantics).

Atlas (docs/semantics.md, "The Omega rule", "Features", "Muon"): ``bias=dict(..., window=c, gamma=...)`` takes
g_t = ∇ Σ_{i=t−c+1..t} γ_i ℓ(W; k_i, v_i) by autograd on that written-out sum (each term with token i's own δ; the
state's ``win_*`` entries are the c − 1 tokens before the first, γ = 0 where empty);
``memory=dict(..., feature="poly", degree=p)`` reads φ_p(x) = [1, x, x⊗x/√2!, …] in the first layer (the residual
adds x); ``learner=dict(kind="muon", lr, theta, ns_steps)`` is S_t = θ_t S_{t−1} + g_t, U_t = −η_t NS(S_t) with
the quintic Newton–Schulz written out below.

The generalized delta transition (docs/semantics.md, "Erase and write keys apart"): ``bias=dict(kind="l2",
read="kappa")`` reads the error at the regression key κ and steps along k, g = (M(κ) − v) kᵀ;
``erase="kappa"`` takes g = ∇½‖M(κ)‖² (autograd) and adds the write v kᵀ to the step at unit rate. κ is read
from the gates dict under ``kappa`` ([B, T, H, Dk]; :func:`make_inputs` draws it there, unit-norm rows).

The preconditioned learner (docs/semantics.md, "Preconditioned learner"): ``learner=dict(kind="precond", lr, nu, rho,
transform="atk" | "rms", base, center, eps)`` keeps the statistic a_t = ν_t a_{t−1} + ρ_t (k_t ⊙ k_t) per key channel
(state ``A`` [B, H, Dk]), its multiplier m_t = base^(−r/(1+|r|)) with r = log(a_t + eps) − center (atk) or
m_t = (a_t + eps)^(−1/2) (rms), and takes U_t = −η_t·g_t·diag(m_t): the gradient's columns (key channels) scaled.

A multi-step learner (docs/semantics.md, "Multi-step learners"): ``steps=n`` makes k, v [B, T, H, n, D], η
[B, T, H, n] (channel-wise [B, T, H, n, D]) and κ [B, T, H, n, Dk]; token t takes n sub-steps j = 1..n, each the
token step above with (k_{t,j}, v_{t,j}, η_{t,j}, κ_{t,j}) at the state the previous sub-step left, the retention's
α_t at j = 1 only (α = 1 after it), and o_t is read after the last.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

GATE_OF_ROLE = {"lr": "eta", "alpha": "alpha", "theta": "theta", "delta": "delta", "gamma": "gamma", "nu": "nu",
                "rho": "rho"}
DEFAULT_GATE_RANGES = {"eta": (0.05, 0.5), "alpha": (0.8, 1.0), "theta": (0.0, 0.9), "delta": (0.2, 1.0),
                       "gamma": (0.0, 1.0), "nu": (0.5, 1.0), "rho": (0.1, 1.0)}

_MLP = dict(kind="mlp", depth=2, expansion=4, act="gelu", residual=True, norm="layernorm")
_LINEAR = dict(kind="linear")


def _cauchy(e: Tensor) -> Tensor:  # log(1 + e^2/2)
    return torch.log(1.0 + e * e / 2.0)


# FLA's preconditioned delta rules (precond_gated_deltanet, precond_kda): the ATK transform with FLA's defaults
_PRECOND_ATK = dict(kind="precond", lr="gate", nu="gate", rho="gate", transform="atk", base=1.5, center=-0.2, eps=1e-6)

REF_CONFIGS: dict[str, dict] = {
    "comba": dict(
        memory=_LINEAR,
        bias=dict(kind="l2", read="kappa"),
        retention=dict(kind="decay", alpha="gate", order="pre"),
        learner=dict(kind="gd", lr="gate"),
        parallel=None,
    ),
    "custom_cauchy": dict(
        memory=_LINEAR,
        bias=dict(kind="custom", f=_cauchy),
        retention=dict(kind="decay", alpha="gate", order="pre"),
        learner=dict(kind="gd", lr="gate"),
        parallel=None,
    ),
    "deltanet": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="none"),
        learner=dict(kind="gd", lr="gate"),
        parallel=None,
    ),
    "deltaproduct": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="none"),
        learner=dict(kind="gd", lr="gate"),
        parallel=None,
        steps=3,
    ),
    "gated_deltanet": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="decay", alpha="gate", order="pre"),
        learner=dict(kind="gd", lr="gate"),
        parallel=None,
    ),
    "gated_deltaproduct": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="decay", alpha="gate", order="pre"),
        learner=dict(kind="gd", lr="gate"),
        parallel=None,
        steps=2,
    ),
    "gla": dict(
        memory=_LINEAR,
        bias=dict(kind="dot"),
        retention=dict(kind="decay", alpha="gate(k)", order="post"),
        learner=dict(kind="gd", lr=1.0),
        parallel=None,
    ),
    "hgrn2": dict(
        memory=_LINEAR,
        bias=dict(kind="dot"),
        retention=dict(kind="decay", alpha="gate(k)", order="post"),
        learner=dict(kind="gd", lr="gate(k)"),
        parallel=None,
    ),
    "hyperbolic_mirror": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="bregman", phi_prime=torch.sinh, phi_prime_inv=torch.asinh),  # phi(w) = cosh(w)
        learner=dict(kind="momentum", lr="gate", theta=0.9),
        parallel=16,
    ),
    "huber_kl_momentum": dict(
        memory=dict(kind="mlp", depth=2, expansion=2, act="silu", residual=False, norm="none"),
        bias=dict(kind="huber", delta="gate", mode="coordinate"),
        retention=dict(kind="kl", c=1.0, alpha="gate"),
        learner=dict(kind="momentum", lr="gate", theta="gate"),
        parallel=32,
    ),
    "kda": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="decay", alpha="gate(k)", order="pre"),
        learner=dict(kind="gd", lr="gate"),
        parallel=None,
    ),
    "linear_attention": dict(
        memory=_LINEAR,
        bias=dict(kind="dot"),
        retention=dict(kind="none"),
        learner=dict(kind="gd", lr=1.0),
        parallel=None,
    ),
    "longhorn": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="none"),
        learner=dict(kind="implicit", lr="gate"),
        parallel=None,
    ),
    "mamba2": dict(
        memory=_LINEAR,
        bias=dict(kind="dot"),
        retention=dict(kind="decay", alpha="gate", order="post"),
        learner=dict(kind="gd", lr="gate"),
        parallel=None,
    ),
    "memora": dict(
        memory=_MLP,
        bias=dict(kind="l2"),
        retention=dict(kind="kl", c=1.0, alpha="gate"),
        learner=dict(kind="gd", lr="gate(v)"),
        parallel=64,
        readout="chunk",
    ),
    "memora_token": dict(
        memory=_MLP,
        bias=dict(kind="l2"),
        retention=dict(kind="kl", c=1.0, alpha="gate"),
        learner=dict(kind="gd", lr="gate"),
        parallel=64,
    ),
    "moneta": dict(
        memory=_MLP,
        bias=dict(kind="lp", p=3.0, eps=1e-6),
        retention=dict(kind="lq", q=4.0, alpha="gate"),
        learner=dict(kind="gd", lr="gate(v)"),
        parallel=64,
        readout="chunk",
    ),
    "moneta_token": dict(
        memory=_MLP,
        bias=dict(kind="lp", p=3.0, eps=1e-6),
        retention=dict(kind="lq", q=4.0, alpha="gate"),
        learner=dict(kind="gd", lr="gate"),
        parallel=64,
    ),
    "linear_attention_elu": dict(
        memory=dict(kind="linear", feature="elu1", normalize=1e-6),
        bias=dict(kind="dot"),
        retention=dict(kind="none"),
        learner=dict(kind="gd", lr=1.0),
        parallel=None,
    ),
    "based": dict(
        memory=dict(kind="linear", feature="taylor", normalize=1e-6),
        bias=dict(kind="dot"),
        retention=dict(kind="none"),
        learner=dict(kind="gd", lr=1.0),
        parallel=None,
    ),
    "momentum_deltanet": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="decay", alpha="gate", order="post"),
        learner=dict(kind="momentum", lr="gate", theta="gate"),
        parallel=None,
    ),
    "hedgehog": dict(
        memory=dict(kind="linear", feature="hedgehog", normalize=1e-6),
        bias=dict(kind="dot"),
        retention=dict(kind="none"),
        learner=dict(kind="gd", lr=1.0),
        parallel=None,
    ),
    "precond_gated_deltanet": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="decay", alpha="gate", order="pre"),
        learner=_PRECOND_ATK,
        parallel=None,
    ),
    "precond_kda": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="decay", alpha="gate(k)", order="pre"),
        learner=_PRECOND_ATK,
        parallel=None,
    ),
    "retnet": dict(
        memory=_LINEAR,
        bias=dict(kind="dot"),
        retention=dict(kind="decay", alpha=lambda h, H: 1 - 2.0 ** (-5 - h), order="post"),  # γ_h per head
        learner=dict(kind="gd", lr=1.0),
        parallel=None,
    ),
    "rwkv7": dict(
        memory=_LINEAR,
        bias=dict(kind="l2", erase="kappa"),
        retention=dict(kind="decay", alpha="gate(k)", order="post"),
        learner=dict(kind="gd", lr="gate(k)"),
        parallel=None,
        gate_ranges=dict(eta=(0.1, 0.9)),
    ),
    "sparse_lp": dict(
        memory=_LINEAR,
        bias=dict(kind="lp", p=1.5, eps=1e-6),
        retention=dict(kind="elastic", lam=0.001, alpha="gate"),
        learner=dict(kind="gd", lr="gate"),
        parallel=32,
    ),
    "titans": dict(
        memory=_MLP,
        bias=dict(kind="l2"),
        retention=dict(kind="decay", alpha="gate", order="post"),
        learner=dict(kind="momentum", lr="gate", theta="gate"),
        parallel=64,
    ),
    "ttt_linear": dict(
        memory=_LINEAR,
        bias=dict(kind="l2"),
        retention=dict(kind="none"),
        learner=dict(kind="gd", lr="gate"),
        parallel=16,
    ),
    "ttt_mlp": dict(
        memory=_MLP,
        bias=dict(kind="l2"),
        retention=dict(kind="none"),
        learner=dict(kind="gd", lr="gate"),
        parallel=16,
    ),
    "atlas": dict(
        memory=dict(_MLP, feature="poly", degree=2),
        bias=dict(kind="l2", window=4, gamma="gate"),
        retention=dict(kind="decay", alpha="gate", order="post"),
        learner=dict(kind="muon", lr="gate", theta="gate", ns_steps=5),
        parallel=64,
    ),
    "omega_yaad": dict(
        memory=_MLP,
        bias=dict(kind="huber", delta="gate", mode="mixture", window=4, gamma="gate"),
        retention=dict(kind="decay", alpha="gate", order="post"),
        learner=dict(kind="gd", lr="gate"),
        parallel=64,
        gate_ranges=dict(delta=(2.5, 6.0)),  # (as yaad: both branches of the mixture are taken)
    ),
    "yaad": dict(
        memory=_MLP,
        bias=dict(kind="huber", delta="gate", mode="mixture"),
        retention=dict(kind="decay", alpha="gate", order="post"),
        learner=dict(kind="gd", lr="gate(v)"),
        parallel=64,
        # ||e|| of a residual+LayerNorm memory is about sqrt(2 Dv + 1); scale delta so that both
        # branches of the mixture are taken (for Dv = 8)
        gate_ranges=dict(delta=(2.5, 6.0)),
    ),
}


# --------------------------------------------------------------------------------------------------
# config helpers


def feature_map(kind: str | None, x: Tensor) -> Tensor:
    """φ(x) over the last axis (docs/semantics.md, "Feature maps and the normaliser"): elu1 = elu(x) + 1; taylor =
    [1, x_1..x_D, x_1²/√2..x_D²/√2, then x_i x_j for i < j in row-major order]; hedgehog at U = I, c = 0."""
    if kind in (None, "identity", "poly"):  # (poly is read inside the memory: memory_forward)
        return x
    if kind == "elu1":
        return F.elu(x) + 1
    if kind == "taylor":
        D = x.shape[-1]
        pairs = [x[..., i] * x[..., j] for i in range(D) for j in range(i + 1, D)]
        cross = torch.stack(pairs, dim=-1) if pairs else x[..., :0]
        return torch.cat([torch.ones_like(x[..., :1]), x, x * x / math.sqrt(2.0), cross], dim=-1)
    if kind == "hedgehog":  # at the op's default parameters U = I, c = 0: softmax([x, −x])
        return torch.softmax(torch.cat([x, -x], dim=-1), dim=-1)
    raise ValueError(f"unknown feature map {kind!r}")


def poly_degree(mem: dict) -> int:
    """p of ``feature="poly", degree=p`` (the memory reads φ_p(x) in its first layer), or 0."""
    return mem.get("degree", 2) if mem.get("feature") == "poly" else 0


def feature_width(mem: dict, Dk: int) -> int:
    """The width of what the memory's (first layer's) weight reads: Dφ of a feature map, Σ_{i<=p} Dk^i for poly."""
    if poly_degree(mem):
        return sum(Dk ** i for i in range(poly_degree(mem) + 1))
    return feature_map(mem.get("feature"), torch.zeros(Dk, dtype=torch.float64)).shape[-1] if mem["kind"] == "linear" \
        else Dk


def _get_cfg(cfg_or_name) -> dict:
    return REF_CONFIGS[cfg_or_name] if isinstance(cfg_or_name, str) else cfg_or_name


def weight_names(mem: dict) -> list[str]:
    if mem["kind"] == "linear":
        return ["W"]
    if mem["kind"] == "mlp":
        return [f"W{i}" for i in range(1, mem["depth"] + 1)]
    raise ValueError(f"unknown memory {mem['kind']!r}")


def declared_gates(cfg) -> set[str]:
    """Gate names (eta, alpha, theta, delta) that the config reads from the gates dict."""
    cfg = _get_cfg(cfg)
    out = set()
    for section in ("bias", "retention", "learner"):
        for role, gate in GATE_OF_ROLE.items():
            if cfg[section].get(role) in ("gate", "gate(k)", "gate(v)"):
                out.add(gate)
    return out


def state_keys(cfg) -> list[str]:
    cfg = _get_cfg(cfg)
    names = weight_names(cfg["memory"])
    keys = list(names)
    if cfg["retention"]["kind"] in ("lq", "elastic", "box"):
        keys += [f"A_{n}" for n in names]
    if cfg["learner"]["kind"] in ("momentum", "muon"):
        keys += [f"S_{n}" for n in names]
    if cfg["learner"]["kind"] == "precond":
        keys.append("A")
    if cfg["memory"].get("normalize") is not None:
        keys.append("z")
    if cfg["bias"].get("window", 1) > 1:
        keys += ["win_k", "win_v", "win_gamma"] + (["win_delta"] if "delta" in cfg["bias"] else [])
    return keys


def needs_positive_weights(cfg) -> bool:
    """kl always; bregman when its potential is only defined for w > 0 (config flag ``positive``)."""
    ret = _get_cfg(cfg)["retention"]
    return ret["kind"] == "kl" or (ret["kind"] == "bregman" and bool(ret.get("positive", False)))


def _coef(value, gate_name: str, gates: dict, t: int, default: float):
    """Coefficient at token t as a factor on a weight [B, H, Dv, Dk]: [B, H, 1, 1] (gate), [B, H, 1, Dk]
    (gate(k): columns), [B, H, Dv, 1] (gate(v): rows), or a python float (constant / undeclared)."""
    if value is None:
        return default
    if callable(value):  # a per-head constant: value(h, H) for heads h = 0..H-1, the same at every token
        like = gates["_q"]
        heads = like.shape[2]
        per_head = torch.tensor([float(value(h, heads)) for h in range(heads)], dtype=like.dtype, device=like.device)
        return per_head[None, :, None, None]
    if value == "gate":
        return gates[gate_name][:, t][..., None, None]
    if value == "gate(k)":
        return gates[gate_name][:, t][..., None, :]
    if value == "gate(v)":
        return gates[gate_name][:, t][..., :, None]
    return float(value)


# --------------------------------------------------------------------------------------------------
# memory, loss, gradient

_ACTS = {
    "gelu": lambda x: F.gelu(x),  # exact erf GELU
    "silu": F.silu,
    "relu": F.relu,
    "tanh": torch.tanh,
    "identity": lambda x: x,
}


def _matvec(W: Tensor, x: Tensor) -> Tensor:
    """W [B,H,m,n], x [B,H,n] -> [B,H,m]."""
    return torch.einsum("bhmn,bhn->bhm", W, x)


def poly_features(x: Tensor, p: int) -> Tensor:
    """φ_p(x) = [1, x, x⊗x/√2!, …, x^⊗p/√p!] over the last axis (row-major tensor powers)."""
    parts, power = [torch.ones_like(x[..., :1]), x], x
    for i in range(2, p + 1):
        power = torch.einsum("...a,...b->...ab", power, x).reshape(*x.shape[:-1], -1)
        parts.append(power / math.sqrt(math.factorial(i)))
    return torch.cat(parts, dim=-1)


def newton_schulz(G: Tensor, steps: int) -> Tensor:
    """The quintic Newton–Schulz iteration of Muon on each matrix: X_0 = G/(‖G‖_F + 1e-7) in the orientation with
    fewer rows, X ← 3.4445 X − 4.7750 (XXᵀ)X + 2.0315 (XXᵀ)²X."""
    X = G.mT if G.shape[-2] > G.shape[-1] else G
    X = X / (torch.sqrt((X * X).sum((-2, -1), keepdim=True)) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        X = 3.4445 * X - 4.7750 * (A @ X) + 2.0315 * (A @ (A @ X))
    return X.mT if G.shape[-2] > G.shape[-1] else X


def memory_forward(mem: dict, Ws: dict[str, Tensor], x: Tensor) -> Tensor:
    """M_W(x) for x [B,H,Dk]; returns [B,H,Dv]."""
    inp = poly_features(x, poly_degree(mem)) if poly_degree(mem) else x
    if mem["kind"] == "linear":
        return _matvec(Ws["W"], inp)
    names = weight_names(mem)
    act = _ACTS[mem["act"]]
    h = inp
    for n in names[:-1]:
        h = act(_matvec(Ws[n], h))
    y = _matvec(Ws[names[-1]], h)
    if mem["norm"] == "layernorm":
        y = F.layer_norm(y, (y.shape[-1],), eps=1e-5)
    elif mem["norm"] != "none":
        raise ValueError(mem["norm"])
    if mem["residual"]:
        y = x + y
    return y


def bias_loss(bias: dict, y: Tensor, v: Tensor, delta, weight=1.0) -> Tensor:
    """Per-(b,h) loss l(y, v), y and v [B,H,Dv] -> [B,H]; `weight` [B,H,Dv] weights each output channel's
    term (lr=gate(v)); `delta` is [B,H,1,1], [B,H,Dv,1] (delta=gate(v)) or a float."""
    kind = bias["kind"]
    if kind == "dot":
        return -(weight * y * v).sum(-1)
    e = y - v
    if kind == "l2":
        return (weight * 0.5 * e * e).sum(-1)
    if kind == "lp":
        p = float(bias["p"])
        return (weight * (e * e + float(bias.get("eps", 1e-6))) ** (p / 2)).sum(-1) / p
    if kind == "huber":
        d = delta[..., 0] if isinstance(delta, Tensor) else delta  # [B,H,1] / [B,H,Dv] or float
        if bias.get("mode", "coordinate") == "mixture":
            d = d[..., 0] if isinstance(d, Tensor) else d  # [B,H]
            quad = 0.5 * (weight * e * e).sum(-1)
            lin = d * (weight * e.abs()).sum(-1)
            row_norm = e.detach().norm(dim=-1)
            return torch.where(row_norm <= d, quad, lin)
        a = e.abs()
        return (weight * torch.where(a <= d, 0.5 * e * e, d * (a - 0.5 * d))).sum(-1)
    if kind == "custom":
        return (weight * bias["f"](e)).sum(-1)
    raise ValueError(f"unknown bias {kind!r}")


def window_grad(cfg: dict, Ws: dict[str, Tensor], window: list, create_graph=True):
    """The Omega rule: ∇ Σ_i γ_i ℓ(M_W(k_i), v_i; δ_i) over the window's (k_i, v_i, δ_i, γ_i), by autograd."""
    names = list(Ws)
    leaves = [Ws[n] if Ws[n].requires_grad else Ws[n].detach().requires_grad_(True) for n in names]
    Wl = dict(zip(names, leaves))
    loss = sum((gamma[..., 0, 0] if isinstance(gamma, Tensor) else gamma)
               * bias_loss(cfg["bias"], memory_forward(cfg["memory"], Wl, ki), vi, delta)
               for ki, vi, delta, gamma in window)
    grads = torch.autograd.grad(loss.sum(), leaves, create_graph=create_graph)
    return dict(zip(names, grads))


def memory_grad(cfg: dict, Ws: dict[str, Tensor], k: Tensor, v: Tensor, delta, create_graph=True, weight=1.0):
    """g = d l(M_W(k), v) / dW for each weight matrix, by autograd (differentiable: create_graph)."""
    names = list(Ws)
    leaves = [Ws[n] if Ws[n].requires_grad else Ws[n].detach().requires_grad_(True) for n in names]
    loss = bias_loss(cfg["bias"], memory_forward(cfg["memory"], dict(zip(names, leaves)), k), v, delta, weight)
    grads = torch.autograd.grad(loss.sum(), leaves, create_graph=create_graph)
    return dict(zip(names, grads))


# --------------------------------------------------------------------------------------------------
# retention read-outs


def rel(a: Tensor, b: Tensor) -> float:
    """Relative error ‖a − b‖ / ‖b‖ in float64 (the tests' measure against this reference)."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def lq_readout(A: Tensor, q: float) -> Tensor:
    """W = A / ||A||_q^{q-2}, entrywise q-norm over each (b,h) matrix."""
    norm = (A.abs() ** q).sum((-2, -1), keepdim=True) ** (1.0 / q)
    return A / norm ** (q - 2.0)


def elastic_readout(A: Tensor, lam: float) -> Tensor:
    return torch.sign(A) * torch.clamp(A.abs() - lam, min=0.0)


def box_readout(A: Tensor, radius: float) -> Tensor:
    """argmin over |w| <= r of ½‖W − A‖²: each entry clipped to [−r, r]."""
    return torch.clamp(A, min=-radius, max=radius)


# --------------------------------------------------------------------------------------------------
# the op


def _as_column(x, like: Tensor) -> Tensor:
    """A per-token scalar coefficient ([B, H, 1, 1] tensor or a float) as [B, H, 1]."""
    return x[..., 0] if isinstance(x, Tensor) else torch.full_like(like[..., :1], float(x))


def reference_apply(cfg, q: Tensor, k: Tensor, v: Tensor, gates: dict[str, Tensor], state: dict[str, Tensor]):
    """Token by token (docs/semantics.md: parametric memories). Returns (o [B,T,H,Dv], final state with the input
    state's keys)."""
    cfg = _get_cfg(cfg)
    inputs = [q, k, v, *gates.values(), *state.values()]
    differentiable = torch.is_grad_enabled() and any(x.requires_grad for x in inputs)
    with torch.enable_grad():
        o, final = _reference_apply(cfg, q, k, v, gates, state, differentiable)
    if not differentiable:
        o, final = o.detach(), {key: x.detach() for key, x in final.items()}
    return o, final


def _reference_apply(cfg, q, k, v, gates, state, create_graph=True):
    mem, ret, lrn = cfg["memory"], cfg["retention"], cfg["learner"]
    C = cfg["parallel"]
    names = weight_names(mem)
    unknown = set(state) - set(state_keys(cfg))
    if unknown:
        raise KeyError(f"unexpected state keys {sorted(unknown)}")
    order = ret.get("order", "post")
    if ret["kind"] == "decay" and order == "pre" and C is not None:
        raise NotImplementedError("decay(order=pre) with minibatch is not used by any spec")
    if lrn["kind"] == "implicit":
        if not (mem["kind"] == "linear" and cfg["bias"]["kind"] == "l2" and C is None):
            raise NotImplementedError("implicit: closed form only for linear + l2, exact")
        if ret["kind"] not in ("none", "decay") or (ret["kind"] == "decay" and order != "pre"):
            raise NotImplementedError("implicit: only retention none or decay(order=pre)")

    chunk_readout = cfg.get("readout", "token") == "chunk"
    if chunk_readout and (C is None or ret["kind"] not in ("lq", "kl")):
        raise ValueError("readout=chunk is defined for lq and kl retention under minibatch(C)")
    # a feature map: the memory reads and writes φ(q), φ(k); the normaliser z_t (dot, gd, none/decay only) is
    # z_t = α_t z_{t-1} + η_t φ(k_t) and the read o_t = W_t φ(q_t) / (z_t·φ(q_t) + eps)
    q, k = feature_map(mem.get("feature"), q), feature_map(mem.get("feature"), k)
    eps = mem.get("normalize")
    if eps is not None and not (cfg["bias"]["kind"] == "dot" and lrn["kind"] == "gd"
                                and ret["kind"] in ("none", "decay")):
        raise NotImplementedError("the normaliser is defined with dot, gd, retention none or decay")
    z = state["z"] if eps is not None else None
    n_steps = cfg.get("steps", 1)
    if n_steps > 1 and (C is not None or lrn["kind"] in ("momentum", "muon") or cfg["bias"].get("window", 1) > 1):
        raise ValueError("steps=n is defined with parallel exact, a gd or implicit learner and no Omega window")
    if n_steps > 1 and (eps is not None or mem.get("feature") not in (None, "identity", "poly")):
        raise NotImplementedError("steps=n with a feature map or the normaliser is not defined (spec.py rejects it)")
    # the inputs of sub-step j: k, v, η and κ have one per sub-step (axis 3), the other gates one per token
    per_step = ("eta", "kappa")
    gates = {**gates, "_q": q}  # (its head count, dtype and device, for per-head constants)
    sub_gates = [{n: x[:, :, :, j] if n in per_step and n_steps > 1 else x for n, x in gates.items()}
                 for j in range(n_steps)]
    T = q.shape[1]
    W = {n: state[n] for n in names}
    A = {n: state[f"A_{n}"] for n in names} if ret["kind"] in ("lq", "elastic", "box") else None
    S = None
    if lrn["kind"] in ("momentum", "muon"):
        S = {n: state.get(f"S_{n}", torch.zeros_like(W[n])) for n in names}
    c_win = cfg["bias"].get("window", 1)
    window = []  # the Omega window: (k_i, v_i, δ_i, γ_i) of the last c tokens, the state's c − 1 first
    if c_win > 1:
        for j in range(c_win - 1):
            d_j = state["win_delta"][:, :, j][..., None] if "win_delta" in state else 0.0
            gamma_j = state["win_gamma"][:, :, j][..., None]
            window.append((state["win_k"][:, :, j], state["win_v"][:, :, j], d_j, gamma_j))
    stat = state["A"] if lrn["kind"] == "precond" else None  # the preconditioner's statistic a [B, H, Dk]
    anchor = W
    Z = None  # kl with α over key channels: the log-space accumulator (below)
    outs = []
    for step in range(T * n_steps):  # token t, sub-step j (one sub-step per token unless steps=n)
        t, j = divmod(step, n_steps)
        last = j == n_steps - 1  # the token's output is read after its last sub-step
        kt, vt, qt = (k[:, t], v[:, t], q[:, t]) if n_steps == 1 else (k[:, t, :, j], v[:, t, :, j], q[:, t])
        gates = sub_gates[j]
        eta = _coef(lrn.get("lr"), "eta", gates, t, 1.0)
        # the retention acts once per token: its decay at the first sub-step, none after it
        alpha = _coef(ret.get("alpha"), "alpha", gates, t, 1.0) if j == 0 else 1.0
        theta = _coef(lrn.get("theta"), "theta", gates, t, 0.0)
        delta = _coef(cfg["bias"].get("delta"), "delta", gates, t, 0.0)

        if ret["kind"] == "decay" and order == "pre":
            W = {n: alpha * W[n] for n in names}  # W'_{t-1}; the gradient is taken here

        if lrn["kind"] == "implicit":
            # argmin_W 1/2||W k - v||^2 + 1/(2 eta)||W - W'||^2, W' = (pre-decayed) previous state
            Wp = W["W"]
            kf = poly_features(kt, poly_degree(mem)) if poly_degree(mem) else kt  # what the memory reads
            kk = (kf * kf).sum(-1)[..., None, None]
            err = _matvec(Wp, kf) - vt
            W = {"W": Wp - eta / (1.0 + eta * kk) * err[..., :, None] * kf[..., None, :]}
            if last:
                outs.append(memory_forward(mem, W, qt))
            continue

        first = C is not None and t % C == 0  # the first token s of a chunk
        if first and chunk_readout and ret["kind"] == "lq":
            # docs/semantics.md: chunk readouts: W_{s-1} := A_{s-1} / n_c, n_c = ||A_{s-1}||_q^{q-2}, frozen for the
            # chunk
            qq = float(ret["q"])
            total = {n: (A[n].abs() ** qq).sum((-2, -1), keepdim=True) for n in names}
            # an all-zero accumulator (e.g. a linear memory's empty start) leaves n_c undefined: taken as 1
            safe = {n: torch.where(x > 0, x, torch.ones_like(x)) for n, x in total.items()}
            n_c = {n: torch.where(total[n] > 0, (safe[n] ** (1.0 / qq)) ** (qq - 2.0), safe[n]) for n in names}
            W = {n: A[n] / n_c[n] for n in names}
        if first:
            anchor = W  # state at the end of the previous chunk
        weight = 1.0
        if lrn.get("lr") == "gate(v)":  # ℓ = Σᵢ ηᵢ ℓ(eᵢ): the step itself is then -g
            weight, eta = eta[..., 0], 1.0
        read, erase = cfg["bias"].get("read") == "kappa", cfg["bias"].get("erase") == "kappa"
        if read:  # the l2 error read at κ, stepped along the write key k
            err = memory_forward(mem, W, gates["kappa"][:, t]) - vt
            g = {"W": err[..., :, None] * kt[..., None, :]}
        elif erase:  # the erase: the gradient of ½‖M(κ)‖² (l2 towards 0 at κ)
            g = memory_grad(cfg, W, gates["kappa"][:, t], torch.zeros_like(vt), delta, create_graph, weight)
        elif c_win > 1:
            window = (window + [(kt, vt, delta, _coef(cfg["bias"].get("gamma", 1.0), "gamma", gates, t, 1.0))])[-c_win:]
            g = window_grad(cfg, anchor if C is not None else W, window, create_graph)
        else:
            g = memory_grad(cfg, anchor if C is not None else W, kt, vt, delta, create_graph, weight)

        if lrn["kind"] == "gd":
            U = {n: -eta * g[n] for n in names}  # (lr=gate(k): eta [B,H,1,Dk] scales g's columns)
            if erase:  # the write v kᵀ at unit rate
                U = {"W": U["W"] + vt[..., :, None] * kt[..., None, :]}
        elif lrn["kind"] == "precond":
            # a_t = ν_t a_{t−1} + ρ_t k_t², then m_t from a_t, and the step −η_t g_t diag(m_t)
            nu = _coef(lrn.get("nu"), "nu", gates, t, 1.0)
            rho = _coef(lrn.get("rho"), "rho", gates, t, 1.0)
            nu, rho = (x[..., 0] if isinstance(x, Tensor) else x for x in (nu, rho))  # [B, H, 1] or a float
            stat = nu * stat + rho * kt * kt
            small = float(lrn.get("eps", 1e-6))
            if lrn.get("transform", "rms") == "atk":
                r = torch.log(stat + small) - float(lrn.get("center", -0.2))
                m = float(lrn.get("base", 1.5)) ** (-r / (1.0 + torch.abs(r)))
            else:
                m = 1.0 / torch.sqrt(stat + small)
            U = {n: -eta * g[n] * m[..., None, :] for n in names}
        elif lrn["kind"] == "momentum":
            S = {n: theta * S[n] - eta * g[n] for n in names}
            U = S
        elif lrn["kind"] == "muon":
            S = {n: theta * S[n] + g[n] for n in names}
            U = {n: -eta * newton_schulz(S[n], lrn["ns_steps"]) for n in names}
        else:
            raise ValueError(f"unknown learner {lrn['kind']!r}")

        kind = ret["kind"]
        if chunk_readout and kind == "lq":
            A = {n: alpha * A[n] + U[n] for n in names}
            W = {n: A[n] / n_c[n] for n in names}
        elif chunk_readout and kind == "kl":
            c = float(ret.get("c", 1.0))
            if first:  # the lag token: full step from log max(W, 1e-12), gradient at W_{s-1}
                W = {n: c * torch.softmax(alpha * torch.log(torch.clamp_min(W[n], 1e-12)) + U[n], dim=-1)
                     for n in names}
                anchor = W  # later tokens of the chunk take their gradient at W_s
            else:  # plain decay step in weight space
                W = {n: alpha * W[n] + U[n] for n in names}
        elif kind == "none" or (kind == "decay" and order == "pre"):
            W = {n: W[n] + U[n] for n in names}
        elif kind == "decay":
            W = {n: alpha * W[n] + U[n] for n in names}
        elif kind == "lq":
            A = {n: alpha * A[n] + U[n] for n in names}
            W = {n: lq_readout(A[n], float(ret["q"])) for n in names}
        elif kind == "elastic":
            A = {n: alpha * A[n] + U[n] for n in names}
            W = {n: elastic_readout(A[n], float(ret["lam"])) for n in names}
        elif kind == "box":
            A = {n: alpha * A[n] + U[n] for n in names}
            W = {n: box_readout(A[n], float(ret["radius"])) for n in names}
        elif kind == "kl" and ret.get("alpha") == "gate(k)":
            # docs/semantics.md: channel-wise gates: a decay over key channels scales kl's log-space form, Z_t =
            # Z_{t-1}·diag(α_t) + U_t with
            # W_t = c·softmax(Z_t). (Not c·softmax(α_t ∘ log W_{t-1} + U_t): with α varying along a row the row's
            # log-normaliser log Σ exp(Z) no longer cancels in the softmax.)
            c = float(ret.get("c", 1.0))
            if Z is None:
                Z = {n: torch.log(W[n] / c) for n in names}
            Z = {n: alpha * Z[n] + U[n] for n in names}
            W = {n: c * torch.softmax(Z[n], dim=-1) for n in names}
        elif kind == "kl":
            c = float(ret.get("c", 1.0))
            W = {n: c * torch.softmax(alpha * torch.log(W[n]) + U[n], dim=-1) for n in names}
        elif kind == "bregman":
            fp, fpi = ret["phi_prime"], ret["phi_prime_inv"]
            W = {n: fpi(fp(W[n]) + U[n]) for n in names}
        else:
            raise ValueError(f"unknown retention {kind!r}")

        if not last:
            continue
        if eps is not None:  # the normaliser: α_t z_{t-1} + η_t φ(k_t) (dot: the gradient does not read W)
            z = (alpha if kind == "decay" else 1.0) * z + eta * kt[..., None, :]
            den = (z[..., 0, :] * qt).sum(-1, keepdim=True) + eps
            outs.append(memory_forward(mem, W, qt) / den)
            continue
        outs.append(memory_forward(mem, W, qt))  # read after write

    o = torch.stack(outs, dim=1)
    final = {}
    for key in state:
        if key == "z":
            final[key] = z
        elif key.startswith("win_"):  # the window left at the end: the last c − 1 tokens ([B, H, c − 1, ·])
            j = ("win_k", "win_v", "win_delta", "win_gamma").index(key)
            final[key] = torch.stack([w[j] if j < 2 else _as_column(w[j], w[0]) for w in window[-(c_win - 1):]], 2)
        elif key == "A":
            final[key] = stat
        elif key.startswith("A_"):
            final[key] = A[key[2:]]
        elif key.startswith("S_"):
            final[key] = S[key[2:]]
        else:
            final[key] = W[key]
    return o, final


# --------------------------------------------------------------------------------------------------
# inputs and states


def make_inputs(cfg_or_spec_name, B: int, T: int, H: int, Dk: int, Dv: int, dtype=torch.float64, seed: int = 0):
    """q, k (unit-norm rows), v ~ N(0,1), and the declared gates in stable ranges.

    Values are drawn in float64 and then cast, so two dtypes with the same seed see the same data.
    """
    cfg = _get_cfg(cfg_or_spec_name)
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    sub = (cfg["steps"],) if cfg.get("steps", 1) > 1 else ()  # a multi-step learner: n keys, values, η, κ per token
    q = F.normalize(torch.randn(B, T, H, Dk, generator=g, dtype=f64), dim=-1)
    k = F.normalize(torch.randn(B, T, H, *sub, Dk, generator=g, dtype=f64), dim=-1)
    v = torch.randn(B, T, H, *sub, Dv, generator=g, dtype=f64)
    ranges = dict(DEFAULT_GATE_RANGES)
    ranges.update(cfg.get("gate_ranges", {}))
    gates = {}
    kinds = {GATE_OF_ROLE[role]: cfg[section][role] for section in ("bias", "retention", "learner")
             for role in GATE_OF_ROLE if role in cfg[section]}
    for name in sorted(declared_gates(cfg)):
        lo, hi = ranges[name]
        shape = {"gate": (B, T, H), "gate(k)": (B, T, H, Dk), "gate(v)": (B, T, H, Dv)}[kinds[name]]
        if name == "eta":
            shape = (*shape[:3], *sub, *shape[3:])
        gates[name] = lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=f64)
    if "kappa" in (cfg["bias"].get("read"), cfg["bias"].get("erase")):  # the regression key κ
        gates["kappa"] = F.normalize(torch.randn(B, T, H, *sub, Dk, generator=g, dtype=f64), dim=-1)
    cast = lambda x: x.to(dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), {n: cast(x) for n, x in gates.items()}


def make_state(cfg_or_spec_name, B: int, H: int, Dk: int, Dv: int, dtype=torch.float64, seed: int = 0):
    """A valid initial state: small random linear W, N(0, 1/fan_in) MLP weights, c*softmax rows for kl
    and positive-domain bregman potentials such as w log w, A = W for lq/elastic, S = 0 for momentum."""
    cfg = _get_cfg(cfg_or_spec_name)
    mem, ret = cfg["memory"], cfg["retention"]
    g = torch.Generator().manual_seed(seed + 7919)
    f64 = torch.float64
    Df = feature_width(mem, Dk)  # the width of φ(k): what the (first layer of the) memory reads
    if mem["kind"] == "linear":
        shapes = {"W": (Dv, Df)}
    else:
        L, hid = mem["depth"], mem["expansion"] * Dk
        if L == 1:
            shapes = {"W1": (Dv, Df)}
        else:
            shapes = {"W1": (hid, Df)}
            shapes.update({f"W{i}": (hid, hid) for i in range(2, L)})
            shapes[f"W{L}"] = (Dv, hid)
    positive = needs_positive_weights(cfg)
    state = {}
    for n, (rows, cols) in shapes.items():
        z = torch.randn(B, H, rows, cols, generator=g, dtype=f64)
        if positive:
            w = float(ret.get("c", 1.0)) * torch.softmax(z, dim=-1)
        elif mem["kind"] == "linear":
            w = z * (0.5 / math.sqrt(cols))
        else:
            w = z / math.sqrt(cols)
        state[n] = w
    if ret["kind"] in ("lq", "elastic", "box"):
        state.update({f"A_{n}": state[n].clone() for n in shapes})
    if cfg["learner"]["kind"] in ("momentum", "muon"):
        state.update({f"S_{n}": torch.zeros_like(state[n]) for n in shapes})
    if cfg["learner"]["kind"] == "precond":  # the preconditioner's statistic: a sum of squares, so >= 0
        state["A"] = torch.rand(B, H, Dk, generator=g, dtype=f64)
    if mem.get("normalize") is not None:  # the normaliser: a sum of positive features, so positive entries
        state["z"] = torch.rand(B, H, 1, shapes["W"][1], generator=g, dtype=f64)
    c = cfg["bias"].get("window", 1)
    if c > 1:  # an empty Omega window (γ = 0: no token before the first)
        Dw = feature_map(mem.get("feature"), torch.zeros(Dk, dtype=f64)).shape[-1]  # the keys the memory is given
        state.update(win_k=torch.zeros(B, H, c - 1, Dw, dtype=f64), win_v=torch.zeros(B, H, c - 1, Dv, dtype=f64),
                     win_gamma=torch.zeros(B, H, c - 1, 1, dtype=f64))
        if "delta" in cfg["bias"]:
            state["win_delta"] = torch.zeros(B, H, c - 1, 1, dtype=f64)
    return {key: x.to(dtype) for key, x in state.items()}


def decode(layer, x):
    """A Layer's outputs token by token through init_cache/step (its O(1) decoding path), stacked as [B, T, d]:
    what every decoding test compares with layer(x)."""
    cache, outs = layer.init_cache(x.shape[0]), []
    for t in range(x.shape[1]):
        y_t, cache = layer.step(x[:, t], cache)
        outs.append(y_t)
    return torch.stack(outs, 1)
