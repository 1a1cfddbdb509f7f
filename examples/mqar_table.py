"""MQAR accuracy table at equal model size for the bundled Miras designs (the rows: benchmarks/RESULTS.md,
"MQAR (associative recall) accuracy").

    python examples/mqar_table.py                                  # the full table (see the time estimate below)
    python examples/mqar_table.py --only deltanet transformer --steps 20 --seeds 0 --out /tmp/mqar_tiny

Runs `mirasc explore --task mqar` on the spec files below (resumable: rerunning with the same options
reuses the finished cells in --out) and writes `OUT/mqar_table.md`, a Markdown table in this order.

What is held equal across rows:
- the model: d_model, number of blocks, number of heads and head_dim = d_model / heads, so every memory
  reads and writes the same q, k, v ∈ R^head_dim per head; the Layer around the memory op (projections,
  short causal conv 4, ℓ2-normalised q/k, low-rank gates, per-head RMS norm, output gate — the defaults
  of every spec, none of these specs has a `layer` block; MLP memories get their family's defaults, a
  retention-gate floor alpha_min = 0.999, Huber δ from softplus(12), RMS-normalised v and gates trained at a tenth
  of the learning rate (docs/training.md); the Forgetting Transformer a full-rank
  forget gate starting at σ(5); see docs/module-api.md), the SwiGLU
  MLPs and the tied byte embeddings;
- the training: AdamW, peak lr, warm-up + cosine schedule, gradient clipping, steps, batch size and
  the exact same stream of generated MQAR batches (same seeds), loss on the query positions only;
- the evaluation: the same held-out MQAR examples at every length (kv pairs scale with the length).

What is *not* equal, and is reported in the `state/layer` column: the number of floats the memory keeps
per layer. A linear memory holds heads·head_dim² floats; an MLP memory (expansion e, depth 2)
2·e·heads·head_dim² plus momentum or accumulator buffers where the learner/retention has them; softmax
attention keeps the whole KV cache (O(T)). The MLP designs take their published expansion (4; 2 for
huber_kl_momentum). To equalise that too, copy a spec and set `expansion=1` (an MLP memory then holds
2·heads·head_dim² floats, twice a linear memory).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECS = ["linear_attention", "deltanet", "gated_deltanet", "gla", "kda", "hgrn2", "titans", "moneta", "yaad", "memora",
         "transformer", "forgetting_transformer", "huber_kl_momentum", "sparse_lp", "hyperbolic_mirror", "ttt_mlp",
         "rwkv7", "comba", "stickbreaking"]
DISPLAY = {"linear_attention": "Linear attention", "deltanet": "DeltaNet", "gated_deltanet": "Gated DeltaNet",
           "gla": "GLA", "kda": "KDA", "rwkv7": "RWKV-7", "comba": "Comba", "hgrn2": "HGRN2-like", "ttt_mlp": "TTT-MLP",
           "titans": "Titans", "moneta": "Moneta", "yaad": "Yaad", "memora": "Memora",
           "transformer": "Softmax attention", "forgetting_transformer": "Forgetting Transformer (FoX)",
           "stickbreaking": "Stick-breaking attention",
           "huber_kl_momentum": "huber_kl_momentum (new)",
           "sparse_lp": "sparse_lp (new)", "hyperbolic_mirror": "hyperbolic_mirror (new)"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=SPECS, default=SPECS, help="a subset of the specs")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--kv-pairs", type=int, default=8)
    p.add_argument("--eval-lengths", nargs="+", type=int, default=None, help="default: seq-len, 2x, 4x")
    p.add_argument("--eval-examples", type=int, default=256)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="benchmarks/mqar")
    a = p.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from mirasc.lab import explore

    lengths = a.eval_lengths or [a.seq_len, 2 * a.seq_len, 4 * a.seq_len]
    args = ["--task", "mqar", "--spec", *[str(ROOT / "specs" / f"{s}.miras") for s in a.only],
            "--seq-len", str(a.seq_len), "--task-opt", f"num_kv_pairs={a.kv_pairs}",
            "--eval-lengths", *map(str, lengths), "--eval-examples", str(a.eval_examples),
            "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--lr", str(a.lr),
            "--d-model", str(a.d_model), "--layers", str(a.layers), "--heads", str(a.heads),
            "--seeds", *map(str, a.seeds), "--out", a.out]
    if a.threads:
        args += ["--threads", str(a.threads)]
    rc = explore.main(args)
    if rc == 2:
        return rc

    doc = json.loads((Path(a.out) / "leaderboard.json").read_text(encoding="utf-8"))
    rows = {r["name"]: r for r in doc["leaderboard"]}
    lengths = doc["budget"]["eval_lengths"]
    b = doc["budget"]
    hd = b["d_model"] // b["heads"]
    head = (f"MQAR (Zoology), train length {a.seq_len} with {a.kv_pairs} kv pairs (pairs scale with the length), "
            f"d_model {b['d_model']}, {b['layers']} blocks, {b['heads']} heads x head_dim {hd}, "
            f"{b['steps']} steps x batch {b['batch_size']}, lr {b['lr']}, seeds {doc['seeds']}; accuracy on the "
            f"query tokens, mean ± std over seeds; {b['eval_examples']} held-out examples per length.")
    cols = ["design", *[f"acc@{L}" for L in lengths], "exact@" + str(a.seq_len), "state/layer", "params", "s/seed"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in a.only:
        r = rows.get(s)
        if r is None:
            lines.append(f"| {DISPLAY[s]} | " + " | ".join(["failed"] * (len(cols) - 1)) + " |")
            continue
        accs = [f"{r[f'acc@{L}']:.3f}" + (f" ± {r['acc_std']:.3f}" if L == a.seq_len and r["seeds"] > 1 else "")
                for L in lengths]
        state = "O(T)" if r["state_floats"] is None else str(r["state_floats"] // b["layers"])
        lines.append(f"| {DISPLAY[s]} | " + " | ".join(accs) + f" | {r['exact_mean']:.3f} | {state} | "
                     f"{r['params']} | {r['seconds_per_seed']:.0f} |")
    table = "\n".join(lines) + "\n"
    (Path(a.out) / "mqar_table.md").write_text(table, encoding="utf-8")
    print()
    print(table)
    print(f"wrote {Path(a.out) / 'mqar_table.md'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
