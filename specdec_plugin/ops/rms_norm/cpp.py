"""RMSNorm on the CPU in C++ (csrc/cpu_layer_ops.cpp): one call per norm instead of the
reference's eight torch ops. Same contract as ``reference.rms_norm`` (tests/ops/test_rms_norm.py
compares them); inputs the kernel does not take (mixed dtypes, other devices) go to the
reference."""
from __future__ import annotations

import torch

from specdec_plugin.ops.rms_norm import reference
from specdec_plugin.ops.rms_norm.validate import check_rms_norm
from specdec_plugin.spec_decode._native import load_extension

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _rows(t: torch.Tensor, hidden: int) -> torch.Tensor:
    rows = t.reshape(-1, hidden)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    check_rms_norm(x, weight, residual)
    if (not x.is_cpu or x.dtype not in _DTYPES
            or (weight is not None and weight.dtype != x.dtype)
            or (residual is not None and residual.dtype != x.dtype)):
        return reference.rms_norm(x, weight, eps, residual)
    hidden = x.shape[-1]
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype)
    res_out = None if residual is None else torch.empty(x.shape, dtype=x.dtype)
    load_extension().cpu_rms_norm(
        _rows(x, hidden), weight, float(eps),
        None if residual is None else _rows(residual, hidden), out.view(-1, hidden),
        None if res_out is None else res_out.view(-1, hidden))
    return out if residual is None else (out, res_out)
