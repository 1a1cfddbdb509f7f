"""`mirasc export --hf`: the exported folder loads with transformers alone (mirasc blocked from import, in a
subprocess), gives mirasc's LanguageModel logits on the same weights, generates greedily what mirasc's
step-by-step cached decoding generates, and survives save_pretrained / from_pretrained."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from mirasc import cli
from mirasc.lab import hf  # noqa: E402
from mirasc.lab.models import LMConfig, build  # noqa: E402
from mirasc.lab.train_config import TrainConfig  # noqa: E402

SPECS = Path(__file__).resolve().parents[2] / "specs"
TINY = dict(d_model=32, n_layers=2, n_heads=2)

# Runs with `python -I` from a directory outside the repository, with every `mirasc` import refused.
LOADER = textwrap.dedent('''
    import json, sys
    class RefuseMirasc:
        def find_spec(self, name, path=None, target=None):
            if name == "mirasc" or name.startswith("mirasc."):
                raise ImportError("mirasc must not be imported here")
    sys.meta_path.insert(0, RefuseMirasc())
    import torch
    from transformers import AutoModelForCausalLM

    report = {}
    for name in sys.argv[1:]:
        case = torch.load(name + ".pt")
        model = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=True).eval()
        calls = []  # the input length of every forward generate() makes: the prompt, then one token each
        def record(module, args, kwargs):
            calls.append((args[0] if args else kwargs["input_ids"]).shape[1])
        model.register_forward_pre_hook(record, with_kwargs=True)
        with torch.no_grad():
            logits = model(case["x"]).logits
            calls.clear()
            generated = model.generate(case["prompt"], max_new_tokens=32, do_sample=False)
            generate_calls = list(calls)
            model.save_pretrained(name + "-again")
            again = AutoModelForCausalLM.from_pretrained(name + "-again", trust_remote_code=True).eval()
            logits_again = again(case["x"]).logits
            # a left-padded batch of the prompt and its first 3 tokens: each row as the prompt alone
            short = case["prompt"][:, :3]
            ids = torch.cat([case["prompt"], torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1)])
            mask = torch.ones_like(ids)
            mask[1, :4] = 0
            padded = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
            alone = model.generate(short, max_new_tokens=8, do_sample=False, pad_token_id=0)
            # in bf16: generate() runs, the memory state stays float32
            half = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=True, dtype=torch.bfloat16).eval()
            half_generated = half.generate(case["prompt"], max_new_tokens=8, do_sample=False)
        report[name] = {
            "logits_err": (logits - case["logits"]).abs().max().item(),
            "same_generation": torch.equal(generated, case["generated"]),
            "calls": generate_calls,
            "reload_err": (logits_again - logits).abs().max().item(),
            "padded_same": torch.equal(padded[0, 7:], generated[0, 7:15]) and torch.equal(padded[1, 7:], alone[0, 3:]),
            "half": [str(half.dtype), list(half_generated.shape)],
            "mirasc_loaded": any(m == "mirasc" or m.startswith("mirasc.") for m in sys.modules),
            "class": type(model).__name__,
        }
    print(json.dumps(report))
''')


def _reference(lm, path: Path, seed: int):
    """mirasc's own logits and greedy cached decoding (LanguageModel.step), saved for the subprocess."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (2, 24), generator=g)
    prompt = torch.randint(0, 256, (1, 7), generator=g)
    lm.eval()
    with torch.no_grad():
        case = {"x": x, "logits": lm(x), "prompt": prompt, "generated": lm.generate(prompt, 32, temperature=0)}
    torch.save(case, path)


