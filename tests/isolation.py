"""Source text of a blocker for tests that run code in a fresh interpreter without some packages (mirasc, lark,
sympy, ...): importing any of them raises ModuleNotFoundError, and the prelude checks that the block holds.

`blocker_prelude(names)` is placed at the top of a script run with `python -I -c`; after it, `BLOCKED` is the tuple
of blocked top-level names and `BLOCKER_WORKS` lists those whose import did fail (the test asserts it is all of
them, so a blocker that blocks nothing cannot pass)."""

from __future__ import annotations

PRELUDE = '''import importlib.abc, sys

BLOCKED = {blocked!r}


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"blocked by the test: {{name}}", name=name)
        return None


sys.meta_path.insert(0, Blocker())
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
BLOCKER_WORKS = []
for name in BLOCKED:
    try:
        __import__(name)
    except ImportError:
        BLOCKER_WORKS.append(name)
'''


def blocker_prelude(names) -> str:
    """The prelude blocking the top-level packages `names`."""
    return PRELUDE.format(blocked=tuple(names))
