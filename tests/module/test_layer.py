"""The emitted Layer (docs/module-api.md): step-by-step decoding equals the full forward for every spec
(including minibatch(C), where the cache keeps the chunk's anchor state), gradients reach every
trainable parameter, and the spec's `layer { ... }` block sets the defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference import decode

import mirasc

SPECS = sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.miras"))


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_step_equals_forward(path):
    torch.manual_seed(0)
    mod = mirasc.compile_spec(path)
    layer = mod.Layer(24, 2).double()
    x = torch.randn(2, 19, 24, dtype=torch.float64)  # 19 tokens: crosses minibatch(16) boundaries
    y = layer(x)
    if getattr(mod, "CAUSAL", True):
        err = ((decode(layer, x) - y).norm() / y.norm()).item()
        assert err < 1e-12, err
    else:  # cross-attention memories read a whole sequence: no decoding, but still trainable
        with pytest.raises(RuntimeError, match="no token-by-token decoding"):
            layer.step(x[:, 0], layer.init_cache(2))
    y.square().sum().backward()
    for name, p in layer.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"


def test_layer_block_sets_defaults():
    spec = """model m {
        memory = linear
        bias = l2
        layer { conv = 0; gate_rank = 0; out_gate = false; head_dim = 6 }
    }"""
    mod = mirasc.compile_spec(spec)
    assert mod.LAYER_DEFAULTS["conv"] == 0 and mod.LAYER_DEFAULTS["head_dim"] == 6
    layer = mod.Layer(16, 2)
    assert layer.head_dim == 6 and not hasattr(layer, "conv_weight") and layer.out_gate is None
    assert len(layer.gate_proj) == 1  # full-rank gate projection
    assert layer(torch.randn(1, 5, 16)).shape == (1, 5, 16)
    with pytest.raises(TypeError, match="unknown Layer option"):
        mod.Layer(16, 2, convv=3)


def test_alpha_bias_sets_the_initial_decay():
    """layer { alpha_bias = 7 } (or Layer(..., alpha_bias=7)) starts the α gate at σ(7) ≈ 0.999; default σ(3)
    (with the MLP memory's floor alpha_min turned off)."""
    path = Path(__file__).resolve().parents[2] / "specs" / "titans.miras"
    text = path.read_text().replace("minibatch(64)", "minibatch(64)\n    layer { alpha_bias = 7 }")
    x = torch.randn(2, 9, 16)
    for mod, kw, want in ((mirasc.compile_spec(text), {}, 7.0), (mirasc.compile_spec(path), {}, 3.0),
                          (mirasc.compile_spec(path), {"alpha_bias": 7.0}, 7.0)):
        torch.manual_seed(0)
        layer = mod.Layer(16, 2, alpha_min=0.0, **kw)
        alpha = layer._project(x)[3]["alpha"]
        assert abs(alpha.mean().item() - torch.sigmoid(torch.tensor(want)).item()) < 0.02, (kw, want)
    assert mirasc.compile_spec(text).LAYER_DEFAULTS["alpha_bias"] == 7.0


def test_alpha_spread_gives_each_key_channel_its_timescale():
    """layer { alpha_spread = 4 } (specs/kda.miras) on a channel-wise α starts channel j of every head at
    σ(3 + 4·j/(D−1)): from 0.95 up to 0.999; a per-head α ignores the option."""
    root = Path(__file__).resolve().parents[2] / "specs"
    spread = "parallel  = exact\n    layer { alpha_spread = 4 }"
    mod = mirasc.compile_spec(root / "kda.miras")
    assert mod.LAYER_DEFAULTS["alpha_spread"] == 4.0
    torch.manual_seed(0)
    layer = mod.Layer(16, 2)
    layer.gate_proj[-1].weight.data.zero_()  # the bias alone: the initial pre-activation
    alpha = layer._project(torch.randn(1, 3, 16))[3]["alpha"]  # [B, T, H, D]
    want = torch.sigmoid(3.0 + torch.linspace(0, 4, 8))
    assert torch.allclose(alpha[0, 0, 0], want, atol=1e-6) and torch.allclose(alpha[0, 0, 1], want, atol=1e-6)
    gdn = mirasc.compile_spec((root / "gated_deltanet.miras").read_text().replace("parallel  = exact", spread))
    torch.manual_seed(0)
    layer = gdn.Layer(16, 2)
    layer.gate_proj[-1].weight.data.zero_()
    alpha = layer._project(torch.randn(1, 3, 16))[3]["alpha"]
    assert torch.allclose(alpha, torch.sigmoid(torch.tensor(3.0)).expand_as(alpha))


def test_key_shift_starts_each_key_reaching_one_token_back():
    """key_shift = s adds s to the convolution's tap one token back on the key channels only (every step's keys for
    a multi-step learner), after the same random draw: the layer equals the unshifted one but for those taps, so at
    initialisation a key is the conv of its own token plus s times the previous token's projection."""
    root = Path(__file__).resolve().parents[2] / "specs"
    for name, steps in (("gated_deltanet", 1), ("titans", 1), ("gated_deltaproduct", 2)):
        mod = mirasc.compile_spec(root / f"{name}.miras")
        torch.manual_seed(0)
        plain = mod.Layer(16, 2, key_shift=0.0)
        torch.manual_seed(0)
        shifted = mod.Layer(16, 2, key_shift=0.5)
        n = 2 * shifted.head_dim
        want = torch.zeros_like(plain.conv_weight)
        want[n:(1 + steps) * n, -2] = 0.5
        assert torch.allclose(shifted.conv_weight - plain.conv_weight, want, atol=1e-7), name
        for (pn, p), (sn, s) in zip(plain.named_parameters(), shifted.named_parameters()):
            assert pn == sn and (pn == "conv_weight" or torch.equal(p, s)), pn
    # the read: with the taps set by hand, the key of token t is SiLU(k_t + 0.5·k_{t-1}) before its norm
    layer = mirasc.compile_spec(root / "gated_deltanet.miras").Layer(16, 2, key_shift=0.5, qk_norm="none")
    with torch.no_grad():
        layer.conv_weight.zero_()
        layer.conv_weight[:, -1] = 1.0
        layer.conv_weight[16:32, -2] = 0.5
    x = torch.randn(1, 5, 16)
    k = layer._project(x)[1].reshape(1, 5, 16)
    raw = layer.qkv_proj(x)[..., 16:32]
    assert torch.allclose(k, torch.nn.functional.silu(raw + 0.5 * torch.cat([raw[:, :1] * 0, raw[:, :-1]], 1)),
                          atol=1e-6)
    assert mirasc.compile_spec(root / "gated_deltanet.miras").LAYER_DEFAULTS["key_shift"] == 0.0
    for conv in (0, 1):  # no tap one token back: nothing to shift (key_shift = 0), and the layer runs
        assert mirasc.compile_spec(root / "gated_deltanet.miras").Layer(16, 2, conv=conv)(x).shape == x.shape


def test_gate_head_term_starts_channel_gates_as_the_per_head_gate():
    """gate_head_term = true: a channel-wise gate's pre-activation is its head's shared term plus a per-channel
    term that starts at zero, so at initialisation every channel of a head has the per-head gate's value; the
    channel terms still get gradients (they learn from there), alpha_spread still spreads α per channel, and
    step() equals forward()."""
    root = Path(__file__).resolve().parents[2] / "specs"
    yaad, kda = mirasc.compile_spec(root / "yaad.miras"), mirasc.compile_spec(root / "kda.miras")
    x = torch.randn(2, 5, 16)
    torch.manual_seed(0)
    layer = yaad.Layer(16, 2, gate_head_term=True)
    eta = layer._project(x)[3]["eta"]  # [B, T, H, D], lr=gate(v)
    assert eta.shape == (2, 5, 2, 8)
    assert torch.equal(eta, eta[..., :1].expand_as(eta))
    assert eta.std() > 0  # the head term reads x: η still varies over tokens and heads
    layer(x).square().sum().backward()
    last = layer.gate_proj[-1]
    channel_rows = last.weight.grad[:2 * 9].view(2, 9, -1)[:, :-1]  # eta's rows: 8 channel terms + 1 head term per head
    assert channel_rows.abs().sum() > 0
    assert torch.all(last.weight[:2 * 9].view(2, 9, -1)[:, :-1] == 0)
    torch.manual_seed(0)
    layer = kda.Layer(16, 2, gate_head_term=True)  # kda: alpha_spread = 4
    layer.gate_proj[-1].weight.data.zero_()
    alpha = layer._project(torch.randn(1, 3, 16))[3]["alpha"]
    want = torch.sigmoid(3.0 + torch.linspace(0, 4, 8))
    assert torch.allclose(alpha[0, 0, 0], want, atol=1e-6) and torch.allclose(alpha[0, 0, 1], want, atol=1e-6)
    torch.manual_seed(0)
    layer = yaad.Layer(16, 2, gate_head_term=True).double()
    layer.gate_proj[-1].weight.data.normal_()  # channel terms away from zero: decoding must still agree
    xd = x.double()
    assert (decode(layer, xd) - layer(xd)).norm() / layer(xd).norm() < 1e-10


def test_mlp_memories_get_their_family_defaults():
    """MLP memories start with the retention gate floored at alpha_min = 0.999, the Huber threshold at
    softplus(12), RMS-normalised v, their gate projections at a tenth of the outer learning rate and each key's
    convolution tap one token back at 0.5 (docs/training.md); linear memories keep α = σ(·), δ = softplus(0.5), v as
    projected, the full rate and no shift; a spec's layer block and Layer(...) win."""
    root = Path(__file__).resolve().parents[2] / "specs"
    x = torch.randn(2, 9, 16)
    for name, floor in (("titans", 0.999), ("yaad", 0.999), ("gated_deltanet", 0.0), ("mamba2", 0.0)):
        mod = mirasc.compile_spec(root / f"{name}.miras")
        assert mod.LAYER_DEFAULTS["alpha_min"] == floor, name
        assert mod.LAYER_DEFAULTS["alpha_bias"] == 3.0, name
        assert mod.LAYER_DEFAULTS["delta_bias"] == (12.0 if floor else 0.5), name
        assert mod.LAYER_DEFAULTS["gate_head_term"] == bool(floor), name
        assert mod.LAYER_DEFAULTS["gate_lr"] == (0.1 if floor else 1.0), name
        assert mod.LAYER_DEFAULTS["v_norm"] == ("rms" if floor else "none"), name
        assert mod.LAYER_DEFAULTS["key_shift"] == (0.5 if floor else 0.0), name
        torch.manual_seed(0)
        layer = mod.Layer(16, 2)
        assert layer.gate_lr == mod.LAYER_DEFAULTS["gate_lr"], name
        _, _, v, gates, _ = layer._project(x)
        alpha = gates["alpha"]
        rms = v.pow(2).mean(-1).sqrt()       # per token and head: 1 under v_norm = rms, the projection's own else
        assert (torch.allclose(rms, torch.ones_like(rms), atol=1e-4)) == bool(floor), (name, rms.mean().item())
        assert alpha.min().item() >= floor, name
        want = floor + (1 - floor) * torch.sigmoid(torch.tensor(3.0)).item()
        assert abs(alpha.mean().item() - want) < 0.02 * (1 - floor), (name, alpha.mean().item(), want)
    no_layernorm = mirasc.compile_spec(root / "huber_kl_momentum.miras").LAYER_DEFAULTS
    assert (no_layernorm["v_norm"], no_layernorm["gate_lr"]) == ("none", 0.1)   # no LayerNorm'd read to match
    titans = (root / "titans.miras").read_text()
    own = mirasc.compile_spec(titans.replace("minibatch(64)", "minibatch(64)\n    layer { alpha_min = 0.5 }"))
    assert own.LAYER_DEFAULTS["alpha_min"] == 0.5
    # the canonical text keeps the options the block sets (and only those), so it compiles to the same Layer
    # a convolution without a tap one token back drops the default shift (and the Layer still builds); asked for
    # with one, the shift is refused
    no_tap = mirasc.compile_spec(titans.replace("minibatch(64)", "minibatch(64)\n    layer { conv = 1 }"))
    assert no_tap.LAYER_DEFAULTS["key_shift"] == 0.0 and no_tap.Layer(16, 2)(x).shape == x.shape
    titans_mod = mirasc.compile_spec(root / "titans.miras")
    assert titans_mod.Layer(16, 2, conv=1)(x).shape == x.shape
    with pytest.raises(ValueError, match="'key_shift' = 0.5 adds to the convolution's tap one token back"):
        titans_mod.Layer(16, 2, conv=1, key_shift=0.5)
    for opts, floor in (("conv = 2", 0.999), ("alpha_min = 0", 0.0)):
        text = titans.replace("minibatch(64)", f"minibatch(64)\n    layer {{ {opts} }}")
        block = mirasc.compile_spec(text)
        assert block.LAYER_DEFAULTS["alpha_min"] == floor, opts
        assert mirasc.compile_spec(block.SPEC).LAYER_DEFAULTS == block.LAYER_DEFAULTS, opts
        assert mirasc.parse_text(block.SPEC) == mirasc.parse_text(text), opts
    torch.manual_seed(0)
    alpha = mirasc.compile_spec(root / "titans.miras").Layer(16, 2, alpha_min=0.0)._project(x)[3]["alpha"]
    assert abs(alpha.mean().item() - torch.sigmoid(torch.tensor(3.0)).item()) < 0.02


def test_layer_float32_chunked_matches_recurrent():
    mod = mirasc.compile_spec(Path(__file__).resolve().parents[2] / "specs" / "titans.miras")
    torch.manual_seed(1)
    fast = mod.Layer(32, 2)
    slow = mod.Layer(32, 2, algorithm="recurrent")
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 70, 32)
    a, b = fast(x), slow(x)
    assert ((a - b).norm() / b.norm()).item() < 1e-5


