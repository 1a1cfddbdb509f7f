"""Data-parallel training for `mirasc train` (docs/cli.md, "mirasc train"): the process group under torchrun
(gloo on the CPU, nccl on GPUs) and the model wrapped in DistributedDataParallel or sharded with FSDP2
(`fully_shard`)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .train_config import resolve_device


class Dist:
    """Rank, world size and device; initialises the process group under torchrun."""

    def __init__(self, device: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device == "cuda" and self.world > 1:
            device = f"cuda:{local}"
        self.device = resolve_device(device, local)
        self.owns_group = False
        if self.world > 1 and not dist.is_initialized():
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
            self.owns_group = True
        self.on = self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def mean(self, value: float) -> float:
        if not self.on:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.world

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.on:
            dist.all_reduce(t)
        return t

    def barrier(self):
        if self.on:
            dist.barrier()

    def close(self):
        if self.owns_group:
            # Every rank must be done with collectives before the group goes: tearing it down while a
            # peer still runs one aborts that peer's gloo thread ("terminate called without an active
            # exception") at exit.
            dist.barrier()
            dist.destroy_process_group()


def wrap(model, cfg, env: Dist):
    """DDP, FSDP2 (fully_shard) or nothing. Returns the module to call for the training forward."""
    if cfg.fsdp:
        if not env.on:
            raise ValueError("--fsdp needs several processes: launch with torchrun --nproc_per_node N")
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
        except ImportError as e:  # torch < 2.6
            raise ValueError(f"--fsdp needs torch.distributed.fsdp.fully_shard (FSDP2, torch >= 2.6): {e}") from e
        mesh = init_device_mesh(env.device.type, (env.world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if env.on:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [env.device.index] if env.device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    return model
