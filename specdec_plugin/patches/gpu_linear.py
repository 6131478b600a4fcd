"""P16: linear layers and the LM head of a few token rows through our skinny GEMM on the GPU.

vLLM 0.26 sends every unquantized linear layer and the LM head through
``dispatch_unquantized_gemm()``, which gives a platform other than ROCm and its own CPU
``F.linear`` (cuBLAS): no hook lets a platform choose the GEMM. At batch 1 a speculative step
multiplies 1-5 rows by each weight, and cuBLAS reads the small ones (a 7B model's qkv and o
projections) well under the memory's rate (``ops/skinny_gemm/triton.py``). This wraps the two
quant methods' ``apply``: a GPU input in bfloat16 or float16 whose weight the device layer
accepts goes to the custom op ``torch.ops.specdec.skinny_linear``, which runs our kernel for
as many rows as the device layer says it beats cuBLAS at on that weight (16, or 64 where the
kernel's wide tile pays: a batch-16 verification) and ``F.linear`` for more. Anything else
calls vLLM's own ``apply``.

Why a custom op: vLLM compiles the model with Dynamo, whose graph has a symbolic number of
tokens. Choosing between the two GEMMs on that number in traced code would guard on it (a
recompile per side of the threshold); inside an opaque op it is a plain integer at run time, and
each CUDA graph captures the choice for its own size.

``compile_variants`` launches the kernel once per weight shape and row tile of the loaded
models at engine start (worker/kernel_warmup.py): a product that start-up never ran (seen on
the H100, 2026-12-07: a SmolLM2 EAGLE-3 engine compiled ``_skinny_gemm_kernel`` while
serving) would otherwise compile in the middle of a request.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from specdec_plugin.ops.skinny_gemm.validate import NARROW_ROWS, row_count

_state: dict = {}
_LIB_NAME = "specdec"


def skinny_linear(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    if row_count(x) <= _state["max_rows"](weight):
        return _state["kernel"](x, weight, bias)
    return F.linear(x, weight, bias)


def _skinny_linear_fake(x: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _register_op(dispatch_key: str) -> None:
    from torch.library import Library
    from vllm.utils.torch_utils import direct_register_custom_op

    # Kept in _state: the op lives as long as its library object.
    _state["lib"] = Library(_LIB_NAME, "FRAGMENT")
    direct_register_custom_op("skinny_linear", skinny_linear, fake_impl=_skinny_linear_fake,
                              target_lib=_state["lib"], dispatch_key=dispatch_key)


def _wrap_apply(cls) -> None:
    original: Callable = cls.apply
    accepts = _state["accepts"]

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        weight = getattr(layer, "weight", None)
        if isinstance(weight, torch.Tensor) and not x.is_cpu and accepts(x, weight, bias):
            return torch.ops.specdec.skinny_linear(x, weight, bias)
        return original(self, layer, x, bias)

    apply.__wrapped__ = original  # type: ignore[attr-defined]
    cls.apply = apply


def compile_variants(models: list[torch.nn.Module]) -> int:
    """Run the kernel once per row tile P16 uses (one random row, and ``NARROW_ROWS`` + 1
    where the weight's ``max_rows`` reaches the wide tile) for each distinct (weight shape,
    dtype, bias) among the modules of ``models`` whose product P16 sends to it; returns how
    many such weights. Nothing (not even a walk of the modules) when P16 is not installed. One
    row count per tile is enough: the kernel does not specialise on the row count, and
    ``ops/skinny_gemm/triton.py`` gives every input layout the same compiled variant."""
    if not _state:
        return 0
    wrapped = _wrapped_classes()
    seen = set()
    for module in (module for model in models for module in model.modules()):
        weight = getattr(module, "weight", None)
        if not isinstance(getattr(module, "quant_method", None), wrapped) \
                or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        bias = getattr(module, "bias", None)
        if not isinstance(bias, torch.Tensor) or getattr(module, "skip_bias_add", False):
            bias = None
        key = (tuple(weight.shape), weight.stride(0), weight.data_ptr() % 16, weight.dtype,
               weight.device, bias is not None)
        if key in seen or weight.is_cpu:
            continue
        x = torch.randn(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
        if not _state["accepts"](x, weight, bias):
            continue
        seen.add(key)
        _state["kernel"](x, weight, bias)
        if _state["max_rows"](weight) > NARROW_ROWS:
            _state["kernel"](x.expand(NARROW_ROWS + 1, -1).contiguous(), weight, bias)
    return len(seen)


def _wrapped_classes() -> tuple[type, ...]:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    return UnquantizedLinearMethod, UnquantizedEmbeddingMethod


def apply(kernel: Callable, accepts: Callable[..., bool], max_rows: Callable[..., int],
          dispatch_key: str) -> None:
    """Install P16 for this process (idempotent). ``kernel(x, weight, bias)`` is the skinny
    GEMM provider; ``accepts(x, weight, bias)`` says which products go to the op (static facts
    only, dtype and layout: it runs in traced code); ``max_rows(weight)`` the most rows the
    op gives the kernel (it runs inside the op, on the actual row count)."""
    if _state:
        return
    _state.update(kernel=kernel, accepts=accepts, max_rows=max_rows)
    _register_op(dispatch_key)
    for cls in _wrapped_classes():
        _wrap_apply(cls)
