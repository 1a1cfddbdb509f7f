"""`mirasc eval MODEL_DIR --tasks ...`: lm-eval (0.4.x, the eval extra) on an exported model, with tasks
defined here from local data only.

The tasks are written as lm-eval task YAML files (`dataset_path: json` over JSONL files beside them, read
by `datasets` from the disk) into a task folder, so the same folder works with lm-eval's own command line
(`lm-eval run --include_path TASK_DIR ...`, printed by `mirasc eval`):

- `mirasc_ppl` (loglikelihood_rolling): the held-out documents of a local corpus (`--data`: the documents
  `mirasc train --data` holds out for validation with the same `--val-fraction`, or every document with
  `--data-split all`); lm-eval's word_perplexity, byte_perplexity and bits_per_byte.
- `mirasc_cloze` (loglikelihood): the same documents cut at a word; the model must give the last word
  ( acc: it is the greedy continuation; perplexity).
- `mirasc_mqar` (loglikelihood): mirasc.lab.tasks' MQAR, one example per query; token i of the generator is
  the printable character chr(33 + i) (vocabulary 94: filler '!', keys '"'..'O', values 'P'..'}'), the
  tokens separated by spaces so that every tokenizer (bytes, BPE, word-level) reads one symbol per
  token; acc: the value is the greedy continuation.
- `mirasc_niah` (loglikelihood): mirasc.lab.tasks' S-NIAH text (haystack with a needle, then the question);
  acc: the whole answer is the greedy continuation.

Synthetic data is generated with a fixed seed (`--seed`), so the files are the same on every run. Nothing
is downloaded: the Hub, transformers and datasets are switched offline before lm-eval is imported (and in
their already-imported modules), the model and the data are local paths, and the datasets cache lives in
the task folder. tests/lab/test_hf_tools.py runs it with every network connection refused.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

TASKS = ("ppl", "cloze", "mqar", "niah")
EVAL_EXTRA = "pip install 'mirasc[eval]'"
MQAR_OFFSET = 33  # token i of the MQAR generator is chr(33 + i)
MQAR_VOCAB = 94   # the printable ASCII characters '!' .. '~'

_YAML = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
test_split: test
output_type: {output_type}
doc_to_text: {doc_to_text}
doc_to_target: {doc_to_target}
target_delimiter: ""
metric_list:
{metrics}metadata:
  version: 1.0
  description: {description}
"""


_AGGREGATION = {  # metric: (aggregation, higher is better)
    "acc": ("mean", "true"), "perplexity": ("perplexity", "false"), "word_perplexity": ("weighted_perplexity", "false"),
    "byte_perplexity": ("weighted_perplexity", "false"), "bits_per_byte": ("bits_per_byte", "false")}


def _metrics(*names: str) -> str:
    lines = []
    for m in names:
        lines.append(f"  - metric: {m}\n")
        aggregation, higher = _AGGREGATION[m]
        lines.append(f"    aggregation: {aggregation}\n    higher_is_better: {higher}\n")
    return "".join(lines)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _task_yaml(task_dir: Path, name: str, rows: list[dict], output_type: str, doc_to_text: str, doc_to_target: str,
               metrics: tuple[str, ...], description: str) -> str:
    data = (task_dir / f"{name}.jsonl").resolve()
    _write_jsonl(data, rows)
    text = _YAML.format(name=name, data=json.dumps(str(data)), cache=json.dumps(str((task_dir / "cache").resolve())),
                        output_type=output_type, doc_to_text=json.dumps(doc_to_text),
                        doc_to_target=json.dumps(doc_to_target), metrics=_metrics(*metrics),
                        description=json.dumps(description))
    (task_dir / f"{name}.yaml").write_text(text, encoding="utf-8")
    return name


# -- task data -------------------------------------------------------------------------------------------
def heldout_documents(data, data_format: str = "auto", text_field: str = "text", val_fraction: float = 0.05,
                      split: str = "val") -> list[str]:
    """The documents of a local corpus that `mirasc train --data` holds out (split "val"), or all of them."""
    from .data import find_documents, split_documents

    docs = find_documents(data, data_format, text_field)
    ids = docs.ids if split == "all" else split_documents(docs, val_fraction)[1]
    texts = (docs.read(i).decode("utf-8", errors="replace") for i in ids)
    return [t for t in texts if t.strip()]  # an empty document has no likelihood to measure


def cloze_rows(documents: list[str], max_chars: int = 2000) -> list[dict]:
    """A document's first max_chars characters, cut before its last word: {"context", "target"} where the
    target is the space and the word (documents without a word after some text are skipped)."""
    rows = []
    for doc in documents:
        text = doc[:max_chars]
        words = list(re.finditer(r"\s(\w+)", text))
        if not words or not text[:words[-1].start()].strip():
            continue
        last = words[-1]
        rows.append({"context": text[:last.start()], "target": text[last.start():last.end()]})
    return rows