@pytest.mark.parametrize("retention", ["kl(c=2, alpha=gate)", "bregman(phi=w*log(w))"])
def test_positive_initial_weights_are_learned_through_their_logits(retention):
    """Retentions that need W > 0 (kl's simplex rows, a potential defined on w > 0) still learn the memory's initial
    weights: the Layer keeps their logits, starts exactly at init_state's weights, and every update keeps W > 0
    (and kl's rows at sum c)."""
    mod = mirasc.compile_spec(f"""model m {{
        memory = mlp(depth=2, expansion=2, act=gelu, residual=true, norm=layernorm)
        bias = l2
        retention = {retention}
        learner = gd(lr=gate)
    }}""")
    torch.manual_seed(0)
    layer = mod.Layer(16, 2).double()
    start = mod.init_state(1, 2, 8, 8, dtype=torch.float64)
    for name, w in layer._state(1, torch.float64).items():
        assert ((w - start[name]).norm() / start[name].norm()).item() < 1e-6, name
    assert all(p.requires_grad for p in layer.initial.values())
    opt = torch.optim.SGD(layer.initial.parameters(), lr=10.0)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    layer(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.initial.values())
    opt.step()
    for name, w in layer._state(1, torch.float64).items():
        assert (w > 0).all(), name
        assert ((w - start[name]).norm() / start[name].norm()).item() > 1e-3, name  # it moved
        if retention.startswith("kl"):
            assert torch.allclose(w.sum(-1), torch.full_like(w.sum(-1), 2.0)), name


