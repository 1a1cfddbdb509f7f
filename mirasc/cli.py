"""Command line: `mirasc compile | check | explain | demo | train | explore | export | eval | verify | kernels`,
one subparser each.
Exit codes: 0 ok, 2 bad input (spec, options, checkpoint), 1 internal error, 130 interrupted;
3 a check that did not pass (`kernels`: a kernel that does not fit its target; `verify`: a row beyond tolerance).

Only the handlers import torch (and through it triton), so `mirasc --help` and `mirasc check` stay fast."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

LANGUAGE_GUIDE = """\
A .miras spec picks the four Miras design choices (plus the parallel form):

  # specs/moneta.miras
  model moneta {
      memory    = mlp(depth=2, expansion=4, act=gelu, residual=true, norm=layernorm)
      bias      = lp(p=3)                 # the attentional bias: the inner loss in e = M(k) - v
      retention = lq(q=4, alpha=gate)     # how the memory keeps the past
      learner   = gd(lr=gate(v))          # how the memory is updated per token (channel-wise step size)
      parallel  = minibatch(64, readout=chunk)  # exact, or gradients per chunk at the chunk's anchor state;
                                                # readout=chunk: lq/kl maps at chunk boundaries only
  }

  memory    linear | mlp(depth, expansion, act=gelu|silu|relu|tanh|identity, residual, norm=layernorm|none)
            | nonparametric(kernel=softmax, scale)
  bias      dot | l2 | lp(p, eps=1e-6) | huber(delta=gate, mode=coordinate|mixture) | custom(loss=EXPR in e)
  retention none | decay(alpha=gate, order=post|pre) | lq(q, alpha=gate) | kl(c=1, alpha=gate)
            | elastic(lam, alpha=gate) | box(radius, alpha=gate) | bregman(phi=EXPR in w)
  learner   gd(lr=gate) | momentum(lr=gate, theta=gate) | implicit(lr=gate) | muon(lr=gate, theta=gate)
            | precond(lr=gate, nu=gate, rho=gate, transform=rms|atk) | nonparametric
  parallel  exact | minibatch(C, readout=token|chunk)

A coefficient written `gate` is a per-token input of the compiled op ([B, T, H]) named by its role:
eta (lr), alpha (retention), theta (momentum), delta (Huber), gamma (Omega window), nu and rho (precond's
statistic); a number makes it a constant.
`gate(k)` / `gate(v)` make it channel-wise, [B, T, H, Dk] / [B, T, H, Dv] (lr=gate(v): the loss weighted
per output channel).

