"""`mirasc train SPEC`: train a language model (bytes, or a local tokenizer's tokens) whose mixers are the
compiled spec.

AdamW (no weight decay on norms, biases, embeddings and the memories' learned initial states), linear
warmup then cosine decay to `min_lr`, gradient clipping, optional bf16 autocast, checkpoints
(model, optimizer, step, RNG states, config) every `ckpt_every` steps and at the end, `--resume`, a
progress display with tokens/s and loss, metrics as JSON lines, and the final validation loss in bits
per byte of text (nats per token / ln 2 × tokens per byte; for bytes, nats / ln 2).

Configuration: `TrainConfig` defaults < `--config FILE.json` < command-line flags (on `--resume`, the
checkpoint's config replaces the defaults). Data: the standard library's source by default; with `--data
PATH` a local text folder, JSONL or Parquet file(s), or a `datasets` save_to_disk folder (see
`mirasc.lab.data`). Tokens: bytes by default; `--tokenizer PATH` reads a tokenizer.json file or a Hugging Face
tokenizer folder from the disk (see `mirasc.lab.tokenizer`), the LM's vocabulary follows it, and checkpoints
carry it (so an export does too). Nothing is downloaded.

Distributed: under `torchrun --nproc_per_node N ...` the same entry point uses DistributedDataParallel
(gloo on CPU, nccl on GPU); `batch_size` is the global batch and rank r takes rows [r·B/N, (r+1)·B/N) of
the batch a single process would draw, so N processes compute the same update as one. `--fsdp` shards
parameters, gradients and optimizer state with PyTorch's FullyShardedDataParallel in its current form,
`torch.distributed.fsdp.fully_shard` (FSDP2; each block and the root are sharded). The older
`FullyShardedDataParallel` wrapper class (FSDP1) refuses to run without an accelerator in torch 2.13
("FSDP needs a non-CPU accelerator device"), whereas `fully_shard` works on the CPU with gloo, so that is
what `--fsdp` uses everywhere. Only rank 0 writes checkpoints, metrics and output.

    python -m mirasc.lab.train specs/gated_deltanet.miras --steps 200
    torchrun --nproc_per_node 2 -m mirasc.lab.train specs/titans.miras --batch-size 16 [--fsdp]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from ..language.frontend import parse_text, read_spec
from . import trainloop
from .distributed import Dist, wrap
from .train_config import (  # noqa: F401  (re-exported: mirasc.lab.train is the training API)
    CHECKPOINT,
    CONFIG_FIELDS,
    DEFAULT_WARMUP,
    METRICS,
    TrainConfig,
    _flag,
    add_arguments,
    apply_threads,
    checkpoint_config,
    config_from,
    read_checkpoint,
    resolve_device,
)

LN2 = math.log(2.0)


def run(args: argparse.Namespace) -> int:
    try:
        apply_threads(getattr(args, "threads", None))
    except ValueError as e:
        print(f"mirasc train: error: {e}", file=sys.stderr)
        return 2
    overrides = {name: getattr(args, name) for name in CONFIG_FIELDS}
    from mirasc.language.messages import SpecError

    export_hf = getattr(args, "export_hf", None)
    if export_hf:
        try:  # before training: a missing extra should not surface after a long run
            import transformers  # noqa: F401
        except ImportError as err:
            print(f"mirasc train: --export-hf needs the hf extra (pip install 'mirasc[hf]'): {err}", file=sys.stderr)
            return 2
    try:
        summary = train(args.spec, config_file=args.config, overrides=overrides, resume=args.resume,
                        metrics=args.metrics, stop_at=args.stop_at)
        if export_hf and int(os.environ.get("RANK", "0")) == 0:  # the checkpoint is complete on disk by now
            from mirasc.lab import hf

            out = hf.export_checkpoint(summary["checkpoint"], export_hf)
            print(f"wrote {out} (Hugging Face model of step {summary['step']})", flush=True)
    except (SpecError, ValueError, OSError) as e:  # usage errors (bad spec, config, data, resume path)
        print(f"mirasc train: error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mirasc train", description=__doc__.split("\n\n")[0])
    return run(add_arguments(parser).parse_args(argv))


# -- pieces ------------------------------------------------------------------------------------------------
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr over cfg.warmup_steps, then cosine to cfg.min_lr at the last step
    (`trainloop.warmup_cosine`)."""
    return trainloop.warmup_cosine(step, cfg.steps, cfg.warmup_steps, cfg.lr, cfg.min_lr, cfg.steps - 1)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: no decay on vectors (norms, biases), embeddings or the memories' `initial.*`; the
    Layers' gate projections at their `gate_lr` share of the learning rate (`trainloop.param_groups`)."""
    def decayed(name, p):
        return not (p.dim() < 2 or "embed" in name or ".initial." in name or name.startswith("initial."))

    return trainloop.param_groups(model, weight_decay, decayed)


