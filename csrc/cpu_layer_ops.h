// The small per-layer ops of a decoder layer on the CPU (see cpu_layer_ops.cpp).
#pragma once

#include <ATen/ATen.h>

namespace specdec {

// ops/rms_norm/reference.py:rms_norm on rows: x [rows, hidden] (unit column stride), weight
// [hidden] or none, residual like x or none; writes out (and residual_out = x + residual).
void cpu_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& weight, double eps,
                  const c10::optional<at::Tensor>& residual, at::Tensor& out,
                  c10::optional<at::Tensor> residual_out);

// ops/rotary/reference.py:apply_rotary in place: query/key [tokens, heads * head_size],
// positions int64 [tokens], cos_sin_cache [max_position, rotary_dim] in query's dtype.
void cpu_rotary(const at::Tensor& positions, at::Tensor& query, c10::optional<at::Tensor> key,
                const at::Tensor& cos_sin_cache, int64_t head_size, int64_t rotary_dim,
                bool is_neox);

// ops/activation/reference.py:silu_and_mul on x [rows, 2 * d]: a new [rows, d].
at::Tensor cpu_silu_and_mul(const at::Tensor& x);

}  // namespace specdec
