"""End-To-End Memory Networks (Sukhbaatar et al. 2015) on generated bAbI-style tasks, with the memory read
compiled from `specs/memn2n.miras` (3 hops, adjacent tying, temporal encoding) and a 1-hop variant compiled
from the same spec text with `hops=1`.

Tasks (generated here, nothing downloaded), all in one small vocabulary and trained jointly:
  1 single supporting fact   "mary went to the kitchen . ... where is mary ?"            -> kitchen
  2 two supporting facts     "john picked up the milk . john went to the garden . where is the milk ?" -> garden
  3 counting                 "how many objects is daniel carrying ?"                      -> none/one/two/three
  4 yes/no                   "is sandra in the office ?"                                  -> yes/no

Model: sentences are embedded as position-encoded bags of words (MemN2N's PE, l_kj), A -> keys k, C -> values v,
B = A for the question (q). The compiled op runs the hops (u^{h+1} = u^h + o^h) and returns u^{K+1} - u^1,
so the answer logits are W(q + o). Learned read parameters (temporal_key/temporal_value, hop_value) are
nn.Parameters passed as `params=`. Trained with Adam on freshly generated stories.

Commands:
    python examples/memn2n_babi.py                      # the "real" run (a few minutes on 1 core)
    python examples/memn2n_babi.py --steps 3000 --seed 1
    python examples/memn2n_babi.py --tiny               # smoke size (tests/lab/test_examples.py)
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
SPEC_PATH = ROOT / "specs" / "memn2n.miras"

PEOPLE = ["mary", "john", "sandra", "daniel"]
PLACES = ["kitchen", "garden", "office", "hallway", "bathroom", "bedroom"]
OBJECTS = ["apple", "football", "milk"]
MOVES = ["went", "moved", "journeyed", "travelled"]
NUMBERS = ["none", "one", "two", "three"]
WORDS = (["<pad>", ".", "?", "to", "the", "picked", "up", "dropped", "where", "is", "in", "how", "many", "objects",
          "carrying", "yes", "no"] + PEOPLE + PLACES + OBJECTS + MOVES + NUMBERS)
VOCAB = {w: i for i, w in enumerate(WORDS)}
TASKS = ["single-supporting-fact", "two-supporting-facts", "counting", "yes-no"]
# Chance for each task: guessing uniformly among its possible answers.
CHANCE = {"single-supporting-fact": 1 / len(PLACES), "two-supporting-facts": 1 / len(PLACES),
          "counting": 1 / len(NUMBERS), "yes-no": 1 / 2}


# ------------------------------------------------------------------------------------------------------
# Story generators: each returns (sentences, question, answer) as lists of words.
# ------------------------------------------------------------------------------------------------------
def _move(rng, who, where):
    return [who, rng.choice(MOVES), "to", "the", where]


def _story_world(rng, n):
    """A random walk of people through places and objects being picked up / dropped. Returns the sentences
    and, after each sentence, a snapshot (location of each person, holder of each object, object places)."""
    loc, holder, obj_at = {}, {}, {}
    sents, snaps = [], []
    for _ in range(n):
        who = rng.choice(PEOPLE)
        r = rng.random()
        held = [o for o, h in holder.items() if h == who]
        free = [o for o in OBJECTS if o not in holder]
        if who in loc and r < 0.35 and free:
            o = rng.choice(free)
            holder[o] = who
            obj_at.pop(o, None)
            sents.append([who, "picked", "up", "the", o])
        elif who in loc and r < 0.5 and held:
            o = rng.choice(held)
            del holder[o]
            obj_at[o] = loc[who]
            sents.append([who, "dropped", "the", o])
        else:
            loc[who] = rng.choice(PLACES)
            sents.append(_move(rng, who, loc[who]))
        snaps.append((dict(loc), dict(holder), dict(obj_at)))
    return sents, snaps


def _moves(rng, n):
    """n random moves; returns the sentences and everyone's last place."""
    sents, loc = [], {}
    for _ in range(n):
        who = rng.choice(PEOPLE)
        loc[who] = rng.choice(PLACES)
        sents.append(_move(rng, who, loc[who]))
    return sents, loc


def gen_single(rng, n):
    sents, loc = _moves(rng, n)
    who = rng.choice(sorted(loc))
    return sents, ["where", "is", who, "?"], loc[who]


