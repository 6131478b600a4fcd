"""What the Triton providers read off the GPU they launch on: its ordinal and multiprocessor
count (the count cached per ordinal: grids are sized by it on every call)."""
from __future__ import annotations

import functools

import torch


def cuda_index(device: torch.device) -> int | None:
    """The CUDA device ordinal of ``device``; None off CUDA (Triton's interpreter on the CPU)."""
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count
