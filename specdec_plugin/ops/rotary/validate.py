"""The rotary-embedding contract (package docstring) as one check every provider runs first."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import (INDEX_DTYPES, CheckedValues, fail, same_device,
                                         values_on_host)

_OP = "rotary_embedding"
_checked = CheckedValues()  # the layers of one step share their positions


def check_rotary(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                 cos_sin_cache: torch.Tensor, head_size: int, rotary_dim: int) -> None:
    if positions.dtype not in INDEX_DTYPES:
        fail(_OP, f"positions must be int32/int64, got {positions.dtype}")
    if rotary_dim % 2 or not 0 < rotary_dim <= head_size:
        fail(_OP, f"rotary_dim {rotary_dim} must be even and in (0, {head_size}]")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != rotary_dim:
        fail(_OP, f"cos_sin_cache must be [max_position, {rotary_dim}], got "
                  f"{tuple(cos_sin_cache.shape)}")
    if not query.is_floating_point() or (key is not None and key.dtype != query.dtype):
        fail(_OP, f"query {query.dtype} and key {None if key is None else key.dtype} must "
                  "share one floating dtype")
    num_tokens = positions.numel()
    _check_heads("query", query, num_tokens, head_size)
    if key is not None:
        _check_heads("key", key, num_tokens, head_size)
    same_device(_OP, positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
    if num_tokens and values_on_host(positions):
        max_position = cos_sin_cache.shape[0]
        if not _checked.seen((positions,), max_position):
            if int(positions.min()) < 0 or int(positions.max()) >= max_position:
                fail(_OP, f"a position is outside the cache's [0, {max_position})")
            _checked.passed((positions,), max_position)


def _check_heads(name: str, x: torch.Tensor, num_tokens: int, head_size: int) -> None:
    # In place needs a [tokens, heads, head_size] view whose heads are contiguous runs.
    if x.shape[0] != num_tokens or x.numel() % max(num_tokens * head_size, 1) \
            or x.stride(-1) != 1:
        fail(_OP, f"{name} {tuple(x.shape)} is not [{num_tokens}, heads * {head_size}] with a "
                  "unit last stride")
