"""Multi-Token Attention (Golovneva et al. 2025) on the paper's motivating toy task, compiled from
`specs/mta.miras`, against the same model with plain softmax attention compiled from `specs/transformer.miras`.

Task: K blocks of N distinct letters, each closed by a separator, then a query marker and L query letters:

    b c f k | a d g h | e f j l | ... | ? f c          ->  answer: index of the block holding ALL query letters

Exactly one block holds all L query letters; every query letter also appears in `--dup` other blocks (which
never hold all of them), so matching any single query letter leaves 1 + dup candidate blocks.
Chance = 1/K. The prediction is read at the last position (a linear readout over the K block indices).

Model (same for both, same size up to MTA's few hundred extra read parameters): token embedding + block-id
embedding -> `--layers` x [x + Layer(rmsnorm(x)); x + MLP(rmsnorm(x))] -> rmsnorm -> linear(K), where Layer is the
compiled module's Layer with conv=0 (no short token-mixing conv, so that tokens are mixed only by attention)
and qk_norm="none" (with l2-normalised q, k and the 1/sqrt(Dk) scale the baseline's logits are bounded by
1/sqrt(Dk) and it could not attend sharply at all; MTA's learned score convolution could rescale them, which
would be an unfair advantage).

Why one layer of single-token attention cannot solve it: at the last position the query is a function of the
last query letter only, so its attention weights can single out the blocks holding that letter but not the
ones holding the other query letters; the values of a letter token know its letter and block but the average
loses the pairing. Its accuracy is therefore bounded by about 1/(1 + dup). MTA's key-query convolution sums
q_{i-i'}.k_{j-j'} over the last cq queries and a window of ck keys, so one score can count how many query
letters a block holds.

Commands:
    python examples/mta_toy.py                     # the "real" run (1 layer; a few minutes on 1 core)
    python examples/mta_toy.py --layers 2          # two layers each
    python examples/mta_toy.py --tiny              # smoke size (tests/lab/test_examples.py)
"""

import argparse
import math
import random
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import mirasc

ROOT = Path(__file__).resolve().parents[1]
SPECS = {"mta": ROOT / "specs" / "mta.miras", "softmax": ROOT / "specs" / "transformer.miras"}


def make_batch(rng, batch, K, N, L, dup, A):
    """tokens [B, T] (letters 0..A-1, SEP = A, QRY = A + 1), block ids [B, T] (query region = K), target [B]."""
    SEP, QRY = A, A + 1
    toks, blks, tgt = [], [], []
    for _ in range(batch):
        t = rng.randrange(K)
        query = rng.sample(range(A), L)
        others = [b for b in range(K) if b != t]
        content = {b: set() for b in range(K)}
        content[t] = set(query)
        # each query letter goes into `dup` other blocks, never so that another block holds all of them
        for ql in query:
            cands = [b for b in others if len(content[b]) < L - 1 and ql not in content[b]]
            for b in rng.sample(cands, dup):
                content[b].add(ql)
        seq, ids = [], []
        for b in range(K):
            rest = [x for x in range(A) if x not in query]
            letters = list(content[b]) + rng.sample(rest, N - len(content[b]))
            rng.shuffle(letters)
            seq += letters + [SEP]
            ids += [b] * (N + 1)
        q = query[:]
        rng.shuffle(q)
        seq += [QRY] + q
        ids += [K] * (L + 1)
        toks.append(seq)
        blks.append(ids)
        tgt.append(t)
    return torch.tensor(toks), torch.tensor(blks), torch.tensor(tgt)


class Net(nn.Module):
    def __init__(self, mod, vocab, K, d_model, heads, layers):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.blk = nn.Embedding(K + 1, d_model)
        self.attn = nn.ModuleList(mod.Layer(d_model, heads, conv=0, qk_norm="none", layer_idx=i) for i in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                               nn.Linear(4 * d_model, d_model)) for _ in range(layers))
        self.norms = nn.ModuleList(nn.RMSNorm(d_model) for _ in range(2 * layers + 1))
        self.head = nn.Linear(d_model, K)

    def forward(self, toks, blks):
        x = self.tok(toks) + self.blk(blks)
        for i, (attn, mlp) in enumerate(zip(self.attn, self.mlp)):
            x = x + attn(self.norms[2 * i](x))
            x = x + mlp(self.norms[2 * i + 1](x))
        return self.head(self.norms[-1](x[:, -1]))


