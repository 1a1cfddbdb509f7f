"""What a GPU lets one kernel use, where torch does not say (a runtime piece: its body is copied into the emitted
modules whose kernels are autotuned against shared memory, by mirasc.codegen.standalone)."""

import torch

# Shared memory per block a kernel may opt into, per compute capability, where torch does not report it.
SMEM_LIMIT = {(8, 0): 166912, (8, 6): 101376, (8, 7): 166912, (8, 9): 101376, (9, 0): 232448, (10, 0): 232448,
              (12, 0): 101376}


def _device_smem_limit(device):
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", None) or SMEM_LIMIT.get((props.major, props.minor), 101376)
