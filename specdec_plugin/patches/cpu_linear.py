"""P11: linear layers and the LM head through ``ops/linear`` on the CPU (see the catalog).

vLLM 0.26 routes unquantized linear layers and the LM head through ``dispatch_unquantized_gemm``
and, on its own CPU platform only (``current_platform.is_cpu()``), repacks their weights in
``process_weights_after_loading``. Ours is an out-of-tree platform, so both fall through to
``F.linear`` on the unpacked fp32 weight, which is 75-85% of a CPU decode step. This wraps the two
quant methods' ``process_weights_after_loading`` and ``apply``: the weight is packed once
(``pack_linear_weight`` of the provider and in the dtype the device layer chooses for that
weight, ``CpuDevice.linear_packing``) and every call with a CPU input runs that provider's
``linear`` on it. Anything else goes to vLLM's own code.

The packing is kept on the weight tensor itself, so layers sharing one weight share one
packing. A linear layer's weight is released after packing (its ``.data`` becomes an empty
``[0, in_features]`` tensor): nothing reads it after load on this path (vLLM's ``apply`` is
replaced, and vLLM's drafters compare and share only embeddings and LM heads), so keeping it
held the linear layers twice (+425 MB for SmolLM2 in float32). Anything that did read its
values would find an empty tensor, never stale values; reloading weights into a running engine
is not supported on this path. LM heads keep theirs: they are often the input embedding itself
(tied, as in SmolLM2), which ``embedding()`` reads every step.

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


def _pack(layer: torch.nn.Module, release: bool = False) -> tuple | None:
    """``(packed, linear)`` for ``layer.weight``, packed as the device layer chooses and kept on
    the weight itself, so a weight shared by several layers is packed (and released) once;
    ``(None, None)`` where the layer stays vLLM's (kept too: the choice is made once)."""
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_cpu:
        return None
    entry = weight.__dict__.get(_ATTR)
    if entry is not None:
        return entry
    if weight.numel() == 0:
        return None
    choice = _state["choose"](weight)
    entry = (None, None)
    if choice is not None:
        from specdec_plugin.ops.registry import get_kernel

        provider, dtype = choice
        entry = (get_kernel("pack_linear_weight", (provider,))(weight, dtype),
                 get_kernel("linear", (provider,)))
    # A plain attribute, not a registered buffer: an opaque oneDNN tensor must stay out of
    # state_dict. A weight replaced after packing (tied late) is a new tensor without it.
    weight.__dict__[_ATTR] = entry
    if release and entry[0] is not None and isinstance(weight, torch.nn.Parameter):
        # The Parameter object stays (and with it the entry); only its storage goes. The packed
        # copy holds its own.
        weight.data = weight.data.new_empty((0, weight.shape[1]))
    return entry


def _wrap_class(cls, pack_at_load: bool) -> None:
    original_load: Callable = cls.process_weights_after_loading
    original_apply: Callable = cls.apply

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        original_load(self, layer)
        if pack_at_load:
            _pack(layer, release=True)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.is_cpu:
            entry = _pack(layer)
            if entry is not None and entry[0] is not None:
                return entry[1](x, entry[0], bias)
        return original_apply(self, layer, x, bias)

    process_weights_after_loading.__wrapped__ = original_load  # type: ignore[attr-defined]
    apply.__wrapped__ = original_apply  # type: ignore[attr-defined]
    cls.process_weights_after_loading = process_weights_after_loading
    cls.apply = apply


def apply(choose: Callable[[torch.Tensor], tuple[str, torch.dtype] | None]) -> None:
    """Install P11 for this process (idempotent). ``choose(weight)`` is the device layer's
    ``(provider, dtype)`` for packing that weight, or None to leave the layer to vLLM."""
    if _state:
        return
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    _state.update(choose=choose)
    _wrap_class(UnquantizedLinearMethod, pack_at_load=True)
    _wrap_class(UnquantizedEmbeddingMethod, pack_at_load=False)
