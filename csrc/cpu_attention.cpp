// Paged attention and the KV-cache write on the CPU, one call per layer.
//
// Why C++: the pure-torch reference gathers the blocks, builds the query index and the causal
// mask with a dozen small torch ops per layer; on a 2-core machine that Python and dispatch
// work cost more than the arithmetic (decode of a 135M model reads ~100 keys per head).
// Here a step is one pass over each request's blocks, read in place from the cache.
//
// Layouts (shared with every provider, see ops/paged_attention/__init__.py):
//   query/out [num_tokens, num_q_heads, head_size]; key/value cache
//   [num_blocks, block_size, num_kv_heads, head_size]; block_table [num_seqs, max_blocks] int32;
//   query_start_loc [num_seqs + 1] int32; seq_lens [num_seqs] int32 (queries included).
#include "cpu_attention.h"
#include "vec16.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace specdec {
namespace {

template <typename T>
inline float to_f(T x) { return static_cast<float>(x); }

// Eight independent partial sums so the compiler vectorises the loop without -ffast-math.
template <typename T>
inline float dot(const float* q, const T* k, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += q[i + j] * to_f(k[i + j]);
  float s = 0;
  for (; i < n; ++i) s += q[i] * to_f(k[i]);
  for (int j = 0; j < 8; ++j) s += acc[j];
  return s;
}

template <typename T>
void attention_impl(const at::Tensor& query, const at::Tensor& key_cache,
                    const at::Tensor& value_cache, const at::Tensor& block_table,
                    const at::Tensor& query_start_loc, const at::Tensor& seq_lens, float scale,
                    at::Tensor& out, bool vectorized) {
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t num_q_heads = query.size(1), head_size = query.size(2);
  const int64_t block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
  const int64_t group = num_q_heads / num_kv_heads;
  const int32_t* qsl = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int64_t table_stride = block_table.stride(0);
  const T* q_base = query.data_ptr<T>();
  const T* k_base = key_cache.data_ptr<T>();
  const T* v_base = value_cache.data_ptr<T>();
  T* o_base = out.data_ptr<T>();
  const int64_t q_tok_stride = query.stride(0), q_head_stride = query.stride(1);
  const int64_t o_tok_stride = out.stride(0), o_head_stride = out.stride(1);
  const int64_t kv_block_stride = key_cache.stride(0), kv_tok_stride = key_cache.stride(1),
                kv_head_stride = key_cache.stride(2);

  // Work item: (request, query head). Grain keeps tiny steps on one thread: waking the
  // OpenMP pool costs more than a decode head's ~100 keys.
  int64_t max_len = 1, max_q = 1;
  for (int64_t s = 0; s < num_seqs; ++s) {
    max_len = std::max<int64_t>(max_len, lens[s]);
    max_q = std::max<int64_t>(max_q, qsl[s + 1] - qsl[s]);
  }
  const int64_t cost = max_len * max_q * head_size;
  const int64_t grain = std::max<int64_t>(1, 262144 / std::max<int64_t>(cost, 1));

  if constexpr (!std::is_same_v<T, double>) {
    if (vectorized && cpu_has_avx512f()) {
      // About 4x the scalar kernel's speed per item, so 4x its grain: one request's 1+K rows
      // over a few hundred keys (~60 us) stay on this thread. On 2 cores with another process
      // running, waking the passive pool made them slower (75 vs 58 us, 4 rows x 300 keys).
      const int64_t vec_grain = std::max<int64_t>(1, 4 * 262144 / std::max<int64_t>(cost, 1));
      const AttnView<T> a{q_base, k_base, v_base, o_base, qsl, lens, table, table_stride,
                          num_q_heads, group, head_size, block_size, q_tok_stride, q_head_stride,
                          o_tok_stride, o_head_stride, kv_block_stride, kv_tok_stride,
                          kv_head_stride, scale};
      TORCH_CHECK(head_size <= 16 * kMaxChunks, "cpu_paged_attention: head_size above ",
                  16 * kMaxChunks);
      at::parallel_for(0, num_seqs * num_q_heads, vec_grain, [&](int64_t begin, int64_t end) {
        std::vector<float> scores(static_cast<size_t>(max_len) + 16);
        paged_attention_avx512<T>(a, begin, end, scores.data());
      });
      return;
    }
  }
  // The scalar kernel (CPUs without AVX-512, and double).
  at::parallel_for(0, num_seqs * num_q_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(max_len));
    std::vector<float> qf(static_cast<size_t>(head_size)), acc(static_cast<size_t>(head_size));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / num_q_heads, h = item % num_q_heads, kvh = h / group;
      const int64_t q_start = qsl[s], q_len = qsl[s + 1] - qsl[s], seq_len = lens[s];
      if (q_len <= 0 || seq_len <= 0) continue;
      const int32_t* blocks = table + s * table_stride;
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t visible = seq_len - q_len + i + 1;  // causal: keys 0 .. own position
        const T* q = q_base + (q_start + i) * q_tok_stride + h * q_head_stride;
        for (int64_t d = 0; d < head_size; ++d) qf[d] = to_f(q[d]) * scale;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < visible; ++t) {
          const T* k = k_base + blocks[t / block_size] * kv_block_stride +
                       (t % block_size) * kv_tok_stride + kvh * kv_head_stride;
          scores[t] = dot(qf.data(), k, head_size);
          m = std::max(m, scores[t]);
        }
        float denom = 0;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t t = 0; t < visible; ++t) {
          const float p = std::exp(scores[t] - m);
          denom += p;
          const T* v = v_base + blocks[t / block_size] * kv_block_stride +
                       (t % block_size) * kv_tok_stride + kvh * kv_head_stride;
          for (int64_t d = 0; d < head_size; ++d) acc[d] += p * to_f(v[d]);
        }
        T* o = o_base + (q_start + i) * o_tok_stride + h * o_head_stride;
        const float inv = 1.f / denom;
        for (int64_t d = 0; d < head_size; ++d) o[d] = static_cast<T>(acc[d] * inv);
      }
    }
  });
}