The manual is docs/ in the mirasc repository: language.md, semantics.md, module-api.md, cli.md.
"""


def _load(path: str):
    from . import compiler
    from .language import frontend

    text, p = frontend.read_spec(Path(path))
    return compiler.compile_text(text, p)


def cmd_compile(args) -> int:
    from .codegen.standalone import model_source

    compiled = _load(args.spec)
    out_dir = Path(args.output)
    target = out_dir / f"{Path(args.spec).stem}.py"
    source = compiled.source + (model_source() if args.model else "")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        target.write_text(source, encoding="utf-8")
    except OSError as err:
        print(f"error: cannot write {target}: {err.strerror or err} (-o takes a directory)", file=sys.stderr)
        return 2
    print(f"wrote {target} ({len(source.splitlines())} lines{', with the language model' if args.model else ''})")
    if args.dump_ir:
        ir_path = out_dir / f"{Path(args.spec).stem}.ir"
        ir_path.write_text(compiled.dump_ir(), encoding="utf-8")
        print(compiled.dump_ir(), end="")
        print(f"wrote {ir_path}")
    return 0


def cmd_check(args) -> int:
    """Parse and validate without generating code. A spec with an expression (custom loss, Bregman
    potential) is also derived, since only the symbolic derivation can reject it; the built-in forms
    always derive (tests/project/test_cli.py checks that), so their check loads lark and pydantic but not sympy."""
    from .language import frontend

    text, path = frontend.read_spec(Path(args.spec))
    s = frontend.parse_text(text, path)
    if s.has_expressions:
        from . import compiler

        compiler.derive_parsed(s, text, path)
    print(f"{args.spec}: ok — model {s.name}: memory={s.memory.kind} bias={s.bias.kind} "
          f"retention={s.retention.kind} learner={s.learner.kind}{f'(steps={s.steps})' if s.steps > 1 else ''} "
          f"parallel={s.parallel.kind}; "
          f"gates={[g + (f'({side})' if side else '') for g, side in s.gate_channels().items()]}")
    return 0


def cmd_explain(args) -> int:
    from .explain import equations

    compiled = _load(args.spec)
    if args.latex:
        print("\\begin{verbatim}\n" + compiled.spec.canonical() + "\\end{verbatim}\n")
    else:
        print(compiled.spec.canonical())
    for line in equations(compiled.spec, compiled.derivation, latex=args.latex):
        print(line)
    if not args.latex:
        print("\nAlgorithms and kernels (docs/kernels.md, \"Which kernels run a spec\"):")
        for line in compiled.plan.describe():
            print("  " + line)
    return 0


def cmd_demo(args) -> int:
    """Compile a spec, run it on random input with both algorithms, print what happened."""
    import torch

    from . import compiler
    from .verify import random_inputs

    B, T, H, D = args.batch, args.length, args.heads, args.dim
    small = [f"--{n} {val}" for n, val in (("batch", B), ("length", T), ("heads", H), ("dim", D)) if val < 1]
    if small:
        print(f"mirasc demo: {', '.join(small)}: sizes must be >= 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    compiled = _load(args.spec)
    mod = compiler.load_source(compiled.source, compiled.spec.name)
    t_compile = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    sub = [mod.STEPS] if hasattr(mod, "STEPS") and mod.STEPS > 1 else []  # a multi-step learner's pairs per token
    # unit-norm q, k (and key inputs such as κ), normal v, gates in their usual ranges (as mirasc verify draws them)
    inputs = random_inputs(mod, B, T, H, D, gen)
    q, k, v, gates, extras = (inputs[n] for n in ("q", "k", "v", "gates", "extras"))
    print(f"compiled {args.spec} -> model `{compiled.spec.name}` in {t_compile * 1e3:.0f} ms "
          f"({len(compiled.source.splitlines())} lines of torch); gates {list(mod.GATES)}")
    print(f"input: B={B} T={T} H={H} Dk=Dv={D}, float32" + (f", {sub[0]} (key, value) pairs per token" if sub else ""))
    results = {}
    for algo in ("recurrent", "chunked"):
        if algo == "chunked" and not mod.CHUNKED:
            print("chunked:   not available for this spec (exact per-token dependence)")
            continue
        t = time.perf_counter()
        try:
            o, state = mod.apply(q, k, v, gates, algorithm=algo, **({"extras": extras} if extras else {}))
        except ValueError as err:  # the op rejects these sizes (e.g. head_mix needs a multiple of heads)
            print(f"mirasc demo: {args.spec} cannot run at B={B} T={T} H={H} D={D}: {err}", file=sys.stderr)
            return 2
        dt = time.perf_counter() - t
        results[algo] = o
        print(f"{algo:<10} {dt * 1e3:8.1f} ms  ‖o‖ = {o.norm():.4f}  final state: {_describe_state(state)}")
    if len(results) == 2:
        a, b = results["chunked"], results["recurrent"]
        print(f"chunked vs recurrent: relative error {(a - b).norm() / b.norm():.2e}")
    return 0


VERIFY_HELP = """\
Check a compiled spec before training it: every algorithm (recurrent, chunked) and backend (torch, triton)
the module has runs at small random sizes (several chunks or mini-batches, a partial last one) against the
module's own float64 token-by-token recurrence. Compared: the output o, the final state and the gradient
of every input (q, k, v, each gate, each extra key input, the read's learned parameters), as the relative
error ||x - x_ref|| / ||x_ref||. Tolerances: float64 1e-9, float32 1e-4.

Without --dtype both are checked (the Triton kernels take float32 only here). Triton runs on the GPU when
there is one, else in Triton's CPU interpreter (TRITON_INTERPRET=1 is set for this run). Exit status: 0
when every row that runs is within its tolerance (PASS), 3 when one is not (FAIL), 2 for a bad spec."""


def cmd_verify(args) -> int:
    import os

    if not 0 <= args.seed < 2 ** 63:
        print(f"mirasc verify: --seed {args.seed}: a seed is in [0, 2^63)", file=sys.stderr)
        return 2
    backends = [args.backend] if args.backend else ["torch", "triton"]
    if "triton" in backends:
        import torch

        if not torch.cuda.is_available():  # the kernels run in Triton's interpreter (read when they are defined)
            os.environ.setdefault("TRITON_INTERPRET", "1")
    from . import compiler, verify

    compiled = _load(args.spec)
    mod = compiler.load_source(compiled.source, compiled.spec.name)
    dtypes = [args.dtype] if args.dtype else ["float64", "float32"]
    s = verify.sizes(mod)
    t0 = time.perf_counter()
    rows = verify.verify(mod, dtypes=dtypes, backends=backends, seed=args.seed)
    print(f"verify {args.spec}: model `{compiled.spec.name}`, B={s['B']} T={s['T']} H={s['H']} Dk=Dv={s['D']}"
          + (f", chunk_size {s['chunk_size']}" if s["chunk_size"] and mod.CHUNKED else "")
          + f"; reference: float64 recurrence (torch); seed {args.seed}")
    for line in verify.format_rows(rows):
        print(line)
    info = [r for r in rows if r.info and not r.failed]  # the float32 recurrence: a measure, not a check
    ran = [r for r in rows if (r.ran or r.failed) and r not in info]
    failed = [r for r in ran if not r.passed()]
    skipped = len(rows) - len(ran) - len(info)
    if not ran:
        print(f"mirasc verify: nothing to check: {args.spec} has no {' or '.join(backends)} path at "
              f"{' or '.join(dtypes)}", file=sys.stderr)
        return 2
    verdict = "FAIL" if failed else "PASS"
    widened = sorted({q for r in rows for q in r.bounds})
    if info:
        own = info[0]
        print(f"note: the float32 torch recurrence (info) measures how far float32 rounding takes this design from "
              f"float64; each other float32 row passes when every error is within max("
              f"{verify.TOLERANCE['float32']:.0e}, {verify.OWN_ROUNDING:g} × the info row's error)"
              + (f", over the tolerance here for {', '.join(widened)} (worst {max(own.errors.values()):.1e})"
                 if widened else ""))
    print(f"{verdict}: {len(ran) - len(failed)} of {len(ran)} checks within tolerance"
          + (f", {skipped} not available" if skipped else "") + f" ({time.perf_counter() - t0:.1f} s)")
    return 3 if verdict == "FAIL" else 0


KERNELS_HELP = """\
Compile, for a real GPU target and without a GPU, every Triton kernel the spec's module launches
(backend="triton", each algorithm it has, forward and backward) in every configuration its autotuner
may try, and report registers, spill bytes, shared memory, whether it fits the target's per-block
shared memory (sm_80 163 KB, sm_90/sm_100 227 KB), tensor-core use and compile time. `kept` marks the
configurations the module's resource model lets a GPU of that target launch.

Exit status: 0 when every kernel has a kept configuration that fits and every kept one fits; 3 when
not (a kernel that cannot launch, or a resource model that lets an oversized configuration through);
2 for a bad spec. Honest compile times need an empty Triton cache (TRITON_CACHE_DIR).
"""


def cmd_kernels(args) -> int:
    import json
    import os
    from dataclasses import asdict

    if not args.plan_only:  # (the launch plan compiles nothing)
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET"):
            print("error: mirasc kernels compiles for a GPU; run it without TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        os.environ.pop("TRITON_INTERPRET", None)
    from .lab import kernel_report as kr

    status, every = 0, []
    for spec in args.spec:
        compiled = _load(spec)  # a bad spec is reported like everywhere else (exit 2)
        print(f"== {spec}: {args.target}, Dk={args.dk} Dv={args.dv or args.dk}, {args.dtype}, T={args.length}")
        print("\n".join(compiled.plan.describe()))
        try:
            print(_launch_plan_line(compiled, args))
        except ValueError as err:  # sizes the module refuses whatever the backend (a mini-batch's fixed chunk)
            print(f"error: {spec}: {err}", file=sys.stderr)
            return 2
        if args.plan_only:
            continue
        try:
            rows = kr.report(spec, target=args.target, dk=args.dk, dv=args.dv or args.dk, dtype=args.dtype,
                             T=args.length, chunk=args.chunk, which="extremes" if args.extremes else "all",
                             algorithms=args.algorithm)
        except kr.NoKernels as err:
            print(f"{spec}: {err} (nothing to compile)")
            continue
        summary = kr.summarize(rows)
        print(kr.format_rows(rows) if args.all else kr.format_summary(summary))
        for s in summary:
            if s.get("refused"):  # the module's own refusal of these sizes (its reason and the way out)
                print(f"{spec}: {s['kernel']}: {s['refused']}", file=sys.stderr)
                status = 3
            elif s["kept_fit"] == 0 or s["kept_not_fit"]:
                print(f"{spec}: {s['kernel']}: {s['kept_fit']} kept configurations fit, {s['kept_not_fit']} kept "
                      f"do not", file=sys.stderr)
                status = 3
        every += [dict(asdict(r), spec=spec, target=args.target) for r in rows]
    if args.json:
        Path(args.json).write_text(json.dumps(every, indent=1), encoding="utf-8")
    return status


def _launch_plan_line(compiled, args) -> str:
    """What the module's apply runs with backend='auto' on a GPU of the target (its launch_plan), in one line."""
    import torch

    from . import compiler

    module = compiler.load_source(compiled.source, compiled.spec.name)
    plan = module.launch_plan(args.dk, args.dv or args.dk, dtype=getattr(torch, args.dtype), device=args.target,
                              chunk_size=args.chunk)
    head = f"launch plan (backend='auto', {args.target}): {plan['backend']}, {plan['algorithm']}"
    if plan["backend"] != "triton":
        return f"{head}: {plan['reason']}"
    chunk = f", {plan['chunk']} tokens per chunk" if plan["chunk"] else ""
    spaces = ", ".join(f"{name} {len(configs)}" for name, configs in plan["kernels"].items())
    return f"{head}{chunk}, {plan['precision']} dots; configurations a GPU may try: {spaces}"


def _describe_state(state) -> str:
    """Parametric memories return weight tensors; attention returns its cache (tensors and the start
    position), or None when it reads another sequence (causal=false) and keeps no cache."""
    if state is None:
        return "none (causal=false reads the given k, v; there is no cache to continue)"
    parts = []
    for name, value in state.items():
        parts.append(f"{name} {list(value.shape)}" if hasattr(value, "shape") else f"{name} = {value}")
    return ", ".join(parts)


def cmd_export(args) -> int:
    """`mirasc export SPEC --hf DIR` (fresh weights) or `mirasc export --from-checkpoint CKPT --hf DIR`."""
    if (args.spec is None) == (args.from_checkpoint is None):
        print("mirasc export: give a SPEC or --from-checkpoint CKPT (one of the two)", file=sys.stderr)
        return 2
    try:
        import transformers  # noqa: F401

        from .lab import hf
    except ImportError as err:
        print(f"mirasc export: needs the hf extra (pip install 'mirasc[hf]'): {err}", file=sys.stderr)
        return 2
    if args.from_checkpoint is not None:
        try:
            out = hf.export_checkpoint(args.from_checkpoint, args.hf)
        except (OSError, ValueError) as err:
            print(f"mirasc export: {err}", file=sys.stderr)
            return 2
        print(f"wrote {out} (Hugging Face model, weights of {args.from_checkpoint})")
        return 0
    from .lab.tokenizer import load_tokenizer
    from .lab.train_config import config_from

    try:
        if not -2 ** 63 <= args.seed < 2 ** 64:
            raise ValueError(f"--seed {args.seed} is out of range: torch's seeds are 64-bit integers")
        tokenizer = load_tokenizer(args.tokenizer)
        cfg = config_from(overrides={k: getattr(args, k) for k in
                                     ("d_model", "n_layers", "n_heads", "mlp_hidden", "hybrid_every", "window",
                                      "layer_options", "vocab_size")})
        lm_config = cfg.lm_config()
        lm_config.vocab_size = cfg.vocab_size or tokenizer.vocab_size
        out = hf.export(args.spec, args.hf, lm_config, seed=args.seed, dtype=args.dtype,
                        tokenizer_files=tokenizer.files())
    except (TypeError, ValueError, OSError) as err:  # sizes, Layer options or a tokenizer the model rejects
        print(f"mirasc export: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} (Hugging Face model, fresh weights, seed {args.seed})")
    return 0


EVAL_HELP = """\
Run lm-eval (0.4.x) on a model folder written by `mirasc export --hf` or `mirasc train --export-hf`, on
tasks written from local data into --task-dir (lm-eval task YAML over JSONL files; nothing is downloaded):

  ppl    perplexity (word, byte, bits per byte) of held-out documents of --data
  cloze  the last word of held-out documents of --data (acc: greedy; perplexity)
  mqar   multi-query associative recall (mirasc.lab.tasks' generator, token i = chr(33 + i)); acc
  niah   single needle in a haystack (mirasc.lab.tasks' S-NIAH text); acc on the whole answer

Writes lm-eval's results JSON (--output) and prints the equivalent `lm-eval run` command."""


def _eval_arguments(p):
    from .lab.evaluation import add_arguments  # no torch or lm-eval import at parse time

    add_arguments(p)


def cmd_eval(args) -> int:
    from .lab import evaluation

    return evaluation.run(args)


def cmd_train(args) -> int:
    from .lab import train

    return train.run(args)


def build_parser() -> argparse.ArgumentParser:
    """The `mirasc` command and its subcommands (argument definitions only: nothing here imports torch)."""
    from .lab import explore, train_config
    from .lab.train_config import add_threads_argument

    parser = argparse.ArgumentParser(prog="mirasc", description="Compile Miras sequence-model specs into "
                                     "standalone PyTorch modules.", epilog=LANGUAGE_GUIDE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compile", help="emit DIR/<spec>.py", epilog=LANGUAGE_GUIDE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec")
    p.add_argument("-o", "--output", default="out", help="output directory (default: out)")
    p.add_argument("--dump-ir", action="store_true", help="print and write the dataflow graphs")
    p.add_argument("--model", action="store_true", help="also emit the byte-level language model (make_model())")
    p.set_defaults(fn=cmd_compile)
    p = sub.add_parser("check", help="parse and validate a spec")
    p.add_argument("spec")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("explain", help="print the derived update equations")
    p.add_argument("spec")
    p.add_argument("--latex", action="store_true", help="LaTeX instead of Unicode")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("explore", help="train and rank a grid of designs on a synthetic task, or search them in an "
                       "Optuna study (--help)")
    explore.add_arguments(p)
    p.set_defaults(fn=explore.run)
    p = sub.add_parser("train", help="train a byte-level LM with the spec's layer (see mirasc train --help)")
    train_config.add_arguments(p)
    p.set_defaults(fn=cmd_train)
    _export_arguments(sub.add_parser(
        "export", help="write a Hugging Face transformers model folder (needs the hf extra)",
        description="Write DIR: config.json (spec text, sizes, auto_map), modeling_mirasc.py (the emitted module, "
        "the LM and its transformers wrapper; no mirasc needed to load it) and model.safetensors. Load it with "
        "AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)."))
    p = sub.add_parser("eval", help="run lm-eval on an exported model with local tasks (needs the eval extra)",
                       description=EVAL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _eval_arguments(p)
    add_threads_argument(p)
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("demo", help="compile a spec and run it on random input")
    p.add_argument("spec")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    add_threads_argument(p)
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("verify", help="check every algorithm and backend of a spec's module against its float64 "
                       "recurrence (outputs, final state, gradients)", description=VERIFY_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec")
    p.add_argument("--dtype", choices=["float64", "float32"], default=None,
                   help="check this dtype only [both]")
    p.add_argument("--backend", choices=["torch", "triton"], default=None, help="check this backend only [both]")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs [0]")
    add_threads_argument(p)
    p.set_defaults(fn=cmd_verify)
    _kernels_arguments(sub.add_parser(
        "kernels", help="compile every Triton kernel a spec launches for a GPU target (no GPU needed) and report "
        "registers, spills, shared memory and whether it fits", description=KERNELS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter))
    return parser


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", default=None, help="a .miras file (omit with --from-checkpoint)")
    p.add_argument("--hf", required=True, metavar="DIR", help="output directory")
    p.add_argument("--from-checkpoint", metavar="CKPT", default=None,
                   help="a mirasc train checkpoint (or run directory): its spec, sizes and trained weights")
    for name, kind, default in (("d_model", int, 128), ("n_layers", int, 2), ("n_heads", int, 2),
                                ("mlp_hidden", int, 0), ("hybrid_every", int, 0), ("window", int, 256)):
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                       help=f"[{default}] as in mirasc train")
    p.add_argument("--layer-options", type=json.loads, default=None, metavar="JSON",
                   help="JSON object of Layer options, as in mirasc train")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"],
                   help="dtype of the saved weights, the one the model loads in by default [float32]")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="a local tokenizer (tokenizer.json or a tokenizer folder) to export with the model; the "
                   "vocabulary follows it [bytes]")
    p.add_argument("--vocab-size", type=int, default=None, help="vocabulary [the tokenizer's; 256 for bytes]")
    p.add_argument("--seed", type=int, default=0, help="seed of the fresh initialisation [0]")
    p.set_defaults(fn=cmd_export)


