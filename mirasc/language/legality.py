"""The design combinations without a defined meaning, each rejected with its reason (docs/language.md; the exact
meaning of what is accepted is docs/semantics.md). `check_combination` runs on every parsed spec; a `Rejection` names
the field (and parameter) the front end points the error at.
"""

from __future__ import annotations

from .spec import FEATURE_WIDTH, GATE_K, GATE_OF_PARAM, GATE_V, PRECOND_ATK_PARAMS, Precond, Spec


class Rejection(Exception):
    """An illegal combination: `field` names where to point the error, `message` says why."""

    def __init__(self, field: str, message: str, param: str | None = None):
        super().__init__(message)
        self.field, self.message, self.param = field, message, param


def _check_stickbreaking(spec: Spec) -> None:
    """The stick-breaking read (docs/semantics.md): its recency is in the read itself, ordered from the newest pair
    back, so it needs causal order and takes no pair decay, hops or MemN2N/MTA options."""
    m, r = spec.memory, spec.retention
    if not m.causal:
        raise Rejection("memory", "the stick breaks from the newest stored pair back, and with causal=false the memory "
                        "has no order relative to the query; use causal=true", param="causal")
    if r.kind != "none":
        raise Rejection("retention", "stick-breaking already forgets: each newer pair takes its share of the stick "
                        "first; a decay of pairs on top of it is not defined here: write `retention = none`")
    if m.hops > 1:
        raise Rejection("memory", "multi-hop reads refine the query with a normalised read; the stick-breaking read "
                        "is not normalised: use hops=1", param="hops")
    if m.temporal:
        raise Rejection("memory", "temporal encoding adds to the softmax kernel's keys; the stick-breaking read has "
                        "its own recency: drop temporal", param="temporal")


def check_combination(spec: Spec) -> None:
    """Reject design combinations that have no defined meaning, each with its reason (the first found)."""
    if not spec.parametric or spec.learner.kind == "nonparametric":
        _check_nonparametric(spec)
        return
    for check in PARAMETRIC_CHECKS:
        check(spec)


def _check_nonparametric(spec: Spec) -> None:
    """A nonparametric memory: the Nadaraya-Watson read of the l2 bias over every stored pair, and its variants."""
    m, b, r, l, par = spec.memory, spec.bias, spec.retention, spec.learner, spec.parallel
    if m.parametric:
        raise Rejection("learner", "learner `nonparametric` needs `memory = nonparametric(...)`; "
                        "a parametric memory learns with gd, momentum or implicit")
    if l.kind != "nonparametric":
        raise Rejection("learner", f"a nonparametric memory has no weights to train with `{l.kind}`; "
                        "write `learner = nonparametric`")
    if b.kind != "l2":
        raise Rejection("bias", "the Nadaraya-Watson estimator is the nonparametric solution of the l2 bias; "
                        "write `bias = l2`")
    if not r.linear:
        raise Rejection("retention", f"`{r.kind}` acts on weights, and a nonparametric memory has none: it keeps "
                        "every pair; the retention defined on stored pairs is `decay` (each pair's weight times "
                        "α_t at every step: the Forgetting Transformer), or write `retention = none`")
    if r.kind == "decay":
        _check_pair_decay(spec)
    if m.kernel == "poly" and m.degree % 2:
        raise Rejection("memory", f"poly kernel of odd degree {m.degree} can be negative, and a Nadaraya-Watson "
                        "weight must be positive; use an even degree (2, 4, ...)", param="degree")
    if (m.score_conv is not None or m.head_mix > 1) and m.kernel != "softmax":
        raise Rejection("memory", "Multi-Token Attention convolves the softmax kernel's pre-softmax scores; "
                        "score_conv/head_mix need kernel=softmax")
    if m.score_conv is not None and m.score_conv[1] % 2 == 0:
        raise Rejection("memory", f"score_conv key width {m.score_conv[1]} must be odd (the key window is "
                        "centred on each key)", param="score_conv")
    if m.window and not m.causal:
        raise Rejection("memory", "window=N is a causal sliding window; with causal=false the memory is a "
                        "whole other sequence: drop window or set causal=true", param="window")
    if m.kernel != "stickbreaking" and (m.remainder != "none" or m.attend_current):
        raise Rejection("memory", "remainder and attend_current belong to the stick-breaking read (a "
                        "Nadaraya-Watson read's weights sum to 1 and always include the query's own pair); "
                        "use kernel=stickbreaking or drop them",
                        param="remainder" if m.remainder != "none" else "attend_current")
    if m.kernel == "stickbreaking":
        _check_stickbreaking(spec)
    if m.sink and (m.kernel != "softmax" or m.hops > 1 or m.score_conv is not None or m.head_mix > 1):
        raise Rejection("memory", "an attention sink is one more logit in the softmax kernel's denominator, with "
                        "no value; it is defined for kernel=softmax with hops=1 and no Multi-Token Attention",
                        param="sink")
    if m.temporal and m.kernel != "softmax":
        raise Rejection("memory", "temporal encoding adds T_A to the keys inside the softmax kernel's dot "
                        "product; it needs kernel=softmax", param="temporal")
    if m.hops > 1 and (m.score_conv is not None or m.head_mix > 1):
        raise Rejection("memory", "multi-hop reads with Multi-Token Attention are not defined: use hops=1 "
                        "with score_conv/head_mix", param="hops")
    if par.kind != "exact":
        raise Rejection("parallel", "a nonparametric memory has no mini-batch form; write `parallel = exact`")


