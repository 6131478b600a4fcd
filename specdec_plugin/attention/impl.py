"""The attention layer implementation: writes new K/V into the paged cache and runs paged
attention, both through the kernel registry (our Triton kernels on GPUs, torch on CPU)."""
from __future__ import annotations

import torch
from vllm.v1.attention.backend import AttentionImpl, AttentionLayer, AttentionType

from specdec_plugin.attention.metadata import SpecDecAttentionMetadata
from specdec_plugin.ops.registry import get_kernel


class SpecDecAttentionImpl(AttentionImpl[SpecDecAttentionMetadata]):
    # Set by the backend (backend.py: _bound) from the device layer; the torch reference here.
    kernel_providers: tuple[str, ...] = ("torch",)
    # Set by the backend whose forward_includes_kv_cache_update is True
    # (SPECDEC_FUSED_KV_WRITE): vLLM then skips its separate KV update, and forward writes the
    # new K/V itself, in the attention kernel's launch (ops/paged_attention:
    # paged_attention_write_kv).
    writes_kv_in_forward: bool = False

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, **extra) -> None:
        # The config checks reject these models up front; this is the last line of defence
        # for a layer that reaches us anyway (e.g. a drafter with its own config).
        unsupported = {
            "alibi_slopes": alibi_slopes is not None,
            "sliding_window": sliding_window is not None,
            "logits_soft_cap": bool(logits_soft_cap),
            "attn_type": attn_type != AttentionType.DECODER,
            "sinks": extra.get("sinks") is not None,
        }
        bad = [name for name, present in unsupported.items() if present]
        if bad:
            raise NotImplementedError(f"specdec_plugin attention does not support {', '.join(bad)}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type
        self._attention = get_kernel("paged_attention", self.kernel_providers)
        self._write_cache = get_kernel("reshape_and_cache", self.kernel_providers)
        self._attention_write_kv = (get_kernel("paged_attention_write_kv", self.kernel_providers)
                                    if self.writes_kv_in_forward else None)
        # (kv_cache, its data_ptr, shape, stride, (key_cache, value_cache)): see _kv_views.
        self._kv_views_of: tuple | None = None

    def _kv_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_cache.unbind(0)``, made once per cache tensor rather than twice per layer per
        step: an unbind is two tensor allocations through the dispatcher (~1.5 us of host time
        each call), and an eager step runs it in every layer. The views are remade if another
        tensor arrives or this one was re-pointed or reshaped in place (its data_ptr, shape or
        stride moved), so they are always what unbind would return now. Holding the tensor
        keeps its id from being reused; the layer holds it anyway."""
        cached = self._kv_views_of
        if cached is not None and cached[0] is kv_cache and cached[1] == kv_cache.data_ptr() \
                and cached[2] == kv_cache.shape and cached[3] == kv_cache.stride():
            return cached[4]
        views = kv_cache.unbind(0)
        self._kv_views_of = (kv_cache, kv_cache.data_ptr(), kv_cache.shape, kv_cache.stride(),
                             views)
        return views

    def do_kv_cache_update(self, layer: AttentionLayer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        key_cache, value_cache = self._kv_views(kv_cache)
        self._write_cache(key, value, key_cache, value_cache, slot_mapping)

    def forward(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: SpecDecAttentionMetadata, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("specdec_plugin attention has no fused output quantization")
        if attn_metadata is None:
            # vLLM's profiling pass runs the model with no metadata and no cache.
            return output.fill_(0)
        key_cache, value_cache = self._kv_views(kv_cache)
        slot_mapping = self._forward_slot_mapping(layer, key, value)
        if slot_mapping is not None:
            self._attention_write_kv(
                query, key, value, key_cache, value_cache, slot_mapping,
                attn_metadata.block_table, attn_metadata.query_start_loc, attn_metadata.seq_lens,
                self.scale, output, attn_metadata.max_query_len, attn_metadata.max_seq_len,
                host_bound=attn_metadata.drafting,
                plan_seq_len=attn_metadata.split_plan_seq_len,
            )
            return output
        self._attention(
            query, key_cache, value_cache, attn_metadata.block_table,
            attn_metadata.query_start_loc, attn_metadata.seq_lens, self.scale, output,
            attn_metadata.max_query_len, attn_metadata.max_seq_len,
            host_bound=attn_metadata.drafting, plan_seq_len=attn_metadata.split_plan_seq_len,
        )
        return output

    def _forward_slot_mapping(self, layer: AttentionLayer, key: torch.Tensor | None,
                              value: torch.Tensor | None) -> torch.Tensor | None:
        """Where forward writes the new K/V: the slots vLLM's separate update would have used
        (this layer's entry of the forward context), or None where it would not have written
        (not our fused backend, a layer sharing another's KV, no key, no slots this step)."""
        if not self.writes_kv_in_forward or self.kv_sharing_target_layer_name is not None \
                or key is None or value is None:
            return None
        from vllm.model_executor.layers.attention.attention import get_attention_context

        return get_attention_context(layer.layer_name)[3]
