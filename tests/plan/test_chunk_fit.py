"""The chunk kernels' GPU autotuning spaces and the refusal where they are empty (a launch over an empty space would
fail inside the autotuner with a TypeError, not with the reason).

The spaces (mirasc.runtime.chunk_space; the momentum scans' in momentum_host) are plain Python, so this runs on the
CPU, and a module's `launch_plan(..., device="sm_90")` lists them for a call on that GPU. At the key widths the
feature maps give (Based's Taylor map 1 + D + D(D+1)/2, Hedgehog's 2D) beyond the scans' 256 padded key columns, or
at a chunk tile whose preparation needs more than the shared memory of sm_90 (SMEM_LIMIT[(9, 0)]), a kernel has no
configuration; the module must then (a) refuse with a RuntimeError that names the kernels, the sizes and
`backend='torch'`, before anything launches, (b) let backend="auto" pick torch, and (c) keep a non-empty space at the
sizes that fit (including heads of 16, whose chunk-parallel spaces need 16-wide tiles). What a call on an sm_90 GPU
decides is read from the module's `launch_plan(..., device="sm_90")`, which asks the same route as `apply`; the
kernel choice's own guard uses a stand-in object with `type == "cuda"` and the module's `_device_smem_limit` patched
to sm_90's; FIT_SMEM_LIMIT is the same check on CPU tensors (`mirasc kernels`)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

import mirasc
from mirasc.runtime import chunk_space

triton = pytest.importorskip("triton")
SPEC_DIR = Path(__file__).resolve().parents[2] / "specs"
CUDA = types.SimpleNamespace(type="cuda", index=0)


@pytest.fixture(scope="module")
def mods():
    return {name: mirasc.compile_spec(SPEC_DIR / f"{name}.miras")
            for name in ("based", "hedgehog", "gated_deltanet", "kda", "rwkv7", "momentum_deltanet")}


def sm90(mod):
    return mod.SMEM_LIMIT[(9, 0)]


def widths(mod, D):
    """(Dk, Dv) the chunk kernels read for heads of width D (feature map; the normaliser's extra value row)."""
    return mod.feature_dim(D) if hasattr(mod, "feature_dim") else D, D + int(getattr(mod, "NORMALIZE", False))


def configs(name, Dk, Dv, BT, smem_limit, prec, ch_decay=False):
    """The resource model's autotuning space of chunk kernel `name` at these sizes (mirasc.runtime.chunk_space, which
    a module's autotuner and `mirasc kernels` read with its CH_DECAY)."""
    return chunk_space._chunk_configs(name, Dk, Dv, BT, smem_limit, prec, ch_decay)


def refusal(mod, D, dtype):
    """Why a call on an sm_90 GPU with backend='triton' has no chunk kernels at heads of D (launch_plan's error)."""
    with pytest.raises(RuntimeError) as err:
        mod.launch_plan(D, D, dtype=dtype, device="sm_90", backend="triton")
    return str(err.value)


def named_kernels(msg):
    """The kernels a refusal says have no configuration."""
    return set(re.findall(r"(_[a-z_]+) (?:holds|needs)", msg))


def on_sm90(mod, monkeypatch):
    monkeypatch.setattr(mod, "_device_smem_limit", lambda device: sm90(mod))


SCANS = {"_chunk_state_fwd", "_chunk_state_bwd"}


@pytest.mark.parametrize("name,D,dtype,prec,empty", [
    ("based", 64, torch.float32, "ieee", SCANS),  # Dk = 2145: 4096 padded key columns
    ("gated_deltanet", 256, torch.float32, "ieee", SCANS),  # exact fp32 products hold at most 128
    ("hedgehog", 256, torch.bfloat16, "bf16x2", SCANS),  # Dk = 512: two K blocks of 256 spill in every configuration
])
def test_empty_space_is_a_refusal(mods, monkeypatch, name, D, dtype, prec, empty):
    mod = mods[name]
    Dk, Dv = widths(mod, D)
    BT = mod.DEFAULT_CHUNK  # (the chunk tile: 64 rows)
    # a call on an sm_90 GPU: backend='triton' refuses before any launch, naming the kernels without a configuration
    msg = refusal(mod, D, dtype)
    assert named_kernels(msg) == empty, msg
    # the scans' space itself is empty there (registers), whatever the shared memory
    assert all(not configs(n, Dk, Dv, BT, None, prec, mod.CH_DECAY) for n in empty)
    most = "at most 128 with fp32 dots" if prec == "ieee" else "at most 256"
    for part in (f"Dk={Dk}", f"Dv={Dv}", f"{BT} rows", "227 KB", "backend='torch'", "in registers", most,
                 *(["feature map"] if hasattr(mod, "feature_dim") else [])):
        assert part in msg, (part, msg)
    # backend='auto' runs torch, saying why
    plan = mod.launch_plan(D, D, dtype=dtype, device="sm_90")
    assert plan["backend"] == "torch" and plan["reason"] == msg and plan["kernels"] == {}, plan
    # the GPU branch of the kernel choice never builds an autotuner over an empty space
    on_sm90(mod, monkeypatch)
    kernel = getattr(mod, sorted(empty)[0])
    with pytest.raises(RuntimeError, match="backend='torch'"):
        mod._chunk_kernel(kernel, types.SimpleNamespace(device=CUDA), Dk, Dv, BT, prec)


def test_hedgehog_refusal_names_the_ways_out(mods, monkeypatch):
    mod = mods["hedgehog"]
    monkeypatch.setattr(mod, "HALF_DOTS", "tf32")  # (TF32 products of 16-bit inputs, opted in: Dk = 512, Dv = 257)
    msg = refusal(mod, 256, torch.bfloat16)
    assert "Dk=512 " in msg and "Dv=257," in msg and "tf32 dots" in msg, msg
    assert "key widths up to 256" in msg and "D <= 128" in msg and "chunk_size <=" not in msg, msg


def test_a_chunk_tile_beyond_shared_memory_is_refused_with_the_chunk_sizes_that_fit(mods):
    """The delta rule's preparation holds [BT, BT] tiles: a chunk tile of 256 rows is past sm_90's shared memory
    (the model), while 64 rows fit; the refusal names the chunk sizes that do."""
    mod = mods["gated_deltanet"]
    assert not configs("_wy_fwd", 128, 128, 256, sm90(mod), "bf16")
    assert configs("_wy_fwd", 128, 128, 256, None, "bf16")  # the model prunes them
    with pytest.raises(RuntimeError) as err:
        mod.launch_plan(128, 128, dtype=torch.bfloat16, device="sm_90", backend="triton", chunk_size=256)
    msg = str(err.value)
    assert "_wy_fwd" in msg and "KB at its smallest" in msg and "chunk_size <= 64 " in msg, msg
    plan = mod.launch_plan(128, 128, dtype=torch.bfloat16, device="sm_90", chunk_size=256)
    assert plan["backend"] == "torch" and plan["reason"] == msg
    assert mod.launch_plan(128, 128, dtype=torch.bfloat16, device="sm_90", chunk_size=64)["backend"] == "triton"


class _Launched(Exception):
    pass


def _no_launch(*args, **kwargs):
    raise _Launched("a chunk kernel was about to launch")


@pytest.mark.parametrize("name,D,dtype", [("based", 64, torch.float32), ("hedgehog", 256, torch.bfloat16)])
def test_apply_refuses_before_any_launch(mods, monkeypatch, name, D, dtype):
    """backend='triton' at sizes with no configuration: the RuntimeError comes before any kernel is chosen (the
    target's limit set as `mirasc kernels` sets it, so CPU tensors take the GPU's decision)."""
    mod = mods[name]
    monkeypatch.setattr(mod, "FIT_SMEM_LIMIT", sm90(mod))
    for fn in ("_chunk_kernel", "_CHUNK_OP"):
        monkeypatch.setattr(mod, fn, _no_launch)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 1, D, generator=g).to(dtype) for _ in range(3))
    with pytest.raises(RuntimeError, match="backend='torch'") as err:
        mod.apply(q, k, v, backend="triton", algorithm="chunked")
    assert "no configuration that fits" in str(err.value)


