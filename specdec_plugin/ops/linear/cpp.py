"""Linear on the CPU: our one-token GEMV (csrc/cpu_linear.cpp) where it measured fastest, the
oneDNN provider everywhere else.

Which runs where, from benchmarks/bench_cpu_linear.py on a 2-core Zen 4 (BENCHMARKS.md): at one
token row the C++ loop beat oneDNN on SmolLM2's layer matrices (576-3072 rows: oneDNN's fixed
per-call cost dominates there), oneDNN won on the 49152-row LM head and at 4+ rows. bfloat16
packing always goes to oneDNN, so the rounding of activations to bfloat16 is the same at every
row count (a decode step and a 1+K verification step see the same numerics).

The float32 GEMV reads the layer's own weight tensor: packing adds only oneDNN's copy.
"""
from __future__ import annotations

import torch

from specdec_plugin import _C
from specdec_plugin.ops.linear import PackedLinear, onednn
from specdec_plugin.ops.linear.validate import check_linear, check_pack

# Up to this many output rows the GEMV runs at one token (LM heads are larger).
GEMV_MAX_OUT_FEATURES = 8192


def pack_linear_weight(weight: torch.Tensor, dtype: torch.dtype) -> PackedLinear:
    check_pack(weight, dtype)
    dnn = onednn.pack_linear_weight(weight, dtype)
    plain = None
    if dtype == torch.float32 and weight.shape[0] <= GEMV_MAX_OUT_FEATURES:
        plain = weight.detach().to(torch.float32).contiguous()  # no copy for an fp32 layer
    return PackedLinear((plain, dnn), dtype, dnn.out_features, dnn.in_features, "cpp", weight)


def linear(x: torch.Tensor, packed: PackedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    check_linear(x, packed, bias, "cpp")
    plain, dnn = packed.weight
    if plain is None or x.dtype != torch.float32 or x.numel() != packed.in_features:
        return onednn.run(x, dnn, bias)
    x2 = x.reshape(1, packed.in_features)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    b = None if bias is None else bias.to(torch.float32).contiguous()
    out = torch.empty(1, packed.out_features, dtype=torch.float32)
    _C.cpu_linear(x2, plain, b, out)
    return out.reshape(*x.shape[:-1], packed.out_features)
