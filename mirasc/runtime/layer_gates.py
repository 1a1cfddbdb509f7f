"""The Layer's gates: one projection from the input to every gate's pre-activations, initialised from the Layer
options, and the squashing that makes each its coefficient (a runtime piece: its body is copied into every emitted
module by mirasc.codegen; docs/module-api.md, "Layer"; docs/language.md, "The layer block")."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class _GateLayout:
    """Where each gate's pre-activations sit in the projection's output. names: the gates in order (GATES);
    channels: name -> side of the channel-wise ones (GATE_CHANNELS; D values per head, where the others have one);
    head_term: each head of a channel-wise gate also gets one shared pre-activation, after its D channel terms
    (D + 1 per head); steps: η's count per token (a multi-step learner: one learning rate per inner step)."""

    def __init__(self, names, channels, heads, head_dim, head_term, steps=1):
        self.names, self.channels, self.heads, self.head_dim = tuple(names), dict(channels), heads, head_dim
        self.head_term, self.steps = bool(head_term), steps
        self.channel_width = head_dim + (1 if self.head_term else 0)
        self.widths = [heads * (self.channel_width if name in self.channels else 1) * (steps if name == "eta" else 1)
                       for name in self.names]


def _gate_projection(d_model, layout, options):
    """x -> every gate's pre-activations (nn.Sequential; None without gates): low rank through options["gate_rank"]
    (0: full rank). The last layer's weights start at a tenth of PyTorch's draw and its bias at each gate's
    `<name>_bias` option, so each gate starts near that value; with head_term the channel terms start at 0 (weights
    and bias: the gate starts as the per-head gate, and every channel learns its own offset from there); a
    channel-wise α with alpha_spread starts channel j of every head alpha_spread·j/(D − 1) above alpha_bias."""
    if not layout.names:
        return None
    total, rank = sum(layout.widths), options["gate_rank"]
    proj = nn.Sequential(nn.Linear(d_model, rank, bias=False), nn.Linear(rank, total)) if rank \
        else nn.Sequential(nn.Linear(d_model, total))
    last, width = proj[-1], layout.channel_width
    with torch.no_grad():
        last.weight.mul_(0.1)
        for name, weight, piece in zip(layout.names, last.weight.split(layout.widths),
                                       last.bias.split(layout.widths)):
            piece.fill_(options[name + "_bias"])
            if name in layout.channels and layout.head_term:
                piece.view(-1, width)[:, :-1] = 0.0
                weight.view(-1, width, weight.shape[-1])[:, :-1] = 0.0
            if name == "alpha" and name in layout.channels and options["alpha_spread"]:
                ramp = torch.linspace(0.0, options["alpha_spread"], layout.head_dim)  # the same in every head
                piece.view(-1, width)[:, :layout.head_dim].add_(ramp)
    return proj


def _gate_values(pre, layout, dtype, eta_max, alpha_act="sigmoid", alpha_min=0.0):
    """Each gate's coefficient from the projection's output `pre` [B, T, sum(widths)], in `dtype` (a decay near 1
    needs more precision than bf16's 2^-8 steps): [B, T, H], [B, T, H, D] channel-wise, and η of a multi-step
    learner [B, T, H, steps(, D)]. η = eta_max·σ, Huber's δ = softplus, α = alpha_min + (1 − alpha_min)·σ (or
    exp(−e^{−·}) in place of σ with alpha_act="exp"), the others σ."""
    B, T = pre.shape[0], pre.shape[1]
    H, D = layout.heads, layout.head_dim
    gates = {}
    for name, r in zip(layout.names, pre.split(layout.widths, dim=-1)):
        width = [layout.channel_width] if name in layout.channels else []
        if name == "eta" and layout.steps > 1:
            r = r.view(B, T, layout.steps, H, *width).movedim(2, 3)
        else:
            r = r.view(B, T, H, *width)
        r = r.to(dtype)
        if name in layout.channels and layout.head_term:
            r = r[..., :D] + r[..., D:]  # each channel's offset plus its head's shared pre-activation
        if name == "eta":
            gates[name] = torch.sigmoid(r) * eta_max
        elif name == "delta":
            gates[name] = F.softplus(r)
        elif name == "alpha":
            a = torch.exp(-torch.exp(-r)) if alpha_act == "exp" else torch.sigmoid(r)
            gates[name] = alpha_min + (1 - alpha_min) * a if alpha_min else a
        else:
            gates[name] = torch.sigmoid(r)
    return gates
