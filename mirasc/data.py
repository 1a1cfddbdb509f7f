"""Byte-level training data that never leaves the machine.

The default corpus is the Python standard library's own source (``sysconfig.get_paths()["stdlib"]``,
``*.py`` files, test directories and site-packages skipped), read in sorted order of relative path.
``--data DIR`` uses every text-like file under DIR instead. Either way the corpus is split into train and
validation **by file**: a file is in validation iff the SHA-256 of its relative path, read as a number in
[0, 1), is below ``val_fraction`` — deterministic across runs, machines and hash seeds, and independent
of which other files exist. Files are joined with a blank line into one ``uint8`` tensor per split.

`BatchSampler` draws ``[B, T]`` int64 windows (inputs and next-byte targets) from such a tensor. Batch
``step`` depends only on ``(seed, step)``, so a resumed run sees exactly the batches an uninterrupted one
would, and under data parallelism rank r of W takes rows ``[r·B/W, (r+1)·B/W)`` of the same global batch.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
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


def _read(root: Path, files: list[str], cap: int | None) -> tuple[torch.Tensor, list[str]]:
    """Concatenate files (in the given order) separated by SEPARATOR, stopping at cap bytes."""
    parts, used, size = [], [], 0
    for f in files:
        if cap is not None and size >= cap:
            break
        blob = (root / f).read_bytes()
        if parts:
            blob = SEPARATOR + blob
        parts.append(blob)
        used.append(f)
        size += len(blob)
    data = b"".join(parts)
    if cap is not None:
        data = data[:cap]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8), used


@dataclass
class Corpus:
    train: torch.Tensor                       # uint8 [N_train]
    val: torch.Tensor                         # uint8 [N_val]
    root: str
    train_files: list[str] = field(default_factory=list)   # the files actually read (after the cap)
    val_files: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return (f"{self.root}: train {len(self.train):,} bytes ({len(self.train_files)} files), "
                f"val {len(self.val):,} bytes ({len(self.val_files)} files)")


def load_corpus(data_dir: str | Path | None = None, *, max_bytes: int | None = None,
                val_fraction: float = 0.05) -> Corpus:
    """The byte corpus: the stdlib sources (data_dir None) or the text files under data_dir.

    max_bytes caps the total: train gets the first ⌈(1 − val_fraction)·max_bytes⌉ bytes of its files in
    sorted order, validation the rest of the budget (at least 1 KiB where the files have it). Nothing is
    ever downloaded."""
    if data_dir is None:
        root = stdlib_root()
        files = stdlib_files(root)
    else:
        root = Path(data_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"--data {data_dir}: not a directory")
        files = text_files(root)
    if not files:
        raise FileNotFoundError(f"no text files under {root} (extensions: {' '.join(sorted(TEXT_EXTENSIONS))})")
    if len(files) < 2:
        raise ValueError(f"{root} has a single text file ({files[0]}); the train/validation split is by file, "
                         "so at least two files are needed")
    train_f, val_f = split_files(files, val_fraction)
    train_cap = val_cap = None
    if max_bytes is not None:
        if max_bytes <= 1:
            raise ValueError(f"max_bytes must be > 1, got {max_bytes}")
        train_cap = max(1, round(max_bytes * (1 - val_fraction)))
        val_cap = max(max_bytes - train_cap, min(1024, max_bytes))
    train, train_used = _read(root, train_f, train_cap)
    val, val_used = _read(root, val_f, val_cap)
    return Corpus(train, val, str(root), train_used, val_used)


class BatchSampler:
    """Random [B, T] windows: x = data[s : s+T], y = data[s+1 : s+T+1] as int64.

    `batch(step)` is a pure function of (seed, step, rank, world_size): the global batch of `batch_size`
    rows is drawn with a generator seeded by (seed, step) and this rank keeps its contiguous share.
    Iterating yields batch(start), batch(start + 1), ..."""

    def __init__(self, data: torch.Tensor, batch_size: int, seq_len: int, *, seed: int = 0,
                 rank: int = 0, world_size: int = 1, start: int = 0):
        if data.dtype != torch.uint8 or data.dim() != 1:
            raise TypeError("data must be a 1-D uint8 tensor")
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
