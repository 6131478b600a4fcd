"""Triton SiLU-and-mul: same contract as ``reference.silu_and_mul`` (see the package doc).

Grid (row, column block): a decode step has few rows, so the columns are split too to put
more than a handful of programs on the GPU. Graph-safe (no host reads of device values).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.activation.validate import check_silu_and_mul

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_out, d,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    x_row = x_ptr + row * stride_x
    gate = tl.load(x_row + cols, mask=mask, other=0.0)
    up = tl.load(x_row + d + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    # silu rounded to the input dtype before the multiply, as eager PyTorch does.
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = silu.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    check_silu_and_mul(x)
    width = x.shape[-1]
    d = width // 2
    x_rows = x.reshape(-1, width)
    if x_rows.stride(1) != 1:
        x_rows = x_rows.contiguous()
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    out_rows = out.view(-1, d)
    num_rows = x_rows.shape[0]
    if num_rows > 0 and d > 0:
        block = min(_BLOCK, triton.next_power_of_2(d))
        grid = (num_rows, triton.cdiv(d, block))
        _silu_and_mul_kernel[grid](
            x_rows, out_rows, x_rows.stride(0), out_rows.stride(0), d,
            BLOCK=block, num_warps=4 if block >= 512 else 1,
        )
    return out
