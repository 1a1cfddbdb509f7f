"""Into the Hugging Face tools: local corpora (JSONL, Parquet, datasets folders) and a
local tokenizer in `mirasc train`, the tokenizer carried by the export, lm-eval on the exported model with
the repository's local tasks (`mirasc eval`), and the transformers Trainer on it under torchrun (2 gloo
processes). Everything is offline: the tokenizer is trained here with `tokenizers`, the corpora are written
here, and the lm-eval test fails on any attempt to open a network connection."""

from __future__ import annotations

import json
import math
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from mirasc import cli  # noqa: E402
from mirasc.lab import data as mdata  # noqa: E402
from mirasc.lab import hf  # noqa: E402
from mirasc.lab.tokenizer import byte_tokenizer_json, load_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPEC = str(ROOT / "specs" / "gated_deltanet.miras")
WORDS = ("the cat sat on a mat and the dog ran to the park with a big red ball under the old tree near our "
         "house while birds sang").split()
TINY = ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--seq-len", "32", "--batch-size", "8",
        "--eval-windows", "8", "--no-progress", "--log-every", "1", "--lr", "1e-2", "--warmup", "2"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 40))).capitalize() + "." for _ in range(n)]


def _train_tokenizer(path: Path, docs: list[str]) -> Path:
    """A byte-level BPE of 300 tokens trained on the documents, with <|endoftext|> as a special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A JSONL and a Parquet corpus of the same 160 documents, and a BPE tokenizer trained on them."""
    root = tmp_path_factory.mktemp("corpus")
    docs = _documents(160)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)))
    pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), root / "corpus.parquet")
    return {"root": root, "docs": docs, "jsonl": root / "corpus.jsonl", "parquet": root / "corpus.parquet",
            "tokenizer": _train_tokenizer(root / "tokenizer.json", docs)}


# -- corpora and tokenizers ------------------------------------------------------------------------------------
def test_local_formats_split_and_tokenize(corpus, tmp_path):
    docs, tok = corpus["docs"], load_tokenizer(corpus["tokenizer"])
    assert tok.vocab_size == 300 and tok.separator == [tok.tok.convert_tokens_to_ids("<|endoftext|>")]

    # JSONL, text field named by text_field; ids FILE#LINE; split by hash of the id, deterministic
    found = mdata.find_documents(corpus["jsonl"], text_field="body")
    assert found.format == "jsonl" and found.ids[:2] == ["corpus.jsonl#1", "corpus.jsonl#2"]
    assert [found.read(i).decode() for i in found.ids] == docs
    c = mdata.load_corpus(corpus["jsonl"], tokenizer=tok, text_field="body", val_fraction=0.1)
    assert c.unit == "tokens" and c.train.dtype == torch.int32 and c.val_files
    assert set(c.train_files).isdisjoint(c.val_files) and len(c.train_files) + len(c.val_files) == 160
    assert c.val_files == mdata.split_files(found.ids, 0.1)[1]
    # the validation tensor is the held-out documents' tokens joined by <|endoftext|>
    held_out = [docs[int(i.split("#")[1]) - 1] for i in c.val_files]
    expected = []
    for n, d in enumerate(held_out):
        expected += (tok.separator if n else []) + tok.tok(d, add_special_tokens=False)["input_ids"]
    assert c.val.tolist() == expected
    assert c.val_bytes == sum(len(d.encode()) for d in held_out) + 2 * (len(held_out) - 1)
    assert tok.decode(c.val[:len(expected)].tolist()).startswith(held_out[0])

    # Parquet: the same documents by row; bytes when no tokenizer
    p = mdata.load_corpus(corpus["parquet"], val_fraction=0.1)
    assert p.format == "parquet" and p.unit == "bytes" and p.train.dtype == torch.uint8
    rows = [docs[int(i.split("#")[1])] for i in p.train_files]
    assert bytes(p.train.tolist()) == mdata.SEPARATOR.join(d.encode() for d in rows)

    # a datasets save_to_disk folder with its own validation split, which is used as given
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs[:150]}),
                          "validation": datasets.Dataset.from_dict({"text": docs[150:]})}).save_to_disk(str(saved))
    d = mdata.load_corpus(saved, tokenizer=tok)
    assert d.format == "datasets" and d.val_files == [f"validation#{i}" for i in range(10)]

    # errors name the file, line and the fields found
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: no 'text' field \(found \['body'\]\)"):
        mdata.load_corpus(bad)
    with pytest.raises(ValueError, match="no column 'body'"):
        mdata.load_corpus(corpus["parquet"], text_field="body")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="not a readable Parquet file"):
        mdata.load_corpus(tmp_path / "broken.parquet")
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        load_tokenizer(tmp_path / "gpt2")


