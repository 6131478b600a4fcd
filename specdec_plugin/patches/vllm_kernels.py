"""P2: vLLM's Triton kernels on the V1 path, replaced by adapters to our kernels (see catalog).

``TABLE`` lists every replaced symbol: (vLLM module, attribute) -> adapter. An adapter is
indexed with vLLM's launch grid and called with vLLM's exact arguments, like a Triton kernel.
"""
from __future__ import annotations

import importlib

import torch


class _GridLaunch:
    """Accepts ``kernel[grid](*args, **kwargs)`` and forwards to ``fn(grid, *args, **kwargs)``."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.fn(grid, *args, **kwargs)


def _slot_mapping(grid, num_tokens, max_num_tokens, query_start_loc, positions, block_table,
                  block_table_stride, block_size, slot_mapping, *, KV_CACHE_BLOCK_SIZE,
                  BLOCKS_PER_KV_BLOCK, TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK,
                  CP_KV_CACHE_INTERLEAVE_SIZE, PAD_ID, **_launch):
    # TEMPORARY: replaced by specdec_plugin.ops.spec_prep once that kernel pair lands.
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("context parallelism is not supported by specdec_plugin")
    num_reqs = grid[0] - 1  # vLLM launches one program per request plus one padding program
    pos = positions[:num_tokens].long()
    token_req = torch.repeat_interleave(
        torch.arange(num_reqs, device=pos.device),
        (query_start_loc[1:num_reqs + 1] - query_start_loc[:num_reqs]).long(),
        output_size=num_tokens,
    )
    kv_block = pos // KV_CACHE_BLOCK_SIZE
    offset_in_kv_block = pos - kv_block * KV_CACHE_BLOCK_SIZE
    block_index = kv_block * BLOCKS_PER_KV_BLOCK + offset_in_kv_block // block_size
    flat = block_table.view(-1)
    block_number = flat[token_req * block_table_stride + block_index].long()
    slot_mapping[:num_tokens] = block_number * block_size + offset_in_kv_block % block_size
    slot_mapping[num_tokens:max_num_tokens] = PAD_ID


TABLE: dict[tuple[str, str], _GridLaunch] = {
    ("vllm.v1.worker.block_table", "_compute_slot_mapping_kernel"): _GridLaunch(_slot_mapping),
}


def apply() -> None:
    for (module, attr), adapter in TABLE.items():
        setattr(importlib.import_module(module), attr, adapter)
