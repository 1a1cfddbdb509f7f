"""The code generators' shared pieces: the templates' line directives (mirasc.codegen.directives) and the runtime
modules an emitted file carries as text (mirasc.codegen.standalone)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from mirasc.codegen.directives import fill_lines, preprocess
from mirasc.codegen.standalone import body, lm_source, model_source, runtime_source
from mirasc.runtime import layer_options, lm

TEXT = """a
# @if x
b
# @elif y
c
# @else
d
# @endif
e"""


@pytest.mark.parametrize("x, y, kept", [(True, True, "b"), (True, False, "b"), (False, True, "c"), (False, False, "d")])
def test_directives_take_one_branch(x, y, kept):
    assert preprocess(TEXT, {"x": x, "y": y}) == f"a\n{kept}\ne\n"


def test_directives_nest_and_negate():
    text = "# @if not x\n  # @if y\nboth\n  # @endif\nnot x\n# @endif\nend"
    assert preprocess(text, {"x": False, "y": True}) == "both\nnot x\nend\n"
    assert preprocess(text, {"x": False, "y": False}) == "not x\nend\n"
    assert preprocess(text, {"x": True, "y": True}) == "end\n"


def test_directives_inside_a_branch_not_taken_are_still_matched():
    text = "# @if x\n# @if y\nin\n# @else\nelse\n# @endif\n# @endif\nout"
    assert preprocess(text, {"x": False, "y": True}) == "out\n"


def test_only_the_first_true_branch_is_kept():
    text = "# @if x\n1\n# @elif y\n2\n# @elif z\n3\n# @endif\n"
    assert preprocess(text, {"x": False, "y": True, "z": True}).split() == ["2"]
    text = "# @if x\n1\n# @elif not y\n2\n# @else\n3\n# @endif\n"
    assert preprocess(text, {"x": False, "y": True}).split() == ["3"]


@pytest.mark.parametrize("text, message", [
    ("a\n# @endif\n", "template line 2: '# @endif': no open # @if"),
    ("# @else\n", "template line 1: '# @else': no open # @if"),
    ("# @if x\nb", "template line 1: # @if without # @endif"),
    ("# @if missing\nb\n# @endif", "template line 1: '# @if missing': unknown flag 'missing'"),
    ("# @if x\n# @elif not nope\n# @endif\n", "template line 2: '# @elif not nope': unknown flag 'nope'"),
    ("# @if x\n# @else\n# @else\n# @endif\n", "template line 3: '# @else': after the # @else of the # @if on line 1"),
    ("# @if x\n# @else\n# @elif x\n# @endif\n",
     "template line 3: '# @elif x': after the # @else of the # @if on line 1"),
    ("# @loop x\nb", "template line 1: '# @loop x': unknown directive"),
])
def test_directive_errors_name_the_template_line(text, message):
    with pytest.raises(ValueError) as err:
        preprocess(text, {"x": True})
    assert str(err.value).startswith(message)


def test_a_hook_takes_its_lines_at_its_indentation():
    text = "def f(x):\n    {{BODY}}\n    {{NONE}}\n    return y\n"
    out = fill_lines(text, {"BODY": ["if x:", "    y = 1", "", "y = 2"], "NONE": [], "ABSENT": ["z"]})
    assert out == "def f(x):\n    if x:\n        y = 1\n\n    y = 2\n    return y\n"
    with pytest.raises(ValueError, match="must stand alone"):
        fill_lines("a = {{BODY}}\n", {"BODY": ["1"]})


def test_every_retention_and_learner_hook_has_one_place_in_the_torch_template():
    from mirasc.codegen import torch_backend, torch_learner, torch_retention
    from mirasc.language.frontend import parse_text

    spec = parse_text("model m { memory = linear; bias = l2; retention = decay; learner = gd }")
    names = [*torch_retention.hooks(torch_retention.for_spec(spec, False)),
             *torch_learner.hooks(torch_learner.for_spec(spec))]
    assert len(names) == 10
    for name in names:
        assert torch_backend.TEMPLATE.count("{{" + name + "}}") == 1, name


def test_body_is_the_module_after_its_docstring_and_imports():
    text = body(lm)
    assert text.startswith("@dataclass\nclass LMConfig")
    assert '"""The language model' not in text and "\nimport " not in text
    assert body(layer_options).startswith("def layer_option_problems(")


def test_the_layer_checks_run_standalone():
    namespace = {}
    exec("import math\n" + runtime_source("layer_options"), namespace)  # an emitted module imports math at its top
    schema = {"conv": {"type": "int", "ge": 0}}
    assert namespace["layer_option_problems"]({"conv": -1, "cnov": 1}, schema) == \
        layer_options.layer_option_problems({"conv": -1, "cnov": 1}, schema)
    assert namespace["layer_size_problems"](64, 3, 0) == layer_options.layer_size_problems(64, 3, 0)
    assert namespace["layer_size_problems"](64, 3, 0)


def test_the_language_model_source_runs_standalone(monkeypatch):
    module = types.ModuleType("standalone_lm")  # dataclasses look their module up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    exec("import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n" + lm_source(), namespace)
    cfg = namespace["LMConfig"](vocab_size=11, d_model=8, n_layers=1, n_heads=2)
    torch.manual_seed(0)
    model = namespace["LanguageModel"](cfg, lambda d, h: torch.nn.Linear(d, d))
    torch.manual_seed(0)
    reference = lm.LanguageModel(lm.LMConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2),
                                 lambda d, h: torch.nn.Linear(d, d))
    x = torch.randint(0, 11, (2, 5))
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
    assert "def make_model(" in model_source()


def test_the_memory_ops_an_emitted_module_carries_are_the_runtime_module_s():
    """Atlas (an MLP memory with LayerNorm, muon, polynomial features) and a precond spec carry every function of
    mirasc/runtime/memory_ops.py verbatim; a linear memory only those it reads."""
    import inspect
    from pathlib import Path

    from mirasc.compiler import compile_text
    from mirasc.runtime import memory_ops

    specs = Path(__file__).resolve().parents[2] / "specs"
    atlas = compile_text((specs / "atlas.miras").read_text(encoding="utf-8")).source
    precond = compile_text((specs / "precond_gated_deltanet.miras").read_text(encoding="utf-8")).source
    names = [n for n, f in vars(memory_ops).items() if inspect.isfunction(f) and f.__module__ == memory_ops.__name__]
    assert len(names) == 16
    precond_only = ("_statistic_scan", "_multiplier", "_precondition", "_preconditioned", "_layer_cache",
                    "_layer_read")
    for name in names:
        text = inspect.getsource(getattr(memory_ops, name))
        assert text in (precond if name in precond_only else atlas), name
    linear = compile_text((specs / "deltanet.miras").read_text(encoding="utf-8")).source
    assert "def _on_weight(" in linear and "def _layernorm(" not in linear and "def _newton_schulz(" not in linear
