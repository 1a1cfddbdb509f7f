"""Train an exported mirasc model with the Hugging Face `transformers` Trainer, on a local corpus, with one
process or several (torchrun: DistributedDataParallel, gloo on the CPU, nccl on GPUs).

The model folder comes from `mirasc export SPEC --hf DIR` (fresh weights) or `mirasc train ... --export-hf
DIR` (trained weights); it holds its tokenizer, so this script needs neither mirasc nor the network: only
torch, transformers (with accelerate) and datasets. The corpus is a local JSONL file (a "text" field per
line) read with `datasets`, tokenized with the model's tokenizer, joined with the tokenizer's separator
(the model's `document_separator`) and cut into blocks of --block-size tokens (the usual causal-LM recipe).
The trained model is saved with its tokenizer to OUT, a folder that loads, evaluates (`mirasc eval OUT`) and
trains again like the one it came from.

    mirasc export specs/gated_deltanet.miras --hf runs/gdn-hf --d-model 128 --n-layers 2
    python examples/hf_trainer.py runs/gdn-hf corpus.jsonl runs/gdn-trainer --max-steps 200
    torchrun --nproc_per_node 2 examples/hf_trainer.py runs/gdn-hf corpus.jsonl runs/gdn-trainer
"""

import argparse
import json
import os

# nothing leaves the machine: the model, tokenizer and corpus are local files
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments  # noqa: E402


def blocks_dataset(path, tokenizer, separator, block_size, cache_dir):
    """The corpus as {"input_ids", "labels"} blocks of block_size tokens (labels = inputs: the model shifts)."""
    from datasets import load_dataset

    raw = load_dataset("json", data_files={"train": path}, split="train", cache_dir=cache_dir)

    def tokenize(batch):
        return {"input_ids": tokenizer(batch["text"], add_special_tokens=False)["input_ids"]}

    def group(batch):
        stream = []
        for ids in batch["input_ids"]:
            stream.extend(list(separator) + ids)
        n = len(stream) // block_size * block_size
        chunks = [stream[i:i + block_size] for i in range(0, n, block_size)]
        return {"input_ids": chunks, "labels": [list(c) for c in chunks]}

    tokens = raw.map(tokenize, batched=True, remove_columns=raw.column_names)
    return tokens.map(group, batched=True, batch_size=1000, remove_columns=tokens.column_names)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="an exported mirasc model folder")
    ap.add_argument("data", help="a local JSONL file with a text field per line")
    ap.add_argument("out", help="output folder (checkpoints and the final model)")
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8, help="per process")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    # the folder's config names its modeling code (auto_map), which the tokenizer lookup reads too
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, trust_remote_code=True, local_files_only=True)
    separator = getattr(model.config, "document_separator", None) or [tokenizer.eos_token_id]
    cuda = torch.cuda.is_available()
    training_args = TrainingArguments(
        output_dir=args.out, max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, lr_scheduler_type="cosine", warmup_steps=max(1, args.max_steps // 10),
        weight_decay=0.1, adam_beta2=0.95, max_grad_norm=1.0, logging_steps=1, save_strategy="no",
        report_to=[], seed=args.seed, dataloader_drop_last=True, use_cpu=not cuda,
        ddp_backend=None if cuda else "gloo", ddp_find_unused_parameters=False,
        bf16=cuda and torch.cuda.is_bf16_supported(), disable_tqdm=True)
    with training_args.main_process_first():  # rank 0 tokenizes (into the datasets cache), the others reuse it
        train_set = blocks_dataset(args.data, tokenizer, separator, args.block_size,
                                   os.path.join(args.out, "datasets-cache"))
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set)
    result = trainer.train()
    trainer.save_model(args.out)
    losses = [rec["loss"] for rec in trainer.state.log_history if "loss" in rec]
    summary = {"world_size": training_args.world_size, "parallel_mode": str(training_args.parallel_mode),
               "steps": result.global_step, "blocks": len(train_set), "losses": losses,
               "train_loss": result.training_loss}
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(args.out)
        with open(os.path.join(args.out, "trainer_summary.json"), "w") as fh:
            json.dump(summary, fh, indent=2)
        print(f"trained {result.global_step} steps on {training_args.world_size} process(es): loss "
              f"{losses[0]:.3f} -> {losses[-1]:.3f}; saved {args.out}", flush=True)
    return summary


if __name__ == "__main__":
    main()