@pytest.mark.parametrize("name,D,dtype,triton_expected", [
    ("based", 64, torch.float32, False),
    ("hedgehog", 256, torch.bfloat16, False),
    ("hedgehog", 16, torch.bfloat16, True),  # Dk = 32 fits: auto keeps the kernels
    ("hedgehog", 128, torch.bfloat16, True),  # Dk = 256: two K blocks of 128
    ("based", 16, torch.bfloat16, True),  # Dk = 153 (Based's own feature size)
])
def test_auto_picks_torch_where_nothing_fits(mods, name, D, dtype, triton_expected):
    """backend='auto' on an sm_90 GPU: the chunk kernels where every one fits, else torch with the refusal as the
    reason; on CPU tensors always torch (the kernels run there only under the interpreter, with backend='triton')."""
    mod = mods[name]
    plan = mod.launch_plan(D, D, dtype=dtype, device="sm_90")
    assert plan["backend"] == ("triton" if triton_expected else "torch"), plan["reason"]
    assert (plan["reason"] is None) == triton_expected and plan["algorithm"] == "chunked"
    assert (plan["precision"] == "bf16x2") == triton_expected  # a feature map's 16-bit features as they are
    cpu = mod.launch_plan(D, D, dtype=dtype, device="cpu")
    assert cpu["backend"] == "torch" and "CUDA inputs" in cpu["reason"] and cpu["kernels"] == {}


