"""Make the repository root importable (for `import mirasc`) when pytest runs without installation, and the
tests' shared modules: the float64 reference (`reference.py`) and the isolation helper here, and the helpers one
test file takes from another in a sibling folder (the folders are the package's layers, docs/development.md, "The
test suite"; a test module's name is unique across them)."""

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
for _path in [str(_TESTS.parent), str(_TESTS), *sorted(str(p) for p in _TESTS.iterdir() if p.is_dir()
                                                      and not p.name.startswith((".", "_")))]:
    if _path not in sys.path:
        sys.path.insert(0, _path)

# Triton kernels run on the CPU through the interpreter; this must be set before triton is imported.
import os  # noqa: E402

import pytest  # noqa: E402

os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist every worker is its own process on its own core: one torch thread each, so that the
# workers do not oversubscribe the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch  # noqa: E402

    torch.set_num_threads(1)


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine OpenMP spinning makes them
    several times slower: one torch thread for the test, restored after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