def _check_implicit(spec: Spec) -> None:
    """The implicit learner: a closed-form proximal step at the running state."""
    m, b, r, l, par = spec.memory, spec.bias, spec.retention, spec.learner, spec.parallel
    if l.kind != "implicit":
        return
    if m.kind != "linear":
        raise Rejection("learner", "`implicit` needs a closed-form proximal step, which exists only for "
                        "`memory = linear`; use gd or momentum for an MLP memory")
    if not b.proximal_step:
        raise Rejection("learner", f"`implicit` has no closed-form proximal step for `bias = {b.kind}"
                        f"{'(mode=mixture)' if b.kind == 'huber' else ''}`; accepted biases: dot, l2, "
                        "huber (coordinate mode)")
    if not r.linear:
        raise Rejection("learner", f"`implicit` is defined with retention none or decay, not `{r.kind}` "
                        "(the proximal step would need the retention's own geometry)")
    if par.kind != "exact":
        raise Rejection("parallel", "`implicit` solves each token's step exactly at the running state; "
                        "it has no mini-batch form: write `parallel = exact`")


def _check_pre_decay(spec: Spec) -> None:
    r, par = spec.retention, spec.parallel
    if r.decays_first and par.kind == "minibatch":
        raise Rejection("retention", "`order=pre` decays the state before taking the gradient there, but under "
                        "`minibatch(C)` the gradient is taken at the chunk's anchor state; use `order=post`",
                        param="order")


def _check_chunk_readout(spec: Spec) -> None:
    r, par = spec.retention, spec.parallel
    if par.chunk_readout and r.kind not in ("lq", "kl"):
        why = ("its weights are already linear in the updates" if r.linear
               else "no chunk form is defined for it")
        raise Rejection("parallel", f"`readout=chunk` applies a retention's nonlinear map (lq's q-norm, kl's softmax) "
                        f"at chunk boundaries only; `retention = {r.kind}` has no such map to defer ({why}): "
                        "use `readout=token` (the default), or retention lq or kl", param="readout")


def _check_pair_decay(spec: Spec) -> None:
    """`decay` on a nonparametric memory (docs/semantics.md, "Decaying pairs"): the weight of the pair stored at s
    is Π_{s<l≤t} α_l when query t reads it. What has no defined meaning with it, and why."""
    m, r = spec.memory, spec.retention
    if r.alpha in (GATE_K, GATE_V):
        raise Rejection("retention", f"`alpha={r.alpha}` decays key or value channels of a weight matrix; a stored "
                        "pair has one weight per head (its kernel value), so its decay is one number per head and "
                        "token: write `alpha=gate`", param="alpha")
    if not m.causal:
        raise Rejection("retention", "a decay ages each pair by the tokens stored after it; with causal=false the "
                        "memory is another sequence that no query step passes: drop the decay or set causal=true")
    if m.score_conv is not None or m.head_mix > 1:
        raise Rejection("retention", "Multi-Token Attention convolves and mixes pre-softmax scores across queries, "
                        "keys and heads; whether the decay enters before or after that is defined by neither model: "
                        "use score_conv/head_mix without a decay, or a decay without them")
    if m.hops > 1 or m.temporal:
        raise Rejection("retention", "MemN2N hops and temporal encoding are not implemented with a decaying memory "
                        "(no reference model combines them): use hops=1 and temporal=0 with a decay")


