"""Training: the default corpus, the batch sampler, the training loop (loss falls), checkpoint/resume,
data-parallel equivalence (2 gloo processes == 1 process on the same global batch), metrics, config."""

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mirasc.lab import data as mdata
from mirasc.lab import train as mtrain
from mirasc.lab.distributed import Dist
from mirasc.lab.models import build

ROOT = Path(__file__).resolve().parents[2]
SPEC = str(ROOT / "specs" / "gated_deltanet.miras")
TINY = dict(d_model=32, n_layers=1, n_heads=2, seq_len=32, batch_size=8, max_bytes=300_000, eval_windows=16,
            progress=False)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine OpenMP spinning makes
    them several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _cfg(tmp, **kw):
    return mtrain.TrainConfig(**{**TINY, "out_dir": str(tmp), **kw})


def _fresh(cfg):
    """The model a run with cfg starts from."""
    torch.manual_seed(cfg.seed)
    return build(SPEC, cfg.lm_config()).to(getattr(torch, cfg.dtype))


def _records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# -- corpus ------------------------------------------------------------------------------------------------
def test_stdlib_split_is_deterministic_disjoint_and_by_file():
    files = mdata.stdlib_files()
    assert len(files) > 100 and files == sorted(files)
    assert not any(set(f.split("/")[:-1]) & mdata.SKIP_DIRS for f in files)
    train, val = mdata.split_files(files, 0.05)
    assert set(train).isdisjoint(val) and sorted(train + val) == files
    assert 0.01 * len(files) < len(val) < 0.15 * len(files)
    # the split depends on the path only: the same in a fresh interpreter with another hash seed
    code = ("import json; from mirasc.lab import data as d; "
            "print(json.dumps(d.split_files(d.stdlib_files(), 0.05)[1]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert json.loads(out) == val
    # capped corpora are reproducible, and the bytes come from the right files
    a = mdata.load_corpus(max_bytes=50_000)
    b = mdata.load_corpus(max_bytes=50_000)
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)
    assert len(a.train) + len(a.val) == 50_000
    assert set(a.train_files) <= set(train) and set(a.val_files) <= set(val) and a.val_files
    first_val = (mdata.stdlib_root() / a.val_files[0]).read_bytes()
    assert bytes(a.val[:100].tolist()) == first_val[:100]


def test_data_folder_split_and_sampler(tmp_path):
    for i in range(40):
        (tmp_path / f"doc{i:02d}.txt").write_text(f"document {i} " * 20)
    (tmp_path / "notes.md").write_text("# notes\n" * 10)
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01" * 100)          # not a text extension
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "secret.txt").write_text("hidden")        # hidden folders are skipped
    corpus = mdata.load_corpus(tmp_path, val_fraction=0.2)
    assert "blob.bin" not in corpus.train_files + corpus.val_files
    assert not any("hidden" in f for f in corpus.train_files + corpus.val_files)
    assert set(corpus.train_files).isdisjoint(corpus.val_files) and corpus.val_files
    assert len(corpus.train_files) + len(corpus.val_files) == 41
    joined = mdata.SEPARATOR.join((tmp_path / f).read_bytes() for f in corpus.val_files)
    assert bytes(corpus.val.tolist()) == joined

    s = mdata.BatchSampler(corpus.train, 8, 16, seed=3)
    x, y = s.batch(5)
    assert x.shape == y.shape == (8, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(s.batch(5)[0], x) and not torch.equal(s.batch(6)[0], x)
    assert not torch.equal(mdata.BatchSampler(corpus.train, 8, 16, seed=4).batch(5)[0], x)
    shares = [mdata.BatchSampler(corpus.train, 8, 16, seed=3, rank=r, world_size=2).batch(5) for r in range(2)]
    assert torch.equal(torch.cat([sh[0] for sh in shares]), x) and torch.equal(torch.cat([sh[1] for sh in shares]), y)
    with pytest.raises(ValueError, match="divisible"):
        mdata.BatchSampler(corpus.train, 7, 16, world_size=2)


# -- training ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    cfg = _cfg(out, steps=30, lr=1e-2, warmup=3, log_every=1, ckpt_every=0)
    result = mtrain.train(SPEC, cfg)
    # validation loss of the untrained model (same seed, same windows), for comparison
    corpus = mdata.load_corpus(max_bytes=cfg.max_bytes)
    before = mtrain.evaluate(_fresh(cfg), corpus.val, cfg, Dist("cpu"), contextlib.nullcontext)
    return result, before


def test_tiny_lm_loss_falls_on_default_corpus(tiny_run):
    result, val_before = tiny_run
    losses = [loss for _, loss in result["losses"]]
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 5.0                      # about ln 256 = 5.55 at initialisation
    assert last < first - 1.0, (first, last)
    assert result["val_loss"] < val_before - 1.0, (val_before, result["val_loss"])
    assert result["val_bpb"] == pytest.approx(result["val_loss"] / math.log(2))
    assert result["val_bpb"] < 7.0          # 8 bits/byte is a uniform guess


def test_metrics_jsonl(tiny_run):
    result, _ = tiny_run
    recs = _records(result["metrics"])
    kinds = [r["kind"] for r in recs]
    assert kinds[0] == "config" and kinds[-1] == "final" and kinds.count("train") == 30
    assert recs[0]["params"] == result["params"] and recs[0]["config"]["d_model"] == 32
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 31))
    assert [r["loss"] for r in train] == [v for _, v in result["losses"]]
    assert all(r["tokens_per_s"] > 0 and r["lr"] > 0 and r["grad_norm"] >= 0 for r in train)
    assert train[2]["lr"] == pytest.approx(1e-2) and train[-1]["lr"] == pytest.approx(2e-4)   # warmup, cosine end
    final = recs[-1]
    assert final["val_bpb"] == pytest.approx(final["val_loss"] / math.log(2)) and final["step"] == 30


