"""Instrumented MQAR training of one design and seed: what separates a seed that learns from one that does not.

    python benchmarks/mlp_probe.py specs/titans.miras --seed 5 --lr 1e-2 --out probe_titans_s5.json [--layer k=v ...]

Trains exactly as `mirasc explore --task mqar` does at the RESULTS setting (d_model 64, 2 blocks, 2 heads, train
length 64 with 8 kv pairs, batch 32, AdamW, the same batches and initialisation for a seed) and records, every
`--every` steps and per block:
- the outer gradient norm per parameter group before clipping (projections, gates, memory's initial weights, ...);
- the scale of what the memory is asked to store and what it returns: RMS of v, of the memory's read o, and
  o's part that is the query itself (residual memories read q + LN(...));
- the gates' means and their spread (η, α, θ, δ), and the fraction of η channels within 1% of a saturated
  sigmoid;
- the inner loss at the keys with the memory's initial weights, 1/2‖M_0(k) − v‖² per token, beside 1/2‖v‖²
  (how much of the error is v and how much the memory's own read);
- the short convolution's reach into the past per stream (q, k, v): ‖taps before the current token‖ / ‖all taps‖
  over that stream's channels (it starts near 0, the current token's tap at 1; MQAR's recall needs the key written
  at a value's position to carry the token before it).
`--key-shift a` sets the Layer option `key_shift = a` (a on the key stream's convolution tap one token back at
initialisation: a previous-token key, the recall circuit's first half; the MLP memories' default is 0.5, and
`--key-shift 0` turns it off); `--perturb ε` multiplies every initial weight by (1 + ε·N(0, 1)) (how far a run's
course moves with its rounding). At the end (or at `--stop-after` steps, the schedule still that of `--steps`):
accuracy at 64/128/256 as `explore` evaluates it, and one JSON file with the log. Layer options are given as in
`mirasc explore --layer` (`--layer v_norm=none gate_lr=1 key_shift=0` restores the earlier defaults).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mirasc  # noqa: E402
from mirasc.lab import explore, tasks, trainloop  # noqa: E402
from mirasc.runtime import lm  # noqa: E402

GROUPS = ("qkv_proj", "gate_proj", "initial", "out_gate", "o_proj", "conv_weight", "norm_weight", "embed", "mlp",
          "other")


def group_of(name: str) -> str:
    for g in GROUPS[:-1]:
        if f".{g}" in name or name.startswith(g) or (g == "mlp" and ".mlp." in name):
            return g
    return "other"


def _stats(x: torch.Tensor) -> float:
    return float(x.detach().float().pow(2).mean().sqrt())


class Recorder:
    """Wraps every Layer's `_project` and `_out` to keep the last forward's q, k, v, gates and read."""

    def __init__(self, model):
        self.layers = [b.mixer for b in model.blocks]
        self.seen: list[dict] = [{} for _ in self.layers]
        for i, layer in enumerate(self.layers):
            self._wrap(i, layer)

    def _wrap(self, i, layer):
        project, out = layer._project, layer._out
        seen = self.seen[i]

        def _project(x, history=None, dtype=None):
            q, k, v, gates, hist = project(x, history, dtype)
            seen.update(q=q.detach(), k=k.detach(), v=v.detach(), gates={n: g.detach() for n, g in gates.items()})
            return q, k, v, gates, hist

        def _out(x, o):
            seen["o"] = o.detach()
            if layer.out_gate is not None:
                seen["out_gate"] = torch.sigmoid(layer.out_gate(x)).detach()
            return out(x, o)

        layer._project, layer._out = _project, _out


def conv_streams(layer):
    """The short convolution's weight [3n, taps] and n, where it convolves q, k, v of n channels each; else None
    (no convolution, or multi-step keys and values)."""
    w = getattr(layer, "conv_weight", None)
    n = layer.num_heads * layer.head_dim
    return (w, n) if w is not None and w.shape[0] == 3 * n and w.shape[1] > 1 else None


def conv_reach(layer) -> list[float]:
    """Per stream q, k, v: the norm of the convolution's taps before the current token over the norm of all its taps."""
    streams = conv_streams(layer)
    if streams is None:
        return []
    w, n = streams[0].detach().float(), streams[1]
    return [float(w[i * n:(i + 1) * n, :-1].norm() / w[i * n:(i + 1) * n].norm().clamp_min(1e-12)) for i in range(3)]


class _Stop(Exception):
    pass


def inner_loss(module, layer, k, v) -> tuple[float, float]:
    """1/2‖M_0(k) − v‖² and 1/2‖v‖² per token (means over tokens and heads), M_0 the memory's initial weights."""
    B = k.shape[0]
    state = layer._state(B, torch.float32)
    kk, vv = k.transpose(1, 2).float(), v.transpose(1, 2).float()   # [B, H, T, D]
    w0 = [state[n] for n in module.WEIGHTS]
    y0 = module._memory_forward(module._dense(w0), kk)
    return float(0.5 * (y0 - vv).pow(2).sum(-1).mean()), float(0.5 * vv.pow(2).sum(-1).mean())


