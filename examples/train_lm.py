"""Train a small byte-level language model on the offline default corpus (the Python standard library's own
source files), report validation bits per byte, reload the checkpoint and sample from it.

    python examples/train_lm.py                                   # Gated DeltaNet, 200 steps, ~1 min on a CPU
    python examples/train_lm.py specs/titans.miras --steps 500 --d-model 256 --n-layers 4

The same run from the command line: `python -m mirasc.lab.train specs/gated_deltanet.miras --steps 200`
(multi-process: `torchrun --nproc_per_node 2 -m mirasc.lab.train ...`).
"""

import argparse
from pathlib import Path

import torch

from mirasc.lab.data import load_corpus
from mirasc.lab.train import TrainConfig, load_model, train

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", default=str(ROOT / "specs" / "gated_deltanet.miras"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--max-bytes", type=int, default=2_000_000, help="corpus cap (keeps start-up quick)")
    ap.add_argument("--out-dir", default="runs/example")
    ap.add_argument("--sample", type=int, default=200, help="bytes to generate")
    args = ap.parse_args()

    cfg = TrainConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=2, seq_len=128, batch_size=8,
                      steps=args.steps, lr=3e-3, warmup=min(20, args.steps // 10), max_bytes=args.max_bytes,
                      out_dir=args.out_dir, log_every=max(1, args.steps // 20))
    result = train(args.spec, cfg)
    print(f"{result['params']:,} parameters; validation {result['val_bpb']:.3f} bits/byte")

    # reload from the checkpoint (as a later session would) and continue a validation prompt
    model = load_model(result["checkpoint"]).eval()
    prompt = load_corpus(max_bytes=args.max_bytes).val[:80].long()[None]
    out = model.generate(prompt, args.sample, temperature=0.8, top_k=40, generator=torch.Generator().manual_seed(0))
    print("--- prompt ---\n" + bytes(prompt[0].tolist()).decode("utf-8", "replace"))
    print("--- continuation ---\n" + bytes(out[0, prompt.shape[1]:].tolist()).decode("utf-8", "replace"))


if __name__ == "__main__":
    main()
