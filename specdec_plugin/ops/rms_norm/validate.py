"""The RMSNorm contract (package docstring) as one check every provider runs first."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import fail

_OP = "rms_norm"


def check_rms_norm(x: torch.Tensor, weight: torch.Tensor | None,
                   residual: torch.Tensor | None) -> None:
    if x.dim() == 0 or not x.is_floating_point():
        fail(_OP, f"x must be a floating [..., hidden] tensor, got {x.dtype} {tuple(x.shape)}")
    if weight is not None and (weight.dim() != 1 or weight.shape[0] != x.shape[-1]
                               or weight.device != x.device):
        fail(_OP, f"weight {tuple(weight.shape)} on {weight.device} must be "
                  f"({x.shape[-1]},) on {x.device}")
    if residual is not None and (residual.shape != x.shape or residual.device != x.device):
        fail(_OP, f"residual {tuple(residual.shape)} on {residual.device} must be "
                  f"{tuple(x.shape)} on {x.device}")
