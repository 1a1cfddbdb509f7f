"""The code generators' shared pieces: the templates' slots and optional sections (mirasc.codegen.slots) and the
runtime modules an emitted file carries as text (mirasc.codegen.standalone)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from mirasc.codegen.slots import TEMPLATES, fill_lines, section
from mirasc.codegen.standalone import (
    body,
    lm_source,
    model_source,
    quoted,
    runtime_constants,
    runtime_doc,
    runtime_source,
    runtime_value,
)
from mirasc.runtime import layer_options, lm


def test_a_hook_takes_its_lines_at_its_indentation():
    text = "def f(x):\n    {{BODY}}\n    {{NONE}}\n    return y\n"
    out = fill_lines(text, {"BODY": ["if x:", "    y = 1", "", "y = 2"], "NONE": [], "ABSENT": ["z"]})
    assert out == "def f(x):\n    if x:\n        y = 1\n\n    y = 2\n    return y\n"
    with pytest.raises(ValueError, match="must stand alone"):
        fill_lines("a = {{BODY}}\n", {"BODY": ["1"]})


def test_every_optional_section_is_one_a_code_generator_names():
    """Each file of templates/sections/ is taken by a line slot of some template, by name, in a code generator; a
    section's lines end where its file ends."""
    import mirasc.codegen as codegen

    sources = "".join(p.read_text(encoding="utf-8") for p in Path(codegen.__file__).parent.glob("*.py"))
    names = sorted(p.name[:-len(".py.tmpl")] for p in (TEMPLATES / "sections").glob("*.py.tmpl"))
    assert len(names) == 5
    for name in names:
        assert f'"{name}"' in sources, name
        text = (TEMPLATES / "sections" / f"{name}.py.tmpl").read_text(encoding="utf-8")
        assert text.endswith("\n") and "\n".join(section(name)) + "\n" == text, name


def test_every_retention_hook_has_one_place_in_the_torch_template():
    from mirasc.codegen import torch_backend, torch_retention
    from mirasc.language.frontend import parse_text

    spec = parse_text("model m { memory = linear; bias = l2; retention = decay; learner = gd }")
    names = [*torch_retention.hooks(torch_retention.for_spec(spec, False)), "RETENTION_STATE", "UPDATE_RULE",
             "TOKEN_STEP"]
    assert len(names) == 4
    for name in names:
        assert torch_backend.TEMPLATE.count("{{" + name + "}}") == 1, name


def test_body_is_the_module_after_its_docstring_and_imports():
    text = body(lm)
    assert text.startswith("@dataclass\nclass LMConfig")
    assert '"""The language model' not in text and "\nimport " not in text
    assert body(layer_options).startswith("def layer_option_problems(")


def test_a_header_prints_the_runtime_declarations_with_the_spec_s_values():
    """An emitted module's constants come from their declaration in mirasc/runtime/ (memory_spec here): its trailing
    comment, and its group's comment block once, before the group's first constant the spec sets; an unset constant
    is left out, None keeps the declared value, a note goes right above its constant, and an undeclared name fails."""
    state = ["# The state beside the weights: the retention's accumulators A_<weight>, momentum buffers S_<weight>, "
             "the", "# preconditioner's statistic A, and the Omega window's last WINDOW − 1 tokens (WINDOW_STATE, "
             "empty without one)."]
    assert runtime_constants("memory_spec", {"STATISTIC": "True", "ACCUMULATORS": "False"}) == state + [
        "ACCUMULATORS = False", "STATISTIC = True"]
    assert runtime_constants("memory_spec", {"STATISTIC": "True"}) == state + ["STATISTIC = True"]
    assert runtime_constants("memory_spec", {"WEIGHTS": None, "CHUNKED": "False"}, {"CHUNKED": ["# a note"]}) == [
        'WEIGHTS = ("W",)  # the memory\'s weights, in the order of its lists (the state\'s keys)', "# a note",
        'CHUNKED = False  # whether algorithm="chunked" exists for this spec']
    assert runtime_constants("memory_spec", {"LQ_Q": "2.5"}) == [
        "LQ_Q = 2.5  # lq's q: the weights are the accumulator over its q-norm, A / ‖A‖_q^(q−2)"]
    with pytest.raises(KeyError, match="declares no NOT_DECLARED"):
        runtime_constants("memory_spec", {"NOT_DECLARED": "1"})
    assert runtime_value("chunk_host", "_CHUNK_KERNELS")[0] == "_chunk_state_fwd"
    assert runtime_value("memory_spec", "NS_COEFFICIENTS") == (3.4445, -4.7750, 2.0315)
    with pytest.raises(KeyError, match="declares no NOT_DECLARED"):
        runtime_value("memory_spec", "NOT_DECLARED")
    assert quoted('a "reason"') == "\"a 'reason'\"" and eval(quoted('say "x"')) == "say 'x'"


