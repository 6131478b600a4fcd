"""The skinny-GEMM contract (package docstring) as one check every provider runs first."""
from __future__ import annotations

import torch

from specdec_plugin.ops.contract import fail

_OP = "skinny_gemm"
# The kernel's two row tiles: up to 16 rows (decode and verification at batch 1-3), and up to
# 64 (verification at batch 16: 16 requests x 1+2 or 1+3 tokens).
NARROW_ROWS = 16
MAX_ROWS = 64
DTYPES = (torch.bfloat16, torch.float16)


def row_count(x: torch.Tensor) -> int:
    """The token rows of ``x`` ``[..., K]``: every dimension but the last."""
    return x.numel() // max(1, x.shape[-1])


def check_skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2 or weight.stride(-1) != 1:
        fail(_OP, f"weight must be [N, K] with unit stride along K, got {tuple(weight.shape)} "
                  f"strides {weight.stride()}")
    if weight.dtype not in DTYPES or x.dtype != weight.dtype:
        fail(_OP, f"x and weight must share one dtype of {DTYPES}, got {x.dtype} and "
                  f"{weight.dtype}")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        fail(_OP, f"x {tuple(x.shape)} must end in K={weight.shape[1]}")
    rows = row_count(x)
    if rows > MAX_ROWS:
        fail(_OP, f"x has {rows} rows, more than {MAX_ROWS}: use a general GEMM")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype):
        fail(_OP, f"bias {tuple(bias.shape)} {bias.dtype} must be ({weight.shape[0]},) "
                  f"{x.dtype}")
    if x.device != weight.device or (bias is not None and bias.device != x.device):
        fail(_OP, "x, weight and bias must be on one device")
