"""Error table of the generated Triton kernels, run under the interpreter on the CPU:

    python benchmarks/triton_errors.py            # ~5 min on 2 cores; prints a markdown table

For every parametric spec in specs/: the Triton recurrent kernel (forward + its backward) and, where the
memory has them, the chunked Triton kernels, each in float32 against the torch recurrence in float64
(the reference path, itself checked against the independent float64 reference in tests/). Reported: the
relative error ‖a − b‖/‖b‖ of the outputs, and the largest one over the final state and the gradients
of q, k, v, every gate and every initial-state tensor. Inputs: B = 1, T = 40 (a partial chunk and a
partial checkpoint segment), H = 2, Dk = Dv = 8 (residual MLP memories need Dk = Dv), chunk 16.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import mirasc  # noqa: E402

RANGES = {"eta": (0.05, 0.5), "alpha": (0.8, 1.0), "theta": (0.0, 0.9), "delta": (0.5, 3.0)}


def _channels(mod, name, Dk, Dv):
    """The trailing shape of a gate: none per head, (Dk,) or (Dv,) channel-wise (docs/semantics.md, channel-wise
    gates)."""
    side = getattr(mod, "GATE_CHANNELS", {}).get(name)
    return () if side is None else (Dk,) if side == "k" else (Dv,)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def run(mod, inputs, backend, algorithm, dtype, chunk):
    q, k, v, gates, state = inputs
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v, *gates.values(), *state.values())]
    gs = dict(zip(gates, leaves[3:3 + len(gates)]))
    st = dict(zip(state, leaves[3 + len(gates):]))
    kw = {"chunk_size": chunk} if algorithm == "chunked" and getattr(mod, "MINIBATCH", None) is None else {}
    o, final = mod.apply(*leaves[:3], gs, state=st, backend=backend, algorithm=algorithm, **kw)
    gen = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(dtype)).sum()
    for n in sorted(final):
        loss = loss + (final[n] * torch.randn(final[n].shape, generator=gen, dtype=torch.float64).to(dtype)).sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return o, [final[n] for n in sorted(final)], list(grads)


def main() -> int:
    rows = []
    for path in sorted((ROOT / "specs").glob("*.miras")):
        if not mirasc.parse_file(path).parametric or mirasc.parse_file(path).generalized_delta:
            continue  # (the generalized delta transition has no Triton kernel)
        mod = mirasc.compile_spec(path)
        g = torch.Generator().manual_seed(0)
        B, T, H, D = 1, 40, 2, 8
        sub = [mod.STEPS] if hasattr(mod, "STEPS") else []  # multi-step learners: n keys, values, η per token
        q = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1)
        k = torch.nn.functional.normalize(torch.randn(B, T, H, *sub, D, generator=g), dim=-1)
        v = torch.randn(B, T, H, *sub, D, generator=g)
        gates = {n: RANGES[n][0] + (RANGES[n][1] - RANGES[n][0])
                 * torch.rand(B, T, H, *(sub if n == "eta" else []), *_channels(mod, n, D, D), generator=g)
                 for n in mod.GATES}
        state = {n: s + 0.01 * torch.randn(s.shape, generator=g) if n.startswith("S_") else s
                 for n, s in mod.init_state(B, H, D, D).items()}
        inputs = (q, k, v, gates, state)
        ref = run(mod, inputs, "torch", "recurrent", torch.float64, 16)
        cells = [path.stem]
        for algorithm in ("recurrent", "chunked"):
            if algorithm == "chunked" and not (hasattr(mod, "_chunked_triton") or hasattr(mod, "_minibatch_triton")):
                cells += ["—", "—"]
                continue
            o, final, grads = run(mod, inputs, "triton", algorithm, torch.float32, 16)
            worst = max([rel(a, b) for a, b in zip(final, ref[1])]
                        + [rel(a, b) for a, b in zip(grads, ref[2]) if b is not None])
            cells += [f"{rel(o, ref[0]):.1e}", f"{worst:.1e}"]
        cells.append("Triton" if mod._BWD_STATE else "torch recompute")
        rows.append(cells)
        print(" | ".join(cells), flush=True)
    print("\n| spec | recurrent: out | recurrent: state+grads | chunked or mini-batch: out | "
          "chunked or mini-batch: state+grads | "
          "recurrent backward |\n|---|---|---|---|---|---|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
