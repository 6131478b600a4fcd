"""Triton RMSNorm: same contract as ``reference.rms_norm`` (see the package doc).

One program per row. Rows up to ``_MAX_SINGLE_PASS`` wide are read once and kept in registers;
wider rows take two passes (sum of squares, then normalise), re-reading the inputs, which are
never overwritten, so the second pass recomputes the same fp32 sum the first one saw. Nothing
here reads device values on the host, so it can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.rms_norm.validate import check_rms_norm

_MAX_SINGLE_PASS = 8192


@triton.jit
def _load_row_sum(x_row, res_row, cols, mask, HAS_RESIDUAL: tl.constexpr):
    """x (+ residual) of one chunk of a row, in fp32."""
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(res_row + cols, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def _store_normalised(out_row, w_ptr, cols, mask, x, rstd, HAS_WEIGHT: tl.constexpr):
    y = x * rstd
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        # Round to the weight's dtype, multiply, round again: vLLM's native order.
        y = (y.to(w.dtype).to(tl.float32) * w.to(tl.float32)).to(w.dtype)
    tl.store(out_row + cols, y.to(out_row.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_res, stride_out, stride_res_out,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr, SINGLE_PASS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    res_row = res_ptr + row * stride_res
    out_row = out_ptr + row * stride_out
    res_out_row = res_out_ptr + row * stride_res_out

    if SINGLE_PASS:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = _load_row_sum(x_row, res_row, cols, mask, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(res_out_row + cols, x.to(res_out_row.dtype.element_ty), mask=mask)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        _store_normalised(out_row, w_ptr, cols, mask, x, rstd, HAS_WEIGHT)
    else:
        sum_sq = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = _load_row_sum(x_row, res_row, cols, mask, HAS_RESIDUAL)
            if HAS_RESIDUAL:
                tl.store(res_out_row + cols, x.to(res_out_row.dtype.element_ty), mask=mask)
            sum_sq += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = _load_row_sum(x_row, res_row, cols, mask, HAS_RESIDUAL)
            _store_normalised(out_row, w_ptr, cols, mask, x, rstd, HAS_WEIGHT)


def _as_rows(t: torch.Tensor, hidden: int) -> torch.Tensor:
    """``t`` as ``[rows, hidden]`` with unit column stride (a view when the layout allows)."""
    rows = t.reshape(-1, hidden)
    return rows if rows.stride(1) == 1 else rows.contiguous()


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    check_rms_norm(x, weight, residual)
    hidden = x.shape[-1]
    if weight is not None and weight.stride(0) != 1:
        weight = weight.contiguous()
    x_rows = _as_rows(x, hidden)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out_rows = out.view(-1, hidden)
    if residual is not None:
        res_rows = _as_rows(residual, hidden)
        res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        res_out_rows = res_out.view(-1, hidden)
    else:
        # Never dereferenced (HAS_RESIDUAL is off); any valid pointer will do.
        res_rows = res_out_rows = x_rows
    num_rows = x_rows.shape[0]
    if num_rows > 0:
        block = min(triton.next_power_of_2(hidden), _MAX_SINGLE_PASS)
        _rms_norm_kernel[(num_rows,)](
            x_rows, res_rows, weight if weight is not None else x_rows, out_rows, res_out_rows,
            x_rows.stride(0), res_rows.stride(0), out_rows.stride(0), res_out_rows.stride(0),
            hidden, eps,
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
            BLOCK=block, SINGLE_PASS=block >= hidden,
            num_warps=max(1, min(16, block // 512)),
        )
    return out if residual is None else (out, res_out)
