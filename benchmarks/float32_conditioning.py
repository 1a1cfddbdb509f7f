"""How far float32 can be from float64 for a spec, set against how far the spec's own recurrence moves when only its
inputs are perturbed by a float32 rounding: a float32 path cannot be expected to agree with float64 better than the
problem's conditioning allows.

For each design, at the exactness tests' shape (tests/module/test_semantics.py: B = 2, H = 3, D = 8, 2.5 chunks, the
reference's inputs and initial state), the token recurrence (`algorithm="recurrent"`, torch) is run
  - in float64: the reference answer;
  - in float32 from the same inputs: the float32 error;
  - in float64 from the inputs rounded to float32: what the inputs' rounding alone moves;
  - in float64 from inputs and initial state each multiplied by (1 + 6e-8·N(0, 1)), about one float32 ulp: the
    recurrence's sensitivity to a perturbation of that size.
Each number is the relative Frobenius error of the final state's weights (and of the outputs).

    python benchmarks/float32_conditioning.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "module")]

import reference as R  # noqa: E402
import test_semantics as TS  # noqa: E402

import mirasc  # noqa: E402

# (label, bundled spec, retention's c where the row sum is changed)
DESIGNS = [("Memora, kl(c=1) (bundled)", "memora", None), ("Memora, kl(c=32)", "memora", 32.0),
           ("Moneta", "moneta", None), ("Yaad", "yaad", None), ("Titans", "titans", None),
           ("Gated DeltaNet", "gated_deltanet", None)]


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def design(name: str, c: float | None):
    text = (ROOT / "specs" / f"{name}.miras").read_text(encoding="utf-8")
    cfg = copy.deepcopy(R.REF_CONFIGS[name])
    if c is not None:
        text = text.replace("kl(c=1,", f"kl(c={c:g},").replace(f"model {name}", f"model {name}_c{c:g}")
        cfg["retention"]["c"] = c
    return mirasc.compile_spec(text), cfg


def measure(name: str, c: float | None) -> dict[str, float]:
    mod, cfg = design(name, c)
    T = TS.seq_len(name)
    q, k, v, g = R.make_inputs(cfg, TS.B, T, TS.H, TS.D, TS.D, torch.float64, TS.SEED)
    s = R.make_state(cfg, TS.B, TS.H, TS.D, TS.D, torch.float64, TS.SEED)

    def run(q, k, v, g, s):
        return mod.apply(q, k, v, g, state=s, algorithm="recurrent")

    def cast(x, dtype):
        return {n: y.to(dtype) for n, y in x.items()} if isinstance(x, dict) else x.to(dtype)

    o64, f64 = run(q, k, v, g, s)
    inputs32 = [cast(x, torch.float32) for x in (q, k, v, g, s)]
    o32, f32 = run(*inputs32)
    o_r, f_r = run(*[cast(x, torch.float64) for x in inputs32])
    gen = torch.Generator().manual_seed(7)

    def perturb(x):
        if isinstance(x, dict):
            return {n: perturb(y) for n, y in x.items()}
        return x * (1 + 6e-8 * torch.randn(x.shape, generator=gen, dtype=torch.float64))

    o_p, f_p = run(*[perturb(x) for x in (q, k, v, g, s)])
    weights = sorted(n for n in f64 if not n.startswith(("S_", "A_")))
    out = {"T": T}
    for label, (o, f) in {"float32": (o32, f32), "rounded": (o_r, f_r), "perturbed": (o_p, f_p)}.items():
        out[label] = max(rel(f[n], f64[n]) for n in weights)
        out[label + "_o"] = rel(o, o64)
    return out


def main() -> int:
    torch.set_num_threads(1)
    print("| design | T | float32 (state) | inputs rounded to float32 (state) | 1-ulp perturbation (state) | "
          "float32 (output) | 1-ulp perturbation (output) |")
    print("|---|---|---|---|---|---|---|")
    for label, name, c in DESIGNS:
        m = measure(name, c)
        print(f"| {label} | {m['T']} | {m['float32']:.1e} | {m['rounded']:.1e} | {m['perturbed']:.1e} | "
              f"{m['float32_o']:.1e} | {m['perturbed_o']:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