def test_byte_tokenizer_is_the_identity_on_bytes():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(byte_tokenizer_json())
    text = "héllo\n\n\tworld \x00 ∑ 😀"
    assert tok.encode(text).ids == list(text.encode()) and tok.decode(list(text.encode())) == text
    assert tok.get_vocab_size() == 256


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """`mirasc train` from the JSONL corpus with the BPE tokenizer, exported with --export-hf."""
    out = tmp_path_factory.mktemp("trained")
    args = ["train", SPEC, "--data", str(corpus["jsonl"]), "--text-field", "body", "--tokenizer",
            str(corpus["tokenizer"]), "--steps", "30", "--out-dir", str(out / "run"), "--export-hf", str(out / "hf"),
            *TINY]
    assert cli.main(args) == 0
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    return {"run": out / "run", "hf": out / "hf", "records": records}


def _loss_falls(records, drop):
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - drop, (first, last)
    return first, last


def test_train_with_local_tokenizer_jsonl_and_parquet(corpus, trained, tmp_path):
    from transformers import AutoTokenizer

    from mirasc.lab.train import load_model

    records = trained["records"]
    config = records[0]
    assert config["unit"] == "tokens" and config["config"]["vocab_size"] == 300
    first, _ = _loss_falls(records, 1.0)
    assert first > math.log(300) - 0.5       # about uniform over the 300 tokens at the start
    final = records[-1]
    assert final["kind"] == "final" and math.isfinite(final["val_bpb"])

    # the export carries the tokenizer; the exported model is the checkpoint's, on the tokenizer's ids
    tok = AutoTokenizer.from_pretrained(trained["hf"], local_files_only=True, trust_remote_code=True)
    assert len(tok) == 300 and tok.eos_token == "<|endoftext|>"
    hf_config = json.loads((trained["hf"] / "config.json").read_text())
    assert hf_config["vocab_size"] == 300 and hf_config["document_separator"] == [tok.eos_token_id]
    _, model_cls = hf.classes()
    exported = model_cls.from_pretrained(trained["hf"]).eval()
    ids = torch.tensor([tok("the cat sat on the mat")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, load_model(trained["run"] / "checkpoint.pt")(ids),
                                   rtol=0, atol=0)

    # fresh weights exported with a tokenizer: the vocabulary follows it, the folder carries it
    fresh = tmp_path / "fresh"
    assert cli.main(["export", SPEC, "--hf", str(fresh), "--tokenizer", str(corpus["tokenizer"]), "--d-model", "16",
                     "--n-layers", "1", "--n-heads", "2"]) == 0
    assert json.loads((fresh / "config.json").read_text())["vocab_size"] == 300
    assert len(AutoTokenizer.from_pretrained(fresh, local_files_only=True, trust_remote_code=True)) == 300

    # Parquet, the same tokenizer (a copy), a fresh run (checkpoint only: the export is covered above)
    run, tok_copy = tmp_path / "parquet", tmp_path / "tok.json"
    tok_copy.write_bytes(corpus["tokenizer"].read_bytes())
    assert cli.main(["train", SPEC, "--data", str(corpus["parquet"]), "--tokenizer", str(tok_copy),
                     "--steps", "20", "--out-dir", str(run), *TINY]) == 0
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["config"]["data"] == str(corpus["parquet"]) and recs[0]["unit"] == "tokens"
    _loss_falls(recs, 0.7)
    # resuming with another tokenizer is refused; without --tokenizer the checkpoint's copy is used, so the
    # run continues after the original file is gone
    (tmp_path / "bytes.json").write_text(byte_tokenizer_json())
    resume = ["train", SPEC, "--data", str(corpus["parquet"]), "--steps", "22", "--out-dir", str(run), "--resume",
              *TINY]
    assert cli.main([*resume, "--tokenizer", str(tmp_path / "bytes.json")]) == 2
    tok_copy.unlink()
    assert cli.main(resume) == 0
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["kind"] == "final" and recs[-1]["step"] == 22


# -- lm-eval -----------------------------------------------------------------------------------------------
@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection (other than a local socket pair) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:] if len(args) > 1 else kwargs}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def _bits_per_byte(model, tok, texts, prefix):
    """Held-out bits per byte computed here: every document after the prefix token, one forward each."""
    nll, size = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([[prefix] + tok(text, add_special_tokens=False)["input_ids"]])
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
            nll -= logp.gather(-1, ids[0, 1:, None]).sum().item()
            size += len(text.encode())
    return nll / size / math.log(2)


