"""The paged-attention contract (package docstring) as one check every provider runs first."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import (CheckedValues, PassedStructure, fail, same_device,
                                         values_on_host)

_OP = "paged_attention"
_WRITE_OP = "paged_attention_write_kv"
_checked = CheckedValues()  # the layers of one step share their metadata tensors
_structure = PassedStructure()  # ... and the shapes of their query, output and caches


def check_paged_attention(query: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, block_table: torch.Tensor,
                          query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                          out: torch.Tensor, max_query_len: int, max_seq_len: int) -> None:
    try:
        q_shape, kc_shape, sl_shape = query.shape, key_cache.shape, seq_lens.shape
        # Every tensor property _check_structure reads, and nothing else (PassedStructure).
        signature = (
            q_shape, query.stride(), query.dtype, query.get_device(),
            kc_shape, key_cache.stride(), key_cache.dtype, key_cache.get_device(),
            value_cache.shape, value_cache.stride(), value_cache.dtype, value_cache.get_device(),
            out.shape, out.stride(), out.dtype, out.get_device(),
            block_table.shape, block_table.dtype, block_table.get_device(),
            query_start_loc.shape, query_start_loc.dtype, query_start_loc.get_device(),
            sl_shape, seq_lens.dtype, seq_lens.get_device(),
        )
    except Exception:  # e.g. a layout without strides, not a tensor: the full checks decide
        signature = None
    if signature is None or signature != _structure.last:
        _check_structure(query, key_cache, value_cache, block_table, query_start_loc, seq_lens,
                         out, max_query_len, max_seq_len)
        if signature is None:  # passed all the same: read the shapes the plain way
            q_shape, kc_shape, sl_shape = query.shape, key_cache.shape, seq_lens.shape
        else:
            _structure.last = signature
    elif max_query_len < 0 or max_seq_len < 0 or max_query_len > q_shape[0]:
        # The one structural check that also reads the integer arguments: runs every call.
        _fail_lengths(query, max_query_len, max_seq_len)
    num_seqs = sl_shape[0]
    if num_seqs and values_on_host(query):
        indices = (block_table, query_start_loc, seq_lens)
        sizes = (q_shape[0], kc_shape[0], kc_shape[1], max_query_len, max_seq_len)
        if not _checked.seen(indices, *sizes):
            _check_lengths(q_shape[0], kc_shape[0], kc_shape[1], block_table,
                           query_start_loc[: num_seqs + 1], seq_lens, max_query_len,
                           max_seq_len)
            _checked.passed(indices, *sizes)


def _fail_lengths(query: torch.Tensor, max_query_len: int, max_seq_len: int) -> None:
    fail(_OP, f"max_query_len {max_query_len} / max_seq_len {max_seq_len} out of range "
              f"for {query.shape[0]} query rows")


def _check_structure(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     block_table: torch.Tensor, query_start_loc: torch.Tensor,
                     seq_lens: torch.Tensor, out: torch.Tensor, max_query_len: int,
                     max_seq_len: int) -> None:
    """Shapes, dtypes, strides, devices and the integer arguments, in the order they were
    always checked (so the first error a bad input meets is the same)."""
    if query.dim() != 3 or key_cache.dim() != 4:
        fail(_OP, f"query must be [tokens, q_heads, head] and the caches [blocks, block_size, "
                  f"kv_heads, head]; got {tuple(query.shape)} and {tuple(key_cache.shape)}")
    if value_cache.shape != key_cache.shape or value_cache.dtype != key_cache.dtype:
        fail(_OP, "key_cache and value_cache differ in shape or dtype")
    if key_cache.dtype != query.dtype or out.dtype != query.dtype:
        fail(_OP, f"query {query.dtype}, KV cache {key_cache.dtype} and out {out.dtype} must "
                  "share one dtype")
    if out.shape != query.shape:
        fail(_OP, f"out {tuple(out.shape)} must have the query's shape {tuple(query.shape)}")
    num_kv_heads, head = key_cache.shape[2], key_cache.shape[3]
    if query.shape[2] != head or query.shape[1] % num_kv_heads:
        fail(_OP, f"query heads {query.shape[1]} x {query.shape[2]} do not fit KV heads "
                  f"{num_kv_heads} x {head}")
    # Providers address rows by stride but read each head as one contiguous run.
    if query.stride(2) != 1 or out.stride(2) != 1 or key_cache.stride(3) != 1 \
            or value_cache.stride(3) != 1:
        fail(_OP, "query, out and the caches need a unit stride in the head dimension")
    if block_table.dtype != torch.int32 or query_start_loc.dtype != torch.int32 \
            or seq_lens.dtype != torch.int32:
        fail(_OP, "block_table, query_start_loc and seq_lens must be int32")
    if block_table.dim() != 2 or query_start_loc.dim() != 1 or seq_lens.dim() != 1:
        fail(_OP, "block_table must be 2-D, query_start_loc and seq_lens 1-D")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] < num_seqs + 1 or block_table.shape[0] < num_seqs:
        fail(_OP, f"{num_seqs} requests need query_start_loc of {num_seqs + 1} and "
                  f"block_table rows {num_seqs}; got {query_start_loc.shape[0]} and "
                  f"{block_table.shape[0]}")
    if max_query_len < 0 or max_seq_len < 0 or max_query_len > query.shape[0]:
        _fail_lengths(query, max_query_len, max_seq_len)
    same_device(_OP, query, key_cache=key_cache, value_cache=value_cache, out=out,
                block_table=block_table, query_start_loc=query_start_loc, seq_lens=seq_lens)


def _check_lengths(num_tokens: int, num_blocks: int, block_size: int, block_table, qsl,
                   seq_lens, max_query_len: int, max_seq_len: int) -> None:
    """Values, host memory only: every read a provider makes stays inside its tensor."""
    q_lens = qsl[1:] - qsl[:-1]
    if bool((q_lens < 0).any()) or int(qsl[0]) < 0 or int(qsl[-1]) > num_tokens:
        fail(_OP, f"query_start_loc must be non-decreasing within [0, {num_tokens}]")
    if bool((q_lens > seq_lens).any()) or bool((q_lens > max_query_len).any()) \
            or bool((seq_lens > max_seq_len).any()):
        fail(_OP, f"every request needs q_len <= seq_len, q_len <= max_query_len "
                  f"{max_query_len} and seq_len <= max_seq_len {max_seq_len}")
    # max_seq_len is only an upper bound (a captured graph passes max_model_len); what a
    # request reads is the first ceil(seq_len / block_size) blocks of its row.
    if bool((seq_lens > block_table.shape[1] * block_size).any()):
        fail(_OP, f"a seq_len is past the block table's {block_table.shape[1]} blocks of "
                  f"{block_size}")
    used = torch.arange(block_table.shape[1]) * block_size < seq_lens[:, None]
    blocks = block_table[: seq_lens.shape[0]]
    if bool((used & ((blocks < 0) | (blocks >= num_blocks))).any()):
        fail(_OP, f"a block_table entry a request reads is outside [0, {num_blocks})")


def check_write_kv(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                   value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                   query_start_loc: torch.Tensor, num_seqs: int) -> None:
    """``paged_attention_write_kv``'s inputs beyond ``paged_attention``'s: the KV write's
    contract, and a slot for every real query token (providers read ``slot_mapping[t]`` for
    the tokens ``t`` of ``query_start_loc``'s ranges)."""
    from specdec_plugin.ops.reshape_and_cache.validate import check_reshape_and_cache

    check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    if num_seqs and values_on_host(query_start_loc) \
            and int(query_start_loc[num_seqs]) > slot_mapping.shape[0]:
        fail(_WRITE_OP, f"{int(query_start_loc[num_seqs])} query tokens but only "
                        f"{slot_mapping.shape[0]} slots in slot_mapping")
