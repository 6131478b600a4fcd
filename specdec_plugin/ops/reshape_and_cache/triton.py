"""Triton KV-cache write: same contract as ``reference.reshape_and_cache`` (see the package doc).

One program copies one token's ``[num_kv_heads, head_size]`` key and value rows (or a chunk of
them, for very wide rows) into its slot. Padded tokens (slot < 0) return before touching the
cache, so the launch shape can stay fixed under CUDA graphs while the slot mapping changes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.reshape_and_cache.validate import check_reshape_and_cache

_MAX_CHUNK = 2048


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    CACHE_BLOCK: tl.constexpr, HEAD: tl.constexpr, ROW: tl.constexpr, CHUNK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // CACHE_BLOCK
    offset = slot % CACHE_BLOCK

    elem = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)  # index into the [heads * head] row
    valid = elem < ROW
    h = elem // HEAD
    d = elem % HEAD
    k = tl.load(key_ptr + token * stride_kt + h * stride_kh + d, mask=valid)
    v = tl.load(value_ptr + token * stride_vt + h * stride_vh + d, mask=valid)
    tl.store(key_cache_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch + d,
             k.to(key_cache_ptr.dtype.element_ty), mask=valid)
    tl.store(value_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + d,
             v.to(value_cache_ptr.dtype.element_ty), mask=valid)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    num_kv_heads, head = key_cache.shape[2], key_cache.shape[3]
    row = num_kv_heads * head
    chunk = min(triton.next_power_of_2(row), _MAX_CHUNK)
    _write_kv_kernel[(num_tokens, triton.cdiv(row, chunk))](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        CACHE_BLOCK=key_cache.shape[1], HEAD=head, ROW=row, CHUNK=chunk,
        num_warps=4,
    )