def test_exported_model_loads_without_mirasc(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # gated DeltaNet, hybrid (block 2 is sliding-window attention over 8 tokens, in hybrid_mirasc.py), through
    # the CLI with fresh weights (seed 3); the weights are read back into mirasc's LM
    gdn = tmp_path / "gdn"
    assert cli.main(["export", str(SPECS / "gated_deltanet.miras"), "--hf", str(gdn), "--d-model", "32",
                     "--n-layers", "2", "--n-heads", "2", "--hybrid-every", "2", "--window", "8", "--seed", "3"]) == 0
    assert {"config.json", "model.safetensors", "modeling_mirasc.py", "hybrid_mirasc.py"} <= {
        p.name for p in gdn.iterdir()}
    config = json.loads((gdn / "config.json").read_text())
    assert config["model_type"] == "mirasc" and config["d_model"] == 32 and "retention" in config["spec"]
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_mirasc.MirascForCausalLM"
    from safetensors.torch import load_file

    lm = build(SPECS / "gated_deltanet.miras", LMConfig(**TINY, hybrid_every=2, window=8))
    weights = load_file(gdn / "model.safetensors")
    lm.load_state_dict({k.removeprefix("model."): v for k, v in weights.items()})
    _reference(lm, tmp_path / "gdn.pt", seed=1)

    # Titans (MLP memory, momentum, minibatch(64)) through the API, with given weights
    torch.manual_seed(5)
    titans_lm = build(SPECS / "titans.miras", LMConfig(**TINY))
    hf.export(SPECS / "titans.miras", tmp_path / "titans", LMConfig(**TINY), state_dict=titans_lm.state_dict())
    _reference(titans_lm, tmp_path / "titans.pt", seed=2)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "hf_modules"), TRANSFORMERS_VERBOSITY="error")
    run = subprocess.run([sys.executable, "-I", "-c", LOADER, "gdn", "titans"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    for name in ("gdn", "titans"):
        r = report[name]
        assert not r["mirasc_loaded"] and r["class"] == "MirascForCausalLM"
        assert r["logits_err"] <= 1e-6, (name, r)
        assert r["same_generation"], (name, r)
        # the cache was used: the 7-token prompt once, then one token per forward
        assert r["calls"] == [7] + [1] * 31, (name, r["calls"])
        assert r["reload_err"] == 0.0, (name, r)
        assert r["padded_same"] and r["half"] == ["torch.bfloat16", [1, 15]], (name, r)


def test_register_and_checkpoint_export(tmp_path):
    """In-process: AutoConfig / AutoModelForCausalLM know model_type "mirasc"; a `mirasc train` checkpoint
    exports with its weights and sizes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config_cls, model_cls = hf.register()
    spec = (SPECS / "gated_deltanet.miras").read_text()
    config = AutoConfig.for_model("mirasc", spec=spec, **TINY)
    assert isinstance(config, config_cls)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert isinstance(model, model_cls)
    x = torch.randint(0, 256, (1, 9))
    with torch.no_grad():
        out = model(x, labels=x)
        assert out.logits.shape == (1, 9, 256)
        expected = torch.nn.functional.cross_entropy(out.logits[0, :-1], x[0, 1:])
        assert torch.allclose(out.loss, expected)
        # cached token-by-token forward equals the whole-sequence forward
        stepped = model(x, use_cache=True)
        assert stepped.past_key_values.get_seq_length() == 9
        torch.testing.assert_close(stepped.logits, out.logits, rtol=1e-5, atol=1e-6)
        # beam search reorders the state cache: the returned beam's score (sum of its tokens' log-probs,
        # length_penalty 0) equals the score the whole-sequence forward gives that sequence
        beam = model.generate(x[:, :5], num_beams=3, max_new_tokens=6, do_sample=False, length_penalty=0.0,
                              return_dict_in_generate=True, output_scores=True)
        logp = torch.log_softmax(model(beam.sequences).logits, -1)
        rescored = logp[0, 4:-1].gather(-1, beam.sequences[0, 5:, None]).sum()
        torch.testing.assert_close(beam.sequences_scores[0], rescored, rtol=1e-5, atol=1e-5)

    cfg = TrainConfig(d_model=32, n_layers=1, n_heads=2, dtype="float64")
    lm = build(spec, cfg.lm_config()).double()
    from dataclasses import asdict

    torch.save({"model": lm.state_dict(), "spec": spec, "config": asdict(cfg), "step": 1}, tmp_path / "ckpt.pt")
    assert cli.main(["export", "--from-checkpoint", str(tmp_path / "ckpt.pt"), "--hf", str(tmp_path / "out")]) == 0
    loaded = model_cls.from_pretrained(tmp_path / "out")
    assert loaded.dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, lm(x), rtol=0, atol=1e-12)


def test_export_errors(tmp_path, capsys):
    assert cli.main(["export", "--hf", str(tmp_path / "a")]) == 2
    assert "one of the two" in capsys.readouterr().err
    (tmp_path / "bad.miras").write_text("model bad {\n    memory = linear\n    bias = nope\n}\n")
    assert cli.main(["export", str(tmp_path / "bad.miras"), "--hf", str(tmp_path / "b")]) == 2
    assert "bad.miras:3:" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
    (tmp_path / "x.pt").write_bytes(b"not a checkpoint")
    assert cli.main(["export", "--from-checkpoint", str(tmp_path / "x.pt"), "--hf", str(tmp_path / "c")]) == 2


def test_train_export_hf(tmp_path):
    """`mirasc train --export-hf DIR` writes the trained model (the final checkpoint's weights)."""
    from mirasc.lab.train import load_model

    run_dir, out = tmp_path / "run", tmp_path / "hf"
    assert cli.main(["train", str(SPECS / "gated_deltanet.miras"), "--steps", "2", "--warmup", "0", "--out-dir",
                     str(run_dir), "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--seq-len", "16",
                     "--batch-size", "2", "--max-bytes", "50000", "--eval-windows", "2", "--no-progress",
                     "--export-hf", str(out)]) == 0
    _, model_cls = hf.classes()
    exported = model_cls.from_pretrained(out).eval()
    trained = load_model(run_dir / "checkpoint.pt").eval()
    x = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        assert torch.equal(exported(x).logits, trained(x))


# -- half precision, padding, special tokens ------------------------------------------------------------------------
def _greedy_by_steps(lm, prompt, n):
    """Greedy decoding through LanguageModel.step, token by token: the tokens and each step's logits."""
    cache, logits = lm.init_cache(prompt.shape[0]), None
    for t in range(prompt.shape[1]):
        logits, cache = lm.step(prompt[:, t], cache)
    tokens, all_logits = [], []
    for _ in range(n):
        all_logits.append(logits)
        tokens.append(logits.argmax(-1))
        logits, cache = lm.step(tokens[-1], cache)
    return torch.cat([prompt, torch.stack(tokens, 1)], 1), torch.stack(all_logits, 1)


@pytest.mark.parametrize("name", ["gated_deltanet", "titans"])
def test_bf16_generate_equals_bf16_step_decoding(tmp_path, name):
    """An exported model in bf16 generates; its tokens and logits are those of its own bf16 step-by-step
    decoding, and the cached decoding agrees with the bf16 whole-sequence forward to bf16 rounding."""
    _, model_cls = hf.classes()
    if name == "gated_deltanet":  # saved in bf16 (`--dtype bfloat16`): it loads in bf16
        assert cli.main(["export", str(SPECS / f"{name}.miras"), "--hf", str(tmp_path), "--d-model", "32",
                         "--n-layers", "2", "--n-heads", "2", "--dtype", "bfloat16"]) == 0
        model = model_cls.from_pretrained(tmp_path).eval()
    else:  # saved in float32, loaded in bf16
        hf.export(SPECS / f"{name}.miras", tmp_path, LMConfig(**TINY), seed=0)
        model = model_cls.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert model.dtype == torch.bfloat16
    prompt = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=12, do_sample=False, return_dict_in_generate=True,
                             output_logits=True)
        sequences, logits = _greedy_by_steps(model.model, prompt, 12)
        assert logits.dtype == torch.bfloat16
        assert torch.equal(out.sequences, sequences)
        assert torch.equal(torch.stack(out.logits, 1), logits.float())
        full = model(out.sequences).logits[:, 5:-1].float()
    scale = full.abs().max().item()
    assert (full - logits.float()).abs().max().item() <= 4 * 2 ** -8 * scale


def _left_padded(prompts, pad):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = p, 1
    return ids, mask


@pytest.mark.parametrize("name, hybrid", [("gated_deltanet", 0), ("titans", 0), ("gated_deltanet", 2),
                                          ("transformer", 0)])
def test_left_padded_batch_equals_each_prompt_alone(tmp_path, name, hybrid):
    """generate() on a left-padded batch of unequal prompts (attention_mask) gives each row what the prompt
    alone gives: the same tokens, the same logits (float64). Titans runs with minibatch(4), so that rows padded
    by 6 and 3 tokens cross their mini-batch boundaries at other columns than the unpadded row; the hybrid stack's
    second block is sliding-window attention over 4 tokens, and the transformer's cache keeps every pair."""
    text = (SPECS / f"{name}.miras").read_text().replace("minibatch(64)", "minibatch(4)")
    hf.export(text, tmp_path, LMConfig(**TINY, hybrid_every=hybrid, window=4), seed=0, dtype="float64")
    _, model_cls = hf.classes()
    model = model_cls.from_pretrained(tmp_path).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 256, (n,), generator=g) for n in (9, 3, 6)]
    ids, mask = _left_padded(prompts, pad=0)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0,
                             return_dict_in_generate=True, output_logits=True)
        batch_logits = torch.stack(out.logits, 1)
        whole = model(ids, attention_mask=mask).logits  # no cache: left padding runs through a fresh cache
        for i, p in enumerate(prompts):
            alone = model.generate(p[None], max_new_tokens=10, do_sample=False, pad_token_id=0,
                                   return_dict_in_generate=True, output_logits=True)
            assert torch.equal(out.sequences[i, ids.shape[1]:], alone.sequences[0, len(p):]), i
            torch.testing.assert_close(batch_logits[i], torch.stack(alone.logits, 1)[0], rtol=0, atol=1e-12)
            torch.testing.assert_close(whole[i, ids.shape[1] - len(p):], model(p[None]).logits[0], rtol=0,
                                       atol=1e-12)