def _check_channel_gates(spec: Spec) -> None:
    """The channel-wise coefficients whose meaning is defined (docs/semantics.md: channel-wise gates), and why the
    others are not."""
    m, b, r, l = spec.memory, spec.bias, spec.retention, spec.learner
    for form, field in ((b, "bias"), (r, "retention"), (l, "learner")):
        for param, value in form:
            if param not in GATE_OF_PARAM or value not in (GATE_K, GATE_V):
                continue
            side = value[5]
            if m.kind == "mlp" and param in ("alpha", "theta"):
                raise Rejection(field, f"`{param}={value}` scales the columns or rows of a linear memory's W; an MLP "
                                "memory's weights have no key/value channels to scale (the hidden width differs): "
                                f"use `{param}=gate` (one value per head) or a linear memory", param=param)
            if param == "lr" and m.kind == "mlp" and side == "k":
                raise Rejection(field, "`lr=gate(k)` scales the key channels of a linear memory's update; an MLP "
                                "memory has no such columns after its first layer: use `lr=gate(v)` (the loss "
                                "weighted per output channel) or `lr=gate`", param=param)
            if param == "lr" and l.kind == "implicit":
                raise Rejection(field, "`implicit` with a channel-wise learning rate has no closed-form proximal "
                                "step (the step couples channels through ‖k‖²): use `lr=gate` or learner gd",
                                param=param)
            if param == "delta" and side == "k":
                raise Rejection(field, "a Huber threshold applies to the residual e = M(k) - v, which lives on the "
                                "value channels: write `delta=gate(v)`", param=param)
            if param == "delta" and b.mode == "mixture":
                raise Rejection(field, "huber mode=mixture compares the whole residual norm ‖e‖ with one threshold; "
                                "a vector threshold has no meaning there: use `delta=gate` or mode=coordinate",
                                param=param)


def _check_generalized_delta(spec: Spec) -> None:
    """l2(read=kappa) / l2(erase=kappa): the generalized delta transition W_t = W_{t-1}(diag(w_t) − a_t b_tᵀ) +
    v_t k_tᵀ is defined for a linear memory, gd, retention none or decay, parallel exact, with the learning rate and
    the decay per head or over key channels (docs/semantics.md, "Erase and write keys apart")."""
    b = spec.bias
    if b.kind != "l2" or (b.read == "key" and b.erase == "key"):
        return
    m, r, l, par = spec.memory, spec.retention, spec.learner, spec.parallel
    param = "erase" if b.erase == "kappa" else "read"
    if b.read == "kappa" and b.erase == "kappa":
        raise Rejection("bias", "`erase=kappa` already reads the memory at κ (it erases M(κ) along κ and writes v "
                        "along k); write `l2(erase=kappa)` for that, or `l2(read=kappa)` to read the error at κ and "
                        "step along k", param="read")
    if m.kind != "linear":
        raise Rejection("bias", f"`{param}=kappa` splits a linear memory's update into an erase along one key and a "
                        "write along another (W ← W(diag(w) − a bᵀ) + v kᵀ); an MLP memory's weights have no key "
                        "channels past the first layer: use a linear memory or `bias = l2`", param=param)
    if l.kind != "gd":
        raise Rejection("learner", f"`l2({param}=kappa)` is defined with `gd` (the step is the transition itself); "
                        f"`{l.kind}` with separate erase and write keys is not defined here: use `learner = gd`")
    if not r.linear:
        raise Rejection("retention", f"`l2({param}=kappa)` is the transition W(diag(w) − a bᵀ) + v kᵀ, whose "
                        f"diagonal part is a decay; `retention = {r.kind}` has a nonlinear readout that takes the "
                        "state out of that form: use none or decay")
    if par.kind != "exact":
        raise Rejection("parallel", f"`l2({param}=kappa)` reads the state the previous token left (its erase term "
                        "is W_{t-1}·a); its mini-batch form is not defined here: write `parallel = exact`")
    for form, field, name in ((l, "learner", "lr"), (r, "retention", "alpha")):
        if getattr(form, name, None) == GATE_V:
            raise Rejection(field, f"`{name}=gate(v)` acts on value channels, but the generalized delta transition "
                            "W(diag(w) − a bᵀ) + v kᵀ acts on the key side (columns of W): use `gate(k)` or `gate`",
                            param=name)