def spec_name(text: str) -> str:
    """The model's name in a spec's text (the run directory's default name), as the parser reads it (a comment
    that says "the model does ..." does not name it)."""
    return parse_text(text).name


def _full_state(model, optimizer, env: Dist, cfg: TrainConfig):
    """Unsharded, unwrapped (model_sd, optim_sd) on the CPU; under FSDP a collective, complete on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(model, optimizer, options=opts)


def save_checkpoint(path: Path, model, optimizer, step: int, cfg: TrainConfig, spec: str, env: Dist,
                    tokenizer_files: dict | None = None):
    """tokenizer_files: the tokenizer's files ({name: bytes}, None for bytes), so that an export of the
    checkpoint carries the tokenizer it was trained with."""
    import mirasc

    model_sd, optim_sd = _full_state(model, optimizer, env, cfg)
    if env.main:
        ckpt = {"model": model_sd, "optimizer": optim_sd, "step": step, "config": asdict(cfg), "spec": spec,
                "layer": layer_options(mirasc.parse_text(spec), cfg), "world_size": env.world,
                "tokenizer": tokenizer_files,
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(ckpt, tmp)
        os.replace(tmp, path)
    env.barrier()


def load_checkpoint_into(ckpt: dict, model, optimizer):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=ckpt["model"], optim_state_dict=ckpt["optimizer"],
                   options=StateDictOptions(full_state_dict=True))
    rng = ckpt.get("rng") or {}
    if rng.get("torch") is not None:
        torch.set_rng_state(rng["torch"])
    if rng.get("python") is not None:
        random.setstate(rng["python"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _run_tokenizer(cfg: TrainConfig, ckpt: dict | None):
    """The run's tokenizer: cfg.tokenizer, or on resume the checkpoint's own copy (its files may have moved
    since). Resuming with another tokenizer than the checkpoint's is refused."""
    from mirasc.lab.tokenizer import load_tokenizer, tokenizer_from_files

    saved = ckpt.get("tokenizer") if ckpt is not None else None
    if saved and cfg.tokenizer == ckpt["config"].get("tokenizer"):
        return tokenizer_from_files(saved)
    tokenizer = load_tokenizer(cfg.tokenizer)
    if ckpt is not None:
        theirs = tokenizer_from_files(saved) if saved else None
        same = (theirs is None and tokenizer.kind == "bytes") or (
            theirs is not None and tokenizer.kind == "tokens" and theirs.separator == tokenizer.separator
            and theirs.tok.get_vocab() == tokenizer.tok.get_vocab())
        if not same:
            was = "bytes" if theirs is None else f"a tokenizer of {theirs.vocab_size} tokens"
            raise ValueError(f"--tokenizer {cfg.tokenizer or 'bytes'}: the checkpoint was trained on {was}; resume "
                             "with the same tokenizer (or leave --tokenizer out to use the checkpoint's copy)")
    return tokenizer


# TrainConfig fields that decide the model's parameters (and so the checkpoint's tensors)
MODEL_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_hidden", "hybrid_every", "window", "layer_options")


def layer_options(spec, cfg: TrainConfig) -> dict:
    """The options the Layers are built with: the parsed spec's defaults (its `layer` block over this version's
    family defaults) under --layer-options. A checkpoint keeps them, so that a change of a default is seen on
    resume."""
    return {**spec.layer_defaults(), **cfg.layer_options}


