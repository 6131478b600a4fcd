"""Attention metadata and its builder: what one forward step tells every attention layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.config import VllmConfig
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import AttentionSpec


@dataclass
class SpecDecAttentionMetadata:
    num_actual_tokens: int  # tokens excluding graph padding
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, cached tokens after this step
    block_table: torch.Tensor  # [num_seqs, max_blocks] int32
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 for padding


class SpecDecAttentionMetadataBuilder(AttentionMetadataBuilder[SpecDecAttentionMetadata]):
    # Every batch shape is served by the same kernel, so any batch may be captured; whether
    # a device captures at all is the platform's decision.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str],
                 vllm_config: VllmConfig, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # 1+K verification queries are batched like decodes (they share one kernel path).
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> SpecDecAttentionMetadata:
        cad = common_attn_metadata
        return SpecDecAttentionMetadata(
            num_actual_tokens=cad.num_actual_tokens,
            max_query_len=cad.max_query_len,
            max_seq_len=cad.max_seq_len,
            query_start_loc=cad.query_start_loc,
            seq_lens=cad.seq_lens,
            block_table=cad.block_table_tensor,
            slot_mapping=cad.slot_mapping,
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata):
        metadata = self.build(0, common_attn_metadata)
        # Capture with short contexts: the graph records the launch, not the lengths.
        metadata.seq_lens.fill_(1)
        return metadata
