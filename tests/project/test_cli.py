"""The command line (`mirasc compile | check | explain | demo`): outputs and exit codes 0 (ok), 2 (bad spec),
1 only for internal errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mirasc.compiler as compiler
from mirasc import compile_text
from mirasc.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
GOOD = "model m {\n    memory = linear\n    bias = l2\n    learner = gd(lr=gate)\n}\n"
BAD = "model m {\n    memory = linear\n    bias = lp(p=0.5)\n}\n"
BUNDLED = sorted(p.stem for p in SPECS.glob("*.miras"))


def write(tmp_path: Path, text: str, name: str = "x.miras") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ------------------------------------------------------------------------------------------------ help
def test_help_shows_language_guide_and_example(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for fragment in ("compile", "check", "explain", "demo",          # the commands
                     "model moneta {", "memory    = mlp(depth=2",  # an example
                     "parallel  = minibatch(64, readout=chunk)",
                     "bias      dot | l2 | lp(p, eps=1e-6)", "retention none | decay(", "learner   gd(lr=gate)",
                     "custom(loss=EXPR in e)", "bregman(phi=EXPR in w)", "`gate`"):
        assert fragment in out, fragment


def test_compile_help_has_guide(capsys):
    with pytest.raises(SystemExit) as info:
        main(["compile", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--dump-ir" in out and "-o" in out and "model moneta {" in out


def test_help_via_subprocess():
    res = subprocess.run([sys.executable, "-m", "mirasc.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0
    assert "model moneta {" in res.stdout and "usage: mirasc" in res.stdout


@pytest.mark.parametrize("argv", [[], ["frobnicate", "x.miras"], ["compile"], ["demo", "x.miras", "--length", "x"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: mirasc" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- compile
def test_compile_writes_stem_py(tmp_path, capsys):
    spec = SPECS / "titans.miras"
    out = tmp_path / "nested" / "dir"
    assert main(["compile", str(spec), "-o", str(out)]) == 0
    target = out / "titans.py"
    assert target.exists()
    assert sorted(p.name for p in out.iterdir()) == ["titans.py"]  # no IR file without --dump-ir
    source = target.read_text(encoding="utf-8")
    assert source == compile_text(spec.read_text(encoding="utf-8"), str(spec)).source
    stdout = capsys.readouterr().out
    assert f"wrote {target}" in stdout
    assert re.search(rf"\({len(source.splitlines())} lines\)", stdout)
    compile(source, str(target), "exec")  # valid Python


def test_compile_default_output_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, GOOD, "my_model.miras")
    assert main(["compile", "my_model.miras"]) == 0
    assert (tmp_path / "out" / "my_model.py").exists()


def test_compile_dump_ir(tmp_path, capsys):
    spec = SPECS / "deltanet.miras"
    assert main(["compile", str(spec), "-o", str(tmp_path), "--dump-ir"]) == 0
    out = capsys.readouterr().out
    ir_text = (tmp_path / "deltanet.ir").read_text(encoding="utf-8")
    assert "graph memory_forward {" in ir_text and "graph memory_grad {" in ir_text
    assert ir_text in out and f"wrote {tmp_path / 'deltanet.ir'}" in out


def test_compile_bad_spec_exit_2_writes_nothing(tmp_path, capsys):
    spec = write(tmp_path, BAD)
    out = tmp_path / "out"
    assert main(["compile", str(spec), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {spec}:3:17: ")
    assert "Traceback" not in err
    assert not (out / "x.py").exists()


def test_compile_output_path_is_a_file(tmp_path, capsys):
    spec = write(tmp_path, GOOD)
    blocker = write(tmp_path, "not a directory", "occupied")
    code = main(["compile", str(spec), "-o", str(blocker)])
    err = capsys.readouterr().err
    assert code != 0 and code != 1
    assert "Traceback" not in err and str(blocker) in err


# ----------------------------------------------------------------------------------------------- check
def test_check_ok(tmp_path, capsys):
    assert main(["check", str(SPECS / "titans.miras")]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "model titans" in out
    assert "gates=['eta', 'alpha', 'theta']" in out


@pytest.mark.parametrize("text,where", [
    (BAD, "3:17"),
    ("model m {\n    memory = linear\n    bias = l2\n    learner = implicit\n    parallel = minibatch(8)\n}\n",
     "5:16"),
    ("model m {\n    memory = linear\n    bias = custom(loss=sign(e))\n}\n", "3:12"),
    ("nonsense", "1:1"),
])
def test_check_bad_exit_2(tmp_path, capsys, text, where):
    spec = write(tmp_path, text)
    assert main(["check", str(spec)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {spec}:{where}: ")
    assert "Traceback" not in captured.err and captured.out == ""


def test_check_missing_file_exit_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "absent.miras")]) == 2
    assert "cannot read spec file" in capsys.readouterr().err


def test_internal_error_exit_1(tmp_path, capsys, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("simulated")

    monkeypatch.setattr(compiler, "compile_text", boom)
    assert main(["compile", str(write(tmp_path, GOOD)), "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "internal error" in err and "RuntimeError: simulated" in err


def test_unsupported_bregman_is_exit_2_not_internal(tmp_path, capsys):
    spec = write(tmp_path, "model m {\n    memory = linear\n    bias = l2\n"
                 "    retention = bregman(phi=w^2 + exp(w))\n}\n")
    code = main(["check", str(spec)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: {spec}:4:")


def test_exit_codes_via_subprocess(tmp_path):
    for text, code in ((GOOD, 0), (BAD, 2)):
        spec = write(tmp_path, text)
        res = subprocess.run([sys.executable, "-m", "mirasc.cli", "check", str(spec)], capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == code, res.stderr
        assert "Traceback" not in res.stderr


# --------------------------------------------------------------------------------------------- explain
def test_explain_prints_spec_and_equations(capsys):
    assert main(["explain", str(SPECS / "gated_deltanet.miras")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("model gated_deltanet {\n")
    for fragment in ("memory:     M_W(x) = W x", "bias:       ℓ = ½‖e‖²", "∂ℓ/∂y = e",
                     "pre-decay:  W'_{t−1} = α_t·W_{t−1}",
                     "gradient:   g_t = ∇_W ℓ(M_W(k_t), v_t) at W'_{t−1}", "learner:    U_t = −η_t·g_t",
                     "retention:  W_t = W'_{t−1} + U_t", "read:       o_t = M_{W_t}(q_t)"):
        assert fragment in out, fragment
    assert "$" not in out and "\\" not in out


def test_explain_derived_pieces(capsys):
    assert main(["explain", str(SPECS / "hyperbolic_mirror.miras")]) == 0
    out = capsys.readouterr().out
    assert "φ(w) = cosh(w)" in out and "(φ')⁻¹(u) = asinh(u)" in out
    assert "S_t = 0.9·S_{t−1} − η_t·g_t" in out
    assert main(["explain", str(SPECS / "longhorn.miras")]) == 0
    out = capsys.readouterr().out
    assert "∂ℓ/∂y = e/(c + 1)" in out and "implicit step" in out


def test_explain_latex(capsys):
    assert main(["explain", str(SPECS / "moneta.miras"), "--latex"]) == 0
    out = capsys.readouterr().out
    derived = [line for line in out.splitlines() if line.startswith("derived:")]
    assert derived and all("$" in line for line in derived)
    assert "\\" in out and "\\sqrt" in out and "\\operatorname{erf}" in out


@pytest.mark.parametrize("name", BUNDLED)
def test_explain_latex_converts_every_line(name, capsys):
    """--latex: the spec in a verbatim block, then every equation line `label: $...$` in plain ASCII
    (no Unicode left over), with balanced braces and math delimiters."""
    assert main(["explain", str(SPECS / f"{name}.miras"), "--latex"]) == 0
    out = capsys.readouterr().out
    verbatim, equations = out.split("\\end{verbatim}\n")
    assert verbatim.startswith("\\begin{verbatim}\nmodel ")
    lines = [line for line in equations.splitlines() if line.strip()]
    assert len(lines) >= 2
    for line in lines:
        assert line.isascii(), line
        label, math = line.split(": ", 1)
        assert re.fullmatch(r"[A-Za-z][\w \-]*", label) and math.startswith("$") and math.endswith("$"), line
        assert math.count("$") == 2 and math.count("{") == math.count("}"), line


def test_explain_bad_spec_exit_2(tmp_path, capsys):
    assert main(["explain", str(write(tmp_path, BAD))]) == 2
    assert capsys.readouterr().out == ""


# ------------------------------------------------------------------------------------------------ demo
REL = re.compile(r"chunked vs recurrent: relative error ([0-9.]+e[-+][0-9]+)")


@pytest.mark.parametrize("name", ["deltanet", "ttt_linear", "titans"])
def test_demo_small(name, capsys):
    assert main(["demo", str(SPECS / f"{name}.miras"), "--length", "32", "--dim", "8", "--batch", "1",
                 "--heads", "2"]) == 0
    out = capsys.readouterr().out
    assert f"model `{name}`" in out
    assert "input: B=1 T=32 H=2 Dk=Dv=8, float32" in out
    assert re.search(r"recurrent\s+[0-9.]+ ms", out) and re.search(r"chunked\s+[0-9.]+ ms", out)
    m = REL.search(out)
    assert m, out
    assert float(m.group(1)) < 1e-4


def test_demo_without_chunked_form(capsys):
    assert main(["demo", str(SPECS / "custom_cauchy.miras"), "--length", "32", "--dim", "8", "--batch", "1",
                 "--heads", "1"]) == 0
    out = capsys.readouterr().out
    assert "chunked:   not available" in out
    assert REL.search(out) is None
    assert re.search(r"recurrent\s+[0-9.]+ ms", out)


def test_demo_bad_spec_exit_2(tmp_path, capsys):
    assert main(["demo", str(write(tmp_path, BAD)), "--length", "8", "--dim", "4"]) == 2
    assert "error:" in capsys.readouterr().err


# ------------------------------------------------------------------------------ every command, every spec


@pytest.mark.parametrize("name", BUNDLED)
def test_every_command_works_on_every_bundled_spec(name, tmp_path, capsys):
    """check, compile, explain and demo (tiny sizes) exit 0 on each bundled spec, with no internal error."""
    spec = str(SPECS / f"{name}.miras")
    for argv in (["check", spec], ["compile", spec, "-o", str(tmp_path)], ["explain", spec],
                 ["demo", spec, "--batch", "1", "--length", "8", "--heads", "2", "--dim", "4"]):
        assert main(argv) == 0, argv
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err and "internal error" not in captured.err, (argv, captured.err)
        assert captured.out.strip(), argv
    assert (tmp_path / f"{name}.py").is_file()


def test_demo_of_cross_attention_says_there_is_no_cache(capsys):
    assert main(["demo", str(SPECS / "bahdanau.miras"), "--batch", "1", "--length", "8", "--heads", "1",
                 "--dim", "4"]) == 0
    assert "final state: none (causal=false reads the given k, v" in capsys.readouterr().out


@pytest.mark.parametrize("argv,words", [
    (["--heads", "3"], "cannot run at B=1 T=8 H=3 D=4: head_mix=2 needs the number of heads to be a multiple"),
    (["--heads", "0"], "--heads 0: sizes must be >= 1"),
])
def test_demo_bad_sizes_exit_2(argv, words, capsys):
    sizes = {"--batch": "1", "--length": "8", "--heads": "2", "--dim": "4"}
    sizes.update(dict(zip(argv[::2], argv[1::2])))
    assert main(["demo", str(SPECS / "mta.miras"), *[x for kv in sizes.items() for x in kv]]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize("argv,words", [
    (["--dk", "0"], "argument --dk: a size must be >= 1, got 0"),
    (["--dv", "-4"], "argument --dv: a size must be >= 1, got -4"),
    (["--length", "0"], "argument --length: a size must be >= 1, got 0"),
    (["--chunk", "x"], "argument --chunk: expected an integer >= 1, got 'x'"),
])
def test_kernels_bad_sizes_exit_2(argv, words, capsys):
    """`mirasc kernels --dk 0` compiled kernels for an empty head and exited 0; --length 0 failed on an autograd
    message: both are usage errors now, before anything compiles."""
    with pytest.raises(SystemExit) as info:
        main(["kernels", str(SPECS / "gated_deltanet.miras"), *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_kernels_plan_only_prints_the_launch_plan(capsys):
    """`mirasc kernels --plan-only`: the compile-time plan and what apply runs on the target (the module's
    launch_plan), nothing compiled; a chunk size the spec fixes otherwise is a located error, exit 2."""
    argv = ["kernels", str(SPECS / "gated_deltanet.miras"), "--plan-only", "--dk", "128", "--target", "sm_80"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert ("launch plan (backend='auto', sm_80): triton, chunked, 64 tokens per chunk, bf16 dots; configurations a "
            "GPU may try: _chunk_state_fwd") in out
    assert main(["kernels", str(SPECS / "based.miras"), "--plan-only", "--dk", "128"]) == 0
    assert "launch plan (backend='auto', sm_90): torch, chunked: the chunked Triton kernels have no configuration" \
        in capsys.readouterr().out
    assert main(["kernels", str(SPECS / "titans.miras"), "--plan-only", "--chunk", "32"]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and "titans.miras: chunk_size is the spec's mini-batch size here (minibatch(64))" in err
    assert "Traceback" not in err


def test_builtin_forms_always_derive():
    """`mirasc check` skips the symbolic derivation for specs without expressions; that is sound only if
    every spec of built-in forms the front end accepts also derives. Check it over the vocabulary."""
    import itertools

    from mirasc import SpecError, derive, parse_text

    memories = ["linear"] + [f"mlp(act={a})" for a in ("gelu", "silu", "relu", "tanh", "identity")]
    biases = ["dot", "l2", "lp(p=1, eps=0)", "lp(p=1.5, eps=0)", "lp(p=3)", "huber", "huber(delta=0.5)",
              "huber(mode=mixture)"]
    retentions = ["none", "decay", "decay(order=pre)", "lq(q=4)", "kl", "elastic(lam=0.01)"]
    learners = ["gd", "momentum", "implicit(lr=0.5)"]
    accepted = 0
    for m, b, r, lr in itertools.product(memories, biases, retentions, learners):
        text = f"model m {{ memory = {m}; bias = {b}; retention = {r}; learner = {lr} }}"
        try:
            spec = parse_text(text)
        except SpecError:
            continue
        assert not spec.has_expressions
        derive.derive(spec)   # raises DerivationError if this shortcut were unsound
        accepted += 1
    assert accepted > 300


def test_check_of_an_expression_spec_still_derives(tmp_path, capsys):
    spec = write(tmp_path, "model m {\n    memory = linear\n    bias = custom(loss=log(e^2))\n}\n")
    assert main(["check", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:3:12: the loss derivative is not finite and real at e = 0.0: it is infinite" in err


# ------------------------------------------------------------------------------- start-up: imports, warnings
def _run_python(code: str, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=ROOT)


def test_help_and_check_import_neither_torch_nor_triton_nor_sympy():
    """What keeps `mirasc --help` and `mirasc check` fast (about 0.25 s and 0.6 s on the shared 2-core
    machine): they load argparse, lark and pydantic only."""
    code = ("import sys, contextlib, io\nfrom mirasc.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--help'])\n"
            "assert main(['check', 'specs/moneta.miras']) == 0\n"
            "print(sorted(m for m in ('torch', 'triton', 'sympy', 'networkx', 'numpy') if m in sys.modules))\n")
    res = _run_python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"


def test_no_numpy_warning_without_numpy(tmp_path):
    """numpy is not a dependency. Without it torch warns "Failed to initialize NumPy" on import; mirasc's
    commands must not print that (a package named numpy that fails to import stands for a missing numpy)."""
    fake = tmp_path / "no_numpy" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    plain = _run_python("import torch; torch.zeros(1)", extra_path=str(fake.parent))
    assert "Failed to initialize NumPy" in plain.stderr   # the environment really lacks numpy for torch
    code = ("import sys\nfrom mirasc.cli import main\n"
            "assert main(['check', 'specs/moneta.miras']) == 0\n"
            "assert main(['demo', 'specs/deltanet.miras', '--length', '8', '--dim', '4', '--heads', '1']) == 0\n")
    res = _run_python(code, extra_path=str(fake.parent))
    assert res.returncode == 0, res.stderr
    assert "NumPy" not in res.stderr and "Warning" not in res.stderr, res.stderr