def test_a_kernel_family_s_note_is_its_runtime_module_s_docstring():
    """The note an emitted module carries over a kernel family is the docstring of the runtime module the kernels
    live in, as comment lines (a blank line as a bare '#'), and it is in every module that carries the family."""
    import mirasc.runtime.kernels.chunk as chunk

    note = runtime_doc("kernels/chunk")
    assert note == [f"# {line}" if line else "#" for line in chunk.__doc__.split("\n")]
    assert "#" in note and any("_chunk_state_fwd   grid (Dv tiles, B·H)" in line for line in note)
    from mirasc import compile_text

    assert "\n".join(note) in compile_text(Path("specs/gated_deltanet.miras").read_text()).source


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
    """Atlas (an MLP memory with LayerNorm, muon, polynomial features) carries every function of
    mirasc/runtime/memory_ops.py verbatim, a precond spec every one of precond.py, and every parametric memory the token
    recurrence of token_step.py (a chunk readout of kl its lag token too, the Omega rule its window's gradient); a
    linear memory only the ops it reads."""
    import inspect
    from pathlib import Path

    from mirasc.compiler import compile_text
    from mirasc.runtime import memory_ops, precond, token_step

    def functions(module):
        return [n for n, f in vars(module).items()
                if inspect.isfunction(f) and f.__module__ == module.__name__ and f.__name__ == n]  # (no aliases)

    specs = Path(__file__).resolve().parents[2] / "specs"
    atlas = compile_text((specs / "atlas.miras").read_text(encoding="utf-8")).source
    pre = compile_text((specs / "precond_gated_deltanet.miras").read_text(encoding="utf-8")).source
    memora = compile_text((specs / "memora.miras").read_text(encoding="utf-8")).source
    omega = compile_text((specs / "omega_yaad.miras").read_text(encoding="utf-8")).source
    assert len(functions(memory_ops)) == 9 and len(functions(precond)) == 6 and len(functions(token_step)) == 8
    for module, source in ((memory_ops, atlas), (precond, pre), (token_step, memora)):
        for name in functions(module):
            if name != "_window_factors":  # (the Omega rule's gradient: only its modules carry it)
                assert inspect.getsource(getattr(module, name)) in source, (module.__name__, name)
    # which gradient a token takes: its own, or the Omega window's (and only that one is carried)
    assert "\n_token_factors = _token_grad\n" in memora and "def _window_factors(" not in memora
    assert "\n_token_factors = _window_factors\n" in omega and "def _token_grad(" not in omega
    assert inspect.getsource(token_step._window_factors) in omega
    linear = compile_text((specs / "deltanet.miras").read_text(encoding="utf-8")).source
    assert "def _on_weight(" in linear and "def _layernorm(" not in linear and "def _newton_schulz(" not in linear
    assert "def _token_step(" in linear and "def _lag_step(" not in linear and "def _statistic_scan(" not in linear


def test_only_a_module_whose_kernels_take_packed_sequences_carries_the_one_launch_path():
    """PACKED (the Plan's `packed`): the module runs cu_seqlens through _packed_on_kernels (one launch of its chunk
    kernels as a padded batch where a call takes them) and carries that path; without it, one call per sequence and
    none of the one-launch pieces."""
    from mirasc.compiler import compile_text

    specs = Path(__file__).resolve().parents[2] / "specs"
    for name, packed in (("gated_deltanet", True), ("titans", True), ("memora", False), ("moneta_token", False)):
        out = compile_text((specs / f"{name}.miras").read_text(encoding="utf-8"))
        assert out.plan.packed == packed and f"\nPACKED = {packed}  #" in out.source, name
        assert f"\n_packed_apply = {'_packed_on_kernels' if packed else '_packed_per_sequence'}\n" in out.source, name
        for piece in ("def _packed_on_kernels(", "def _packed_padded_apply(", "def _packed_padded("):
            assert (piece in out.source) == packed, (name, piece)
        assert "def _packed_per_sequence(" in out.source and "def _packed(" in out.source, name

