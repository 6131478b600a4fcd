"""Triton rotary embedding, in place: same contract as ``reference.apply_rotary`` (package doc).

Grid (token, head block): the query's heads and then the key's are cut into blocks of
``BLOCK_H`` heads, so even a one-token decode step spreads over several programs. Each program
reads its token's cos/sin row once and rotates every head of its block. Products and sums are
rounded to the tensor's dtype one by one, as eager PyTorch does; the compiler may still fuse
one product into the sum (on sm_90 the bf16 code is ``mul.bf16`` + ``fma.rn.bf16``), so on a GPU
a few elements can differ from vLLM's native op by one rounding (more accurate, not less); the
interpreter matches it bit for bit. Graph-safe (no host reads of device values).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.rotary.validate import check_rotary

# Elements (heads x rotary_dim / 2) one program rotates per tensor half.
_TILE = 512


@triton.jit
def _rounded_mul(a, b, DTYPE: tl.constexpr):
    return (a * b).to(DTYPE).to(tl.float32)


# The query/key branch below assigns these per branch; a value of 1 would otherwise be
# specialised into a constant in one branch only and the branch types would not match.
@triton.jit(do_not_specialize=["stride_qt", "stride_qh", "stride_kt", "stride_kh",
                               "num_q_heads", "num_k_heads"])
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    num_q_heads, num_k_heads, num_q_blocks,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_H: tl.constexpr, IS_NEOX: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    if blk < num_q_blocks:
        base = q_ptr + tok * stride_qt
        stride_h = stride_qh
        first_head = blk * BLOCK_H
        num_heads = num_q_heads
    else:
        base = k_ptr + tok * stride_kt
        stride_h = stride_kh
        first_head = (blk - num_q_blocks) * BLOCK_H
        num_heads = num_k_heads
    dtype = q_ptr.dtype.element_ty

    i = tl.arange(0, HALF_PAD)
    i_mask = i < HALF
    cache_row = cache_ptr + tl.load(pos_ptr + tok).to(tl.int64) * stride_cache
    # The cache is rounded to the query's dtype first, as vLLM's native op does.
    cos = tl.load(cache_row + i, mask=i_mask, other=0.0).to(dtype).to(tl.float32)[None, :]
    sin = tl.load(cache_row + HALF + i, mask=i_mask, other=0.0).to(dtype).to(tl.float32)[None, :]

    heads = first_head + tl.arange(0, BLOCK_H)
    mask = (heads < num_heads)[:, None] & i_mask[None, :]
    if IS_NEOX:
        off1 = i
        off2 = i + HALF
    else:
        off1 = 2 * i
        off2 = 2 * i + 1
    head_base = base + heads[:, None].to(tl.int64) * stride_h
    x1 = tl.load(head_base + off1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(head_base + off2[None, :], mask=mask, other=0.0).to(tl.float32)
    o1 = _rounded_mul(x1, cos, dtype) - _rounded_mul(x2, sin, dtype)
    o2 = _rounded_mul(x2, cos, dtype) + _rounded_mul(x1, sin, dtype)
    tl.store(head_base + off1[None, :], o1.to(dtype), mask=mask)
    tl.store(head_base + off2[None, :], o2.to(dtype), mask=mask)


def _heads_view(x: torch.Tensor, num_tokens: int, head_size: int) -> torch.Tensor:
    heads = x.view(num_tokens, -1, head_size)  # raises if no view exists: in place needs one
    if heads.stride(2) != 1:
        raise ValueError("rotary embedding in place needs a contiguous head dimension")
    return heads


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
    if num_tokens == 0:  # before the views: view(0, -1, head_size) has no size to infer
        return query, key
    q = _heads_view(query, num_tokens, head_size)
    k = _heads_view(key, num_tokens, head_size) if key is not None else q
    num_k_heads = k.shape[1] if key is not None else 0
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()

    half = rotary_dim // 2
    half_pad = triton.next_power_of_2(half)
    block_h = max(1, min(_TILE // half_pad, triton.next_power_of_2(max(q.shape[1], num_k_heads))))
    num_q_blocks = triton.cdiv(q.shape[1], block_h)
    grid = (num_tokens, num_q_blocks + triton.cdiv(num_k_heads, block_h))
    _rotary_kernel[grid](
        positions, q, k, cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cache.stride(0),
        q.shape[1], num_k_heads, num_q_blocks,
        HALF=half, HALF_PAD=half_pad, BLOCK_H=block_h, IS_NEOX=is_neox,
        num_warps=4 if block_h * half_pad >= 512 else 2,
    )
    return query, key
