"""Pure-torch linear with the package's contract: the product in the packed dtype's values with
float32 accumulation (for bfloat16 both operands are rounded to bfloat16 first, as the oneDNN
provider does), the result rounded to the packed dtype and returned in x's dtype."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_plugin.ops.linear import PackedLinear
from specdec_plugin.ops.linear.validate import check_linear, check_pack


def pack_linear_weight(weight: torch.Tensor, dtype: torch.dtype) -> PackedLinear:
    check_pack(weight, dtype)
    w = weight.detach().to(dtype).contiguous()
    return PackedLinear(w, dtype, w.shape[0], w.shape[1], "torch", weight)


def linear(x: torch.Tensor, packed: PackedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    check_linear(x, packed, bias, "torch")
    dt = packed.dtype
    xf = x.to(dt).float()
    b = None if bias is None else bias.to(dt).float()
    return F.linear(xf, packed.weight.float(), b).to(dt).to(x.dtype)
