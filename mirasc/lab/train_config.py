"""The training configuration and the `mirasc train` flags, without importing torch.

`mirasc --help` and every command's argument parsing read this module; `mirasc.lab.train` (which imports
torch) re-exports everything here and runs the loop.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from dataclasses import asdict, dataclass, field

CHECKPOINT = "checkpoint.pt"
DEFAULT_WARMUP = 20   # warm-up steps of a long run; a short one warms up for a tenth of its steps
METRICS = "metrics.jsonl"


@dataclass
class TrainConfig:
    # model (LMConfig)
    d_model: int = field(default=128, metadata={"help": "model width"})
    n_layers: int = field(default=2, metadata={"help": "number of blocks"})
    n_heads: int = field(default=2, metadata={"help": "memory heads per layer"})
    mlp_hidden: int = field(default=0, metadata={"help": "SwiGLU hidden size (0: 8/3 d_model, rounded to 32)"})
    hybrid_every: int = field(default=0, metadata={"help": "every N-th block is sliding-window attention (0: none)"})
    window: int = field(default=256, metadata={"help": "window of the hybrid attention blocks"})
    layer_options: dict = field(default_factory=dict,
                                metadata={"help": "JSON object of Layer options, e.g. '{\"gate_rank\": 16}'"})
    vocab_size: int | None = field(default=None, metadata={
        "help": "vocabulary of the LM (default: the tokenizer's size; 256 for bytes; larger pads it)"})
    # data
    data: str | None = field(default=None, metadata={
        "help": "a text folder, JSONL or Parquet file(s), or a datasets save_to_disk folder "
        "(default: the Python stdlib sources)"})
    data_format: str = field(default="auto", metadata={"help": "auto, text, jsonl, parquet or datasets"})
    text_field: str = field(default="text", metadata={"help": "the text field of JSONL / Parquet / datasets records"})
    tokenizer: str | None = field(default=None, metadata={
        "help": "a local tokenizer: a tokenizer.json file or a Hugging Face tokenizer folder (default: bytes)"})
    max_bytes: int | None = field(default=None, metadata={"help": "cap the corpus to this many bytes"})
    val_fraction: float = field(default=0.05, metadata={"help": "fraction of files held out for validation"})
    seq_len: int = field(default=128, metadata={"help": "training context length (tokens; bytes by default)"})
    batch_size: int = field(default=8, metadata={"help": "global batch size (split over ranks)"})
    # optimisation
    steps: int = field(default=200, metadata={"help": "optimizer steps"})
    lr: float = field(default=2e-3, metadata={"help": "peak learning rate"})
    min_lr: float = field(default=2e-4, metadata={"help": "final learning rate of the cosine schedule"})
    warmup: int | None = field(default=None, metadata={
        "help": f"linear warmup steps (default: min({DEFAULT_WARMUP}, steps // 10), so it ends within the run)"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay (matrices only)"})
    beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    beta2: float = field(default=0.95, metadata={"help": "AdamW beta2"})
    grad_clip: float = field(default=1.0, metadata={"help": "max global gradient norm (0: no clipping)"})
    # precision, device, parallelism
    seed: int = field(default=0, metadata={"help": "seed of the initialisation and of the batch order"})
    dtype: str = field(default="float32", metadata={"help": "parameter dtype: float32 or float64"})
    bf16: bool | None = field(default=None, metadata={
        "help": "bf16 autocast (default: on for CUDA devices with bf16, off on the CPU)"})
    device: str = field(default="auto", metadata={"help": "auto, cpu, cuda, cuda:N"})
    fsdp: bool = field(default=False, metadata={"help": "shard with FSDP (fully_shard) instead of DDP"})
    # output
    out_dir: str | None = field(default=None, metadata={"help": "run directory (default: runs/SPEC_NAME)"})
    log_every: int = field(default=10, metadata={"help": "log training loss every N steps"})
    eval_every: int = field(default=0, metadata={"help": "validate every N steps (0: only at the end)"})
    eval_windows: int = field(default=64, metadata={"help": "validation windows of seq_len bytes"})
    ckpt_every: int = field(default=100, metadata={"help": "checkpoint every N steps (0: only at the end)"})
    sample: int = field(default=0, metadata={"help": "generate this many bytes at the end (0: none)"})
    progress: bool = field(default=True, metadata={"help": "progress bar (tqdm if installed)"})

    @property
    def warmup_steps(self) -> int:
        """The warm-up actually used: the given one, else min(DEFAULT_WARMUP, steps // 10)."""
        return self.warmup if self.warmup is not None else min(DEFAULT_WARMUP, self.steps // 10)

    def lm_config(self):
        from mirasc.lab.models import LMConfig

        return LMConfig(vocab_size=self.vocab_size or 256, d_model=self.d_model, n_layers=self.n_layers,
                        n_heads=self.n_heads, mlp_hidden=self.mlp_hidden, hybrid_every=self.hybrid_every,
                        window=self.window, layer_options=dict(self.layer_options))

    def validate(self):
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")
        for name in ("d_model", "n_layers", "n_heads", "seq_len", "batch_size", "log_every", "eval_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.steps < 0 or (self.warmup or 0) < 0 or self.ckpt_every < 0 or self.eval_every < 0:
            raise ValueError("steps, warmup, ckpt_every and eval_every must be >= 0")
        if self.warmup is not None and self.steps > 0 and self.warmup >= self.steps:
            raise ValueError(f"warmup ({self.warmup}) must be shorter than steps ({self.steps}): the learning rate "
                             f"would never reach its peak (leave warmup unset for min({DEFAULT_WARMUP}, steps // 10))")
        if not -2 ** 63 <= self.seed < 2 ** 64:
            raise ValueError(f"seed {self.seed} is out of range: torch's seeds are 64-bit integers")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")
        if self.data_format not in ("auto", "text", "jsonl", "parquet", "datasets"):
            raise ValueError(f"data_format must be auto, text, jsonl, parquet or datasets, got {self.data_format!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device {self.device!r}: not a device mirasc runs on; use {DEVICE_FORMS}")
        if not isinstance(self.layer_options, dict):
            raise ValueError("layer_options must be a JSON object")
        from ..language.layer_options import check as check_layer_options
        from ..runtime.layer_options import layer_size_problems

        head_dim = self.layer_options.get("head_dim", 0)
        problems = check_layer_options(self.layer_options) + layer_size_problems(
            self.d_model, self.n_heads, head_dim if isinstance(head_dim, int) else 0)
        if problems:
            raise ValueError("layer options: " + "; ".join(problems))


CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
DEVICE_FORMS = "auto, cpu, cuda or cuda:N"


def resolve_device(name: str, local_rank: int = 0):
    """The torch.device for a --device value ("auto": CUDA device `local_rank` when there is one, else the CPU).
    Raises ValueError for a value that is no device mirasc runs on, or a CUDA device this torch cannot reach."""
    import re

    import torch

    if not isinstance(name, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", name):
        raise ValueError(f"--device {name!r}: not a device mirasc runs on; use {DEVICE_FORMS}")
    if name == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: this torch sees no CUDA device (torch.cuda.is_available() is False; "
                             "a CPU-only build, or no GPU here); use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: there are {torch.cuda.device_count()} CUDA device(s), numbered from 0")
    return device


CHECKPOINT_KEYS = ("model", "optimizer", "step", "config", "spec")


def read_checkpoint(path, keys=CHECKPOINT_KEYS) -> dict:
    """A `mirasc train` checkpoint file (or a run directory's): its dict, checked to carry `keys`. Raises
    FileNotFoundError for a missing file and ValueError naming the file for one that is empty, truncated,
    corrupt or of another kind; whatever torch.load's unpickler raises on a damaged file becomes that ValueError."""
    from pathlib import Path

    import torch

    src = Path(path)
    if src.is_dir():
        src = src / CHECKPOINT
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no such checkpoint")
    if src.stat().st_size == 0:
        raise ValueError(f"{src}: the checkpoint file is empty")
    try:
        ckpt = torch.load(src, map_location="cpu", weights_only=False)
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001  (a damaged file makes the unpickler raise almost anything)
        first = (str(err).splitlines() or [""])[0].split(". ")[0]  # torch's first sentence, not its advice
        raise ValueError(f"{src}: not a readable mirasc train checkpoint (truncated or corrupt?): "
                         f"{type(err).__name__}: {first}") from None
    missing = [k for k in keys if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise ValueError(f"{src}: not a mirasc train checkpoint (it lacks {', '.join(missing)})")
    try:
        config_from(ckpt["config"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{src}: the checkpoint's config is not valid: {err}") from None
    return ckpt


def checkpoint_config(ckpt: dict) -> TrainConfig:
    """The config of a checkpoint's model, with the Layer options it was built with where the checkpoint keeps
    them (`layer`): a default changed since does not change the model an export or evaluation loads."""
    cfg = config_from(ckpt["config"])
    if isinstance(ckpt.get("layer"), dict):
        cfg = dataclasses.replace(cfg, layer_options=dict(ckpt["layer"]))
    return cfg


def config_from(base: TrainConfig | dict | None = None, file: str | None = None,
                overrides: dict | None = None) -> TrainConfig:
    """Defaults (or `base`) < JSON file < overrides (keys whose value is None are ignored)."""
    values = asdict(base) if isinstance(base, TrainConfig) else dict(base or {})
    layers = [("the base config", values)]
    if file:
        with open(file) as fh:
            loaded = json.load(fh)
        if not isinstance(loaded, dict):
            raise ValueError(f"{file}: expected a JSON object of TrainConfig fields")
        layers.append((file, loaded))
    layers.append(("the overrides", {k: v for k, v in (overrides or {}).items() if v is not None}))
    merged = {}
    for src, layer in layers:
        unknown = sorted(set(layer) - set(CONFIG_FIELDS))
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown} in {src}; valid keys: {sorted(CONFIG_FIELDS)}")
        merged.update(layer)
    cfg = TrainConfig(**merged)
    cfg.validate()
    return cfg


# -- command line ------------------------------------------------------------------------------------------
THREADS_HELP = ("torch CPU threads [OMP_NUM_THREADS when set, else 1: torch's one thread per core is many times "
                "slower on a small or busy machine; 0: torch's default]")


def threads_to_use(value: int | None) -> int:
    """The CPU thread count of a --threads value: the value; unset, OMP_NUM_THREADS when it is a positive integer,
    else 1; 0 keeps torch's default (returned as 0). Raises ValueError for a negative count."""
    import os

    if value is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        return int(env) if env.isdigit() and int(env) > 0 else 1
    if value < 0:
        raise ValueError(f"--threads {value}: a thread count is >= 0 (0: torch's default)")
    return value


def apply_threads(value: int | None) -> int:
    """Set torch's CPU threads from a --threads value (see threads_to_use); returns the count in effect."""
    import torch

    n = threads_to_use(value)
    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def add_threads_argument(parser) -> None:
    parser.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)


def _flag(name):
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`SPEC [--config FILE.json] [--resume [CKPT]] [--metrics FILE]` plus one flag per TrainConfig field."""
    parser.add_argument("spec", help="a .miras file (or spec text)")
    parser.add_argument("--config", metavar="FILE.json", help="JSON object of TrainConfig fields")
    parser.add_argument("--resume", nargs="?", const="auto", default=None, metavar="CKPT",
                        help=f"resume from CKPT (default: OUT_DIR/{CHECKPOINT}; starts fresh if it does not exist)")
    parser.add_argument("--metrics", metavar="FILE", help=f"JSONL metrics file (default: OUT_DIR/{METRICS})")
    parser.add_argument("--export-hf", metavar="DIR", default=None,
                        help="after training, export the final checkpoint as a Hugging Face model folder "
                        "(mirasc export --from-checkpoint; needs the hf extra)")
    parser.add_argument("--stop-at", type=int, metavar="STEP",
                        help="checkpoint and exit after STEP (the schedule still runs to --steps; resume later)")
    add_threads_argument(parser)
    group = parser.add_argument_group("training configuration (TrainConfig; flags override --config)")
    hints = {"int": int, "float": float, "str": str, "int | None": int, "str | None": str}
    for name, f in CONFIG_FIELDS.items():
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        kw = {"dest": name, "default": None, "help": f"{f.metadata.get('help', '')} [{default}]"}
        if f.type in ("bool", "bool | None"):
            kw["action"] = argparse.BooleanOptionalAction
        elif f.type == "dict":
            kw["type"], kw["metavar"] = json.loads, "JSON"
        else:
            kw["type"] = hints[f.type]
            kw["metavar"] = {"data": "PATH", "out_dir": "DIR", "tokenizer": "PATH"}.get(name, name.upper())
        group.add_argument(_flag(name), **kw)
    return parser
