"""Compile at engine start the attention kernel variants that serving launches.

A Triton kernel compiles once per set of constexpr values, and a compile in the middle of
serving stalls that step for a second or more. Our paged attention kernel
(ops/paged_attention/triton.py) has six variants: query tile 1 (decode, drafting), the
verification tile and the largest tile (prefill), each with and without a KV split. Graph
capture compiles only what its graphs record. Eager steps reach the rest: mixed prefill-decode
batches, prefills whose prefix is cached (a short query over a long context is split), and
drafting outside our graphs. Seen on the H100, 2026-11-25: with one warm-up run, the first
timed run at batch 1 took 1.74 s against 0.80 s, because a split prefill variant compiled
inside it.

So each variant is launched once here, on one request over the KV cache's null block. The
inputs have the same dtypes and the same stride classes as the live ones (Triton also
specialises integers by divisibility by 16): the layer's own cache, and a block table as wide
as the runner's.
"""
from __future__ import annotations

import torch

from specdec_plugin.attention.impl import SpecDecAttentionImpl
from specdec_plugin.log import init_logger

logger = init_logger(__name__)

# A plan length that makes the kernel split the KV of a single short query (one tile); the
# split heuristic reads only this host value.
_SPLIT_PLAN_SEQ_LEN = 1 << 20


def _block_table_width(runner, block_size: int) -> int:
    try:
        return int(runner.input_batch.block_table[0].max_num_blocks_per_req)
    except (AttributeError, IndexError, TypeError):
        return -(-runner.model_config.max_model_len // block_size)


def compile_attention_variants(runner) -> int:
    """Launch every attention variant once per distinct layer shape; returns the launches.
    Only for devices whose kernels compile at first use (the Triton provider)."""
    from specdec_plugin.ops.paged_attention.triton import variant_query_lengths

    layers = runner.compilation_config.static_forward_context
    seen: set[tuple] = set()
    launches = 0
    for layer in layers.values():
        impl = getattr(layer, "impl", None)
        kv_cache = getattr(layer, "kv_cache", None)
        if not isinstance(impl, SpecDecAttentionImpl) or not isinstance(kv_cache, torch.Tensor):
            continue
        if kv_cache.dim() != 5:  # [2, blocks, block_size, kv_heads, head] once allocated
            continue
        dtype = getattr(layer, "dtype", None) or runner.model_config.dtype
        shape = (impl.num_heads, impl.num_kv_heads, impl.head_size, kv_cache.dtype, dtype,
                 kv_cache.shape[2])
        if shape in seen:
            continue
        seen.add(shape)
        key_cache, value_cache = kv_cache.unbind(0)
        device = kv_cache.device
        width = _block_table_width(runner, kv_cache.shape[2])
        block_table = torch.zeros(1, width, dtype=torch.int32, device=device)  # null block
        for q in variant_query_lengths(impl.num_heads, impl.num_kv_heads):
            query = torch.randn(q, impl.num_heads, impl.head_size, dtype=dtype, device=device)
            out = torch.empty_like(query)
            query_start_loc = torch.tensor([0, q], dtype=torch.int32, device=device)
            seq_lens = torch.tensor([q], dtype=torch.int32, device=device)
            for plan_seq_len in (0, _SPLIT_PLAN_SEQ_LEN):
                impl._attention(query, key_cache, value_cache, block_table, query_start_loc,
                                seq_lens, impl.scale, out, q, q, host_bound=False,
                                plan_seq_len=plan_seq_len)
                launches += 1
    return launches  # compiled on the host at launch: nothing to wait for
