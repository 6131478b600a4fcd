"""Linear on the CPU in C++ (csrc/cpu_linear_packed.cpp) on a weight packed once into panels of
32 output columns, stored as bfloat16 (or float32) and widened to float32 in registers:
float32 activations, float32 accumulation, float32 result. Contract: ``widened_reference.py``.

Why: at batch 1 a CPU decode step is bound by reading the weights; a bfloat16 checkpoint's
weights are exact in bfloat16, so this computes the float32 model's products from half the
bytes. Every output element is one fixed chain of fused multiply-adds over k whatever the number
of rows, so a token's logits are bit-identical in a 1-row decode and a (1+K)-row verification
(oneDNN's bf16 path rounds x and y to bfloat16 and sums in a row-count-dependent order).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_plugin.ops.linear import PackedLinear
from specdec_plugin.ops.linear.validate import check_linear, check_pack

PROVIDER = "cpp"
PANEL = 32  # output columns per panel; the kernel's kPanel


def _ext():
    from specdec_plugin.spec_decode._native import load_extension

    return load_extension()


def available() -> bool:
    """Whether the built extension has this kernel (an extension built before it lacks it)."""
    try:
        return hasattr(_ext(), "cpu_linear_packed")
    except ImportError:
        return False


def pack_linear_weight(weight: torch.Tensor, dtype: torch.dtype) -> PackedLinear:
    check_pack(weight, dtype)
    if not weight.is_cpu:
        raise ValueError("pack_linear_weight: the cpp provider packs host (CPU) weights only")
    w = weight.detach().to(dtype)
    n, k = w.shape
    panels = -(-n // PANEL)
    if panels * PANEL != n:
        w = F.pad(w, (0, 0, 0, panels * PANEL - n))  # zero columns, never stored in y
    if dtype == torch.bfloat16:
        # Element 2j of a k-row = column j, element 2j+1 = column 16+j: one 64-byte load
        # then gives columns 0-15 (shift) and 16-31 (mask) as float32.
        packed = w.reshape(panels, 2, 16, k).permute(0, 3, 2, 1).reshape(panels, k, PANEL)
    else:
        packed = w.reshape(panels, PANEL, k).permute(0, 2, 1)
    return PackedLinear(packed.contiguous(), dtype, n, k, PROVIDER, weight)


def linear(x: torch.Tensor, packed: PackedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    check_linear(x, packed, bias, PROVIDER)
    x2 = x if x.dim() == 2 else x.reshape(-1, packed.in_features)
    if x2.dtype != torch.float32:
        x2 = x2.float()  # widened, never rounded: a bfloat16 model's activations are exact
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.float().contiguous()
    y = _ext().cpu_linear_packed(x2, packed.weight, packed.out_features, bias)
    if x.dtype != torch.float32:
        y = y.to(x.dtype)
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], packed.out_features)