def _check_steps(spec: Spec) -> None:
    """A multi-step learner (`steps=n`, n > 1): each token's n sub-steps are token steps of §3 run one after
    another, the retention's gates at the first sub-step only (docs/semantics.md, "Multi-step learners"). What
    has no defined meaning with it, and why."""
    l, par = spec.learner, spec.parallel
    if spec.steps == 1:
        return
    if l.kind == "momentum":
        raise Rejection("learner", "`momentum(steps=n)` is not defined: with θ applied once per token the buffer "
                        "would enter W at each of the n sub-steps (θ·S_{t-1} added n times), and a θ per sub-step "
                        "is no published model either; use `gd(steps=n)` or `implicit(steps=n)`", param="steps")
    if par.kind == "minibatch":
        raise Rejection("learner", "`steps=n` takes n gradient steps one after another, each at the state the "
                        "previous one left; under `minibatch(C)` every gradient is taken at the chunk's anchor, so "
                        "the n steps would collapse into one step on their summed loss: write `parallel = exact`",
                        param="steps")
    if l.kind == "muon":
        raise Rejection("learner", "`muon(steps=n)` is not defined: muon keeps a momentum buffer, which would enter "
                        "W at each of the n sub-steps as momentum's would; use `gd(steps=n)` or `implicit(steps=n)`",
                        param="steps")
    if spec.window > 1:
        raise Rejection("bias", "an Omega window (`window=c`) with `steps=n` is not defined: the window would have to "
                        "count either tokens (n pairs each, γ per token) or sub-steps, and neither is implemented; "
                        "use `window=1`, or `steps=1`", param="window")
    if spec.composite:
        maps = ([f"`feature={spec.feature}`"] if spec.feature != "identity" else []) \
            + (["`normalize=true`"] if spec.normalized else [])
        raise Rejection("learner", f"`steps=n` with {' and '.join(maps)} is not supported: the op would have to map "
                        "each of a token's n keys (and keep the normaliser between sub-steps), which no kernel here "
                        "does; use `steps=1`, or `feature=poly` (part of the memory, which runs the sub-steps)",
                        param="steps")


def _check_composite(spec: Spec) -> None:
    """linear(feature=..., normalize=true): what has no defined meaning with a feature map or the normaliser, and
    why (docs/semantics.md, "Feature maps and the normaliser")."""
    if not spec.composite:
        return
    m, b, r, l = spec.memory, spec.bias, spec.retention, spec.learner
    sides = {side for side in spec.gate_channels().values() if side}
    if spec.generalized_delta:
        raise Rejection("memory", "a feature map or normaliser with `l2(read/erase=kappa)` would need the map on κ as "
                        "well, which is not defined here: use `linear` without them, or `bias = l2`", param="feature")
    if "k" in sides and m.feature in ("taylor", "hedgehog"):
        raise Rejection("memory", f"`feature={m.feature}` maps a key of width Dk to {FEATURE_WIDTH[m.feature]} "
                        "features, and a `gate(k)` coefficient has one value per key channel, not per feature: use "
                        "`gate` (one value per head), or feature elu1 (Dφ = Dk)", param="feature")
    if not m.normalize:
        if m.eps != type(m).model_fields["eps"].default:
            raise Rejection("memory", "`eps` is the normaliser's (o = W φ(q) / (z·φ(q) + eps)); without "
                            "`normalize=true` it has no effect: drop it or set normalize=true", param="eps")
        return
    why = ("the normaliser z_t is the memory's update applied to the constant value 1 (z_t = Σ φ(k_s) for linear "
           "attention), defined for the Hebbian write")
    if b.kind != "dot":
        raise Rejection("memory", f"`normalize=true` with `bias = {b.kind}`: {why} (`bias = dot`), not for a loss that "
                        "reads the memory; drop normalize, or use bias dot", param="normalize")
    if not r.linear:
        raise Rejection("memory", f"`normalize=true` with `retention = {r.kind}`: {why} and a linear retention "
                        "(none or decay); this one mixes the normaliser with the values", param="normalize")
    if l.kind != "gd":
        raise Rejection("memory", f"`normalize=true` with `learner = {l.kind}`: {why} by gd; use `learner = gd`",
                        param="normalize")
    if spec.window > 1:
        raise Rejection("memory", "`normalize=true` with an Omega window (`window=c`) is not supported: the normaliser "
                        "would have to carry the window's past φ(k) and γ as well, which its state (W, z) does not; "
                        "drop normalize, or the window", param="normalize")
    if "v" in sides:
        raise Rejection("memory", "`normalize=true` with a `gate(v)` coefficient: the normaliser has no value "
                        "channel for it to scale; use `gate` or `gate(k)`", param="normalize")