def train_one(name, args, log):
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    mod = mirasc.compile_spec(SPECS[name])
    vocab = args.letters + 2
    model = Net(mod, vocab, args.blocks, args.d_model, args.heads, args.layers)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s / args.steps, 1))))
    losses, t0 = [], time.time()
    shape = (args.blocks, args.block_len, args.query_len, args.dup, args.letters)
    for step in range(args.steps):
        toks, blks, tgt = make_batch(rng, args.batch, *shape)
        loss = F.cross_entropy(model(toks, blks), tgt)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log and (step + 1) % max(1, args.steps // 10) == 0:
            print(f"  [{name}] step {step + 1:5d}  loss {sum(losses[-50:]) / len(losses[-50:]):.3f}  "
                  f"({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    erng = random.Random(10_000 + args.seed)
    correct = 0
    with torch.no_grad():
        for _ in range(args.eval_n // 500):
            toks, blks, tgt = make_batch(erng, 500, *shape)
            correct += (model(toks, blks).argmax(-1) == tgt).sum().item()
    k = max(1, len(losses) // 10)
    return {"acc": correct / (args.eval_n // 500 * 500), "loss_first": sum(losses[:k]) / k,
            "loss_last": sum(losses[-k:]) / k, "params": n_params, "seconds": time.time() - t0}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--blocks", type=int, default=None, help="K")
    p.add_argument("--block-len", dest="block_len", type=int, default=None, help="N letters per block")
    p.add_argument("--query-len", dest="query_len", type=int, default=2, help="L query letters")
    p.add_argument("--dup", type=int, default=None, help="other blocks holding each query letter")
    p.add_argument("--letters", type=int, default=None, help="alphabet size")
    p.add_argument("--d-model", dest="d_model", type=int, default=None)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--eval-n", dest="eval_n", type=int, default=2000)
    p.add_argument("--models", default="softmax,mta")
    p.add_argument("--quiet", action="store_true", help="no progress lines (the results are still printed)")
    a = p.parse_args(argv)
    # tiny: a smaller task (K=4 blocks of 3, each query letter in 1 other block: chance 1/4, bound 1/2)
    tiny = dict(steps=300, d_model=32, batch=32, lr=1e-2, blocks=4, block_len=3, dup=1, letters=10)
    real = dict(steps=2000, d_model=64, batch=64, lr=3e-3, blocks=6, block_len=4, dup=2, letters=16)
    for n, val in (tiny if a.tiny else real).items():
        if getattr(a, n) is None:
            setattr(a, n, val)
    return a


def main(argv=None):
    torch.set_num_threads(1)
    args = parse(argv)
    chance = 1 / args.blocks
    bound = 1 / (1 + args.dup)
    res = {}
    for name in args.models.split(","):
        if not args.quiet:
            print(f"training {name} attention ({args.layers} layer(s), d_model {args.d_model}, {args.steps} steps)",
                  flush=True)
        res[name] = train_one(name, args, not args.quiet)
    # --quiet drops the progress lines only: the results are what a run is for
    print(f"\nheld-out accuracy ({args.eval_n} sequences; chance {chance:.3f}, single-token matching bound "
          f"~{bound:.3f})")
    for name, r in res.items():
        print(f"  {name:8s} acc {r['acc']:.3f}   params {r['params']}   loss {r['loss_first']:.3f} -> "
              f"{r['loss_last']:.3f}   ({r['seconds']:.0f}s)")
    res["chance"], res["single_token_bound"] = chance, bound
    return res


if __name__ == "__main__":
    main()
