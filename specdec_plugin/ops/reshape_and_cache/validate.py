"""The KV-cache write contract (package docstring) as one check every provider runs first."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import (INDEX_DTYPES, CheckedValues, PassedStructure, fail,
                                         same_device, values_on_host)

_OP = "reshape_and_cache"
_checked = CheckedValues()  # the layers of one step share their slot mapping
_structure = PassedStructure()  # ... and the shapes of their key, value and caches


def check_reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    try:
        # Every tensor property _check_structure reads, and nothing else (PassedStructure):
        # key/value dtypes are not checked (the providers convert to the cache's).
        signature = (
            key.shape, key.stride(), key.get_device(),
            value.shape, value.stride(), value.get_device(),
            key_cache.shape, key_cache.stride(), key_cache.get_device(),
            value_cache.shape, value_cache.stride(), value_cache.get_device(),
            slot_mapping.shape, slot_mapping.dtype, slot_mapping.get_device(),
        )
    except Exception:  # e.g. a layout without strides, not a tensor: the full checks decide
        signature = None
    if signature is None or signature != _structure.last:
        _check_structure(key, value, key_cache, value_cache, slot_mapping)
        if signature is not None:
            _structure.last = signature
    if slot_mapping.shape[0] and values_on_host(slot_mapping):
        capacity = key_cache.shape[0] * key_cache.shape[1]
        if not _checked.seen((slot_mapping,), capacity):
            # Negative slots are padding; anything else must be a slot of the cache.
            if int(slot_mapping.max()) >= capacity:
                fail(_OP, f"a slot is past the cache's {capacity} slots")
            _checked.passed((slot_mapping,), capacity)


def _check_structure(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                     value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Shapes, dtypes, strides and devices, in the order they were always checked."""
    if key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
        fail(_OP, f"key_cache and value_cache must both be [blocks, block_size, kv_heads, head]; "
                  f"got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}")
    if key.dim() != 3 or value.shape != key.shape or key.shape[1:] != key_cache.shape[2:]:
        fail(_OP, f"key and value must be [tokens, {key_cache.shape[2]}, {key_cache.shape[3]}]; "
                  f"got {tuple(key.shape)} and {tuple(value.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in INDEX_DTYPES:
        fail(_OP, f"slot_mapping must be 1-D int32/int64, got {slot_mapping.dtype} "
                  f"{tuple(slot_mapping.shape)}")
    if slot_mapping.shape[0] > key.shape[0]:
        fail(_OP, f"{slot_mapping.shape[0]} slots but only {key.shape[0]} key/value rows")
    if key.stride(-1) != 1 or value.stride(-1) != 1 or key_cache.stride(3) != 1 \
            or value_cache.stride(3) != 1:
        fail(_OP, "key, value and the caches need a unit stride in the head dimension")
    same_device(_OP, key_cache, value_cache=value_cache, key=key, value=value,
                slot_mapping=slot_mapping)