@pytest.mark.parametrize("name", ["gated_deltanet", "kda", "rwkv7", "momentum_deltanet", "hedgehog"])
def test_sizes_that_fit_keep_a_space(mods, monkeypatch, name):
    """Heads 16..128 fit sm_90 in every dot precision and heads of 256 (Hedgehog: D = 128, Dk = 256) with 16-bit and
    TF32 products: a call on sm_90 takes the kernels, every launched one with configurations (launch_plan; TF32 for
    16-bit inputs opted in with HALF_DOTS = "tf32"), the same kernels at every size. Heads of 16 (and a value width
    of 16 under wider keys) get 16-wide tiles."""
    mod = mods[name]
    normalizer = int(getattr(mod, "NORMALIZE", False))
    launched = set()
    for D in ((16, 32, 64, 128) if name == "hedgehog" else (16, 32, 64, 128, 256)):
        Dk, Dv = widths(mod, D)
        for dims, d_v in (((Dk, Dv), D), ((Dk, 16), 16 - normalizer)):
            ways = [(torch.bfloat16, mod.HALF_DOTS), (torch.bfloat16, "tf32")] + (
                [(torch.float32, mod.HALF_DOTS)] if max(dims) <= 128 else [])
            for dtype, half_dots in ways:
                monkeypatch.setattr(mod, "HALF_DOTS", half_dots)
                plan = mod.launch_plan(D, d_v, dtype=dtype, device="sm_90")
                assert plan["backend"] == "triton" and plan["reason"] is None, (D, d_v, dtype, plan["reason"])
                assert plan["kernels"] and all(plan["kernels"].values()), (D, d_v, dtype)
                assert mod.launch_plan(D, d_v, dtype=dtype, device="sm_90", backend="triton") == plan
                launched = launched or set(plan["kernels"])
                assert set(plan["kernels"]) == launched


def test_small_heads_get_16_wide_tiles(mods, monkeypatch):
    mod = mods["gated_deltanet"]
    monkeypatch.setattr(mod, "HALF_DOTS", "tf32")
    small = mod.launch_plan(16, 16, dtype=torch.bfloat16, device="sm_90")["kernels"]
    wide = mod.launch_plan(64, 64, dtype=torch.bfloat16, device="sm_90")["kernels"]  # unchanged where the tiles fit
    for kernel in ("_chunk_output_fwd", "_chunk_du_local_bwd", "_chunk_grads_bwd"):
        assert {(c["BV"], c["BK"]) for c in small[kernel]} == {(16, 16)}
        assert {(c["BV"], c["BK"]) for c in wide[kernel]} == {(32, 32), (32, 64), (64, 32), (64, 64)}
