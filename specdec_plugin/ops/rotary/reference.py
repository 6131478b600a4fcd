"""Pure-torch rotary embedding, in place: the reference for other providers and the CPU kernel.

Same arithmetic in the same order as vLLM's native op, so on the same device it is bit-equal.
"""
from __future__ import annotations

import torch

from specdec_plugin.ops.rotary.validate import check_rotary


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """``x`` [tokens, heads, rotary_dim] rotated; cos/sin [tokens, 1, rotary_dim / 2]."""
    if is_neox:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


def apply_rotary(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    rotary_dim: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    check_rotary(positions, query, key, cos_sin_cache, head_size, rotary_dim)
    positions = positions.reshape(-1)
    num_tokens = positions.shape[0]
    if num_tokens == 0:  # view(0, -1, head_size) below has no size to infer
        return query, key
    cos_sin = cos_sin_cache.to(query.dtype).index_select(0, positions)
    cos, sin = cos_sin.unsqueeze(-2).chunk(2, dim=-1)
    for x in (query, key):
        if x is None:
            continue
        rot = x.view(num_tokens, -1, head_size)[..., :rotary_dim]
        rot.copy_(_rotated(rot, cos, sin, is_neox))
    return query, key
