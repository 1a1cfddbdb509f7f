"""Reproducible output (docs/module-api.md): the same spec always gives the same bytes, whatever the process's
hash seed, and the emitted file is standalone — it imports and runs where mirasc and the compiler's own
dependencies (lark, sympy, pydantic, networkx) cannot be imported.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from isolation import blocker_prelude

from mirasc import compile_text
from mirasc.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATHS = sorted((ROOT / "specs").glob("*.miras"))
SPEC_IDS = [p.stem for p in SPEC_PATHS]
BLOCKED = ("mirasc", "lark", "sympy", "pydantic", "networkx")
# Specs not in specs/ that reach other emitter paths (kept small so they stay valid as the language grows).
EXTRA_SPECS = {
    "extra_elastic_mlp": "model extra_elastic_mlp { memory = mlp(depth=3, expansion=2, act=relu, residual=false, "
                         "norm=none); bias = huber(delta=0.5); retention = elastic(lam=0.01, alpha=0.9); "
                         "learner = momentum(lr=0.1, theta=gate); parallel = minibatch(4) }",
    "extra_bregman_w4": "model extra_bregman_w4 { memory = linear; bias = lp(p=1.5, eps=0); "
                        "retention = bregman(phi=w^4/4); learner = gd(lr=0.05) }",
    "extra_attention": "model extra_attention { memory = nonparametric }",
}


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory) -> Path:
    """specs/*.miras plus EXTRA_SPECS, as files in one directory."""
    d = tmp_path_factory.mktemp("specs")
    for p in SPEC_PATHS:
        (d / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    for name, text in EXTRA_SPECS.items():
        (d / f"{name}.miras").write_text(text, encoding="utf-8")
    return d


@pytest.mark.parametrize("path", SPEC_PATHS, ids=SPEC_IDS)
def test_compile_twice_is_byte_identical(path):
    text = path.read_text(encoding="utf-8")
    a, b = compile_text(text, str(path)), compile_text(text, str(path))
    assert a.source == b.source
    assert a.dump_ir() == b.dump_ir()
    assert a.source.encode() == b.source.encode()


def _compile_all(spec_dir: Path, out: Path, seed: str) -> subprocess.CompletedProcess:
    """`mirasc compile SPEC -o OUT --dump-ir` for every spec, in a fresh interpreter with PYTHONHASHSEED=seed."""
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from mirasc.cli import main
        codes = [main(["compile", str(p), "-o", {str(out)!r}, "--dump-ir"])
                 for p in sorted(Path({str(spec_dir)!r}).glob("*.miras"))]
        sys.exit(max(codes))
    """)
    env = dict(os.environ, PYTHONHASHSEED=seed)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)


def test_output_independent_of_hash_seed(spec_dir, tmp_path):
    outs = []
    for seed in ("0", "4242"):
        out = tmp_path / f"seed{seed}"
        res = _compile_all(spec_dir, out, seed)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "Traceback" not in res.stderr
        outs.append(out)
    names = sorted(p.stem for p in spec_dir.glob("*.miras"))
    expected = sorted([f"{n}.py" for n in names] + [f"{n}.ir" for n in names])
    for out in outs:
        assert sorted(p.name for p in out.iterdir()) == expected
    differing = [n for n in expected if (outs[0] / n).read_bytes() != (outs[1] / n).read_bytes()]
    assert not differing, f"files differ between PYTHONHASHSEED=0 and 4242: {differing}"
    # every name an emitted module uses is defined in it, in the branches a spec cannot take as well (a reader
    # should not meet a helper that is not there): pyflakes' undefined-name check
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "F821",
                           "--output-format", "concise", str(outs[0])], capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout[-3000:] + lint.stderr[-1000:]
    # and both equal what this process emits; each module constant in them is declared in the runtime
    declared = _runtime_declarations()
    for n in names:
        compiled = compile_text((spec_dir / f"{n}.miras").read_text(encoding="utf-8"), str(spec_dir / f"{n}.miras"))
        assert (outs[0] / f"{n}.py").read_text(encoding="utf-8") == compiled.source
        assert (outs[0] / f"{n}.ir").read_text(encoding="utf-8") == compiled.dump_ir()
        constants = _module_constants(compiled.source)
        assert "GATES" in constants and constants <= declared, (n, sorted(constants - declared))


def _assigned(nodes: list[ast.stmt]) -> set[str]:
    """The names the statements assign at their level (the branches of an `if` included)."""
    names, nodes = set(), list(nodes)
    while nodes:
        node = nodes.pop()
        nodes += node.body + node.orelse if isinstance(node, ast.If) else []
        for target in node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]:
            names.update(e.id for e in getattr(target, "elts", [target]) if isinstance(e, ast.Name))
    return names


def _runtime_declarations() -> set[str]:
    """The top-level names the modules under mirasc/runtime/ assign."""
    return set().union(*(_assigned(ast.parse(p.read_text(encoding="utf-8")).body)
                         for p in (ROOT / "mirasc" / "runtime").rglob("*.py")))


def _module_constants(source: str) -> set[str]:
    """An emitted module's constants (its upper-case top-level names): each is printed from its declaration, with its
    meaning, in a module under mirasc/runtime/ (codegen.standalone.runtime_constants); no template writes its own."""
    return {n for n in _assigned(ast.parse(source).body) if re.fullmatch(r"_?[A-Z][A-Z0-9_]*", n)}


def test_cli_entry_point_hash_seed(tmp_path):
    """The real command line, `python -m mirasc.cli compile SPEC -o DIR`, twice with different seeds."""
    spec = ROOT / "specs" / "moneta.miras"
    files = []
    for seed in ("1", "98765"):
        out = tmp_path / seed
        res = subprocess.run([sys.executable, "-m", "mirasc.cli", "compile", str(spec), "-o", str(out)],
                             env=dict(os.environ, PYTHONHASHSEED=seed), capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        files.append((out / "moneta.py").read_bytes())
    assert files[0] == files[1]


# ---------------------------------------------------------------------------------------- standalone
ISOLATED_RUNNER = blocker_prelude(BLOCKED) + textwrap.dedent('''
    import importlib.util, json

    report = {"blocker_works": BLOCKER_WORKS, "modules": {}}

    import torch

    def run(path):
        spec = importlib.util.spec_from_file_location("generated_" + path.split("/")[-1][:-3], path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        g = torch.Generator().manual_seed(0)
        B, T, H, D = 1, 9, 2, 4
        sub = [mod.STEPS] if hasattr(mod, "STEPS") else []  # multi-step learners: n keys, values, η, κ per token
        q = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1)
        k = torch.nn.functional.normalize(torch.randn(B, T, H, *sub, D, generator=g), dim=-1)
        v = torch.randn(B, T, H, *sub, D, generator=g)
        gates = {name: 0.2 + 0.6 * torch.rand(B, T, H, *(sub if name == "eta" else []),
                                                *([D] if name in getattr(mod, "GATE_CHANNELS", {}) else []),
                                                generator=g) for name in mod.GATES}
        state0 = mod.init_state(B, H, D, D)
        x = {"extras": {n: torch.nn.functional.normalize(torch.randn(B, T, H, *sub, D, generator=g), dim=-1)
                         for n in mod.EXTRAS}} if getattr(mod, "EXTRAS", ()) else {}
        o, state = mod.apply(q, k, v, gates, **x)
        out = {"shape": list(o.shape), "finite": bool(torch.isfinite(o).all()), "spec_head": mod.SPEC.split("{")[0],
               "gates": list(mod.GATES), "state_keys": None}
        if state is not None:  # (a non-causal attention has no streaming state)
            o2, _ = mod.apply(q, k, v, gates, state=state, **x)  # the final state continues the sequence
            out.update(state_keys=sorted(state), init_keys=sorted(state0), continued_finite=bool(
                torch.isfinite(o2).all()))
        if mod.CHUNKED:
            oc, _ = mod.apply(q, k, v, gates, algorithm="chunked", **x)
            out["chunked_vs_recurrent"] = float((oc - mod.apply(q, k, v, gates, algorithm="recurrent", **x)[0]).norm()
                                                / o.norm().clamp_min(1e-30))
        torch.manual_seed(0)
        layer = mod.Layer(8, 2)
        y = layer(torch.randn(2, 5, 8))
        out["layer_shape"] = list(y.shape)
        out["layer_finite"] = bool(torch.isfinite(y).all())
        return out

    for path in sys.argv[1:]:
        try:
            report["modules"][path] = run(path)
        except Exception as err:
            report["modules"][path] = {"error": f"{type(err).__name__}: {err}"}
    report["leaked"] = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps(report))
''')


@pytest.fixture(scope="module")
def isolated_report(spec_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("emitted")
    for p in sorted(spec_dir.glob("*.miras")):
        assert main(["compile", str(p), "-o", str(out)]) == 0
    files = sorted(str(p) for p in out.glob("*.py"))
    # -I: no PYTHONPATH, no user site, no cwd on sys.path; the blocker hides the compiler's packages.
    res = subprocess.run([sys.executable, "-I", "-c", ISOLATED_RUNNER, *files], capture_output=True, text=True,
                         timeout=300, cwd=str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    report["dir"] = str(out)
    return report


def test_blocker_really_blocks(isolated_report):
    assert sorted(isolated_report["blocker_works"]) == sorted(BLOCKED)
    assert isolated_report["leaked"] == []


ALL_IDS = SPEC_IDS + sorted(EXTRA_SPECS)


@pytest.mark.parametrize("name", ALL_IDS)
def test_emitted_module_runs_without_compiler_dependencies(isolated_report, name):
    result = isolated_report["modules"][str(Path(isolated_report["dir"]) / f"{name}.py")]
    assert "error" not in result, result.get("error")
    assert result["shape"] == [1, 9, 2, 4]
    assert result["finite"]
    assert result["spec_head"].strip() == f"model {name}"
    if result["state_keys"] is not None:
        assert set(result["init_keys"]) <= set(result["state_keys"])
        assert result["continued_finite"]
    assert result["layer_shape"] == [2, 5, 8] and result["layer_finite"]
    if "chunked_vs_recurrent" in result:
        assert result["chunked_vs_recurrent"] < 1e-4


@pytest.mark.parametrize("path", SPEC_PATHS, ids=SPEC_IDS)
def test_emitted_source_imports_only_torch(path):
    source = compile_text(path.read_text(encoding="utf-8"), str(path)).source
    imported = set()
    for line in source.splitlines():
        m = re.match(r"\s*(?:import|from)\s+([A-Za-z_][\w.]*)", line)
        if m:
            imported.add(m.group(1).split(".")[0])
    assert imported <= {"functools", "math", "torch", "triton"}, imported  # (the standard library and torch)
    assert "torch" in imported


@pytest.mark.parametrize("path", SPEC_PATHS, ids=SPEC_IDS)
def test_emitted_source_binds_each_module_name_once(path):
    """Every top-level function, class and constant of an emitted file (its Triton block's included) is bound once: two
    runtime pieces of one name would leave the first dead, and what reads it would read the second."""
    import ast
    from collections import Counter

    source = compile_text(path.read_text(encoding="utf-8"), str(path)).source
    bound = Counter()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bound[node.name] += 1
            elif isinstance(node, ast.Assign):
                bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.If):
                visit(node.body)

    visit(ast.parse(source).body)
    assert not [name for name, n in bound.items() if n > 1]


# ------------------------------------------------------------------------------------------ --dump-ir
IR_LINE = re.compile(r"^  %(\d+) (\w+) = (\w+)(\[.*\])?\(((?:%\d+)(?:, %\d+)*)?\)(    # fused group \d+)?$")


@pytest.mark.parametrize("path", SPEC_PATHS, ids=SPEC_IDS)
def test_dump_ir_file_is_stable_text(path, tmp_path, capsys):
    assert main(["compile", str(path), "-o", str(tmp_path), "--dump-ir"]) == 0
    printed = capsys.readouterr().out
    ir_file = tmp_path / f"{path.stem}.ir"
    assert ir_file.exists() and (tmp_path / f"{path.stem}.py").exists()
    text = ir_file.read_text(encoding="utf-8")
    assert text in printed  # also printed
    assert text == compile_text(path.read_text(encoding="utf-8"), str(path)).dump_ir()
    assert main(["compile", str(path), "-o", str(tmp_path), "--dump-ir"]) == 0
    assert ir_file.read_text(encoding="utf-8") == text
    compiled = compile_text(path.read_text(encoding="utf-8"), str(path))
    if compiled.forward is None:
        assert text.startswith("#") and "nonparametric" in text
        return
    graphs = re.findall(r"^graph (\w+) \{\n(.*?)\n\}$", text, flags=re.S | re.M)
    assert [g[0] for g in graphs] == ["memory_forward", "memory_grad"]
    for _, body in graphs:
        defined: set[str] = set()
        for line in body.splitlines():
            m = IR_LINE.match(line)
            assert m, f"unexpected IR line: {line!r}"
            srcs = re.findall(r"%(\d+)", m.group(5) or "")
            assert set(srcs) <= defined, f"{line!r} uses a node before it is defined"
            defined.add(m.group(1))
        assert "output[" in body
