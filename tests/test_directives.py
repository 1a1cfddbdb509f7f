"""The templates' line directives (mirasc/codegen/directives.py): branches kept and dropped, nesting, negation, and
a located error for every malformed template."""

from __future__ import annotations

import pytest

from mirasc.codegen.directives import preprocess

TEXT = """a
# @if x
b
# @elif not y
c
# @else
d
# @endif
e
"""


@pytest.mark.parametrize("x, y, kept", [(True, True, "a b e"), (True, False, "a b e"), (False, False, "a c e"),
                                        (False, True, "a d e")])
def test_branches(x, y, kept):
    assert preprocess(TEXT, {"x": x, "y": y}).split() == kept.split()


def test_nested_branches_follow_their_parent():
    text = "# @if x\n# @if y\nxy\n# @else\nx_only\n# @endif\n# @else\n# @if y\ny_only\n# @endif\n# @endif\nend\n"
    assert preprocess(text, {"x": True, "y": True}).split() == ["xy", "end"]
    assert preprocess(text, {"x": True, "y": False}).split() == ["x_only", "end"]
    assert preprocess(text, {"x": False, "y": True}).split() == ["y_only", "end"]
    assert preprocess(text, {"x": False, "y": False}).split() == ["end"]


def test_only_the_first_true_branch_is_kept():
    text = "# @if x\n1\n# @elif y\n2\n# @elif z\n3\n# @endif\n"
    assert preprocess(text, {"x": False, "y": True, "z": True}).split() == ["2"]


def test_indented_directives_and_lines_as_they_are():
    text = "def f():\n    # @if x\n    return 1\n    # @endif\n    return 2\n"
    assert preprocess(text, {"x": True}) == "def f():\n    return 1\n    return 2\n"


@pytest.mark.parametrize("text, message", [
    ("a\n# @endif\n", "template line 2: '# @endif': no open # @if"),
    ("# @else\n", "template line 1: '# @else': no open # @if"),
    ("# @if x\na\n", "template line 1: # @if without # @endif"),
    ("# @if nope\n# @endif\n", "template line 1: '# @if nope': unknown flag 'nope'"),
    ("# @if x\n# @elif not nope\n# @endif\n", "template line 2: '# @elif not nope': unknown flag 'nope'"),
    ("# @if x\n# @else\n# @else\n# @endif\n", "template line 3: '# @else': after the # @else of the # @if on line 1"),
    ("# @if x\n# @else\n# @elif x\n# @endif\n",
     "template line 3: '# @elif x': after the # @else of the # @if on line 1"),
    ("# @ifdef x\n", "template line 1: '# @ifdef x': unknown directive"),
])
def test_malformed_templates_are_located(text, message):
    with pytest.raises(ValueError) as err:
        preprocess(text, {"x": True})
    assert str(err.value).startswith(message)
