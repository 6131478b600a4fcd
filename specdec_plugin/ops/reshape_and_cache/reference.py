"""Pure-torch KV-cache write: the reference for other providers and the CPU kernel."""
from __future__ import annotations

import torch

from specdec_plugin.ops.reshape_and_cache.validate import check_reshape_and_cache


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    num_tokens = slot_mapping.shape[0]
    slots = slot_mapping.long()
    keep = slots >= 0  # PAD_SLOT_ID (-1) marks padded tokens that must not touch the cache
    slots = slots[keep]
    heads, head_size = key_cache.shape[2], key_cache.shape[3]
    key_cache.view(-1, heads, head_size)[slots] = key[:num_tokens][keep].to(key_cache.dtype)
    value_cache.view(-1, heads, head_size)[slots] = value[:num_tokens][keep].to(value_cache.dtype)
