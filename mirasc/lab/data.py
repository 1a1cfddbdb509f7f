"""Training data that never leaves the machine: bytes by default, token ids with a local tokenizer.

The default corpus is the Python standard library's own source (``sysconfig.get_paths()["stdlib"]``,
``*.py`` files, test directories and site-packages skipped), read in sorted order of relative path.
``--data PATH`` reads instead (``--data-format auto`` tells them apart):

- a folder of text files: every text-like file under it (a document per file);
- JSONL: a ``.jsonl`` / ``.json`` file or a folder of them, a document per record's ``text`` field
  (``--text-field``); a ``.json`` file may also hold one JSON array of records;
- Parquet: a ``.parquet`` file or a folder of them, a document per row of the text column (pyarrow);
- a folder written by ``datasets``' ``save_to_disk`` (a Dataset, or a DatasetDict whose "train" split is
  trained on and whose "validation" or "test" split, when there is one, is the validation set).

The corpus is split into train and validation **by document**: a document is in validation iff the
SHA-256 of its id (the relative path of a file, ``FILE#LINE`` of a JSONL record, ``FILE#ROW`` of a
Parquet row), read as a number in [0, 1), is below ``val_fraction`` — deterministic across runs, machines
and hash seeds, and independent of which other documents exist. Documents are joined with a blank line
into one ``uint8`` tensor per split, or, with a tokenizer (mirasc.lab.tokenizer), encoded and joined with its
end-of-sequence token into one ``int32`` tensor.

`BatchSampler` draws ``[B, T]`` int64 windows (inputs and next-token targets) from such a tensor. Batch
``step`` depends only on ``(seed, step)``, so a resumed run sees exactly the batches an uninterrupted one
would, and under data parallelism rank r of W takes rows ``[r·B/W, (r+1)·B/W)`` of the same global batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
TEXT_EXTENSIONS = frozenset({
    ".txt", ".md", ".rst", ".tex", ".org", ".adoc", ".csv", ".tsv", ".json", ".jsonl", ".yaml", ".yml",
    ".toml", ".ini", ".cfg", ".xml", ".html", ".htm", ".css", ".py", ".pyi", ".c", ".h", ".cc", ".cpp",
    ".hpp", ".rs", ".go", ".java", ".js", ".ts", ".sh", ".lua", ".rb", ".pl", ".r", ".jl", ".sql",
    ".miras", ".lark"})
SEPARATOR = b"\n\n"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _walk(root: Path, keep) -> list[str]:
    """Relative POSIX paths of the files under root accepted by keep(name), sorted; skipped and hidden
    directories are pruned (not descended into)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        rel = Path(dirpath).relative_to(root)
        out.extend((rel / f).as_posix() for f in filenames if keep(f) and not f.startswith("."))
    return sorted(out)


def stdlib_files(root: Path | None = None) -> list[str]:
    """The default corpus' files: relative paths of the stdlib's *.py sources, sorted."""
    return _walk(root or stdlib_root(), lambda f: f.endswith(".py"))


def text_files(root: str | Path) -> list[str]:
    """Every file under root with a text-like extension (`TEXT_EXTENSIONS`), sorted by relative path."""
    return _walk(Path(root), lambda f: Path(f).suffix.lower() in TEXT_EXTENSIONS)


