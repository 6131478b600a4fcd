"""Pure-torch skinny GEMM with the package's contract: float32 products and accumulation,
the bias added in float32, one rounding to x's dtype."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_plugin.ops.skinny_gemm.validate import check_skinny_gemm


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    check_skinny_gemm(x, weight, bias)
    b = None if bias is None else bias.float()
    return F.linear(x.float(), weight.float(), b).to(x.dtype)
