// Paged attention on the CPU with AVX-512 (compiled for avx512f; cpu_attention.cpp calls it
// only when the CPU has it, else its scalar kernel). About 4x the scalar kernel on this Zen 4
// (one request, 300 keys, 9 heads: 61 -> 15 us for a decode row, 251 -> 69 us for 4 rows).
//
// A query row's arithmetic depends only on its own query, its visible keys and the head size,
// never on the other rows of the step or on the thread split, so a token attends with the same
// bits in a 1-row decode and in a (1+K)-row verification (speculation's losslessness):
//   score[t] = vsum(fma chain over the 16-lane chunks of d of (q * scale) * k[t]);
//   m = max score; w[t] = vexp(score[t] - m); denom = vsum of 16 lane sums (lane j adds
//   w[j], w[16 + j], ... in order); out = (fma chain over t of w[t] * v[t]) * (1 / denom).
// Keys are read block by block in place from the paged cache.
#include "cpu_attention.h"
#include "vec16.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

namespace specdec {
namespace {

using namespace avx512;

template <typename T>
SPECDEC_AVX512 inline void store_row(T* o, V a, int n) {
  if constexpr (std::is_same_v<T, float>) {
    vstore(o, a, n);
  } else {
    float tmp[16];
    vstore(tmp, a, n);
    for (int j = 0; j < n; ++j) o[j] = static_cast<T>(tmp[j]);
  }
}

// NV: 16-lane chunks per head (head_size / 16) when known at compile time, 0 for any head size.
template <typename T, int NV>
SPECDEC_AVX512 inline void attend_row(const AttnView<T>& a, const int32_t* blocks, int64_t kvh,
                               const T* q, T* o, int64_t visible, float* scores) {
  const int64_t D = a.head_size;
  const int nv = NV ? NV : static_cast<int>((D + 15) / 16);
  int width[kMaxChunks];
  V qv[kMaxChunks], acc[kMaxChunks];
  for (int c = 0; c < nv; ++c) {
    width[c] = NV ? 16 : static_cast<int>(std::min<int64_t>(16, D - 16 * c));
    qv[c] = vmul(vload_t(q + 16 * c, width[c]), vset1(a.scale));
  }
  // Keys block by block (no division per key).
  const int64_t head_off = kvh * a.head_stride;
  for (int64_t t0 = 0; t0 < visible; t0 += a.block_size) {
    const T* k = a.k + blocks[t0 / a.block_size] * a.block_stride + head_off;
    const int64_t n = std::min<int64_t>(a.block_size, visible - t0);
    for (int64_t j = 0; j < n; ++j, k += a.tok_stride) {
      V d = vzero();
      for (int c = 0; c < nv; ++c) d = vfma(qv[c], vload_t(k + 16 * c, width[c]), d);
      scores[t0 + j] = vsum(d);
    }
  }
  float m = -std::numeric_limits<float>::infinity();
  int64_t t = 0;
  if (visible >= 16) {
    V vm = vload(scores);
    for (t = 16; t + 16 <= visible; t += 16) vm = vmax(vm, vload(scores + t));
    m = vmax_all(vm);
  }
  for (; t < visible; ++t) m = scores[t] > m ? scores[t] : m;
  V lane_sums = vzero();
  const V vmx = vset1(m);
  for (int64_t t0 = 0; t0 < visible; t0 += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, visible - t0));
    vstore(scores + t0, vexp(vsub(vload(scores + t0, n), vmx)), n);
    lane_sums = vadd(lane_sums, vload(scores + t0, n));  // lanes past n: +0
  }
  const float denom = vsum(lane_sums);
  for (int c = 0; c < nv; ++c) acc[c] = vzero();
  for (int64_t t0 = 0; t0 < visible; t0 += a.block_size) {
    const T* v = a.v + blocks[t0 / a.block_size] * a.block_stride + head_off;
    const int64_t n = std::min<int64_t>(a.block_size, visible - t0);
    for (int64_t j = 0; j < n; ++j, v += a.tok_stride) {
      const V w = vset1(scores[t0 + j]);
      for (int c = 0; c < nv; ++c) acc[c] = vfma(w, vload_t(v + 16 * c, width[c]), acc[c]);
    }
  }
  const V inv = vset1(1.f / denom);
  for (int c = 0; c < nv; ++c) store_row(o + 16 * c, vmul(acc[c], inv), width[c]);
}

// Work items [begin, end) of (request, query head), every query row of each.
template <typename T, int NV>
SPECDEC_AVX512 inline void attend_items(const AttnView<T>& a, int64_t begin, int64_t end,
                                 float* scores) {
  for (int64_t item = begin; item < end; ++item) {
    const int64_t s = item / a.num_q_heads, h = item % a.num_q_heads, kvh = h / a.group;
    const int64_t q_start = a.qsl[s], q_len = a.qsl[s + 1] - a.qsl[s], seq_len = a.lens[s];
    if (q_len <= 0 || seq_len <= 0) continue;
    const int32_t* blocks = a.table + s * a.table_stride;
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t visible = seq_len - q_len + i + 1;  // causal: keys 0 .. own position
      attend_row<T, NV>(a, blocks, kvh, a.q + (q_start + i) * a.q_tok_stride + h * a.q_head_stride,
                        a.o + (q_start + i) * a.o_tok_stride + h * a.o_head_stride, visible,
                        scores);
    }
  }
}

}  // namespace

template <typename T>
SPECDEC_AVX512 void paged_attention_avx512(const AttnView<T>& a, int64_t begin, int64_t end, float* scores) {
  if (a.head_size == 64)
    attend_items<T, 4>(a, begin, end, scores);
  else if (a.head_size == 128)
    attend_items<T, 8>(a, begin, end, scores);
  else
    attend_items<T, 0>(a, begin, end, scores);
}

template void paged_attention_avx512<float>(const AttnView<float>&, int64_t, int64_t, float*);
template void paged_attention_avx512<c10::BFloat16>(const AttnView<c10::BFloat16>&, int64_t,
                                                    int64_t, float*);
template void paged_attention_avx512<c10::Half>(const AttnView<c10::Half>&, int64_t, int64_t,
                                                float*);

}  // namespace specdec
