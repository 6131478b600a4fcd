"""SiLU-and-mul on the CPU in C++ (csrc/cpu_layer_ops.cpp): one call instead of the reference's
slice, silu and mul. Same contract as ``reference.silu_and_mul`` (tests/ops/test_activation.py);
other dtypes and devices go to the reference."""
from __future__ import annotations

import torch

from specdec_plugin.ops.activation import reference
from specdec_plugin.ops.activation.validate import check_silu_and_mul
from specdec_plugin.spec_decode._native import load_extension

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    check_silu_and_mul(x)
    if not x.is_cpu or x.dtype not in _DTYPES:
        return reference.silu_and_mul(x)
    width = x.shape[-1]
    rows = x.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return load_extension().cpu_silu_and_mul(rows).view(*x.shape[:-1], width // 2)
