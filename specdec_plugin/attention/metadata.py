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
    # A drafter's step. Where our drafter graphs do not record it (spec_decode/drafter_graphs.py)
    # vLLM runs drafter attention eagerly in a loop bound by host launch cost, so the kernel
    # launches as little as it can. Recorded steps carry the flag too (see the note there).
    drafting: bool = False
    # The context length the attention kernel plans its KV split for (max_model_len, from
    # the workspace reservation): the same for captured and eager steps, so one request gets
    # one summation order on both paths. 0: plan from this step's max_seq_len.
    split_plan_seq_len: int = 0


class SpecDecAttentionMetadataBuilder(AttentionMetadataBuilder[SpecDecAttentionMetadata]):
    # Every batch shape is served by the same kernel, so any batch may be captured; whether
    # a device captures at all is the platform's decision.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS
    # Set by the backend (backend.py: _bound) from the device layer; the torch reference here.
    kernel_providers: ClassVar[tuple[str, ...]] = ("torch",)

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str],
                 vllm_config: VllmConfig, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # 1+K verification queries are batched like decodes (they share one kernel path).
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self._split_plan_seq_len = self._reserve_kernel_workspace(
            kv_cache_spec, layer_names, vllm_config, device)

    def _reserve_kernel_workspace(self, kv_cache_spec: AttentionSpec, layer_names: list[str],
                                  vllm_config: VllmConfig, device: torch.device) -> int:
        # A launch inside graph capture cannot allocate, so size the attention kernel's
        # scratch now for every decode/verify/draft step shape this builder will see.
        from specdec_plugin.ops.registry import get_kernel

        layers = vllm_config.compilation_config.static_forward_context
        num_q_heads = max((getattr(layers.get(name), "num_heads", 0) for name in layer_names),
                          default=0) or kv_cache_spec.num_kv_heads
        spec = vllm_config.speculative_config
        k = spec.num_speculative_tokens if spec is not None and spec.num_speculative_tokens else 0
        reserve = get_kernel("paged_attention_workspace", self.kernel_providers)
        return reserve(vllm_config.scheduler_config.max_num_seqs, (1, 1 + k) if k else (1,),
                       num_q_heads, kv_cache_spec.num_kv_heads, kv_cache_spec.head_size,
                       vllm_config.model_config.max_model_len, kv_cache_spec.dtype, device)

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
            split_plan_seq_len=self._split_plan_seq_len,
        )

    def build_for_drafting(self, common_attn_metadata: CommonAttentionMetadata,
                           draft_index: int) -> SpecDecAttentionMetadata:
        # Every drafter step (EAGLE, EAGLE-3, MTP, draft model) builds its metadata here.
        metadata = self.build(0, common_attn_metadata)
        metadata.drafting = True
        return metadata

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata):
        metadata = self.build(0, common_attn_metadata)
        # Capture with short contexts: the graph records the launch, not the lengths.
        metadata.seq_lens.fill_(1)
        return metadata
