"""Paged attention on the CPU in C++ (csrc/cpu_attention.cpp): one call per layer that reads
the request's blocks in place, instead of the reference's per-layer gather, index and mask.

Same signature and result as ``reference.paged_attention``; tests/ops/test_paged_attention.py
compares the two on fresh random inputs.
"""
from __future__ import annotations

import torch

from specdec_plugin import _C
from specdec_plugin.ops.paged_attention.validate import check_paged_attention


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
    check_paged_attention(query, key_cache, value_cache, block_table, query_start_loc, seq_lens,
                          out, max_query_len, max_seq_len)
    # max_query_len / max_seq_len / host_bound / plan_seq_len are hints for other providers:
    # the kernel reads the exact lengths itself.
    _C.cpu_paged_attention(query, key_cache, value_cache, block_table, query_start_loc,
                           seq_lens, float(scale), out)
    return out


def reserve_workspace(max_num_seqs: int, query_lens: tuple[int, ...], num_q_heads: int,
                      num_kv_heads: int, head_size: int, max_seq_len: int, dtype: torch.dtype,
                      device: torch.device) -> int:
    """No workspace: each thread keeps its own score row."""
    return max_seq_len
