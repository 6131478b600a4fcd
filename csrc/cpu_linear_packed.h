// Linear on the CPU with a packed bfloat16 (or float32) weight (see cpu_linear_packed.cpp).
#pragma once

#include <ATen/ATen.h>

namespace specdec {

// y = x @ W^T (+ bias) in float32, W packed by specdec_plugin/ops/linear/cpp.py
// ([ceil(N / 32), K, 32]). Same contract as specdec_plugin/ops/linear/widened_reference.py;
// every output element is one fixed chain of fused multiply-adds over k (row invariant).
// portable=true runs the portable path even where AVX-512 is available (tests: bit-identical).
at::Tensor cpu_linear_packed(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                             const c10::optional<at::Tensor>& bias, bool portable);

// Whether this CPU runs the AVX-512 path (else the portable one).
bool cpu_linear_packed_vectorized();

}  // namespace specdec
