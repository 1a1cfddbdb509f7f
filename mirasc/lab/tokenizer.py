"""Tokenizers for `mirasc train`: bytes (the default, no dependency) or a local Hugging Face tokenizer.

`load_tokenizer(None)` is `ByteTokenizer` (token = byte, vocabulary 256). `load_tokenizer(PATH)` reads a
`tokenizers` file (`tokenizer.json`) or a folder written by `save_pretrained` (tokenizer.json,
tokenizer_config.json, ... or a slow tokenizer's files) through `transformers` (the hf extra), from the
local disk only: a path that does not exist is an error, never a Hub repository id, and nothing is
downloaded (`local_files_only=True`).

Documents are joined with the tokenizer's end-of-sequence token when it has one, else with the encoding
of a blank line (what the byte corpus uses). A bare tokenizer.json carries no tokenizer_config.json to
name its special tokens, so its end-of-sequence token is taken from its added special tokens when one of
them has a usual name (`EOS_NAMES`).

`files()` is the tokenizer as `save_pretrained` writes it ({file name: bytes}): `mirasc train` stores it in
its checkpoints so that `mirasc export --from-checkpoint` can put the same tokenizer beside the model. A
byte-level model is exported with `byte_tokenizer_files()`, a `tokenizers` file whose ids are the bytes,
so lm-eval and `transformers` pipelines read text for it too.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[EOS]", "<|eos|>")
HF_EXTRA = "pip install 'mirasc[hf]'"


def offline():
    """Make every Hugging Face library that is imported after this refuse the network (the Hub's offline
    switches); explicit local_files_only arguments cover those already imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


class ByteTokenizer:
    """Token = byte. Text is encoded as UTF-8; documents are separated by a blank line."""

    kind = "bytes"
    vocab_size = 256
    separator = [10, 10]
    source = "bytes"

    def encode_batch(self, docs: list[bytes]) -> list[list[int]]:
        return [list(d) for d in docs]

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def files(self) -> None:
        return None


class HFTokenizer:
    """A transformers tokenizer (fast or slow) read from the local disk."""

    kind = "tokens"

    def __init__(self, tokenizer, source: str):
        self.tok, self.source = tokenizer, source
        self.vocab_size = len(tokenizer)  # added tokens included
        eos = tokenizer.eos_token_id
        self.separator = [eos] if eos is not None else self._encode(["\n\n"])[0]
        if not self.separator:
            raise ValueError(f"tokenizer {source}: encodes a blank line as no token and has no end-of-sequence "
                             "token, so documents could not be told apart")

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def encode_batch(self, docs: list[bytes]) -> list[list[int]]:
        return self._encode([d.decode("utf-8", errors="replace") for d in docs])

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])

    def files(self) -> dict[str, bytes]:
        with tempfile.TemporaryDirectory() as tmp:
            self.tok.save_pretrained(tmp)
            return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def _import_transformers():
    offline()
    try:
        import transformers
    except ImportError as err:
        raise ValueError(f"--tokenizer needs the hf extra ({HF_EXTRA}): {err}") from None
    return transformers


def load_tokenizer(path: str | Path | None):
    """ByteTokenizer (path None or "bytes") or the tokenizer at path (a tokenizer.json file or a folder)."""
    if path is None or str(path) == "bytes":
        return ByteTokenizer()
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"--tokenizer {path}: no such file or folder (a tokenizer.json file or a local "
                                "tokenizer folder; nothing is downloaded)")
    transformers = _import_transformers()
    try:
        if p.is_file():
            tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(p))
            specials = {t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values() if t.special}
            eos = next((name for name in EOS_NAMES if name in specials), None)
            if eos is not None:
                tok.eos_token = eos
        else:
            tok = transformers.AutoTokenizer.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # transformers and tokenizers raise many types for an unreadable tokenizer
        raise ValueError(f"--tokenizer {path}: cannot read a tokenizer there ({type(err).__name__}: {err})") from None
    return HFTokenizer(tok, str(p))


def tokenizer_from_files(files: dict[str, bytes]) -> HFTokenizer:
    """The tokenizer stored in a checkpoint (`HFTokenizer.files()`)."""
    with tempfile.TemporaryDirectory() as tmp:
        write_files(files, tmp)
        tok = load_tokenizer(tmp)
        tok.source = "checkpoint"
        return tok


def write_files(files: dict[str, bytes], out_dir: str | Path) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, blob in files.items():
        (out / Path(name).name).write_bytes(blob)


def _byte_to_char() -> dict[int, str]:
    """The byte -> printable character table of byte-level BPE (GPT-2): printable Latin-1 bytes map to
    themselves, the other bytes to the characters from U+0100 on, in order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_tokenizer_json() -> str:
    """A `tokenizers` tokenizer (tokenizer.json text) whose token ids are the UTF-8 bytes of the text: a
    byte-level BPE with the 256 single bytes as its vocabulary and no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in _byte_to_char().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str(pretty=True)


def byte_tokenizer_files() -> dict[str, bytes]:
    """tokenizer.json and tokenizer_config.json of the byte tokenizer (for a byte-level model's export)."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1_000_000_000,
              "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": byte_tokenizer_json().encode(),
            "tokenizer_config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()}