def test_special_token_ids_in_configs(tmp_path):
    """The tokenizer's end-of-sequence and padding ids go into config.json and generation_config.json (generate
    stops at the end of a document); the byte tokenizer declares none."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GenerationConfig

    from mirasc.lab.tokenizer import load_tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the cat sat on the mat"] * 8, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>", "<pad>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tok.json"))
    tokenizer = load_tokenizer(tmp_path / "tok.json")
    tokenizer.tok.pad_token = "<pad>"
    eos, pad = tokenizer.tok.eos_token_id, tokenizer.tok.pad_token_id
    assert (eos, pad) == (0, 1) and tokenizer.tok.bos_token_id is None
    out = tmp_path / "model"
    hf.export(SPECS / "gated_deltanet.miras", out, LMConfig(vocab_size=280, **TINY), tokenizer_files=tokenizer.files())
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == eos and config["pad_token_id"] == pad and config.get("bos_token_id") is None
    generation = GenerationConfig.from_pretrained(out)
    assert generation.eos_token_id == eos and generation.pad_token_id == pad and generation.bos_token_id is None
    _, model_cls = hf.classes()
    assert model_cls.from_pretrained(out).generation_config.eos_token_id == eos

    hf.export(SPECS / "gated_deltanet.miras", tmp_path / "bytes", LMConfig(**TINY))
    config = json.loads((tmp_path / "bytes" / "config.json").read_text())
    assert all(config.get(name) is None for name in ("bos_token_id", "eos_token_id", "pad_token_id"))