def test_lm_eval_on_exported_model(corpus, trained, tmp_path, no_network, capsys):
    pytest.importorskip("lm_eval")
    from transformers import AutoTokenizer

    from mirasc.lab import evaluation

    out = tmp_path / "results.json"
    assert cli.main(["eval", str(trained["hf"]), "--tasks", "ppl,cloze,mqar,niah", "--data", str(corpus["jsonl"]),
                     "--text-field", "body", "--examples", "3", "--mqar-seq-len", "24", "--mqar-kv-pairs", "3",
                     "--niah-seq-len", "160", "--device", "cpu", "--output", str(out),
                     "--task-dir", str(tmp_path / "tasks")]) == 0
    printed = capsys.readouterr().out
    assert "lm-eval run --model hf --model_args pretrained=" in printed and "--include_path" in printed
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"mirasc_ppl", "mirasc_cloze", "mirasc_mqar", "mirasc_niah"}
    for task in ("mirasc_cloze", "mirasc_mqar", "mirasc_niah"):
        assert 0.0 <= results[task]["acc,none"] <= 1.0
    assert math.isfinite(results["mirasc_cloze"]["perplexity,none"])

    # lm-eval's bits per byte on the held-out documents equals the one computed here from the model's logits
    # (each document fits in one window, after the prefix token: the end-of-text the corpus joined them with)
    held_out = evaluation.heldout_documents(corpus["jsonl"], text_field="body")
    assert held_out and len(held_out) < 160
    tok = AutoTokenizer.from_pretrained(trained["hf"], local_files_only=True, trust_remote_code=True)
    _, model_cls = hf.classes()
    model = model_cls.from_pretrained(trained["hf"]).eval()
    ours = _bits_per_byte(model, tok, held_out, tok.eos_token_id)
    assert results["mirasc_ppl"]["bits_per_byte,none"] == pytest.approx(ours, rel=1e-5)
    # the trained model is far better than a uniform guess over its 300 tokens
    assert ours < 0.8 * math.log2(300) * len(tok(" ".join(held_out))["input_ids"]) / len(" ".join(held_out))

    # the task files: deterministic, MQAR one row per query with the generator's value as the target
    rows = [json.loads(line) for line in (tmp_path / "tasks" / "mirasc_mqar.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 3 and all(r["target"][0] == " " and "P" <= r["target"][1] <= "}" for r in rows)
    assert evaluation.mqar_rows(3, 0, 24, 3) == rows


def test_eval_errors(tmp_path, capsys):
    assert cli.main(["eval", str(tmp_path), "--tasks", "mqar"]) == 2
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    assert cli.main(["eval", str(tmp_path), "--tasks", "mqar"]) == 2
    assert "no tokenizer beside the model" in capsys.readouterr().err
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    assert cli.main(["eval", str(tmp_path), "--tasks", "ppl"]) == 2
    assert "give --data" in capsys.readouterr().err
    assert cli.main(["eval", str(tmp_path), "--tasks", "mmlu"]) == 2
    assert "unknown task" in capsys.readouterr().err


# -- transformers Trainer, 2 processes -------------------------------------------------------------------------
def test_transformers_trainer_ddp_two_processes(tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("datasets")
    from safetensors.torch import load_file

    from mirasc.lab.models import LMConfig

    model_dir, out = tmp_path / "model", tmp_path / "trained"
    hf.export(SPEC, model_dir, LMConfig(d_model=32, n_layers=1, n_heads=2), seed=1)  # bytes, fresh weights
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in _documents(120, seed=1)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("PYTHONPATH", None)  # the example needs transformers and datasets only, not mirasc
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "examples" / "hf_trainer.py"), str(model_dir), str(corpus), str(out),
           "--max-steps", "12", "--block-size", "32", "--batch-size", "4", "--lr", "1e-2"]
    start = time.perf_counter()
    run = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    elapsed = time.perf_counter() - start
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads((out / "trainer_summary.json").read_text())
    assert summary["world_size"] == 2 and "DISTRIBUTED" in summary["parallel_mode"], summary
    assert summary["steps"] == 12 and len(summary["losses"]) == 12
    losses = summary["losses"]
    assert losses[0] > 5.0 and sum(losses[-3:]) / 3 < losses[0] - 1.0, losses   # ln 256 = 5.55 at the start
    # the saved folder is a model like the one it came from, with new weights and the byte tokenizer
    _, model_cls = hf.classes()
    trained = model_cls.from_pretrained(out).eval()
    before = load_file(model_dir / "model.safetensors")
    after = load_file(out / "model.safetensors")
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
    assert (out / "tokenizer.json").is_file() and (out / "modeling_mirasc.py").is_file()
    with torch.no_grad():
        assert trained(torch.tensor([list(b"the cat")])).logits.shape == (1, 7, 256)
    print(f"torchrun x2 with the Trainer: {elapsed:.1f} s")
