"""Pure-torch reference of the ``cpp`` provider's contract (csrc/cpu_linear_packed.cpp): the
weight stored in the packed dtype (bfloat16 halves the bytes; exact for a bfloat16 checkpoint),
the activations widened to float32, never rounded, float32 accumulation and a float32 result,
returned in x's dtype. For a weight whose values are bfloat16 already this is the float32
model's product, which is why the CPU device layer makes it the default for such weights.

It differs from ``reference.py`` (oneDNN's contract: bfloat16 packing rounds x and the result to
bfloat16 too) only in those roundings. The kernel's fixed per-element summation order is not
reproduced here (torch's GEMM picks its own): providers agree with this to float32 rounding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_plugin.ops.linear import PackedLinear
from specdec_plugin.ops.linear.validate import check_linear, check_pack

PROVIDER = "torch_widened"


def pack_linear_weight(weight: torch.Tensor, dtype: torch.dtype) -> PackedLinear:
    check_pack(weight, dtype)
    w = weight.detach().to(dtype).contiguous()
    return PackedLinear(w, dtype, w.shape[0], w.shape[1], PROVIDER, weight)


def linear(x: torch.Tensor, packed: PackedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    check_linear(x, packed, bias, PROVIDER)
    b = None if bias is None else bias.float()
    return F.linear(x.float(), packed.weight.float(), b).to(x.dtype)