def check_resumable(ckpt: dict, text: str, cfg: TrainConfig, src) -> None:
    """A checkpoint continues only the model it was saved from: the same design (spec) and the same sizes.
    Raises ValueError naming every difference (instead of load_state_dict's key and shape dump)."""
    import mirasc
    from mirasc.language import spec as S

    mine, theirs = mirasc.parse_text(text), mirasc.parse_text(ckpt["spec"], str(src))
    diffs = []
    for part in ("memory", "bias", "retention", "learner", "parallel"):
        a, b = getattr(theirs, part), getattr(mine, part)
        if a != b:
            diffs.append(f"{part} `{S.form_text(a)}` in the checkpoint, `{S.form_text(b)}` here")
    for option, a in theirs.layer:
        b = getattr(mine.layer, option)
        if a != b:
            diffs.append(f"layer option {option} = {S.format_value(a)} in the checkpoint, {S.format_value(b)} here")
    saved = config_from(ckpt["config"])
    built = ckpt.get("layer")        # the Layers' options as built (checkpoints from before they were kept: None)
    for name in MODEL_FIELDS:
        a, b = getattr(saved, name), getattr(cfg, name)
        if a != b and not (name == "layer_options" and built is not None):
            diffs.append(f"{name} {json.dumps(a)} in the checkpoint, {json.dumps(b)} here")
    if built is not None and not diffs:
        # the same design and sizes: a default that changed since (or other --layer-options) builds another model
        here = layer_options(mine, cfg)
        changed = {k: v for k, v in built.items() if k in here and here[k] != v}
        if changed:
            diffs += [f"Layer option {k} = {json.dumps(v)} in the checkpoint's model, {json.dumps(here[k])} here"
                      for k, v in changed.items()]
            diffs.append(f"--layer-options '{json.dumps({**cfg.layer_options, **changed})}' continues the "
                         "checkpoint's model")
    if diffs:
        raise ValueError(f"--resume {src}: the checkpoint is of another model (spec `{theirs.name}`, "
                         f"step {ckpt['step']}): " + "; ".join(diffs) + ". Resume with the same spec and sizes, "
                         "or start a new run in another --out-dir")


def load_model(path: str | Path, map_location="cpu"):
    """The LanguageModel stored in a checkpoint (for sampling or evaluation)."""
    from mirasc.lab.models import build

    ckpt = read_checkpoint(path, ("model", "config", "spec"))
    cfg = checkpoint_config(ckpt)
    model = build(ckpt["spec"], cfg.lm_config()).to(getattr(torch, cfg.dtype))
    model.load_state_dict(ckpt["model"])
    return model