@pytest.mark.parametrize("name,algorithm", [("gated_deltanet", "auto"), ("titans", "recurrent"),
                                            ("transformer", "auto"), ("hedgehog", "auto")])
def test_layer_launch_plan_is_the_modules_at_its_sizes(name, algorithm):
    """Layer.launch_plan is the module's launch_plan at the layer's head size and algorithm, for inputs in the
    parameters' dtype (a bf16 layer's memory gets 16-bit q, k, v) unless another is given."""
    pytest.importorskip("triton")
    mod = mirasc.compile_spec(Path(__file__).resolve().parents[2] / "specs" / f"{name}.miras")
    layer = mod.Layer(96, 2, algorithm=algorithm, head_dim=32)
    assert layer.launch_plan() == mod.launch_plan(32, 32, algorithm=algorithm)
    layer = layer.to(torch.bfloat16)
    plan = layer.launch_plan(device="sm_80")
    assert plan == mod.launch_plan(32, 32, dtype=torch.bfloat16, device="sm_80", algorithm=algorithm)
    assert layer.launch_plan(dtype=torch.float32) == mod.launch_plan(32, 32, algorithm=algorithm)
    assert (plan["backend"] == "triton") == (algorithm == "auto") and plan["precision"] in (None, "bf16", "bf16x2")