def mqar_rows(n: int, seed: int, seq_len: int = 64, num_kv_pairs: int = 8) -> list[dict]:
    """MQAR as text, one row per query: the sequence up to and including the queried key, and its value
    (after a space)."""
    from .tasks import MQARConfig, generate_mqar

    cfg = MQARConfig(seq_len=seq_len, num_kv_pairs=num_kv_pairs, vocab_size=MQAR_VOCAB)
    inputs, targets, mask = generate_mqar(cfg, n, seed)
    rows = []
    for b in range(n):
        symbols = [chr(MQAR_OFFSET + int(t)) for t in inputs[b]]
        for p in mask[b].nonzero().flatten().tolist():
            rows.append({"context": " ".join(symbols[:p + 1]), "target": " " + chr(MQAR_OFFSET + int(targets[b, p])),
                         "example": b})
    return rows


def niah_rows(n: int, seed: int, seq_len: int = 256, needle: str = "passkey") -> list[dict]:
    from .tasks import NIAHConfig, niah_text

    cfg = NIAHConfig(seq_len=seq_len, needle=needle)
    cfg.validate()
    rng = random.Random(seed)
    return [dict(zip(("context", "target"), niah_text(cfg, rng))) for _ in range(n)]


def write_tasks(task_dir, tasks, *, data=None, data_format: str = "auto", text_field: str = "text",
                val_fraction: float = 0.05, data_split: str = "val", examples: int = 100, seed: int = 0,
                mqar_seq_len: int = 64, mqar_kv_pairs: int = 8, niah_seq_len: int = 256,
                niah_needle: str = "passkey") -> list[str]:
    """Write the task YAML and JSONL files of `tasks` (names from TASKS) into task_dir; returns the lm-eval
    task names (mirasc_<task>)."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; mirasc eval knows {', '.join(TASKS)}")
    out = Path(task_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    documents = None
    for task in tasks:
        if task in ("ppl", "cloze"):
            if data is None:
                raise ValueError(f"task {task} reads held-out text: give --data (a text folder, JSONL or Parquet)")
            if documents is None:
                documents = heldout_documents(data, data_format, text_field, val_fraction, data_split)
        if task == "ppl":
            names.append(_task_yaml(out, "mirasc_ppl", [{"text": d} for d in documents], "loglikelihood_rolling",
                                    "", "{{text}}", ("word_perplexity", "byte_perplexity", "bits_per_byte"),
                                    f"perplexity of the held-out documents of {data}"))
        elif task == "cloze":
            rows = cloze_rows(documents)
            if not rows:
                raise ValueError(f"--data {data}: no held-out document has a last word to predict")
            names.append(_task_yaml(out, "mirasc_cloze", rows, "loglikelihood", "{{context}}", "{{target}}",
                                    ("acc", "perplexity"), f"last word of the held-out documents of {data}"))
        elif task == "mqar":
            names.append(_task_yaml(out, "mirasc_mqar", mqar_rows(examples, seed, mqar_seq_len, mqar_kv_pairs),
                                    "loglikelihood", "{{context}}", "{{target}}", ("acc",),
                                    f"MQAR, {examples} sequences of {mqar_seq_len} with {mqar_kv_pairs} pairs, "
                                    f"seed {seed}"))
        else:
            names.append(_task_yaml(out, "mirasc_niah", niah_rows(examples, seed, niah_seq_len, niah_needle),
                                    "loglikelihood", "{{context}}", "{{target}}", ("acc",),
                                    f"S-NIAH ({niah_needle}), {examples} texts of {niah_seq_len} bytes, seed {seed}"))
    return names


# -- running lm-eval -------------------------------------------------------------------------------------
def model_args(model_dir) -> dict:
    """lm-eval's HFLM arguments for an exported mirasc model: trust its modeling file, and prefix rolling
    perplexities with the token the training corpus put before each document."""
    args = {"pretrained": str(Path(model_dir).resolve()), "trust_remote_code": True}
    config = json.loads((Path(model_dir) / "config.json").read_text())
    separator = config.get("document_separator")
    if separator:
        args["prefix_token_id"] = int(separator[-1])
    return args


def command_line(model_dir, task_dir, names, output, device: str, batch_size: int, limit) -> str:
    """The lm-eval command that runs the same evaluation."""
    margs = ",".join(f"{k}={v}" for k, v in model_args(model_dir).items())
    return (f"HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 lm-eval run --model hf --model_args {margs} "
            f"--include_path {Path(task_dir).resolve()} --tasks {','.join(names)} --device {device} "
            f"--batch_size {batch_size}" + (f" --limit {limit}" if limit is not None else "")
            + f" --output_path {output}")


def _offline():
    """Switch the Hub, transformers and datasets offline, also where they were imported already."""
    from .tokenizer import offline

    offline()
    for module, attr in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_DATASETS_OFFLINE"),
                         ("datasets.config", "HF_HUB_OFFLINE")):
        mod = sys.modules.get(module)
        if mod is not None and hasattr(mod, attr):
            setattr(mod, attr, True)


def evaluate(model_dir, task_dir, names, *, device: str = "cpu", batch_size: int = 1, limit=None,
             bootstrap_iters: int = 0) -> dict:
    """Run lm-eval's simple_evaluate on the exported model folder with the tasks in task_dir; returns its
    results dict (the one lm-eval writes as results JSON)."""
    _offline()
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise ValueError(f"mirasc eval needs lm-eval ({EVAL_EXTRA}): {err}") from None
    _offline()
    if not (Path(model_dir) / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json (export a model with mirasc export --hf or "
                                "mirasc train --export-hf)")
    manager = TaskManager(include_path=str(Path(task_dir).resolve()), include_defaults=False)
    return lm_eval.simple_evaluate(model="hf", model_args=model_args(model_dir), tasks=list(names),
                                   task_manager=manager, device=device, batch_size=batch_size, limit=limit,
                                   bootstrap_iters=bootstrap_iters, log_samples=False)


def save_results(results: dict, path) -> Path:
    from lm_eval.utils import handle_non_serializable

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n",
                   encoding="utf-8")
    return out


def summary(results: dict) -> list[str]:
    lines = []
    for task, metrics in sorted(results.get("results", {}).items()):
        values = [f"{k.split(',')[0]} {v:.4f}" for k, v in metrics.items()
                  if "," in k and "stderr" not in k and isinstance(v, (int, float))]
        lines.append(f"{task}: " + ", ".join(values))
    return lines


# -- command line ----------------------------------------------------------------------------------------
def add_arguments(p):
    p.add_argument("model", help="an exported model folder (mirasc export --hf, mirasc train --export-hf)")
    p.add_argument("--tasks", default="mqar,niah", help=f"comma-separated, of {', '.join(TASKS)} [mqar,niah]")
    p.add_argument("--data", default=None, metavar="PATH", help="held-out text for ppl and cloze: a text folder, "
                   "JSONL or Parquet file(s), as mirasc train --data")
    p.add_argument("--data-format", default="auto", help="as mirasc train [auto]")
    p.add_argument("--text-field", default="text", help="as mirasc train [text]")
    p.add_argument("--val-fraction", type=float, default=0.05, help="as mirasc train: which documents are held out "
                   "[0.05]")
    p.add_argument("--data-split", choices=["val", "all"], default="val",
                   help="val: the documents mirasc train holds out; all: every document [val]")
    p.add_argument("--examples", type=int, default=100, help="sequences of each synthetic task [100]")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic tasks [0]")
    p.add_argument("--mqar-seq-len", type=int, default=64, help="[64]")
    p.add_argument("--mqar-kv-pairs", type=int, default=8, help="[8]")
    p.add_argument("--niah-seq-len", type=int, default=256, help="[256]")
    p.add_argument("--niah-needle", default="passkey", choices=["passkey", "number", "word"], help="[passkey]")
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N examples of each task")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N [cuda when available, else cpu]")
    p.add_argument("--batch-size", type=int, default=1, help="lm-eval batch size [1]")
    p.add_argument("--output", default=None, metavar="FILE", help="results JSON [MODEL/eval/results.json]")
    p.add_argument("--task-dir", default=None, metavar="DIR", help="where the task files go [MODEL/eval/tasks]")
    return p


def run(args) -> int:
    model = Path(args.model)
    out = Path(args.output) if args.output else model / "eval" / "results.json"
    task_dir = Path(args.task_dir) if args.task_dir else model / "eval" / "tasks"
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    from .train_config import resolve_device

    try:
        device = str(resolve_device(args.device or "auto"))
        if not (model / "config.json").is_file():
            raise FileNotFoundError(f"{model}: no config.json (export a model with mirasc export --hf or "
                                    "mirasc train --export-hf)")
        if not any((model / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            raise FileNotFoundError(f"{model}: no tokenizer beside the model (lm-eval reads text); export it again "
                                    "with this mirasc (exports carry their tokenizer, bytes included)")
        names = write_tasks(task_dir, tasks, data=args.data, data_format=args.data_format, text_field=args.text_field,
                            val_fraction=args.val_fraction, data_split=args.data_split, examples=args.examples,
                            seed=args.seed, mqar_seq_len=args.mqar_seq_len, mqar_kv_pairs=args.mqar_kv_pairs,
                            niah_seq_len=args.niah_seq_len, niah_needle=args.niah_needle)
        print("the same with lm-eval's command line:\n  " + command_line(model, task_dir, names, out.parent, device,
                                                                         args.batch_size, args.limit), flush=True)
        results = evaluate(model, task_dir, names, device=device, batch_size=args.batch_size, limit=args.limit)
    except (ValueError, OSError) as err:
        print(f"mirasc eval: {err}", file=sys.stderr)
        return 2
    path = save_results(results, out)
    for line in summary(results):
        print(line)
    print(f"wrote {path}")
    return 0