@torch.no_grad()
def evaluate(model, data: torch.Tensor, cfg: TrainConfig, env: Dist, autocast) -> float:
    """Mean next-token cross-entropy (nats) over deterministic validation windows, sharded over ranks (every
    rank runs the same number of forwards, so FSDP's collectives line up)."""
    from mirasc.lab.data import eval_windows

    x_all, y_all = eval_windows(data, cfg.seq_len, cfg.eval_windows)
    local = max(1, cfg.batch_size // env.world)
    per_round = local * env.world
    total = torch.zeros(2, dtype=torch.float64, device=env.device)
    for start in range(0, len(x_all), per_round):
        lo = start + env.rank * local
        idx = torch.arange(lo, lo + local)
        valid = idx < len(x_all)
        idx = torch.where(valid, idx, torch.zeros_like(idx))
        x, y = x_all[idx].to(env.device), y_all[idx].to(env.device)
        with autocast():
            logits = model(x)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none").view(len(idx), -1)
        mask = valid.to(env.device)
        total[0] += nll.sum(-1).double()[mask].sum()
        total[1] += mask.sum() * cfg.seq_len
    env.sum_(total)
    return (total[0] / total[1]).item()


class _Progress:
    def __init__(self, total: int, start: int, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)
            except ImportError:
                pass
        self.enabled = enabled

    def update(self, step: int, total: int, rec: dict, advance: int):
        if self.bar is not None:
            self.bar.update(advance)
            self.bar.set_postfix(loss=f"{rec['loss']:.4f}", lr=f"{rec['lr']:.2e}",
                                 tok_s=f"{rec['tokens_per_s']:,.0f}", refresh=False)
        elif self.enabled:
            print(f"step {step:>6}/{total}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  "
                  f"gnorm {rec['grad_norm']:.3f}  {rec['tokens_per_s']:,.0f} tok/s", flush=True)

    def write(self, msg: str):
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _rewrite_metrics(path: Path, keep_upto: int):
    """On resume: drop records past the checkpoint's step so the file holds one clean trajectory."""
    if not path.exists():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    kept = [ln for ln in lines if json.loads(ln).get("step", 0) <= keep_upto and json.loads(ln).get("kind") != "final"]
    path.write_text("".join(ln + "\n" for ln in kept))


# -- the loop ----------------------------------------------------------------------------------------------
def train(spec: str, config: TrainConfig | None = None, *, config_file: str | None = None,
          overrides: dict | None = None, resume: str | None = None, metrics: str | None = None,
          stop_at: int | None = None) -> dict:
    """Train and return a summary: {"step", "val_loss", "val_bpb", "losses" (per logged step: (step, loss)),
    "out_dir", "checkpoint", "params", "model" (the unwrapped module)}.

    resume: a checkpoint path, or "auto" for OUT_DIR/checkpoint.pt (a fresh start if it does not exist); the
    run then continues with the checkpoint's config (or `config` if given), updated by the file and overrides.
    stop_at: checkpoint and return after this step (a preemption; the LR schedule still targets cfg.steps)."""
    import mirasc

    cfg = config_from(config, config_file, overrides)
    mirasc.compile_spec(spec)   # errors located in the spec file (SpecError); cached for build() below
    text = read_spec(spec)[0]
    name = spec_name(text)
    out_dir = Path(cfg.out_dir or f"runs/{name}")
    ckpt_path = out_dir / CHECKPOINT
    ckpt = None
    if resume is not None:
        src = ckpt_path if resume == "auto" else Path(resume)
        if src.is_dir():  # a run directory: its checkpoint
            src = src / CHECKPOINT
        if src.exists():
            try:
                ckpt = read_checkpoint(src)
            except ValueError as err:
                raise ValueError(f"--resume {err}") from None
            cfg = config_from(config or ckpt["config"], config_file, overrides)
            check_resumable(ckpt, text, cfg, src)
            done = int(ckpt["step"])
            if done > cfg.steps:
                raise ValueError(f"--resume {src}: the checkpoint is at step {done}, past --steps {cfg.steps}: "
                                 f"nothing to train; give --steps above {done} to train on")
            if done == cfg.steps and int(os.environ.get("RANK", "0")) == 0:
                print(f"mirasc train: the checkpoint {src} already reached --steps {cfg.steps}: no steps to train; "
                      "evaluating it", flush=True)
            out_dir = Path(cfg.out_dir or out_dir)
            ckpt_path = out_dir / CHECKPOINT
        elif resume != "auto":
            raise FileNotFoundError(f"--resume {resume}: no such checkpoint")
    metrics_path = Path(metrics) if metrics else out_dir / METRICS

    env = Dist(cfg.device)
    try:
        return _train(cfg, text, name, out_dir, ckpt_path, ckpt, metrics_path, env, stop_at)
    finally:
        env.close()


def _data(cfg, ckpt):
    """The run's tokenizer (bytes, a local one, or the checkpoint's), the config with the vocabulary it implies, and
    the corpus split into training and validation tokens."""
    from mirasc.lab.data import load_corpus

    tokenizer = _run_tokenizer(cfg, ckpt)
    if cfg.vocab_size is None:  # the LM's vocabulary follows the tokenizer (recorded in checkpoints)
        cfg = dataclasses.replace(cfg, vocab_size=tokenizer.vocab_size)
    elif cfg.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"vocab_size {cfg.vocab_size} is smaller than the tokenizer's vocabulary "
                         f"({tokenizer.vocab_size} tokens from {tokenizer.source})")
    corpus = load_corpus(cfg.data, max_bytes=cfg.max_bytes, val_fraction=cfg.val_fraction, tokenizer=tokenizer,
                         data_format=cfg.data_format, text_field=cfg.text_field)
    return cfg, tokenizer, corpus