def gen_two(rng, n):
    """Where is the object? The answer needs the sentence where someone picked it up AND that person's latest
    move after it (the object is still held). Rejection-sampled so that the holder moved after the pick-up."""
    if n < 3:
        raise ValueError("two supporting facts needs at least 3 sentences (move, pick up, move)")
    while True:
        sents, snaps = _story_world(rng, n)
        loc, holder, _ = snaps[-1]
        cands = []
        for o, who in holder.items():
            picked = max(i for i, s in enumerate(sents) if s[1] == "picked" and s[4] == o)
            moved_after = any(s[0] == who and s[1] in MOVES for s in sents[picked + 1:])
            if moved_after:
                cands.append(o)
        if cands:
            o = rng.choice(sorted(cands))
            who = holder[o]
            # distractors after the holder's last move: other people moving (the latest place mentioned is then
            # usually not the answer, so "answer with the most recent place" does not solve the task)
            others = [p for p in PEOPLE if p != who]
            for _ in range(rng.randint(1, 2)):
                sents.append(_move(rng, rng.choice(others), rng.choice(PLACES)))
            return sents, ["where", "is", "the", o, "?"], loc[who]


def gen_count(rng, n):
    sents, snaps = _story_world(rng, n)
    loc, holder, _ = snaps[-1]
    people = sorted(loc)
    # prefer people that took part in an object event, so that counts other than "none" are common
    busy = sorted({s[0] for s in sents if s[1] in ("picked", "dropped")})
    who = rng.choice(busy if busy and rng.random() < 0.8 else people)
    count = sum(1 for h in holder.values() if h == who)
    return sents, ["how", "many", "objects", "is", who, "carrying", "?"], NUMBERS[count]


def gen_yesno(rng, n):
    sents, loc = _moves(rng, n)
    who = rng.choice(sorted(loc))
    yes = rng.random() < 0.5
    place = loc[who] if yes else rng.choice([p for p in PLACES if p != loc[who]])
    return sents, ["is", who, "in", "the", place, "?"], "yes" if yes else "no"


GENERATORS = [gen_single, gen_two, gen_count, gen_yesno]


