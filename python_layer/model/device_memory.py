"""How MILI's process shares a GPU's memory with MAX.

The weights and the KV cache are torch's memory. The compiled graph's activations and the decode steps' captured
device graphs live in MAX's memory pool, which MAX sizes at ~90% of the GPU unless
MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_SIZE_PERCENT says otherwise when the process makes its first MAX device. A
capture backs that pool: on an H200 every capture failed out of memory beside a 40 GB KV cache
under MAX's default, and every one held with the pool at 66% (the GPU less the KV cache and 8 GB). So before the
model loads, the pool is sized to leave room for what torch will hold."""

from __future__ import annotations

import os
from typing import Optional

MAX_POOL_PERCENT = "MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_SIZE_PERCENT"
HEADROOM_GB = 8.0  # beside the weights and the KV cache: the CUDA contexts, torch's workspace, sampling (what held)
MIN_PERCENT, MAX_PERCENT = 5, 90  # 90: MAX's own default, never raised


def max_pool_percent(total_bytes: int, torch_bytes: float, headroom_gb: float = HEADROOM_GB) -> int:
    """MAX's pool as a percent of a GPU of total_bytes on which torch holds torch_bytes, with headroom_gb left."""
    share = 1 - (torch_bytes + headroom_gb * 2**30) / total_bytes
    return max(MIN_PERCENT, min(MAX_PERCENT, int(100 * share)))


def leave_room_beside_max_pool(device: str, torch_bytes: float) -> Optional[int]:
    """On a GPU, before the process's first MAX device (one made earlier keeps its pool): MAX's pool sized so that
    torch_bytes of torch's memory (the weights and the KV cache) fit beside it. Returns the percent set; None where
    none was: not a GPU, or the environment sets it already (the operator's choice stays)."""
    if not device.startswith("cuda") or MAX_POOL_PERCENT in os.environ:
        return None
    import torch

    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    percent = max_pool_percent(total, torch_bytes)
    os.environ[MAX_POOL_PERCENT] = str(percent)
    return percent