void check_common(const at::Tensor& cache, const char* name) {
  TORCH_CHECK(cache.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(cache.dim() == 4 && cache.stride(3) == 1, name,
              " must be [num_blocks, block_size, num_kv_heads, head_size] with unit last stride");
}

}  // namespace

void cpu_paged_attention(const at::Tensor& query, const at::Tensor& key_cache,
                         const at::Tensor& value_cache, const at::Tensor& block_table,
                         const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                         double scale, at::Tensor& out, bool vectorized) {
  check_common(key_cache, "key_cache");
  check_common(value_cache, "value_cache");
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1, "query must be [tokens, heads, head_size]");
  TORCH_CHECK(out.sizes() == query.sizes() && out.stride(2) == 1 &&
                  out.scalar_type() == query.scalar_type(), "out must match query");
  TORCH_CHECK(key_cache.scalar_type() == query.scalar_type() &&
                  value_cache.scalar_type() == query.scalar_type(),
              "the KV cache must have the query's dtype");
  TORCH_CHECK(value_cache.strides() == key_cache.strides(), "key and value caches must share strides");
  TORCH_CHECK(query.size(1) % key_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.stride(1) == 1 &&
                  query_start_loc.scalar_type() == at::kInt && query_start_loc.is_contiguous() &&
                  seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous(),
              "block_table, query_start_loc and seq_lens must be int32 (row-contiguous)");
  TORCH_CHECK(query_start_loc.size(0) >= seq_lens.size(0) + 1 &&
                  block_table.size(0) >= seq_lens.size(0),
              "query_start_loc / block_table shorter than seq_lens");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "cpu_paged_attention", [&] {
    attention_impl<scalar_t>(query, key_cache, value_cache, block_table, query_start_loc, seq_lens,
                             static_cast<float>(scale), out, vectorized);
  });
}

void cpu_reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                           at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  check_common(key_cache, "key_cache");
  check_common(value_cache, "value_cache");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous int64");
  const int64_t num_tokens = slot_mapping.size(0);
  TORCH_CHECK(key.size(0) >= num_tokens && value.size(0) >= num_tokens, "fewer K/V rows than slots");
  const int64_t heads = key_cache.size(2), head_size = key_cache.size(3),
                block_size = key_cache.size(1);
  // Rows of new K/V as [tokens, heads * head_size] in the cache dtype (a copy only if needed).
  const at::Tensor k = key.narrow(0, 0, num_tokens).reshape({num_tokens, heads * head_size})
                           .to(key_cache.scalar_type()).contiguous();
  const at::Tensor v = value.narrow(0, 0, num_tokens).reshape({num_tokens, heads * head_size})
                           .to(value_cache.scalar_type()).contiguous();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t row_bytes = heads * head_size * key_cache.element_size();
  const bool packed = key_cache.stride(2) == head_size && value_cache.stride(2) == head_size;
  TORCH_CHECK(packed, "KV cache heads must be packed");
  char* kc = static_cast<char*>(key_cache.data_ptr());
  char* vc = static_cast<char*>(value_cache.data_ptr());
  const char* ks = static_cast<const char*>(k.data_ptr());
  const char* vs = static_cast<const char*>(v.data_ptr());
  const int64_t es = key_cache.element_size();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;  // PAD_SLOT_ID: padded tokens never touch the cache
    const int64_t b = slot / block_size, o = slot % block_size;
    std::memcpy(kc + (b * key_cache.stride(0) + o * key_cache.stride(1)) * es, ks + t * row_bytes, row_bytes);
    std::memcpy(vc + (b * value_cache.stride(0) + o * value_cache.stride(1)) * es, vs + t * row_bytes, row_bytes);
  }
}

}  // namespace specdec
