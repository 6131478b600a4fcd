"""The SiLU-and-mul contract (package docstring) as one check every provider runs first."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import fail

_OP = "silu_and_mul"


def check_silu_and_mul(x: torch.Tensor) -> None:
    if x.dim() == 0 or x.shape[-1] % 2 or not x.is_floating_point():
        fail(_OP, f"x must be a floating [..., 2 * d] tensor, got {x.dtype} {tuple(x.shape)}")
