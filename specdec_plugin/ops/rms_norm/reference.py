"""Pure-torch RMSNorm: the reference for other providers and the CPU kernel (see package doc).

Same operations in the same order as vLLM's native op, so on the same device it is bit-equal.
"""
from __future__ import annotations

import torch

from specdec_plugin.ops.rms_norm.validate import check_rms_norm


def _normalise(x32: torch.Tensor, weight: torch.Tensor | None, eps: float,
               out_dtype: torch.dtype) -> torch.Tensor:
    variance = x32.pow(2).mean(dim=-1, keepdim=True)
    y = x32 * torch.rsqrt(variance + eps)
    if weight is not None:
        # Rounded to the weight's dtype before the multiply, as vLLM (and HF Llama) do.
        y = y.to(weight.dtype) * weight
    return y.to(out_dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    check_rms_norm(x, weight, residual)
    x32 = x.to(torch.float32)
    if residual is None:
        return _normalise(x32, weight, eps, x.dtype)
    x32 = x32 + residual.to(torch.float32)
    return _normalise(x32, weight, eps, x.dtype), x32.to(x.dtype)
