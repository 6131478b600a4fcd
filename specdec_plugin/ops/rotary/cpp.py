"""Rotary embedding on the CPU in C++ (csrc/cpu_layer_ops.cpp), in place: one call per layer
instead of the reference's ~10 torch ops, with the same roundings (each product and sum in the
query's dtype: bit-equal to the reference). Same contract as ``reference.apply_rotary``
(tests/ops/test_rotary.py); what the kernel does not take goes to the reference."""
from __future__ import annotations

import torch

from specdec_plugin.ops.rotary import reference
from specdec_plugin.ops.rotary.validate import check_rotary
from specdec_plugin.spec_decode._native import load_extension

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _token_rows(x: torch.Tensor, num_tokens: int) -> torch.Tensor | None:
    """``x`` as a [tokens, heads * head_size] view of the same storage, or None."""
    try:
        rows = x.view(num_tokens, -1)
    except RuntimeError:
        return None
    return rows if rows.stride(-1) == 1 else None


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
    num_tokens = positions.numel()
    if num_tokens == 0:
        return query, key
    q_rows = _token_rows(query, num_tokens) if query.is_cpu and query.dtype in _DTYPES else None
    k_rows = None if key is None else _token_rows(key, num_tokens)
    if q_rows is None or (key is not None and k_rows is None):
        return reference.apply_rotary(positions, query, key, cos_sin_cache, head_size,
                                      rotary_dim, is_neox)
    if cos_sin_cache.dtype != query.dtype or cos_sin_cache.stride(-1) != 1:
        cos_sin_cache = cos_sin_cache.to(query.dtype).contiguous()
    load_extension().cpu_rotary(positions.reshape(-1).long(), q_rows, k_rows, cos_sin_cache,
                                head_size, rotary_dim, is_neox)
    return query, key
