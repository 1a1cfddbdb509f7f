"""What a GPU lets one kernel use, where torch does not say (a runtime piece: its body is copied into the emitted
modules with Triton kernels, by mirasc.codegen.standalone)."""

import torch

# Shared memory per block a kernel may opt into, per compute capability, where torch does not report it.
SMEM_LIMIT = {(8, 0): 166912, (8, 6): 101376, (8, 7): 166912, (8, 9): 101376, (9, 0): 232448, (10, 0): 232448,
              (12, 0): 101376}


class _GPUTarget:
    """A GPU named by its compute capability ("sm_90"), present or not: what `launch_plan` asks about, in place of a
    torch.device (type "cuda", no index; its shared memory per block from SMEM_LIMIT)."""

    type = "cuda"
    index = None

    def __init__(self, name):
        digits = name[3:] if isinstance(name, str) and name.startswith("sm_") else ""
        if len(digits) not in (2, 3) or not digits.isdigit() or (int(digits[:-1]), int(digits[-1])) not in SMEM_LIMIT:
            known = ", ".join(f"sm_{a}{b}" for a, b in SMEM_LIMIT)
            raise ValueError(f"unknown GPU target {name!r}; one of {known}, or a torch device")
        self.name, self.capability = name, (int(digits[:-1]), int(digits[-1]))
        self.smem_limit = SMEM_LIMIT[self.capability]

    def __repr__(self):
        return f"_GPUTarget({self.name!r})"


def _device_smem_limit(device):
    if isinstance(device, _GPUTarget):
        return device.smem_limit
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", None) or SMEM_LIMIT.get((props.major, props.minor), 101376)