def _check_omega(spec: Spec) -> None:
    """The Omega rule (docs/semantics.md, "The Omega rule"): ℓ_t(W) = Σ_{i=t−c+1..t} γ_i ℓ(W; k_i, v_i), and what has no
    defined meaning with it."""
    b, l, par = spec.bias, spec.learner, spec.parallel
    c, gamma = spec.window, getattr(b, "gamma", 1.0)
    if c == 1:
        if gamma != 1.0:
            raise Rejection("bias", "`gamma` weighs the tokens of an Omega window; with window=1 (the online bias) it "
                            "would only rescale the learning rate: give a window, e.g. `window=4`, or drop gamma",
                            param="gamma")
        return
    if gamma in (GATE_K, GATE_V):
        raise Rejection("bias", f"`gamma={gamma}`: the Omega rule weighs each token's whole loss by one number "
                        "γ_i per head: write `gamma=gate` or a constant", param="gamma")
    if spec.generalized_delta:
        raise Rejection("bias", "the Omega window sums the bias over past tokens at the current state; with separate "
                        "erase/regression keys (read/erase=kappa) that sum is not the generalized delta transition "
                        "any more: use `l2` with a window, or read/erase=kappa without one", param="window")
    if l.kind == "implicit":
        raise Rejection("learner", "`implicit` solves a one-token proximal step in closed form; the Omega window's "
                        f"sum over {c} tokens has none: use gd, momentum or muon")
    if getattr(l, "lr", None) in (GATE_K, GATE_V):
        raise Rejection("learner", f"`lr={l.lr}` is folded into each token's loss, so over an Omega window it would "
                        "weigh token i's loss by η_i rather than step t's η_t: use `lr=gate` (the window's per-token "
                        "weights are `gamma`)", param="lr")
    if par.chunk_readout:
        raise Rejection("parallel", "readout=chunk (lq/kl chunk readouts) is not defined with an Omega window: use "
                        "readout=token", param="readout")


def _check_features(spec: Spec) -> None:
    """Polynomial features of the memory's input (docs/semantics.md, "Features")."""
    if not spec.poly_degree:
        if spec.memory.kind in ("linear", "mlp") and spec.memory.degree != 2:
            raise Rejection("memory", "`degree` is the degree p of `feature=poly` (φ_p); the other feature maps have "
                            "none: drop it, or write `feature=poly`", param="degree")
        return
    if spec.normalized:
        raise Rejection("memory", "`normalize=true` with `feature=poly`: the normaliser is kept for the maps the op "
                        "applies around the memory (elu1, taylor, hedgehog), while φ_p is part of the memory itself; "
                        "for normalised second-order features write `feature=taylor` (the same kernel as poly "
                        "degree 2)", param="normalize")
    if spec.generalized_delta:
        raise Rejection("memory", "`feature=poly` maps the key and query; the regression/erase key κ of "
                        "read/erase=kappa would need the same map, which is not defined here: drop one of them",
                        param="feature")
    for g, side in spec.gate_channels().items():
        if side == "k":
            name = {v: k for k, v in GATE_OF_PARAM.items()}[g]
            field = "learner" if g == "eta" else "retention" if g == "alpha" else "learner"
            raise Rejection(field, f"`{name}=gate(k)` acts on the memory's key channels, but with `feature=poly` the "
                            "first layer reads φ_p(k), whose columns are the features, not the key channels: use "
                            f"`{name}=gate` or `gate(v)`", param=name)