def test_checkpoint_resume_reproduces_the_uninterrupted_run(tmp_path):
    kw = dict(steps=8, warmup=2, lr=3e-3, log_every=1, ckpt_every=2, eval_windows=4)
    full = mtrain.train(SPEC, _cfg(tmp_path / "full", **kw))
    part = mtrain.train(SPEC, _cfg(tmp_path / "part", **kw), stop_at=4)
    assert part["step"] == 4 and part["val_loss"] is None
    ckpt = torch.load(tmp_path / "part" / mtrain.CHECKPOINT, weights_only=False)
    assert ckpt["step"] == 4 and ckpt["optimizer"]["state"] and ckpt["config"]["steps"] == 8
    rest = mtrain.train(SPEC, resume="auto", overrides={"out_dir": str(tmp_path / "part")})
    assert [s for s, _ in rest["losses"]] == list(range(5, 9))
    torch.testing.assert_close(torch.tensor([v for _, v in part["losses"] + rest["losses"]]),
                               torch.tensor([v for _, v in full["losses"]]), rtol=1e-6, atol=1e-6)
    for (name, a), b in zip(full["model"].state_dict().items(), rest["model"].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
    assert rest["val_loss"] == pytest.approx(full["val_loss"], rel=1e-6)
    steps = [r["step"] for r in _records(tmp_path / "part" / mtrain.METRICS) if r["kind"] == "train"]
    assert steps == list(range(1, 9))      # one clean trajectory in the resumed run's metrics


DIST = dict(n_layers=2, steps=3, warmup=1, log_every=1, max_bytes=100_000, eval_windows=4, dtype="float64")


@pytest.fixture(scope="module")
def single_reference(tmp_path_factory):
    cfg = _cfg(tmp_path_factory.mktemp("single"), **DIST)
    return cfg, mtrain.train(SPEC, cfg)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_gloo_processes_equal_one_on_the_same_global_batch(tmp_path, mode, single_reference):
    """`torchrun --nproc_per_node 2 -m mirasc.lab.train ...` (gloo, CPU, float64) ends with the parameters of the
    single-process run: each rank takes its half of the same global batch and gradients are averaged."""
    cfg, single = single_reference
    flags = {"d_model": cfg.d_model, "n_heads": cfg.n_heads, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size,
             **DIST}
    args = [a for k, v in flags.items() for a in (mtrain._flag(k), str(v))]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "mirasc.lab.train", SPEC, *args, "--no-progress", "--out-dir", str(tmp_path / mode)]
    cmd += ["--fsdp"] if mode == "fsdp" else []
    path = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = _records(tmp_path / mode / mtrain.METRICS)
    assert recs[0]["mode"] == mode and recs[0]["world_size"] == 2     # it really ran distributed
    # the recorded config is the one given, with the vocabulary resolved (bytes: 256)
    assert recs[0]["config"] == {**mtrain.asdict(cfg), "vocab_size": 256, "out_dir": str(tmp_path / mode),
                                 "fsdp": mode == "fsdp"}
    dist_sd = torch.load(tmp_path / mode / mtrain.CHECKPOINT, weights_only=False)["model"]
    ref_sd = single["model"].state_dict()
    assert set(dist_sd) == set(ref_sd)
    for name, ref in ref_sd.items():
        got = dist_sd[name]
        assert got.dtype == torch.float64
        rel = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        assert rel < 1e-10, (name, rel)
    init = _fresh(cfg).state_dict()
    assert max((init[n] - ref_sd[n]).abs().max().item() for n in ref_sd) > 1e-3   # training moved the weights
    train_losses = [r["loss"] for r in recs if r["kind"] == "train"]
    assert train_losses == pytest.approx([v for _, v in single["losses"]], rel=1e-6)   # the loss is float32
    final = recs[-1]
    assert final["kind"] == "final" and final["val_loss"] == pytest.approx(single["val_loss"], rel=1e-6)


