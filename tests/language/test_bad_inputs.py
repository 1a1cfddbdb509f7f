"""Bad inputs past the spec boundary, through the API, the Layer and the command line: each is a plain, located
message with an exception of a documented type (ValueError, TypeError, RuntimeError, SpecError) or exit status 2,
never a traceback or `mirasc: internal error`; and the cases that used to be silent surprises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mirasc
from mirasc import SpecError, compile_spec, compile_text
from mirasc.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
GDN = str(SPECS / "gated_deltanet.miras")


@pytest.fixture(scope="module")
def gdn():
    return compile_spec(GDN)


def _inputs(mod, B=1, T=5, H=2, D=4):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    gates = {n: torch.rand(B, T, H, generator=g) for n in mod.GATES}
    return q, k, v, gates


# ------------------------------------------------------------------------------------------ Layer options
@pytest.mark.parametrize("options, words", [
    ({"qk_norm": "L2"}, ["'qk_norm'", "did you mean 'l2'"]),
    ({"out_norm": "RMS"}, ["'out_norm'", "did you mean 'rms'"]),
    ({"alpha_min": 1.5, "conv": 99}, ["'alpha_min' = 1.5", "'conv' = 99", "<= 16", "< 1"]),
    ({"conv": 2.0}, ["'conv' takes an integer"]),
    ({"out_gate": 1}, ["'out_gate' takes true or false"]),
    ({"eta_max": float("nan")}, ["'eta_max' takes a finite number"]),
    ({"key_shift": 0.5, "conv": 1}, ["'key_shift' = 0.5", "conv = 1 has none", "conv >= 2"]),
])
def test_layer_refuses_bad_option_values_naming_each(gdn, options, words):
    with pytest.raises(ValueError) as info:
        gdn.Layer(8, 2, **options)
    for w in words:
        assert w in str(info.value)


def test_layer_schema_accepts_what_the_layer_block_accepts():
    """The emitted checker and the spec's LayerOptions agree at every bound and on every word."""
    from pydantic import ValidationError

    from mirasc.language import layer_options, spec

    def block_accepts(key, value):
        try:
            spec.LayerOptions(**{key: value})
            return True
        except ValidationError:
            return False

    for key, rule in layer_options.schema().items():
        if rule["type"] == "bool":
            values = [True, False]
        elif rule["type"] == "choice":
            values = [*rule["choices"], "nope"]
        else:
            bounds = [rule[b] for b in ("ge", "gt", "le", "lt") if b in rule]
            step = 1 if rule["type"] == "int" else 1e-9
            values = sorted({b + d for b in bounds for d in (-step, 0, step)})
            values = [int(x) if rule["type"] == "int" else float(x) for x in values]
        for value in values:
            assert (layer_options.check({key: value}) == []) == block_accepts(key, value), (key, value)


def test_layer_unknown_option_is_a_type_error_with_a_suggestion(gdn):
    with pytest.raises(TypeError, match=r"unknown Layer option 'qknorm' \(did you mean 'qk_norm'\?\)"):
        gdn.Layer(8, 2, qknorm="l2")


@pytest.mark.parametrize("d_model, heads, words", [(30, 4, "not a multiple of num_heads = 4"),
                                                   (8, 0, "num_heads must be an integer >= 1"),
                                                   (0, 2, "d_model must be an integer >= 1"),
                                                   (8.0, 2, "d_model must be an integer")])
def test_layer_sizes(gdn, d_model, heads, words):
    with pytest.raises(ValueError, match=words):
        gdn.Layer(d_model, heads)


def test_layer_head_dim_makes_any_width_legal(gdn):
    layer = gdn.Layer(30, 4, head_dim=8)
    assert layer(torch.randn(1, 3, 30)).shape == (1, 3, 30)