def _check_muon(spec: Spec) -> None:
    """Muon (docs/semantics.md, "Muon"): S_t = θ_t S_{t−1} + ∇ℓ_t, U_t = −η_t NS_k(S_t) per weight matrix."""
    l, par = spec.learner, spec.parallel
    if l.kind != "muon":
        return
    if l.lr in (GATE_K, GATE_V):
        raise Rejection("learner", f"`lr={l.lr}` would weigh the loss per channel before the momentum is "
                        "orthogonalised, and Newton–Schulz mixes the channels again; muon's η_t scales the "
                        "orthogonalised step: write `lr=gate`", param="lr")
    if par.chunk_readout:
        raise Rejection("parallel", "readout=chunk (lq/kl) is not defined with muon: use readout=token",
                        param="readout")


def _check_precond(spec: Spec) -> None:
    """The preconditioned learner (docs/semantics.md, "Preconditioned learner"): its statistic is over the key-side
    factor of a linear memory's gradient e kᵀ, which does not read the memory; what has no defined meaning, and why."""
    m, l, par = spec.memory, spec.learner, spec.parallel
    if l.kind != "precond":
        return
    if l.transform == "rms":
        for p in PRECOND_ATK_PARAMS:
            if getattr(l, p) != Precond.model_fields[p].default:
                raise Rejection("learner", f"`{p}` shapes the atk transform m(a) = base^(−r/(1+|r|)), r = log(a + eps) "
                                "− center; with transform=rms, m(a) = (a + eps)^(−1/2), it has no effect: drop it or "
                                "write `transform=atk`", param=p)
    if m.kind != "linear":
        raise Rejection("learner", "`precond` keeps a second-moment statistic per key channel of the gradient's "
                        "key-side factor; an MLP memory's gradient factors past the first layer are hidden "
                        "activations that depend on W, so the statistic would read the memory and the step would "
                        "not stay a per-channel learning rate: use a linear memory, or gd/momentum")
    if spec.composite or spec.poly_degree:
        normalize = " and `normalize=true`" if m.normalize else ""
        raise Rejection("learner", f"`precond` with `feature={m.feature}`{normalize} is not defined here: the "
                        "statistic is over the memory's key channels, and a feature map "
                        "makes the gradient's key-side factor φ(k) (of another width for taylor, hedgehog, poly); use "
                        "`linear` without a feature map")
    # (l2(read/erase=kappa) is refused before: _check_generalized_delta takes gd only)
    if spec.window > 1:
        raise Rejection("bias", "an Omega window with `precond`: the preconditioned rate is a key-channel learning "
                        "rate, and over a window it would weigh token i's loss by step t's multiplier; use window=1",
                        param="window")
    if par.chunk_readout:
        raise Rejection("parallel", "readout=chunk (lq/kl) is not defined with `precond`: use readout=token",
                        param="readout")
    if l.lr == GATE_V:
        raise Rejection("learner", "`precond(lr=gate(v))`: the preconditioner scales the key channels of the step "
                        "(U = −g·diag(η ⊙ m)); a value-channel rate on top would scale both sides of W, which the "
                        "op's single channel-wise rate does not carry: use `lr=gate` or `lr=gate(k)`", param="lr")
    for p in ("nu", "rho"):
        if getattr(l, p) in (GATE_K, GATE_V):
            raise Rejection("learner", f"`{p}={getattr(l, p)}`: the statistic's {'decay' if p == 'nu' else 'rate'} is "
                            "one number per head and token here (as FLA's g_atk, β_atk); write `" + p + "=gate` or a "
                            "constant", param=p)


PARAMETRIC_CHECKS = (_check_implicit, _check_pre_decay, _check_chunk_readout, _check_channel_gates,
                     _check_generalized_delta, _check_steps, _check_composite, _check_omega, _check_features,
                     _check_muon, _check_precond)
