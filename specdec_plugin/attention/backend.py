"""The attention backend vLLM selects on our platform, registered as ``CUSTOM``.

KV cache layout: ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (K then V), so each
of K and V is the ``[num_blocks, block_size, num_kv_heads, head_size]`` tensor our kernels take.
"""
from __future__ import annotations

from functools import lru_cache
from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionType, MultipleOf

from specdec_plugin.attention.impl import SpecDecAttentionImpl
from specdec_plugin.attention.metadata import SpecDecAttentionMetadataBuilder


class SpecDecAttentionBackend(AttentionBackend):
    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        # vLLM looks the name up in AttentionBackendEnum; CUSTOM is the out-of-tree slot.
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[SpecDecAttentionImpl]:
        return _bound(SpecDecAttentionImpl, _kernel_providers())

    @staticmethod
    def get_builder_cls() -> type[SpecDecAttentionMetadataBuilder]:
        return _bound(SpecDecAttentionMetadataBuilder, _kernel_providers())

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size % 8 == 0 and head_size <= 256

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return True


class SpecDecFusedKVAttentionBackend(SpecDecAttentionBackend):
    """The same attention with the new K/V written inside its launch (SPECDEC_FUSED_KV_WRITE,
    chosen by the platform): vLLM skips its separate KV update for such a backend."""
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_impl_cls() -> type[SpecDecAttentionImpl]:
        return _bound(SpecDecAttentionImpl, _kernel_providers(), writes_kv_in_forward=True)


def _kernel_providers() -> tuple[str, ...]:
    # The one place in attention/ that reads the platform: the layers below get the device's
    # kernel providers from here (vLLM constructs them with its own arguments only).
    from vllm.platforms import current_platform

    return tuple(current_platform.device.kernel_providers)


@lru_cache(maxsize=None)
def _bound(cls: type, providers: tuple[str, ...], **attributes) -> type:
    """``cls`` with ``kernel_providers`` (and ``attributes``) set: one subclass per (class,
    providers, attributes), so vLLM's class identity checks between layers of the same model
    still see a single class."""
    return type(cls.__name__, (cls,), {"kernel_providers": providers, **attributes,
                                       "__module__": cls.__module__})
