"""Pure-torch SiLU-and-mul: the reference for other providers and the CPU kernel."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_plugin.ops.activation.validate import check_silu_and_mul


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    check_silu_and_mul(x)
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