def split_value(relpath: str) -> float:
    """A deterministic number in [0, 1) for a relative path (first 8 bytes of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big") / 2.0**64


def split_files(files: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, val) by file. If no file falls under val_fraction (tiny folders), the file with the smallest
    split value becomes validation, so both splits are non-empty whenever there are two files or more."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    val = [f for f in files if split_value(f) < val_fraction]
    if not val and len(files) >= 2:
        val = [min(files, key=split_value)]
    chosen = set(val)
    return [f for f in files if f not in chosen], val


FORMATS = ("auto", "text", "jsonl", "parquet", "datasets")
JSONL_SUFFIXES = (".jsonl", ".json")
DATA_EXTRA = "pip install 'mirasc[data]'"


@dataclass
class Documents:
    """A corpus' documents before the split: ids in reading order (relative file paths for a text folder,
    "FILE#LINE" for JSONL, "FILE#ROW" for Parquet, "SPLIT#ROW" for a saved `datasets` folder) and a
    reader from id to the document's UTF-8 bytes. given_val: the ids of a validation split the dataset
    itself names (a DatasetDict's "validation" or "test"), else None (split by hash)."""

    root: str
    format: str
    ids: list[str]
    read: Callable[[str], bytes]
    given_val: list[str] | None = None


def _detect(path: Path) -> str:
    """The format of --data PATH when --data-format is auto."""
    if path.is_file():
        name = path.name.lower()
        if name.endswith(JSONL_SUFFIXES):
            return "jsonl"
        if name.endswith(".parquet"):
            return "parquet"
        raise ValueError(f"--data {path}: a single file must be .jsonl, .json or .parquet (a text corpus is a "
                         "folder of text files: the train/validation split is by file)")
    if (path / "dataset_dict.json").is_file() or ((path / "state.json").is_file()
                                                   and (path / "dataset_info.json").is_file()):
        return "datasets"  # written by datasets' save_to_disk (a DatasetDict, or a Dataset)
    texts = text_files(path)
    if _walk(path, lambda f: f.lower().endswith(".parquet")) and not texts:
        return "parquet"
    if texts and all(f.lower().endswith(JSONL_SUFFIXES) for f in texts):
        return "jsonl"
    return "text"


def _record_text(value, where: str, text_field: str) -> bytes | None:
    if value is None:
        return None  # a null text (Parquet/datasets): no document
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {text_field!r} is {type(value).__name__}, not a string")
    return value.encode("utf-8")


def _jsonl_records(root: Path, text_field: str) -> dict[str, bytes]:
    files = [root.name] if root.is_file() else _walk(root, lambda f: f.lower().endswith(JSONL_SUFFIXES))
    base = root.parent if root.is_file() else root
    records = {}
    for rel in files:
        path = base / rel
        text = path.read_text(encoding="utf-8")
        stripped = text.lstrip()
        if rel.lower().endswith(".json") and stripped.startswith("["):  # a JSON array of objects
            try:
                rows = list(enumerate(json.loads(text), 1))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: not valid JSON ({err})") from None
            label = "item"
        else:
            rows = []
            for line_no, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append((line_no, json.loads(line)))
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{path}:{line_no}: not a JSON object ({err.msg})") from None
            label = "line"
        for n, row in rows:
            where = f"{path}:{n}" if label == "line" else f"{path} item {n}"
            if not isinstance(row, dict) or text_field not in row:
                keys = sorted(row) if isinstance(row, dict) else type(row).__name__
                raise ValueError(f"{where}: no {text_field!r} field (found {keys}); name the text field "
                                 "with --text-field (or read the files as plain text with --data-format text)")
            blob = _record_text(row[text_field], where, text_field)
            if blob is not None:
                records[f"{rel}#{n}"] = blob
    return records


def _parquet_records(root: Path, text_field: str) -> dict[str, bytes]:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ValueError(f"Parquet data needs pyarrow ({DATA_EXTRA}): {err}") from None
    files = [root.name] if root.is_file() else _walk(root, lambda f: f.lower().endswith(".parquet"))
    base = root.parent if root.is_file() else root
    records = {}
    import pyarrow as pa

    for rel in files:
        try:
            schema = pq.read_schema(base / rel)
            if text_field not in schema.names:
                raise ValueError(f"{base / rel}: no column {text_field!r} (columns: {schema.names}); name the "
                                 "text column with --text-field")
            column = pq.read_table(base / rel, columns=[text_field]).column(text_field).to_pylist()
        except pa.ArrowException as err:
            raise ValueError(f"{base / rel}: not a readable Parquet file ({err})") from None
        for i, value in enumerate(column):
            blob = _record_text(value, f"{base / rel} row {i}", text_field)
            if blob is not None:
                records[f"{rel}#{i}"] = blob
    return records


def _datasets_records(root: Path, text_field: str) -> tuple[dict[str, bytes], list[str] | None]:
    try:
        import datasets
    except ImportError as err:
        raise ValueError(f"a saved datasets folder needs the datasets library ({DATA_EXTRA}): {err}") from None
    loaded = datasets.load_from_disk(str(root))
    splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    if "train" not in splits:
        raise ValueError(f"--data {root}: a DatasetDict without a 'train' split (splits: {sorted(splits)})")
    held_out = next((name for name in ("validation", "test") if name in splits), None)
    records, given_val = {}, None
    for name in ["train"] + ([held_out] if held_out else []):
        ds = splits[name]
        if text_field not in ds.column_names:
            raise ValueError(f"--data {root} split {name}: no column {text_field!r} (columns: {ds.column_names}); "
                             "name the text column with --text-field")
        ids = []
        for i, value in enumerate(ds[text_field]):
            blob = _record_text(value, f"{root} split {name} row {i}", text_field)
            if blob is not None:
                records[f"{name}#{i}"] = blob
                ids.append(f"{name}#{i}")
        if name == held_out:
            given_val = ids
    return records, given_val


def find_documents(data: str | Path | None = None, data_format: str = "auto", text_field: str = "text") -> Documents:
    """The documents of --data: the stdlib sources (None), a text folder, JSONL or Parquet files (one file or
    a folder of them; each record's `text_field` is a document), or a `datasets` save_to_disk folder."""
    if data_format not in FORMATS:
        raise ValueError(f"--data-format must be one of {', '.join(FORMATS)}, got {data_format!r}")
    if data is None:
        root = stdlib_root()
        return Documents(str(root), "text", stdlib_files(root), lambda f: (root / f).read_bytes())
    path = Path(data)
    if not path.exists():
        raise FileNotFoundError(f"--data {data}: no such file or folder")
    fmt = _detect(path) if data_format == "auto" else data_format
    if fmt == "text":
        if not path.is_dir():
            raise FileNotFoundError(f"--data {data}: not a directory (a text corpus is a folder of text files)")
        files = text_files(path)
        if not files:
            raise FileNotFoundError(f"no text files under {path} (extensions: {' '.join(sorted(TEXT_EXTENSIONS))})")
        return Documents(str(path), fmt, files, lambda f: (path / f).read_bytes())
    given_val = None
    if fmt == "jsonl":
        records = _jsonl_records(path, text_field)
    elif fmt == "parquet":
        records = _parquet_records(path, text_field)
    else:
        if not path.is_dir():
            raise ValueError(f"--data {data}: a saved datasets corpus is a folder (datasets' save_to_disk)")
        records, given_val = _datasets_records(path, text_field)
    if not records:
        raise ValueError(f"--data {data}: no {fmt} records with a {text_field!r} text")
    return Documents(str(path), fmt, list(records), records.__getitem__, given_val)


def _gather(docs: Documents, ids: list[str], cap: int | None) -> tuple[list[bytes], list[str]]:
    """The documents' bytes in the given order, until their total with SEPARATOR between them reaches cap
    (the last one cut to fit)."""
    out, used, size = [], [], 0
    for i in ids:
        if cap is not None and size >= cap:
            break
        blob = docs.read(i)
        size += len(blob) + (len(SEPARATOR) if out else 0)
        out.append(blob)
        used.append(i)
    if cap is not None and size > cap:
        out[-1] = out[-1][:max(0, len(out[-1]) - (size - cap))]
    return out, used


def _encode(blobs: list[bytes], tokenizer) -> torch.Tensor:
    """One tensor of the documents: bytes joined by SEPARATOR (uint8), or token ids joined by the
    tokenizer's separator (int32)."""
    if tokenizer is None or tokenizer.kind == "bytes":
        data = SEPARATOR.join(blobs)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    ids: list[int] = []
    for n, tokens in enumerate(tokenizer.encode_batch(blobs)):
        if n:
            ids.extend(tokenizer.separator)
        ids.extend(tokens)
    return torch.tensor(ids, dtype=torch.int32)


@dataclass
class Corpus:
    train: torch.Tensor                       # uint8 bytes, or int32 token ids [N_train]
    val: torch.Tensor                         # [N_val]
    root: str
    train_files: list[str] = field(default_factory=list)   # the documents actually read (after the cap)
    val_files: list[str] = field(default_factory=list)
    format: str = "text"
    unit: str = "bytes"                       # what one position of train/val is: bytes or tokens
    train_bytes: int = 0                      # UTF-8 bytes of text behind train / val (separators included)
    val_bytes: int = 0

    @property
    def tokens_per_byte(self) -> float:
        """Validation tokens per byte of validation text (1 for bytes): converts nats/token to nats/byte."""
        return len(self.val) / self.val_bytes if self.val_bytes else 1.0

    @property
    def train_tokens_per_byte(self) -> float:
        """Training tokens per byte of training text (1 for bytes)."""
        return len(self.train) / self.train_bytes if self.train_bytes else 1.0

    def describe(self) -> str:
        what = "files" if self.format == "text" else f"{self.format} documents"
        if self.unit == "bytes":
            return (f"{self.root}: train {len(self.train):,} bytes ({len(self.train_files)} {what}), "
                    f"val {len(self.val):,} bytes ({len(self.val_files)} {what})")
        return (f"{self.root}: train {len(self.train):,} tokens of {self.train_bytes:,} bytes "
                f"({len(self.train_files)} {what}), val {len(self.val):,} tokens of {self.val_bytes:,} bytes "
                f"({len(self.val_files)} {what})")


def split_documents(docs: Documents, val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, val) ids: the dataset's own validation split where it has one, else by hash of the id."""
    if docs.given_val is not None:
        chosen = set(docs.given_val)
        return [i for i in docs.ids if i not in chosen], list(docs.given_val)
    if len(docs.ids) < 2:
        what = "text file" if docs.format == "text" else "document"
        raise ValueError(f"{docs.root} has a single {what} ({docs.ids[0]}); the train/validation split is by "
                         f"{'file' if docs.format == 'text' else 'document'}, so at least two are needed")
    return split_files(docs.ids, val_fraction)


def load_corpus(data_dir: str | Path | None = None, *, max_bytes: int | None = None,
                val_fraction: float = 0.05, tokenizer=None, data_format: str = "auto",
                text_field: str = "text") -> Corpus:
    """The training corpus: the stdlib sources (data_dir None), a text folder, JSONL / Parquet files or a saved
    `datasets` folder (see `find_documents`), split into train and validation by document, as bytes or
    (with a tokenizer from mirasc.lab.tokenizer) as token ids.

    max_bytes caps the total text read: train gets the first ⌈(1 − val_fraction)·max_bytes⌉ bytes of its
    documents in order, validation the rest of the budget (at least 1 KiB where the documents have it).
    Nothing is ever downloaded."""
    docs = find_documents(data_dir, data_format, text_field)
    train_ids, val_ids = split_documents(docs, val_fraction)
    train_cap = val_cap = None
    if max_bytes is not None:
        if max_bytes <= 1:
            raise ValueError(f"max_bytes must be > 1, got {max_bytes}")
        train_cap = max(1, round(max_bytes * (1 - val_fraction)))
        val_cap = max(max_bytes - train_cap, min(1024, max_bytes))
    train_blobs, train_used = _gather(docs, train_ids, train_cap)
    val_blobs, val_used = _gather(docs, val_ids, val_cap)

    def size(blobs):
        return sum(map(len, blobs)) + len(SEPARATOR) * max(0, len(blobs) - 1)

    unit = "bytes" if tokenizer is None or tokenizer.kind == "bytes" else "tokens"
    return Corpus(_encode(train_blobs, tokenizer), _encode(val_blobs, tokenizer), docs.root, train_used, val_used,
                  docs.format, unit, size(train_blobs), size(val_blobs))


class BatchSampler:
    """Random [B, T] windows: x = data[s : s+T], y = data[s+1 : s+T+1] as int64.

    `batch(step)` is a pure function of (seed, step, rank, world_size): the global batch of `batch_size`
    rows is drawn with a generator seeded by (seed, step) and this rank keeps its contiguous share.
    Iterating yields batch(start), batch(start + 1), ..."""

    def __init__(self, data: torch.Tensor, batch_size: int, seq_len: int, *, seed: int = 0,
                 rank: int = 0, world_size: int = 1, start: int = 0):
        if data.dtype not in (torch.uint8, torch.int16, torch.int32, torch.int64) or data.dim() != 1:
            raise TypeError("data must be a 1-D tensor of bytes (uint8) or token ids (int16/int32/int64)")
        if len(data) < seq_len + 2:
            raise ValueError(f"corpus of {len(data)} bytes is too small for seq_len {seq_len}")
        if batch_size % world_size:
            raise ValueError(f"global batch size {batch_size} is not divisible by world size {world_size}")
        self.data, self.batch_size, self.seq_len, self.seed = data, batch_size, seq_len, seed
        self.rank, self.world_size, self.step = rank, world_size, start
        self.local = batch_size // world_size
        self._offsets = torch.arange(seq_len + 1)

    def starts(self, step: int) -> torch.Tensor:
        """The global batch's window starts at `step` (all ranks agree)."""
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) % (2**63 - 1))
        return torch.randint(0, len(self.data) - self.seq_len - 1, (self.batch_size,), generator=g)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.starts(step)[self.rank * self.local:(self.rank + 1) * self.local]
        w = self.data[s[:, None] + self._offsets].long()
        return w[:, :-1], w[:, 1:]

    def __iter__(self):
        return self

    def __next__(self):
        out = self.batch(self.step)
        self.step += 1
        return out


def eval_windows(data: torch.Tensor, seq_len: int, max_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic validation windows: up to max_windows non-overlapping [T] windows evenly spread over
    data (all of it when it is short enough). Returns (x, y) of shape [N, T]."""
    n_all = (len(data) - 1) // seq_len
    if n_all < 1:
        raise ValueError(f"validation split of {len(data)} bytes is too small for seq_len {seq_len}")
    n = min(n_all, max_windows)
    starts = torch.linspace(0, (n_all - 1) * seq_len, n).long() // seq_len * seq_len
    w = data[starts[:, None] + torch.arange(seq_len + 1)].long()
    return w[:, :-1], w[:, 1:]