def probe(args) -> dict:
    torch.set_num_threads(1)
    module = mirasc.compile_spec(args.spec)
    layer_opts = explore._pairs(args.layer)  # as `mirasc explore --layer` reads them
    if args.key_shift is not None:  # the Layer option (MLP memories' default 0.5; 0 turns it off)
        layer_opts["key_shift"] = args.key_shift
    cfg = tasks.make_config("mqar", seq_len=args.seq_len, num_kv_pairs=args.pairs)
    torch.manual_seed(args.seed)
    model = trainloop.make_model(module, lm, tasks.VOCAB, 64, 2, 2, layer_opts)
    if args.perturb:  # every initial weight times (1 + ε·N(0, 1)), from its own generator (the batches stay the same)
        g = torch.Generator().manual_seed(12345)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + args.perturb * torch.randn(p.shape, generator=g, dtype=p.dtype))
    rec = Recorder(model)
    steps, lr, seed = args.steps, args.lr, args.seed
    log, t0 = [], time.time()
    names = dict(model.named_parameters())

    def on_backward(done, loss):  # explore's own loop (trainloop.train) calls this before it clips the gradients
        step = done - 1
        if step % args.every == 0 or step == steps - 1:
            entry = {"step": step, "loss": float(loss.detach()), "grad": {}, "weight": {}, "blocks": []}
            for g in GROUPS:
                sq = [names[n].grad.pow(2).sum() for n in names if group_of(n) == g and names[n].grad is not None]
                w = [names[n].detach().pow(2).sum() for n in names if group_of(n) == g]
                if sq:
                    entry["grad"][g] = float(torch.stack(sq).sum().sqrt())
                if w:
                    entry["weight"][g] = float(torch.stack(w).sum().sqrt())
            with torch.no_grad():
                for layer, seen in zip(rec.layers, rec.seen):
                    b = {"v_rms": _stats(seen["v"]), "o_rms": _stats(seen["o"]),
                         "o_minus_q_rms": _stats(seen["o"].float() - seen["q"].float())}
                    for n, gt in seen["gates"].items():
                        gt = gt.float()
                        b[n] = [float(gt.mean()), float(gt.std()), float(gt.min()), float(gt.max())]
                    if "out_gate" in seen:
                        g = seen["out_gate"].float()
                        b["out_gate"] = [float(g.mean()), float(((g < 0.01) | (g > 0.99)).float().mean())]
                    if "eta" in seen["gates"]:
                        e = seen["gates"]["eta"].float() / layer.eta_max
                        b["eta_saturated"] = float(((e < 0.01) | (e > 0.99)).float().mean())
                    b["inner_loss_init"], b["half_v_sq"] = inner_loss(module, layer, seen["k"], seen["v"])
                    b["conv_reach"] = conv_reach(layer)
                    entry["blocks"].append(b)
            log.append(entry)
            if args.verbose:
                print(json.dumps({"step": step, "loss": round(float(loss.detach()), 3),
                                  "grad": {k: round(v, 3) for k, v in entry["grad"].items()},
                                  "v_rms": [round(b["v_rms"], 3) for b in entry["blocks"]],
                                  "il0": [round(b["inner_loss_init"], 2) for b in entry["blocks"]],
                                  "eta": [round(b["eta"][0], 3) for b in entry["blocks"] if "eta" in b],
                                  "eta_saturated": [b.get("eta_saturated") for b in entry["blocks"]],
                                  "out_gate": [b.get("out_gate") for b in entry["blocks"]]}),
                      flush=True)
        if args.stop_after and done >= args.stop_after:
            raise _Stop

    try:
        trainloop.train(model, tasks, "mqar", cfg, steps=steps, batch_size=32, lr=lr, weight_decay=0.1, seed=seed,
                        log_every=args.every, on_backward=on_backward)
    except _Stop:
        model.zero_grad(set_to_none=True)
    acc, exact = trainloop.evaluate(model, tasks, "mqar", cfg, [64, 128, 256], 64, 32)
    return {"spec": args.spec, "seed": seed, "lr": lr, "layer": layer_opts, "steps": steps,
            "stop_after": args.stop_after, "perturb": args.perturb, "key_shift": args.key_shift,
            "seconds": round(time.time() - t0, 1), "accuracy": acc, "log": log}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--stop-after", type=int, default=0, help="end after this many steps (0: --steps)")
    p.add_argument("--perturb", type=float, default=0.0, help="relative noise ε on every initial weight (0: none)")
    p.add_argument("--key-shift", type=float, default=None,
                   help="the Layer option key_shift: added to the key stream's convolution tap one token back at "
                        "initialisation (default: the spec's Layer default; 0 turns it off)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--pairs", type=int, default=8, help="key-value pairs per training sequence")
    p.add_argument("--layer", nargs="*", default=[], metavar="K=V")
    p.add_argument("--out", required=True)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    result = probe(args)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"seed": args.seed, "accuracy": result["accuracy"], "seconds": result["seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
