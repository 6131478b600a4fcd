// CPU kernels for the attention layer over the paged KV cache (see cpu_attention.cpp).
#pragma once

#include <ATen/ATen.h>

namespace specdec {

// Same contract as specdec_plugin/ops/paged_attention/reference.py:paged_attention.
void cpu_paged_attention(const at::Tensor& query, const at::Tensor& key_cache,
                         const at::Tensor& value_cache, const at::Tensor& block_table,
                         const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                         double scale, at::Tensor& out);

// Same contract as specdec_plugin/ops/reshape_and_cache/reference.py:reshape_and_cache.
void cpu_reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                           at::Tensor& value_cache, const at::Tensor& slot_mapping);

}  // namespace specdec