# -- configuration -----------------------------------------------------------------------------------------
def test_config_precedence_cli_and_param_groups(tmp_path):
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps({"d_model": 48, "steps": 7, "hybrid_every": 2, "window": 16}))
    args = mtrain.add_arguments(argparse.ArgumentParser()).parse_args(
        [SPEC, "--config", str(cfg_file), "--steps", "9", "--no-progress", "--layer-options", '{"conv": 0}'])
    cfg = mtrain.config_from(None, args.config, {n: getattr(args, n) for n in mtrain.CONFIG_FIELDS})
    assert (cfg.d_model, cfg.steps, cfg.progress, cfg.n_layers) == (48, 9, False, 2)   # flag > file > default
    lm = cfg.lm_config()
    assert (lm.hybrid_every, lm.window, lm.layer_options) == (2, 16, {"conv": 0})
    cfg_file.write_text(json.dumps({"d_modle": 48}))
    with pytest.raises(ValueError, match="d_modle"):
        mtrain.config_from(None, str(cfg_file))
    assert mtrain.main([SPEC, "--dtype", "float16", "--out-dir", str(tmp_path / "x")]) == 2

    model = build(SPEC, mtrain.TrainConfig(d_model=32, n_layers=1).lm_config())
    groups = mtrain.param_groups(model, 0.1)
    assert {g["lr_scale"] for g in groups} == {1.0}      # the default design's gates train at the full rate
    decay, no_decay = (next(g for g in groups if (g["weight_decay"] > 0) == d) for d in (True, False))
    names = {id(p): n for n, p in model.named_parameters()}
    nd = {names[id(p)] for p in no_decay["params"]}
    d = {names[id(p)] for p in decay["params"]}
    assert "embed.weight" in nd and "norm.weight" in nd and any(".initial." in n for n in nd)
    assert any(n.endswith("gate_proj.1.bias") for n in nd) and "blocks.0.mlp.down.weight" in d
    assert not any(".initial." in n or "norm" in n or n.endswith("bias") for n in d)
    assert no_decay["weight_decay"] == 0 and decay["weight_decay"] == 0.1


def test_resume_into_another_spec_or_size_names_the_difference(tmp_path, capsys):
    """`mirasc train --resume` with a run directory of another design or size: exit 2 and a sentence that
    names each difference, not load_state_dict's traceback."""
    from mirasc.cli import main

    run_dir = tmp_path / "run"
    tiny = ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--seq-len", "16", "--batch-size", "2",
            "--max-bytes", "50000", "--eval-windows", "2", "--no-progress"]
    assert main(["train", SPEC, "--steps", "1", "--warmup", "0", "--out-dir", str(run_dir)] + tiny) == 0
    capsys.readouterr()
    other = str(ROOT / "specs" / "titans.miras")
    assert main(["train", other, "--resume", str(run_dir), "--out-dir", str(run_dir)] + tiny) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "state_dict" not in err
    assert "the checkpoint is of another model (spec `gated_deltanet`, step 1)" in err
    assert "memory `linear` in the checkpoint, `mlp(depth=2, expansion=4, act=gelu, residual=true, " \
           "norm=layernorm)` here" in err
    assert "learner `gd(lr=gate)` in the checkpoint, `momentum(lr=gate, theta=gate)` here" in err
    assert "parallel `exact` in the checkpoint, `minibatch(C=64)` here" in err
    bigger = [a if a != "16" else "32" for a in tiny[:2]] + tiny[2:]
    assert main(["train", SPEC, "--resume", "--out-dir", str(run_dir)] + bigger) == 2
    err = capsys.readouterr().err
    assert "d_model 16 in the checkpoint, 32 here" in err and "memory" not in err