def make_batch(rng, task_ids, max_sents, max_words=7):
    """Tokenised batch: story [B, S, W] (front-padded with empty sentences, the latest sentence last),
    question [B, W], answer [B]."""
    B = len(task_ids)
    story = torch.zeros(B, max_sents, max_words, dtype=torch.long)
    question = torch.zeros(B, max_words, dtype=torch.long)
    answer = torch.zeros(B, dtype=torch.long)
    for b, t in enumerate(task_ids):
        n = rng.randint(max(2, max_sents // 2), max_sents)
        # two supporting facts: leave room for the 1-2 distractors (and at least move, pick up, move)
        sents, q, a = GENERATORS[t](rng, max(3, n - 2) if t == 1 else n)
        for i, s in enumerate(sents):
            row = max_sents - len(sents) + i
            story[b, row, :len(s)] = torch.tensor([VOCAB[w] for w in s])
        question[b, :len(q)] = torch.tensor([VOCAB[w] for w in q])
        answer[b] = VOCAB[a]
    return story, question, answer


# ------------------------------------------------------------------------------------------------------
# The model.
# ------------------------------------------------------------------------------------------------------
def position_encoding(max_words, d):
    """MemN2N PE: l_kj = (1 - j/J) - (k/d)(1 - 2j/J), 1-based j (word) and k (dimension). [W, d] for J=W;
    rows are recomputed per sentence length in `_embed`."""
    j = torch.arange(1, max_words + 1, dtype=torch.float32)[:, None]
    k = torch.arange(1, d + 1, dtype=torch.float32)[None, :]
    return j, k


class MemN2N(nn.Module):
    def __init__(self, mod, vocab, d, max_words=7):
        super().__init__()
        self.mod, self.d = mod, d
        self.A = nn.Embedding(vocab, d, padding_idx=0)  # keys (and B = A: the question)
        self.C = nn.Embedding(vocab, d, padding_idx=0)  # values
        for e in (self.A, self.C):
            nn.init.normal_(e.weight, std=0.1)
            with torch.no_grad():
                e.weight[0].zero_()
        self.W = nn.Linear(d, vocab, bias=False)
        # the learned parameters of the compiled read (hop_value, temporal_key, temporal_value), per head (H=1)
        self.read = nn.ParameterDict({n: nn.Parameter(t) for n, t in mod.init_params(1, d, d).items()})
        j, k = position_encoding(max_words, d)
        self.register_buffer("pe_j", j)
        self.register_buffer("pe_k", k)

    def _embed(self, emb, tokens):
        """Position-encoded bag of words: Σ_j l_j ⊙ E x_j. tokens [..., W] -> [..., d]."""
        J = (tokens > 0).sum(-1, keepdim=True).clamp_min(1).float()[..., None]  # [..., 1, 1]
        lj = (1 - self.pe_j / J) - (self.pe_k / self.d) * (1 - 2 * self.pe_j / J)  # [..., W, d]
        return (emb(tokens) * lj).sum(-2)

    def forward(self, story, question):
        k = self._embed(self.A, story)[:, :, None]  # [B, S, 1, d]
        v = self._embed(self.C, story)[:, :, None]
        q = self._embed(self.A, question)[:, None, None]  # [B, 1, 1, d]
        o, _ = self.mod.apply(q, k, v, params=dict(self.read))  # o = u^{K+1} - u^1
        return self.W((q + o)[:, 0, 0])


def train_one(mod, args, hops_name, log):
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = MemN2N(mod, len(WORDS), args.dim)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s / args.steps, 1))))
    losses = []
    t0 = time.time()
    for step in range(args.steps):
        tasks = [rng.randrange(len(TASKS)) for _ in range(args.batch)]
        story, question, answer = make_batch(rng, tasks, args.mem)
        loss = F.cross_entropy(model(story, question), answer)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 40.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log and (step + 1) % max(1, args.steps // 10) == 0:
            print(f"  [{hops_name}] step {step + 1:5d}  loss {sum(losses[-50:]) / len(losses[-50:]):.3f}  "
                  f"({time.time() - t0:.0f}s)", flush=True)
    # held-out evaluation on fresh stories from a different seed stream
    erng = random.Random(10_000 + args.seed)
    acc = {}
    model.eval()
    with torch.no_grad():
        for t, name in enumerate(TASKS):
            story, question, answer = make_batch(erng, [t] * args.eval_n, args.mem)
            acc[name] = (model(story, question).argmax(-1) == answer).float().mean().item()
    k = max(1, len(losses) // 10)
    return {"acc": acc, "loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="smoke-test size")
    p.add_argument("--dim", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--mem", type=int, default=None, help="max sentences per story (memory size)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--eval-n", dest="eval_n", type=int, default=None)
    p.add_argument("--hops", default="1,3", help="comma-separated hop counts to train and compare")
    p.add_argument("--quiet", action="store_true", help="no progress lines (the results are still printed)")
    a = p.parse_args(argv)
    tiny = dict(steps=250, dim=24, batch=32, mem=6, eval_n=200)
    real = dict(steps=2500, dim=40, batch=64, mem=10, eval_n=1000)
    for n, val in (tiny if a.tiny else real).items():
        if getattr(a, n) is None:
            setattr(a, n, val)
    return a


def main(argv=None):
    torch.set_num_threads(1)
    args = parse(argv)
    text = SPEC_PATH.read_text()
    assert "hops=3" in text, "specs/memn2n.miras is expected to say hops=3"
    results = {}
    for hops in [int(h) for h in args.hops.split(",")]:
        mod = mirasc.compile_spec(text.replace("hops=3", f"hops={hops}"))
        assert mod.HOPS == hops
        if not args.quiet:
            print(f"training MemN2N with {hops} hop(s) ({args.steps} steps, d={args.dim}, memory {args.mem})",
                  flush=True)
        results[hops] = train_one(mod, args, f"{hops} hop", not args.quiet)
    # --quiet drops the progress lines only: the results are what a run is for
    print("\nheld-out accuracy per task (chance in brackets)")
    print(f"{'task':26s}" + "".join(f"{f'{h} hop(s)':>12s}" for h in results))
    for name in TASKS:
        print(f"{name + f' [{CHANCE[name]:.2f}]':26s}" + "".join(f"{r['acc'][name]:12.3f}"
                                                                for r in results.values()))
    print(f"{'train loss first->last':26s}" + "".join(f"{r['loss_first']:5.2f}->{r['loss_last']:4.2f}"
                                                      for r in results.values()))
    return results


if __name__ == "__main__":
    main()
