"""KV-cache write on the CPU in C++ (csrc/cpu_attention.cpp): a row copy per token, skipping
padded slots, without the reference's mask, gather and two index_put calls per layer.
Same signature as ``reference.reshape_and_cache`` (tests/ops/test_reshape_and_cache.py)."""
from __future__ import annotations

import torch

from specdec_plugin import _C
from specdec_plugin.ops.reshape_and_cache.validate import check_reshape_and_cache


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    _C.cpu_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping.long())