def _precision(cfg, env):
    """The weights' dtype, whether bf16 autocast is on (default: on a GPU that has it), and the autocast context."""
    dtype = getattr(torch, cfg.dtype)
    bf16 = cfg.bf16
    if bf16 is None:
        bf16 = env.device.type == "cuda" and torch.cuda.is_bf16_supported()
    if bf16 and dtype == torch.float64:
        raise ValueError("bf16 autocast and dtype float64 do not go together")
    if bf16 and env.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU does not support bf16")

    def autocast():
        if not bf16:
            return contextlib.nullcontext()
        return torch.autocast(env.device.type, dtype=torch.bfloat16)

    return dtype, bf16, autocast


def _announce(cfg, env, name, n_params, bf16, corpus, start, resumed, out_dir, metrics_path, progress, record):
    """Rank 0 at the start: the output folders, the metrics file (new, or cut back to the resumed step), the run's
    line and, on a fresh run, its config record."""
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    if not resumed:
        metrics_path.write_text("")
    else:
        _rewrite_metrics(metrics_path, start)
    mode = "fsdp" if cfg.fsdp else "ddp" if env.on else "single"
    progress.write(f"mirasc train: {name}, {n_params:,} parameters, {mode} x{env.world} on {env.device}, "
                   f"{cfg.dtype}{' + bf16 autocast' if bf16 else ''}; {corpus.describe()}"
                   + (f"; resumed at step {start}" if start else ""))
    if start == 0:
        record({"kind": "config", "step": 0, "spec": name, "params": n_params, "world_size": env.world,
                "mode": mode, "config": asdict(cfg), "unit": corpus.unit, "train_bytes": corpus.train_bytes,
                "val_bytes": corpus.val_bytes, "train_tokens": len(corpus.train), "val_tokens": len(corpus.val)})


def _recorder(env, metrics_path):
    """record(rec): one JSON line in the metrics file, on rank 0."""
    def record(rec):
        if env.main:
            with metrics_path.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")

    return record


def _step(model, raw, optimizer, batch, lr, cfg, env, autocast):
    """One optimizer step at learning rate `lr` (each group's times its lr_scale), `trainloop.step`: forward,
    backward, clipping at cfg.grad_clip. Returns (lr, the loss, the gradient norm before clipping)."""
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    x, y = (b.to(env.device, non_blocking=True) for b in batch)
    loss, norm = trainloop.step(model, optimizer, x, y, cfg.grad_clip, raw.parameters(), autocast,
                                stop_if_not_finite=False)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return lr, loss, norm


