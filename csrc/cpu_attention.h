// CPU kernels for the attention layer over the paged KV cache (see cpu_attention.cpp).
#pragma once

#include <ATen/ATen.h>

namespace specdec {

// Pointers and strides of one paged-attention call, for the AVX-512 row kernel.
constexpr int kMaxChunks = 32;  // 16-lane chunks per head: head sizes up to 512
template <typename T>
struct AttnView {
  const T *q, *k, *v;
  T* o;
  const int32_t *qsl, *lens, *table;
  int64_t table_stride, num_q_heads, group, head_size, block_size;
  int64_t q_tok_stride, q_head_stride, o_tok_stride, o_head_stride;
  int64_t block_stride, tok_stride, head_stride;
  float scale;
};

// Work items [begin, end) of (request, query head), every query row of each; scores holds
// max_seq_len + 16 floats (cpu_attention_avx512.cpp; float, bfloat16, half). AVX-512 only.
template <typename T>
void paged_attention_avx512(const AttnView<T>& a, int64_t begin, int64_t end, float* scores);

// Same contract as specdec_plugin/ops/paged_attention/reference.py:paged_attention. The AVX-512
// kernel where the CPU has it (float/bfloat16/half), else the scalar one (vectorized=false
// forces it; tests run both).
void cpu_paged_attention(const at::Tensor& query, const at::Tensor& key_cache,
                         const at::Tensor& value_cache, const at::Tensor& block_table,
                         const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                         double scale, at::Tensor& out, bool vectorized = true);

// Same contract as specdec_plugin/ops/reshape_and_cache/reference.py:reshape_and_cache.
void cpu_reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                           at::Tensor& value_cache, const at::Tensor& slot_mapping);

}  // namespace specdec
