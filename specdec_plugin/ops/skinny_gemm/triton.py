"""Triton skinny GEMM: ``y = x @ weight.T + bias`` for a few rows of ``x`` (see the package doc).

Why a kernel of our own: at batch 1 a speculative step multiplies 1-5 token rows by every weight
of the model, so each product only streams its weight once from device memory. cuBLAS reads the
attention projections (qkv, o) of a 7B model at about 3.2 TB/s on the H200 (session 61's
device profile), two thirds of the memory's rate; they are small matrices (34-50 MB) that its
tiles spread over too few programs.

One program owns ``BLOCK_N`` output columns for all (at most ``BLOCK_M``) rows and walks the
whole of K in order, so there is no split-K reduction and no second launch. (A config may
split K into ``SPLIT_K`` ranges whose float32 partial sums a second kernel adds in a fixed
order; the benchmark sweeps it, the default config does not use it.) The tile is a
``tl.dot`` of the padded rows ``[BLOCK_M, BLOCK_K]`` with ``[BLOCK_K, BLOCK_N]`` of the weight
(read along K, its contiguous dimension, in 16-byte loads), accumulated in float32. The order
of the accumulation depends only on K and the block sizes, never on the number of rows, and
the block sizes depend only on the weight's shape and the row tile: a row's result is the same
whether it is multiplied alone (a plain decode step) or with others (a verification step) of
the same tile.

Two row tiles, each one compiled variant per weight: ``BLOCK_M`` 16 for 1-16 rows, and 64 for
17-64 rows (a batch-16 verification of 2 or 3 drafts multiplies 48 or 64). A row's bits may
differ between the tiles (their tensor-core instructions differ), as cuBLAS's do between the
kernels it picks by row count.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_plugin.ops.gpu_props import cuda_index, sm_count
from specdec_plugin.ops.skinny_gemm.validate import (MAX_ROWS, NARROW_ROWS, check_skinny_gemm,
                                                     row_count)


# M (the row count) is not specialised on: one compiled kernel per weight shape and row tile
# serves all its row counts, so a batch size first seen after start-up compiles nothing.
@triton.jit(do_not_specialize=["M"])
def _skinny_gemm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, part_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, SPLIT_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    k_start = tl.program_id(1) * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_start + offs_k)[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + (k_start + offs_k)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            k_mask = (k + offs_k) < k_end
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:  # this split's float32 partial sums, [SPLIT_K, M, N], summed by _sum_splits_kernel
        part = part_ptr + (tl.program_id(1) * M + offs_m[:, None]) * N + offs_n[None, :]
        tl.store(part, acc, mask=out_mask)


@triton.jit(do_not_specialize=["M"])
def _sum_splits_kernel(part_ptr, b_ptr, y_ptr, M, N, stride_ym,
                       HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """The split-K partial sums of one row, added in split order (deterministic), + bias."""
    row = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + (split * M + row) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def tile_rows(rows: int) -> int:
    """The row tile (``BLOCK_M``) that serves ``rows`` rows."""
    return NARROW_ROWS if rows <= NARROW_ROWS else MAX_ROWS


def block_config(out_features: int, in_features: int, num_sms: int,
                 block_m: int = NARROW_ROWS) -> tuple[int, int, int, int, int]:
    """``(BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_K)`` for a weight's shape and row
    tile only (see the doc). The 16-row tile's come from the H100 sweep of session 65
    (benchmarks/bench_skinny_gemm.py --sweep: 42 configs on the six 7B shapes, 3 rows). 32
    columns and 128-wide K tiles per program won or came within 2.2% of the winner on every
    shape. The pipeline depth is what depends on the shape: 6 stages where the grid is about
    one wave (4,096-6,144 columns: qkv, o, down, EAGLE-3's fc), 3 where it is several
    (gate_up, the LM head). K was never worth splitting. Narrower blocks for small layers keep
    at least half the multiprocessors busy (not timed: such products are short whatever their
    config). The 64-row tile's: ``wide_block_config``."""
    if block_m > NARROW_ROWS:
        return wide_block_config(out_features, in_features, num_sms)
    block_n = 32 if triton.cdiv(out_features, 32) >= num_sms // 2 else 16
    block_k = 128 if in_features >= 128 else max(16, triton.next_power_of_2(in_features))
    many_waves = triton.cdiv(out_features, block_n) >= 4 * num_sms
    return block_n, block_k, 4, 3 if many_waves else 6, 1


def wide_block_config(out_features: int, in_features: int,
                      num_sms: int) -> tuple[int, int, int, int, int]:
    """The 64-row tile's config, from session 65's H100 probe at 40 rows (``--wide``: 18
    configs a shape). Where the columns fill a wave of 128-column programs (gate_up, the LM
    head) those won, with 3 stages; where they fill half a wave of 64-column ones (qkv), those
    with 4; otherwise (o, down, EAGLE-3's fc: 4,096 columns) 32 columns with 4 stages, the best
    of the probe there, though slower than cuBLAS (``wide_tile_pays``)."""
    block_k = 128 if in_features >= 128 else max(16, triton.next_power_of_2(in_features))
    if triton.cdiv(out_features, 128) >= num_sms:
        return 128, block_k, 4, 3, 1
    block_n = 64 if triton.cdiv(out_features, 64) >= num_sms // 2 else 32
    return block_n, block_k, 4, 4, 1


def wide_tile_pays(out_features: int, num_sms: int) -> bool:
    """Whether the 64-row tile beat cuBLAS for such a weight in session 65's H100 probe (40
    rows, best config / cuBLAS): yes where a 32-column grid is more than one wave (qkv 0.955,
    gate_up 0.947, the LM head 0.912), no where it is one wave or less (o 1.079, down 1.039,
    EAGLE-3's fc 1.018)."""
    return triton.cdiv(out_features, 32) > num_sms


def max_rows_worth_it(weight: torch.Tensor) -> int:
    """The most rows for which this kernel is expected to beat cuBLAS on ``weight`` (what P16
    sends it, through the device layer): ``MAX_ROWS`` where the wide tile pays, else
    ``NARROW_ROWS``."""
    return MAX_ROWS if wide_tile_pays(weight.shape[0], _num_sms(weight.device)) else NARROW_ROWS


def _num_sms(device: torch.device) -> int:
    index = cuda_index(device)
    # Triton's interpreter (CPU tests): any count gives valid blocks.
    return 4 if index is None else sm_count(index)


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    check_skinny_gemm(x, weight, bias)
    block_m = tile_rows(row_count(x))
    return launch(x, weight, bias, block_config(*weight.shape, _num_sms(x.device), block_m),
                  block_m)


def canonical_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` as ``[M, K]`` rows laid out as a fresh contiguous tensor is (16-byte aligned,
    row stride K): the kernel is passed K as the row stride.

    Why: one compiled variant per weight, whatever the input's layout. Triton specialises
    integer arguments on equalling 1 or being multiples of 16, and pointers on 16-byte
    alignment, so a row stride or an offset seen only while serving would compile a new
    variant mid-request (a late compile was seen on the H100, 2026-12-07). Other layouts are
    copied; a single row's stride is never read, so it is passed as K."""
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    if rows.stride(-1) != 1 or rows.data_ptr() % 16 or (m > 1 and rows.stride(0) != k):
        rows = rows.clone(memory_format=torch.contiguous_format)
    return rows


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           config: tuple[int, int, int, int, int],
           block_m: int = NARROW_ROWS) -> torch.Tensor:
    """The kernel with a given block config and row tile, on validated inputs (the benchmark
    sweeps both). ``block_m`` (a power of two, at least the row count) may exceed the op's
    tiles, so that the benchmark can probe more rows than the op accepts (a batch-16
    verification of 4 drafts has 80)."""
    n, k = weight.shape
    rows = canonical_rows(x, k)
    m = rows.shape[0]
    assert m <= block_m, f"{m} rows need block_m >= {m}"
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*x.shape[:-1], n)
    block_n, block_k, warps, stages, split_k = config
    # Each split a whole number of K tiles, so only the last one can be ragged.
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    split_k = triton.cdiv(k, k_per_split)
    part = (torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
            if split_k > 1 else y)
    bias_arg = bias if bias is not None else weight
    _skinny_gemm_kernel[(triton.cdiv(n, block_n), split_k)](
        rows, weight, bias_arg, y, part,
        m, n, k, k_per_split, k, weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=k % block_k == 0, SPLIT_K=split_k, num_warps=warps, num_stages=stages)
    if split_k > 1:
        _sum_splits_kernel[(triton.cdiv(n, 1024), m)](
            part, bias_arg, y, m, n, y.stride(0), HAS_BIAS=bias is not None,
            SPLIT_K=split_k, BLOCK=1024, num_warps=4)
    return y.reshape(*x.shape[:-1], n)
