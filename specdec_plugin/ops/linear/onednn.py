"""Linear through oneDNN with the weight reordered once into oneDNN's blocked layout (torch's
``mkldnn._reorder_linear_weight`` / ``mkldnn._linear_pointwise``, the ops torch's own CPU
freezing pass uses).

Why not torch's ``F.linear``: at decode sizes the step is bound by reading the weights, and
torch's fp32 GEMM (MKL, unpacked) read SmolLM2's matrices at about half the rate the packed
oneDNN kernels do; for bfloat16 weights ``F.linear`` was 2.6-8x slower than fp32 on this torch
while oneDNN runs native avx512_bf16 code (benchmarks/bench_cpu_linear.py, BENCHMARKS.md).
"""
from __future__ import annotations

import functools

import torch

from specdec_plugin.ops.linear import PackedLinear
from specdec_plugin.ops.linear.validate import check_linear, check_pack


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                            "_linear_pointwise")


@functools.cache
def supports(dtype: torch.dtype) -> bool:
    """Whether this CPU can pack ``dtype`` weights here. float32: wherever oneDNN is there.
    bfloat16: torch's oneDNN reorder refuses it on CPUs without avx512bw/vl/dq or
    avx_ne_convert (an AVX2-only AMD EPYC, 2026-11-28), so torch is asked once, on a small
    weight, rather than the CPU's flags read against a list that torch may change."""
    if not available():
        return False
    if dtype == torch.float32:
        return True
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.ones(16, 16, dtype=dtype))
    except RuntimeError:
        return False
    return True


def pack_linear_weight(weight: torch.Tensor, dtype: torch.dtype) -> PackedLinear:
    check_pack(weight, dtype)
    if not weight.is_cpu:
        raise ValueError("pack_linear_weight: the onednn provider packs host (CPU) weights only")
    if not supports(dtype):
        raise RuntimeError(
            f"pack_linear_weight: oneDNN on this CPU cannot pack {dtype} weights (its bfloat16 "
            "path needs avx512bw/vl/dq or avx_ne_convert): pack float32, or use the cpp provider")
    w = weight.detach().to(dtype).contiguous()
    # No batch-size hint: measured no faster at the sizes it was given for, and one layout
    # serves decode (1-8 rows) and prefill alike.
    packed = torch.ops.mkldnn._reorder_linear_weight(w)
    return PackedLinear(packed, dtype, w.shape[0], w.shape[1], "onednn", weight)


def linear(x: torch.Tensor, packed: PackedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    check_linear(x, packed, bias, "onednn")
    dt = packed.dtype
    if bias is not None and bias.dtype != dt:
        bias = bias.to(dt)
    # The common case (a 2-D float32 activation, contiguous) goes straight to oneDNN: each
    # no-op reshape / cast costs microseconds, and a step makes 121 of these calls.
    if x.dim() == 2 and x.dtype == dt and x.is_contiguous() and x.shape[0]:
        return torch.ops.mkldnn._linear_pointwise(x, packed.weight, bias, "none", [], "")
    x2 = x.reshape(-1, packed.in_features).to(dt).contiguous()
    if x2.shape[0] == 0:
        y = x2.new_empty(0, packed.out_features)
    else:
        y = torch.ops.mkldnn._linear_pointwise(x2, packed.weight, bias, "none", [], "")
    return y.to(x.dtype).reshape(*x.shape[:-1], packed.out_features)