def test_layer_inputs(gdn):
    layer = gdn.Layer(8, 2)
    with pytest.raises(ValueError, match=r"\[B, T, d_model\] with d_model = 8, got \(1, 3, 6\)"):
        layer(torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match=r"\[B, d_model\] with d_model = 8, got \(1, 1, 8\)"):
        layer.step(torch.randn(1, 1, 8), layer.init_cache(1))
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.ones(1, 3, 8, dtype=torch.long))
    # (torch's own matmul message, "expected m1 and m2 to have the same dtype", named neither x nor the Layer)
    with pytest.raises(TypeError, match=r"x is torch.float64 but the Layer's parameters are torch.float32"):
        layer(torch.randn(1, 3, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"x is torch.bfloat16 but the Layer's parameters are torch.float32"):
        layer.step(torch.randn(1, 8, dtype=torch.bfloat16), layer.init_cache(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts for the projections: any float x
        assert layer(torch.randn(1, 3, 8, dtype=torch.bfloat16)).shape == (1, 3, 8)
    with pytest.raises(TypeError, match="cache must be the dict"):
        layer.step(torch.randn(1, 8), None)
    assert layer.to(torch.float64)(torch.randn(1, 3, 8, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("name", ["gated_deltanet", "titans", "transformer", "bahdanau", "deltaproduct"])
def test_layer_on_an_empty_sequence(name):
    layer = compile_spec(str(SPECS / f"{name}.miras")).Layer(8, 2)
    x = torch.randn(2, 0, 8, requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 0, 8)
    y.sum().backward()


def test_layer_block_reports_every_bad_setting(tmp_path, capsys):
    text = ("model m {\n    memory = linear\n    bias = l2\n"
            "    layer { conv = 99; qk_norm = L2; alpha_min = 1.5; out_gate = 3 }\n}\n")
    with pytest.raises(SpecError) as info:
        compile_text(text, "m.miras")
    assert [(e.line, "conv" in e.message or "qk_norm" in e.message or "alpha_min" in e.message
             or "out_gate" in e.message) for e in info.value.all] == [(4, True)] * 4
    assert [e.col for e in info.value.all] == sorted(e.col for e in info.value.all)
    p = tmp_path / "m.miras"
    p.write_text(text)
    assert main(["check", str(p)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 4


def test_layer_block_refuses_a_key_shift_without_a_previous_tap():
    text = "model m {\n    memory = linear\n    bias = l2\n    layer { conv = 0; key_shift = 0.5 }\n}\n"
    with pytest.raises(SpecError) as info:
        compile_text(text, "m.miras")
    assert (info.value.line, info.value.col) == (4, 35)  # at the value, as every layer setting
    assert "'key_shift' = 0.5" in info.value.message and "conv = 0 has none" in info.value.message
    assert main(["explore", "--spec", GDN, "--layer", "conv=0", "key_shift=0.5", "--steps", "1"]) == 2


# ------------------------------------------------------------------------------------------ apply
def test_apply_gate_types(gdn):
    q, k, v, gates = _inputs(gdn)
    with pytest.raises(TypeError, match=r"gates\['eta'\] must be a tensor"):
        gdn.apply(q, k, v, {**gates, "eta": 0.5})
    with pytest.raises(TypeError, match="gates must be a dict"):
        gdn.apply(q, k, v, list(gates.values()))
    with pytest.raises(TypeError, match="q must be a tensor"):
        gdn.apply(q.tolist(), k, v, gates)
    transformer = compile_spec(str(SPECS / "transformer.miras"))
    with pytest.raises(TypeError, match="gates must be a dict"):
        transformer.apply(q, k, v, [])


def test_apply_takes_an_empty_sequence(gdn):
    q, k, v, gates = _inputs(gdn, T=0)
    o, state = gdn.apply(q, k, v, gates)
    assert o.shape == (1, 0, 2, 4)


def test_triton_backend_on_cpu_tensors_outside_the_interpreter(gdn, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: CPU tensors are refused only where no GPU is meant")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, gates = _inputs(gdn)
    with pytest.raises(RuntimeError, match="backend='triton' runs its kernels on CUDA tensors.*backend='torch'"):
        gdn.apply(q, k, v, gates, backend="triton")


def test_compile_spec_of_a_missing_file():
    with pytest.raises(SpecError, match=r"no such file \(did you mean specs/titans.miras\?\)"):
        mirasc.compile_spec("specs/titans")
    with pytest.raises(SpecError, match="no such file"):
        mirasc.compile_spec("specs/nope.miras")
    with pytest.raises(SpecError, match="directory"):
        mirasc.compile_spec(str(SPECS))


# ------------------------------------------------------------------------------------------ expressions, explain
def _custom(loss: str) -> str:
    return f"model m {{ memory = linear; bias = custom(loss={loss}); learner = gd(lr=gate) }}"


def test_a_long_flat_sum_is_one_level_and_redundant_parentheses_count():
    compile_text(_custom(" + ".join(["0.01*e^2"] * 300)))        # a chain: one level, however long
    compile_text(_custom("(" * 40 + "e^2" + ")" * 40))
    for loss in ("(" * 5000 + "e^2" + ")" * 5000, "e^2 + " + "(" * 100 + "e" + ")" * 100 + "^2"):
        with pytest.raises(SpecError, match=r"nested \d+ levels deep; at most 64"):
            compile_text(_custom(loss))


def test_explain_without_layernorm(tmp_path, capsys):
    spec = tmp_path / "m.miras"
    spec.write_text("model m { memory = mlp(depth=2, expansion=2, act=gelu, residual=true, norm=none); bias = l2; "
                    "learner = gd(lr=gate) }")
    assert main(["explain", str(spec)]) == 0
    assert "LayerNorm" not in capsys.readouterr().out
    assert main(["explain", str(SPECS / "titans.miras")]) == 0
    assert "LayerNorm" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ command line
def _plain(capsys, argv, words=()):
    """Run `mirasc argv`: exit 2 with a plain message containing `words`, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    for w in words:
        assert w in err, err
    return err


def test_cli_layer_options_everywhere(tmp_path, capsys):
    bad = '{"qk_norm": "L2", "conv": 99}'
    _plain(capsys, ["train", GDN, "--layer-options", bad, "--steps", "1", "--out-dir", str(tmp_path / "r")],
           ["'qk_norm'", "'conv' = 99"])
    _plain(capsys, ["export", GDN, "--hf", str(tmp_path / "hf"), "--layer-options", bad], ["'qk_norm'"])
    _plain(capsys, ["export", GDN, "--hf", str(tmp_path / "hf"), "--d-model", "30", "--n-heads", "4"],
           ["not a multiple"])
    _plain(capsys, ["explore", "--spec", GDN, "--layer", "conv=99", "--out", str(tmp_path / "x")], ["'conv' = 99"])
    _plain(capsys, ["explore", "--spec", GDN, "--layer", "nope=1", "--out", str(tmp_path / "x")],
           ["unknown Layer option 'nope'"])


def test_cli_devices_threads_and_missing_files(tmp_path, capsys):
    _plain(capsys, ["train", GDN, "--device", "tpu", "--steps", "1"], ["not a device mirasc runs on"])
    if not torch.cuda.is_available():
        _plain(capsys, ["train", GDN, "--device", "cuda", "--steps", "1", "--out-dir", str(tmp_path / "r")],
               ["no CUDA device"])
    _plain(capsys, ["demo", GDN, "--threads", "-1"], ["--threads -1"])
    _plain(capsys, ["verify", GDN, "--seed", str(2 ** 70)], ["--seed"])
    _plain(capsys, ["export", GDN, "--hf", str(tmp_path / "hf"), "--seed", str(2 ** 70)], ["64-bit"])
    _plain(capsys, ["train", GDN, "--seed", str(2 ** 70), "--steps", "1"], ["64-bit"])
    _plain(capsys, ["compile", "specs/titans", "-o", str(tmp_path)], ["no such file"])
    _plain(capsys, ["verify", str(tmp_path / "missing.miras")], ["no such file"])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny run trained to step 2 (its directory holds checkpoint.pt)."""
    run = tmp_path_factory.mktemp("run")
    assert main(["train", GDN, *TINY, "--steps", "2", "--out-dir", str(run)]) == 0
    return run


TINY = ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--seq-len", "16", "--batch-size", "2",
        "--max-bytes", "20000", "--eval-windows", "2", "--no-progress"]


def test_cli_damaged_checkpoints(finished_run, tmp_path, capsys):
    good = (finished_run / "checkpoint.pt").read_bytes()
    files = {"empty": b"", "truncated": good[:len(good) // 3], "garbage": bytes(range(256)) * 8,
             "json": b'{"model": 1}'}
    torch.save([1, 2], tmp_path / "list.pt")
    for name, data in files.items():
        (tmp_path / f"{name}.pt").write_bytes(data)
    for name in [*files, "list"]:
        ckpt = str(tmp_path / f"{name}.pt")
        train_err = _plain(capsys, ["train", GDN, *TINY, "--steps", "4", "--resume", ckpt,
                                    "--out-dir", str(tmp_path / "r")], [ckpt])
        export_err = _plain(capsys, ["export", "--from-checkpoint", ckpt, "--hf", str(tmp_path / "hf")], [ckpt])
        assert ("empty" in train_err) == (name == "empty") == ("empty" in export_err)


def test_cli_resume_past_the_last_step(finished_run, capsys):
    _plain(capsys, ["train", GDN, *TINY, "--steps", "1", "--resume", "--out-dir", str(finished_run)],
           ["at step 2, past --steps 1", "nothing to train"])
    assert main(["train", GDN, *TINY, "--steps", "2", "--resume", "--out-dir", str(finished_run)]) == 0
    assert "already reached --steps 2" in capsys.readouterr().out


def test_python_dash_m_mirasc():
    done = subprocess.run([sys.executable, "-m", "mirasc", "check", str(SPECS / "deltanet.miras")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout
    done = subprocess.run([sys.executable, "-m", "mirasc", "check", "specs/titans"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "no such file" in done.stderr
