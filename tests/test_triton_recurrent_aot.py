"""The fused recurrent kernels compile for real GPUs ahead of time, on the CPU (issue 10): at Dk = Dv = 128
the resource model's configuration of a V-tiled spec compiles for sm_90 and sm_80, fits the shared memory
of a block, and its forward does not spill. A subprocess without TRITON_INTERPRET intercepts the launches
of `_launch_recurrent` / `_launch_recurrent_bwd` and compiles each with `triton.compile(target=...)`;
registers and spill come from the cubin via the cuobjdump that ships with Triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SMEM = {80: 166912, 90: 232448}  # bytes of shared memory a block may use

SCRIPT = r"""
import json, os, re, subprocess, sys, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
import mirasc

spec, arch, D, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), getattr(torch, sys.argv[4])
TY = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
rows = []

def compile_launch(self, *args, grid=None, warmup=False, **kw):
    opts = {k: kw.pop(k) for k in list(kw) if k in ("num_warps", "num_stages")}
    bound = dict(zip([p.name for p in self.params], args)) | kw
    sig, const = {}, {}
    for p in self.params:
        v = bound[p.name]
        if p.is_constexpr:
            sig[p.name], const[p.name] = "constexpr", v
        else:
            sig[p.name] = "*" + TY[v.dtype] if isinstance(v, torch.Tensor) else "i32"
    k = triton.compile(ASTSource(fn=self, signature=sig, constexprs=const), target=GPUTarget("cuda", arch, 32),
                       options=opts)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        open(path, "wb").write(k.asm["cubin"])
        text = subprocess.run([sys.argv[5], "--dump-resource-usage", path], capture_output=True, text=True).stdout
    stack = max([int(x) for x in re.findall(r"STACK:(\d+)", text)] or [0])
    rows.append({"kernel": self.fn.__name__, "BV": const["BV"], "shared": k.metadata.shared, "spill": stack})

JITFunction.run = compile_launch
mod = mirasc.compile_spec(spec)
B, H, T = 1, 2, 64
q, k = (torch.randn(B, H, T, D, dtype=dtype) for _ in range(2))
v = torch.randn(B, H, T, D, dtype=dtype)
coefs = [torch.rand(B, H, T) for _ in mod._COEF_ORDER]
state = [mod.init_state(B, H, D, D)[key] for key in mod._state_keys()]
mod._launch_recurrent(q, k, v, dict(zip(mod._COEF_ORDER, coefs)), dict(zip(mod._state_keys(), state)))
mod._launch_recurrent_bwd(q, k, v, coefs, state, [torch.randn(B, H, T, D)] + [torch.zeros_like(s) for s in state])
print(json.dumps(rows))
"""


@pytest.mark.skipif(not (BIN / "ptxas").exists() or not (BIN / "cuobjdump").exists(),
                    reason="Triton's NVIDIA tools (ptxas, cuobjdump) are not installed")
@pytest.mark.parametrize("name,arch,dtype", [("deltanet", 90, "bfloat16"), ("sparse_lp", 80, "float32")])
def test_recurrent_kernels_fit_at_d128(name, arch, dtype):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "specs" / f"{name}.miras"), str(arch), "128",
                          dtype, str(BIN / "cuobjdump")], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["kernel"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])}
    assert set(rows) == {"_fused_recurrent_fwd", "_fused_recurrent_bwd"}
    for r in rows.values():
        assert r["BV"] < 128 and r["shared"] <= SMEM[arch], r  # V tiles, and the block's shared memory fits
    assert rows["_fused_recurrent_fwd"]["spill"] == 0, rows
