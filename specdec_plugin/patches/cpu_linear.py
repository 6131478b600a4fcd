"""P11: linear layers and the LM head through ``ops/linear`` on the CPU (see the catalog).

vLLM 0.26 routes unquantized linear layers and the LM head through ``dispatch_unquantized_gemm``
and, on its own CPU platform only (``current_platform.is_cpu()``), repacks their weights in
``process_weights_after_loading``. Ours is an out-of-tree platform, so both fall through to
``F.linear`` on the unpacked fp32 weight, which is 75-85% of a CPU decode step. This wraps the two
quant methods' ``process_weights_after_loading`` and ``apply``: the weight is packed once
(``pack_linear_weight`` of the device's provider, in the dtype the device layer chooses) and
every call with a CPU input runs ``linear`` on it. Anything else goes to vLLM's own code.

The LM head is packed at its first ``apply``: ``UnquantizedEmbeddingMethod`` serves input
embeddings too (``embedding()``, never ``apply``), and packing those at load would copy a
vocabulary-sized matrix that no product ever reads. A layer whose ``weight`` was replaced after
packing (weights tied after loading) is packed again, never run with stale values.
"""
from __future__ import annotations

from typing import Callable

import torch

_ATTR = "_specdec_packed_linear"
_state: dict = {}


def _pack(layer: torch.nn.Module) -> object | None:
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_cpu \
            or weight.numel() == 0:
        return None
    dtype = _state["choose"](weight.dtype)
    if dtype is None:
        return None
    packed = _state["pack"](weight, dtype)
    # Not a registered buffer: an opaque oneDNN tensor must stay out of state_dict and .to().
    object.__setattr__(layer, _ATTR, packed)
    return packed


def _packed_for(layer: torch.nn.Module) -> object | None:
    packed = layer.__dict__.get(_ATTR)
    if packed is not None and packed.source is getattr(layer, "weight", None):
        return packed
    return _pack(layer)


def _wrap_class(cls, pack_at_load: bool) -> None:
    original_load: Callable = cls.process_weights_after_loading
    original_apply: Callable = cls.apply

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        original_load(self, layer)
        if pack_at_load:
            _pack(layer)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.is_cpu:
            packed = _packed_for(layer)
            if packed is not None:
                return _state["linear"](x, packed, bias)
        return original_apply(self, layer, x, bias)

    process_weights_after_loading.__wrapped__ = original_load  # type: ignore[attr-defined]
    apply.__wrapped__ = original_apply  # type: ignore[attr-defined]
    cls.process_weights_after_loading = process_weights_after_loading
    cls.apply = apply


def apply(kernel_providers: tuple[str, ...], choose_dtype: Callable[[torch.dtype], object]) -> None:
    """Install P11 for this process (idempotent). ``choose_dtype(model_dtype)`` is the device
    layer's choice of packed weight dtype, or None to leave a layer to vLLM."""
    if _state:
        return
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    from specdec_plugin.ops.registry import get_kernel

    _state.update(choose=choose_dtype,
                  pack=get_kernel("pack_linear_weight", kernel_providers),
                  linear=get_kernel("linear", kernel_providers))
    _wrap_class(UnquantizedLinearMethod, pack_at_load=True)
    _wrap_class(UnquantizedEmbeddingMethod, pack_at_load=False)