def _train(cfg, text, name, out_dir, ckpt_path, ckpt, metrics_path, env, stop_at):
    from mirasc.lab.data import BatchSampler
    from mirasc.lab.models import build

    dtype, bf16, autocast = _precision(cfg, env)
    cfg, tokenizer, corpus = _data(cfg, ckpt)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    raw = build(text, cfg.lm_config()).to(device=env.device, dtype=dtype)
    n_params = raw.num_params()
    model = wrap(raw, cfg, env)
    optimizer = torch.optim.AdamW(param_groups(raw, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                  eps=1e-8, foreach=False if cfg.fsdp else None)
    start = 0
    if ckpt is not None:
        load_checkpoint_into(ckpt, model, optimizer)
        start = int(ckpt["step"])
    sampler = BatchSampler(corpus.train, cfg.batch_size, cfg.seq_len, seed=cfg.seed, rank=env.rank,
                           world_size=env.world)
    tok_files = tokenizer.files()

    record = _recorder(env, metrics_path)
    progress = _Progress(cfg.steps, start, cfg.progress and env.main)
    if env.main:
        _announce(cfg, env, name, n_params, bf16, corpus, start, ckpt is not None, out_dir, metrics_path, progress,
                  record)

    # losses are in nats per token; bits per byte of text = nats / ln 2 * tokens per byte (1 for bytes)
    unit, train_tpb, val_tpb = corpus.unit[:-1], corpus.train_tokens_per_byte, corpus.tokens_per_byte
    losses = []
    tokens_per_step = cfg.batch_size * cfg.seq_len
    t_last, steps_since, t0 = time.perf_counter(), 0, time.perf_counter()
    model.train()
    end = cfg.steps if stop_at is None else max(start, min(cfg.steps, stop_at))
    for step in range(start, end):
        lr, loss, norm = _step(model, raw, optimizer, sampler.batch(step), lr_at(step, cfg), cfg, env, autocast)
        steps_since += 1
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            loss_v = env.mean(loss.item())
            now = time.perf_counter()
            rec = {"kind": "train", "step": done, "loss": loss_v, "bpb": loss_v / LN2 * train_tpb, "lr": lr,
                   "grad_norm": float(norm), "tokens_per_s": steps_since * tokens_per_step / max(now - t_last, 1e-9),
                   "elapsed_s": now - t0}
            losses.append((done, loss_v))
            record(rec)
            progress.update(done, cfg.steps, rec, steps_since)
            t_last, steps_since = now, 0
        if cfg.eval_every and done % cfg.eval_every == 0 and done != cfg.steps:
            v = evaluate(model, corpus.val, cfg, env, autocast)
            record({"kind": "val", "step": done, "loss": v, "bpb": v / LN2 * val_tpb})
            if env.main:
                progress.write(f"step {done}: val loss {v:.4f} nats/{unit}, {v / LN2 * val_tpb:.4f} bits/byte")
        if cfg.ckpt_every and done % cfg.ckpt_every == 0 and done != end:
            save_checkpoint(ckpt_path, model, optimizer, done, cfg, text, env, tok_files)
    progress.close()

    final_step = max(start, end)
    result = {"losses": losses, "out_dir": str(out_dir), "checkpoint": str(ckpt_path), "metrics": str(metrics_path),
              "params": n_params, "model": raw}
    if end > start:
        save_checkpoint(ckpt_path, model, optimizer, final_step, cfg, text, env, tok_files)
    if final_step < cfg.steps:  # stopped early on purpose: no final evaluation, resume later
        if env.main:
            print(f"stopped at step {final_step}/{cfg.steps}; checkpoint {ckpt_path} (resume with --resume)",
                  flush=True)
        return {"step": final_step, "val_loss": None, "val_bpb": None, **result}
    val = evaluate(model, corpus.val, cfg, env, autocast)
    bpb = val / LN2 * val_tpb
    record({"kind": "final", "step": final_step, "val_loss": val, "val_bpb": bpb, "params": n_params,
            "elapsed_s": time.perf_counter() - t0})
    if env.main:
        print(f"final: step {final_step}, validation {val:.4f} nats/{unit} = {bpb:.4f} bits/byte "
              f"(perplexity {math.exp(val):.3f} per {unit}); checkpoint {ckpt_path}; metrics {metrics_path}",
              flush=True)
    if cfg.sample:
        _sample(raw, model, optimizer, corpus, cfg, env, text, tokenizer)
    return {"step": final_step, "val_loss": val, "val_bpb": bpb, **result}


def _sample(raw, model, optimizer, corpus, cfg, env, text, tokenizer):
    """Rank 0 prints `cfg.sample` generated tokens after a validation prompt (FSDP: from an unsharded copy)."""
    from mirasc.lab.models import build

    if cfg.fsdp:
        model_sd, _ = _full_state(model, optimizer, env, cfg)
        if not env.main:
            return
        raw = build(text, cfg.lm_config()).to(getattr(torch, cfg.dtype))
        raw.load_state_dict(model_sd)
    if not env.main:
        return
    prompt = corpus.val[:64].long()[None].to(next(raw.parameters()).device)
    g = torch.Generator(device=prompt.device).manual_seed(cfg.seed)
    out = raw.generate(prompt, cfg.sample, temperature=0.8, top_k=40, generator=g)
    print(f"--- sample (prompt: first 64 validation {corpus.unit}) ---\n{tokenizer.decode(out[0].tolist())}\n---",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
