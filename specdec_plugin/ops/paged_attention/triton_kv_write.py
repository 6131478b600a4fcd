"""The KV write of ``paged_attention_write_kv``'s Triton kernel, run by each attention program
before it reads its keys (``triton.py``, ``_attention_tile_kernel`` with ``WRITE_KV``).

Why fused: in a verification or decode step the separate ``reshape_and_cache`` launch costs
more than its work (about 1.4 us a layer on the H200 for a few tokens, session 61's profile,
plus the gap before the attention kernel), once per attention layer per step. Issue 12 asks
for the drafter's KV write inside its attention kernel; this does it for every layer.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _write_new_kv(key_ptr, value_ptr, slot_mapping_ptr, stride_knt, stride_knh, stride_vnt,
                  stride_vnh, k_head, v_head, stride_kb, stride_ks, stride_vb, stride_vs,
                  kv_head, q_start, context_len, kv_lo, kv_hi, dims, dim_valid,
                  CACHE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store this step's K/V rows of the keys [kv_lo, kv_hi) that are query tokens (positions
    from ``context_len``) at their ``slot_mapping`` slots (negative: skipped), as
    ``reshape_and_cache`` would. Every program writes the new keys its own loop reads, so no
    program reads a slot another program of the launch may still be writing; programs whose
    ranges overlap (query tiles of one request) store the same values."""
    for start in range(tl.maximum(kv_lo, context_len), kv_hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        live = pos < kv_hi
        tok = (q_start + pos - context_len).to(tl.int64)
        slot = tl.load(slot_mapping_ptr + tok, mask=live, other=-1).to(tl.int64)
        live = live & (slot >= 0)
        block = slot // CACHE_BLOCK
        offset = slot % CACHE_BLOCK
        mask = live[:, None] & dim_valid[None, :]
        k = tl.load(key_ptr + tok[:, None] * stride_knt + kv_head * stride_knh + dims[None, :],
                    mask=mask)
        tl.store(k_head + block[:, None] * stride_kb + offset[:, None] * stride_ks
                 + dims[None, :], k.to(k_head.dtype.element_ty), mask=mask)
        v = tl.load(value_ptr + tok[:, None] * stride_vnt + kv_head * stride_vnh
                    + dims[None, :], mask=mask)
        tl.store(v_head + block[:, None] * stride_vb + offset[:, None] * stride_vs
                 + dims[None, :], v.to(v_head.dtype.element_ty), mask=mask)
