// CPU linear layers for one-token decode steps (see cpu_linear.cpp).
#pragma once

#include <ATen/ATen.h>

namespace specdec {

// out [M, N] (contiguous rows) = x [M, K] @ weight [N, K]^T + bias [N]; all fp32, x with a unit
// column stride, weight and bias contiguous (checked by ops/linear/cpp.py before the call).
void cpu_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                at::Tensor& out);

// True when the AVX-512 path runs (else the portable loop).
bool cpu_linear_vectorized();

}  // namespace specdec
