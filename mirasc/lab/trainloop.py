"""The training step and schedule of both training loops, and `mirasc explore`'s loop and evaluation, in torch
alone (`mirasc train`'s loop, mirasc.lab.train, adds its data, checkpoints and distribution around the same step).

This file imports only torch and the standard library on purpose: `benchmarks/gpu_mqar.py` loads it by file path
(with mirasc/lab/tasks.py and mirasc/runtime/lm.py) on machines without the compiler's dependencies, so that a GPU
run trains and evaluates exactly as `mirasc explore` does. `tasks` and `lm` are passed in as modules for the same
reason. `device`: where the model lives; batches are generated on the CPU (the same tensors everywhere) and moved.
"""

from __future__ import annotations

import contextlib
import math
import statistics

import torch

TRAIN_SEED, EVAL_SEED = 1_000_003, 987_654_321


def make_model(module, lm, vocab_size: int, d_model: int, layers: int, heads: int, layer_options: dict):
    """The language model (`lm`: mirasc.runtime.lm) around the emitted `module`'s Layer (initialised from torch's
    global RNG); Layer options the module does not have are skipped."""
    layer_opts = {k: v for k, v in layer_options.items() if k in getattr(module, "LAYER_DEFAULTS", {})}
    cfg = lm.LMConfig(vocab_size=vocab_size, d_model=d_model, n_layers=layers, n_heads=heads, layer_options=layer_opts)
    return lm.LanguageModel(cfg, lambda d, h: module.Layer(d, h, **layer_opts))


def param_groups(model, weight_decay: float, decayed=None) -> list[dict]:
    """AdamW's parameter groups: weight decay on the parameters `decayed(name, p)` selects (default: matrices) and
    none on the rest; the gate projections of every Layer whose `gate_lr` is not 1 in groups of their own, with
    "lr_scale" = that `gate_lr` (docs/training.md). A trainer gives each group lr·lr_scale."""
    decayed = decayed or (lambda name, p: p.dim() >= 2)
    scale = {}
    for m in model.modules():
        proj, factor = getattr(m, "gate_proj", None), getattr(m, "gate_lr", 1.0)
        if isinstance(proj, torch.nn.Module) and factor != 1.0:
            scale.update({id(p): float(factor) for p in proj.parameters()})
    groups: dict[tuple, list] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            key = (weight_decay if decayed(name, p) else 0.0, scale.get(id(p), 1.0))
            groups.setdefault(key, []).append(p)
    return [{"params": ps, "weight_decay": wd, "lr_scale": s} for (wd, s), ps in groups.items()]


def warmup_cosine(step: int, steps: int, warmup: int, peak: float = 1.0, floor: float = 0.1,
                  end: int | None = None) -> float:
    """The learning rate (or its factor) at `step`: linear warm-up to `peak` over `warmup` steps, then a cosine
    to `floor`, reached at step `end` (default `steps`, one past the last step: explore's schedule; `mirasc
    train` ends at steps − 1) and held after it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    span = max(1, (steps if end is None else end) - warmup)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * min(step - warmup, span) / span))


def step(model, optimizer, x, y, clip: float, params=None, autocast=None, on_backward=None, done: int = 0,
         stop_if_not_finite: bool = True):
    """One optimizer step, at the learning rates already in `optimizer`'s groups: the loss, and unless it is not
    finite (then nothing is updated, where `stop_if_not_finite`) the backward pass, `on_backward(done, loss)` (the
    gradients as computed), clipping of `params` (default the model's) to a global norm of `clip` (0: none, the
    norm is still returned), the update, and the gradients cleared. Returns (loss, the gradient norm before
    clipping, or None when the step stopped). Both training loops (explore's `train`, and `mirasc train`, whose
    distributed ranks must all reach the backward pass) take their steps here."""
    with autocast() if autocast is not None else contextlib.nullcontext():
        _, loss = model(x, y)
    if stop_if_not_finite and not torch.isfinite(loss):
        return loss, None
    loss.backward()
    if on_backward is not None:
        on_backward(done, loss)
    params = model.parameters() if params is None else params
    norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, norm


def train(model, tasks, task: str, cfg, *, steps: int, batch_size: int, lr: float, weight_decay: float, seed: int,
          log_every: int, on_step=None, on_backward=None, device=None):
    """AdamW (betas 0.9, 0.95; `param_groups`: weight decay on matrices only), `warmup_cosine` with a warm-up over a
    tenth of the steps and a floor of 10%, gradient clipping at 1, on batches seeded TRAIN_SEED·(seed+1)+step.
    Returns (loss curve [[step, mean loss over the last log_every steps]], status); `on_step(step, loss)` after
    every step, `on_backward(step, loss)` between the backward pass and the clipping (the gradients as computed)."""
    groups = param_groups(model, weight_decay)
    opt = torch.optim.AdamW([{**g, "lr": lr * g["lr_scale"]} for g in groups], lr=lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: warmup_cosine(i, steps, warmup))
    curve, window, status = [], [], "ok"
    model.train()
    for i in range(steps):
        x, y, _ = tasks.generate(task, cfg, batch_size, seed=TRAIN_SEED * (seed + 1) + i)
        if device is not None:
            x, y = x.to(device), y.to(device)
        loss, norm = step(model, opt, x, y, 1.0, on_backward=on_backward, done=i + 1)
        if norm is None:
            status = f"diverged at step {i}"
            break
        sched.step()
        window.append(loss.item())
        if (i + 1) % log_every == 0 or i + 1 == steps:
            curve.append([i + 1, statistics.fmean(window)])
            window = []
        if on_step is not None:
            on_step(i + 1, loss.item())
    return curve, status


def evaluate(model, tasks, task: str, cfg, lengths, n: int, batch_size: int, scored: dict | None = None,
             device=None):
    """Masked-token accuracy and per-example exact match at each length, on a fixed evaluation set (seeded
    EVAL_SEED + length). `scored`, if given, receives the number of scored tokens at each length."""
    model.eval()
    accuracy, exact = {}, {}
    with torch.no_grad():
        for L in lengths:
            c = tasks.at_length(task, cfg, L)
            x, y, m = tasks.generate(task, c, n, seed=EVAL_SEED + L)
            if device is not None:
                x, y, m = x.to(device), y.to(device), m.to(device)
            right = total = examples_ok = 0
            for i in range(0, n, batch_size):
                logits = model(x[i:i + batch_size])
                hit = (logits.argmax(-1) == y[i:i + batch_size]) & m[i:i + batch_size].bool()
                right += int(hit.sum())
                total += int(m[i:i + batch_size].sum())
                examples_ok += int((hit.sum(1) == m[i:i + batch_size].sum(1)).sum())
            accuracy[L], exact[L] = right / max(1, total), examples_ok / n
            if scored is not None:
                scored[L] = total
    model.train()
    return accuracy, exact