def _size(text: str) -> int:
    """An argument that is a size: an integer >= 1 (argparse reports anything else as the argument's error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a size must be >= 1, got {value}")
    return value


def _kernels_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="+")
    p.add_argument("--target", default="sm_90", choices=["sm_80", "sm_86", "sm_89", "sm_90", "sm_100"])
    p.add_argument("--dk", type=_size, default=64, help="key head size (default 64)")
    p.add_argument("--dv", type=_size, default=None, help="value head size (default: --dk)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--chunk", type=_size, default=None, help="chunk_size for specs whose chunk is a schedule choice")
    p.add_argument("--length", type=_size, default=256, help="sequence length of the traced call (default 256)")
    p.add_argument("--algorithm", choices=["chunked", "recurrent"], action="append", default=None,
                   help="trace only this algorithm (repeatable; default: every algorithm the spec has)")
    p.add_argument("--all", action="store_true", help="one line per compiled configuration, not per kernel")
    p.add_argument("--extremes", action="store_true", help="compile only the first (safest) and last (largest) "
                   "configuration the resource model keeps per autotuned kernel (a quick check)")
    p.add_argument("--json", default=None, help="also write every row as JSON to this file")
    p.add_argument("--plan-only", action="store_true", help="print the compile-time plan and the launch plan "
                   "(what apply runs on the target, module.launch_plan) and compile nothing")
    p.set_defaults(fn=cmd_kernels)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # torch warns on import when numpy is missing; mirasc never hands tensors to numpy (and numpy is no
    # dependency of it), so the warning says nothing about a user's run
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

    from .language.messages import SpecError

    try:
        if "threads" in vars(args) and args.command in ("demo", "eval", "verify"):  # (train and explore: their own)
            from .lab.train_config import apply_threads

            try:
                apply_threads(args.threads)
            except ValueError as err:
                print(f"mirasc {args.command}: {err}", file=sys.stderr)
                return 2
        return args.fn(args)
    except SpecError as err:
        for e in err.all:  # every error the front end found, one per line
            print(f"error: {e.path}:{e.line}:{e.col}: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception:  # an internal error: say so plainly, with the trace for the bug report
        print("mirasc: internal error (this is a bug in mirasc, not in your spec):", file=sys.stderr)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
