"""Pure-torch paged attention: the reference every other provider is tested against, and the
kernel the CPU platform runs.

It gathers each request's blocks into a padded ``[num_seqs, max_seq_len]`` key/value view and
runs one masked ``scaled_dot_product_attention`` over all requests, so a batch costs a handful
of torch calls rather than a Python loop per request.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_plugin.ops.paged_attention.validate import check_paged_attention, check_write_kv


def _padded_query_index(query_start_loc: torch.Tensor, max_query_len: int):
    """Token index of (request, j) in the packed query, and whether j is a real query row."""
    starts = query_start_loc[:-1].long()
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    j = torch.arange(max_query_len, device=query_start_loc.device)
    valid = j[None, :] < q_lens[:, None]
    index = torch.where(valid, starts[:, None] + j[None, :], torch.zeros_like(valid, dtype=torch.long))
    return index, valid, q_lens


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    host_bound: bool = False,
    plan_seq_len: int = 0,
) -> torch.Tensor:
    """Write attention for every real query row into ``out`` (same shape as ``query``).

    ``host_bound`` and ``plan_seq_len`` are launch hints for the Triton kernel (see there); the
    result is the same.
    """
    check_paged_attention(query, key_cache, value_cache, block_table, query_start_loc, seq_lens,
                          out, max_query_len, max_seq_len)
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or max_query_len == 0 or max_seq_len == 0:
        return out
    block_size = key_cache.shape[1]
    num_kv_heads, head_size = key_cache.shape[2], key_cache.shape[3]
    num_q_heads = query.shape[1]

    blocks_needed = (max_seq_len + block_size - 1) // block_size
    blocks = block_table[:num_seqs, :blocks_needed].long().clamp_min(0)
    # [num_seqs, blocks * block_size, kv_heads, head] -> [num_seqs, kv_heads, L, head]
    k = key_cache[blocks].reshape(num_seqs, -1, num_kv_heads, head_size).transpose(1, 2)
    v = value_cache[blocks].reshape(num_seqs, -1, num_kv_heads, head_size).transpose(1, 2)
    kv_len = k.shape[2]

    index, valid, q_lens = _padded_query_index(query_start_loc[: num_seqs + 1], max_query_len)
    q = query[index].transpose(1, 2)  # [num_seqs, q_heads, max_q, head]

    # Query row j of request i sits at absolute position seq_len_i - q_len_i + j.
    seq = seq_lens[:num_seqs].long()
    q_pos = (seq - q_lens)[:, None] + torch.arange(max_query_len, device=seq.device)[None, :]
    k_pos = torch.arange(kv_len, device=seq.device)
    mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & (k_pos[None, None, :] < seq[:, None, None])
    # Padding rows get one visible key so softmax stays finite; they are never written back.
    mask[..., 0] |= ~valid

    attn = F.scaled_dot_product_attention(
        q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask[:, None], scale=scale,
        enable_gqa=num_q_heads != num_kv_heads,
    )  # [num_seqs, q_heads, max_q, head]
    attn = attn.transpose(1, 2)[valid]  # [total real rows, q_heads, head], in packed order
    out[index[valid]] = attn.to(out.dtype)
    return out


def paged_attention_write_kv(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
    value_cache: torch.Tensor, slot_mapping: torch.Tensor, block_table: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, out: torch.Tensor,
    max_query_len: int, max_seq_len: int, host_bound: bool = False, plan_seq_len: int = 0,
) -> torch.Tensor:
    """The real query tokens' K/V written at their ``slot_mapping`` slots (negative: skipped),
    then ``paged_attention`` (the package docstring's contract)."""
    from specdec_plugin.ops.reshape_and_cache.reference import reshape_and_cache

    # Checked before the write (paged_attention checks again, after it): a bad attention
    # argument must not leave the caches written.
    check_paged_attention(query, key_cache, value_cache, block_table, query_start_loc, seq_lens,
                          out, max_query_len, max_seq_len)
    num_seqs = seq_lens.shape[0]
    check_write_kv(key, value, key_cache, value_cache, slot_mapping, query_start_loc, num_seqs)
    if num_seqs:
        first, end = int(query_start_loc[0]), int(query_start_loc[num_seqs])
        reshape_and_cache(key[first:end], value[first:end], key_cache, value_cache,
                          slot_mapping[first:end])
    return paged_attention(query, key_cache, value_cache, block_table, query_start_loc, seq_lens,
                           scale, out, max_query_len, max_seq_len, host_bound, plan_seq_len)


def reserve_workspace(max_num_seqs: int, query_lens: tuple[int, ...], num_q_heads: int,
                      num_kv_heads: int, head_size: int, max_seq_len: int, dtype: torch.dtype,
                      device: torch.device) -> int:
    """The torch reference needs no workspace (same signature as the Triton one); launches
    plan for ``max_seq_len`` (the hint is unused here)."""
    return max_seq_len