def test_default_warmup_ends_within_a_short_run():
    """Unset, the warm-up is min(20, steps // 10): a 20-step run warms up for 2 steps and then decays."""
    short = mtrain.TrainConfig(steps=20)
    assert short.warmup_steps == 2 and mtrain.TrainConfig().warmup_steps == mtrain.DEFAULT_WARMUP == 20
    lrs = [mtrain.lr_at(s, short) for s in range(20)]
    assert lrs[1] == pytest.approx(short.lr) and lrs[-1] == pytest.approx(short.min_lr)
    assert mtrain.TrainConfig(steps=20, warmup=5).warmup_steps == 5
    with pytest.raises(ValueError, match=r"warmup \(20\) must be shorter than steps \(20\)"):
        mtrain.config_from(overrides={"steps": 20, "warmup": 20})


def test_gate_lr_scales_the_gate_projections_step():
    """`gate_lr` reaches the optimiser: Adam's first step moves every parameter by lr·sign(g), so after one step of
    the explore loop the gate projections have moved by gate_lr·lr and the other matrices by lr (weight decay
    shrinks a weight by lr·wd·|w| ≪ lr on top)."""
    from mirasc.lab import models, tasks, trainloop

    torch.manual_seed(0)
    model = build(SPEC, models.LMConfig(d_model=32, n_layers=1, n_heads=2, layer_options={"gate_lr": 0.1}))
    assert model.blocks[0].mixer.gate_lr == 0.1
    groups = trainloop.param_groups(model, 0.1)
    gate = {id(p) for p in model.blocks[0].mixer.gate_proj.parameters()}
    assert all((g["lr_scale"] == 0.1) == (id(g["params"][0]) in gate) for g in groups)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = tasks.make_config("mqar", seq_len=16, num_kv_pairs=2)
    lr = 1e-3
    trainloop.train(model, tasks, "mqar", cfg, steps=1, batch_size=4, lr=lr, weight_decay=0.1, seed=0, log_every=1)
    moved = {n: float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters()}
    gate_moves = [m for n, m in moved.items() if ".gate_proj." in n]
    assert gate_moves and max(gate_moves) == pytest.approx(0.1 * lr, rel=0.05)
    assert moved["blocks.0.mixer.qkv_proj.weight"] == pytest.approx(lr, rel=0.05)


def test_checkpoint_keeps_the_layer_options_it_was_built_with(tmp_path, capsys):
    """A checkpoint records the Layer options its model was built with (the spec's defaults under --layer-options):
    resuming where a default has changed since names the option and the --layer-options that continue the same
    model, and loading the checkpoint builds the model it was trained as, not today's default."""
    from mirasc.cli import main

    run_dir = tmp_path / "run"
    tiny = ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--seq-len", "16", "--batch-size", "2",
            "--max-bytes", "50000", "--eval-windows", "2", "--no-progress"]
    assert main(["train", SPEC, "--steps", "1", "--warmup", "0", "--out-dir", str(run_dir)] + tiny) == 0
    path = run_dir / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=False)
    assert ckpt["layer"]["v_norm"] == "none" and ckpt["layer"]["gate_lr"] == 1.0
    ckpt["layer"]["v_norm"] = "rms"          # as if the model had been built under another default
    torch.save(ckpt, path)
    assert mtrain.load_model(path).blocks[0].mixer.v_norm == "rms"
    capsys.readouterr()
    assert main(["train", SPEC, "--steps", "2", "--warmup", "0", "--resume", "--out-dir", str(run_dir)] + tiny) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "Layer option v_norm = \"rms\" in the checkpoint's model, \"none\" here" in err
    assert "--layer-options '{\"v_norm\": \"rms\"}' continues the checkpoint's model" in err
    assert main(["train", SPEC, "--steps", "2", "--warmup", "0", "--resume", "--out-dir", str(run_dir),
                 "--layer-options", '{"v_norm": "rms"}'] + tiny) == 0


def test_the_run_is_named_after_the_model_not_a_comment():
    """The default run directory takes the spec's model name, for every bundled spec its file's stem; a comment that
    says "the model does ..." above the model line does not name it."""
    specs = sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.miras"))
    assert specs
    for path in specs:
        assert mtrain.spec_name(path.read_text(encoding="utf-8")) == path.stem
    text = "# the model does not read past one chunk\nmodel memora { memory = linear; bias = dot }\n"
    assert mtrain.spec_name(text) == "memora"
