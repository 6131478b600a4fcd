// Linear on the CPU with the weight in a packed panel layout, stored as bfloat16 (or float32):
// y[M, N] = x[M, K] @ W[N, K]^T (+ bias), float32 activations, float32 accumulation, float32 out.
//
// Why: a decode step at batch 1 is bound by reading the weights. A bfloat16 checkpoint's weights
// are exactly representable in bfloat16, so storing them as bfloat16 and widening them to float32
// in registers computes the float32 model's products while reading half the bytes. oneDNN's bf16
// path is not a substitute: it rounds the activations and each result to bfloat16, and its
// summation order depends on the number of rows, so a 1-row decode and a (1+K)-row verification
// of the same token disagree and speculative greedy output drifts.
//
// Row invariance (the contract that makes speculation lossless): every output element is one
// chain of fused multiply-adds over k = 0, 1, ..., K-1 starting from +0, then + bias, whatever M,
// the row's place in the batch, the tiling or the thread split. Tiles only decide which chains
// run side by side; the portable path runs the same chains with std::fma, so it is bit-identical.
//
// Packed layout (made in ops/linear/cpp.py): panels of 32 output columns, [P, K, 32] elements,
// the last panel zero-padded. A panel is one sequential stream (64 bytes per k for bfloat16: one
// cache line). For bfloat16 the 32 columns of one k are interleaved (element 2j = column j,
// element 2j+1 = column 16+j), so one 64-byte load gives both halves with a shift and a mask.
#include "cpu_linear_packed.h"

#include <ATen/Parallel.h>

#include "cpu_work_pool.h"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace specdec {
namespace {

constexpr int64_t kPanel = 32;   // output columns per panel (2 zmm registers)
// Products of fewer multiply-adds (M * N * K) stay on the calling thread: helpers are cheap to
// reach while they spin (cpu_work_pool.cpp), not free. The smallest product measured to gain
// from them is SmolLM2's o projection at one token (332K: 27.9 -> 18.3 us, 2-core Xeon).
constexpr int64_t kMinParallelMacs = 100000;

#define SPECDEC_AVX512 __attribute__((target("avx512f")))
#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))

bool cpu_has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

// AVX2 with FMA and no AVX-512 (AMD Zen 1-3, Intel client parts): an AVX2 path, not the
// element-at-a-time one, which on such a CPU (2-core AMD EPYC, 2026-11-28) made the default
// CPU linear 4-5x slower than oneDNN float32 at 5 rows and on the LM head.
bool cpu_has_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

// Which tile code runs: the same chains in each (the row-invariance contract above).
enum class Isa { kScalar, kAvx2, kAvx512 };

inline float widen(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Where column c (0..31) of a panel sits inside one k's 32 elements.
inline int64_t slot(int64_t c, bool bf16) {
  return bf16 ? (c < 16 ? 2 * c : 2 * (c - 16) + 1) : c;
}

// ---- AVX-512 ----------------------------------------------------------------------------

template <bool BF16>
SPECDEC_AVX512 inline void load_panel_row(const void* base, int64_t k, __m512& lo, __m512& hi) {
  if constexpr (BF16) {
    const __m512i v = _mm512_loadu_si512(static_cast<const uint16_t*>(base) + k * kPanel);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));                               // cols 0-15
    hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xFFFF0000u))));  // 16-31
  } else {
    const float* p = static_cast<const float*>(base) + k * kPanel;
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 16);
  }
}

// R rows of x against NP adjacent panels (NP x 32 columns): acc[r][j] = one fma chain over k,
// then + bias, stored (columns past N masked). Two panels side by side halve the broadcasts of x
// per multiply-add, which is what bounds the larger tiles (prefill, batch x (1+K) rows).
template <bool BF16, int R, int NP>
SPECDEC_AVX512 void tile_avx512(const float* x, int64_t ldx, const void* panel, int64_t K,
                                int64_t panel_bytes, const float* bias, float* y, int64_t ldy,
                                int64_t cols) {
  __m512 acc[R][2 * NP];
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 2 * NP; ++j) acc[r][j] = _mm512_setzero_ps();
  const char* base = static_cast<const char*>(panel);
  constexpr int64_t row_bytes = kPanel * (BF16 ? 2 : 4);
  for (int64_t k = 0; k < K; ++k) {
    __m512 w[2 * NP];
#pragma GCC unroll 2
    for (int q = 0; q < NP; ++q) {
      const char* pq = base + q * panel_bytes;
      // Each panel is one stream; keep lines in flight ahead of the loads (weights come from
      // memory in a decode step: no cache holds a model's worth of them). A/B without it on
      // this Zen 4 (bench_cpu_linear.py, load ~2): no measurable difference; kept because it
      // costs one instruction per 64 bytes and a weaker hardware prefetcher would need it.
      _mm_prefetch(pq + (k + 16) * row_bytes, _MM_HINT_T0);
      if constexpr (!BF16) _mm_prefetch(pq + (k + 16) * row_bytes + 64, _MM_HINT_T0);
      load_panel_row<BF16>(pq, k, w[2 * q], w[2 * q + 1]);
    }
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
#pragma GCC unroll 4
      for (int j = 0; j < 2 * NP; ++j) acc[r][j] = _mm512_fmadd_ps(w[j], xv, acc[r][j]);
    }
  }
  __mmask16 mask[2 * NP];
  __m512 b[2 * NP];
#pragma GCC unroll 4
  for (int j = 0; j < 2 * NP; ++j) {
    const int64_t left = std::min<int64_t>(16, std::max<int64_t>(0, cols - 16 * j));
    mask[j] = left == 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    b[j] = bias ? _mm512_maskz_loadu_ps(mask[j], bias + 16 * j) : _mm512_setzero_ps();
  }
#pragma GCC unroll 32
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 2 * NP; ++j)
      _mm512_mask_storeu_ps(y + r * ldy + 16 * j, mask[j],
                            bias ? _mm512_add_ps(acc[r][j], b[j]) : acc[r][j]);
}

// Rows per tile: R x 2NP accumulators + 2NP weights + x must fit the 32 zmm registers.
constexpr int64_t max_rows(int np) { return np == 2 ? 6 : 12; }

template <bool BF16, int NP>
SPECDEC_AVX512 void tile_avx512_rows(int64_t rows, const float* x, int64_t ldx, const void* panel,
                                     int64_t K, int64_t panel_bytes, const float* bias, float* y,
                                     int64_t ldy, int64_t cols) {
  switch (rows) {
#define SPECDEC_CASE(R)                                                                  \
  case R:                                                                                \
    if constexpr (R <= max_rows(NP))                                                     \
      return tile_avx512<BF16, R, NP>(x, ldx, panel, K, panel_bytes, bias, y, ldy, cols); \
    break;
    SPECDEC_CASE(1) SPECDEC_CASE(2) SPECDEC_CASE(3) SPECDEC_CASE(4) SPECDEC_CASE(5)
    SPECDEC_CASE(6) SPECDEC_CASE(7) SPECDEC_CASE(8) SPECDEC_CASE(9) SPECDEC_CASE(10)
    SPECDEC_CASE(11) SPECDEC_CASE(12)
#undef SPECDEC_CASE
    default: break;
  }
}

// ---- AVX2 --------------------------------------------------------------------------------

// One k of a panel as four 8-column vectors, columns 0-7, 8-15, 16-23, 24-31. For bfloat16 the
// first 32 bytes hold columns 0-7 (even elements) and 16-23 (odd), the next 32 bytes 8-15 and
// 24-31 (the interleave above).
template <bool BF16>
SPECDEC_AVX2 inline void load_panel_row_avx2(const void* base, int64_t k, __m256 w[4]) {
  if constexpr (BF16) {
    const uint16_t* p = static_cast<const uint16_t*>(base) + k * kPanel;
    const __m256i hi_mask = _mm256_set1_epi32(int(0xFFFF0000u));
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    w[0] = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
    w[1] = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    w[2] = _mm256_castsi256_ps(_mm256_and_si256(v0, hi_mask));
    w[3] = _mm256_castsi256_ps(_mm256_and_si256(v1, hi_mask));
  } else {
    const float* p = static_cast<const float*>(base) + k * kPanel;
    for (int j = 0; j < 4; ++j) w[j] = _mm256_loadu_ps(p + 8 * j);
  }
}

// R rows (at most 3: 4R accumulators + 4 weights + x in 16 ymm registers) against one panel:
// acc[r][j] = one fma chain over k, then + bias; columns past ``cols`` are not stored.
template <bool BF16, int R>
SPECDEC_AVX2 void tile_avx2(const float* x, int64_t ldx, const void* panel, int64_t K,
                            const float* bias, float* y, int64_t ldy, int64_t cols) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  const char* base = static_cast<const char*>(panel);
  constexpr int64_t row_bytes = kPanel * (BF16 ? 2 : 4);
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch(base + (k + 16) * row_bytes, _MM_HINT_T0);
    if constexpr (!BF16) _mm_prefetch(base + (k + 16) * row_bytes + 64, _MM_HINT_T0);
    __m256 w[4];
    load_panel_row_avx2<BF16>(panel, k, w);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_set1_ps(x[r * ldx + k]);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_fmadd_ps(w[j], xv, acc[r][j]);
    }
  }
  alignas(32) float out[kPanel];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < 4; ++j) _mm256_store_ps(out + 8 * j, acc[r][j]);
    float* yr = y + r * ldy;
    for (int64_t c = 0; c < cols; ++c) yr[c] = bias ? out[c] + bias[c] : out[c];
  }
}

// ``rows`` rows against ``np`` adjacent panels, three rows at a time.
template <bool BF16>
void tile_avx2_rows(int64_t rows, const float* x, int64_t ldx, const void* panel, int64_t np,
                    int64_t K, int64_t panel_bytes, const float* bias, float* y, int64_t ldy,
                    int64_t cols) {
  for (int64_t q = 0; q < np; ++q) {
    const void* pq = static_cast<const char*>(panel) + q * panel_bytes;
    const int64_t qcols = std::min<int64_t>(kPanel, cols - q * kPanel);
    const float* bq = bias ? bias + q * kPanel : nullptr;
    for (int64_t r = 0; r < rows; r += 3) {
      const float* xr = x + r * ldx;
      float* yr = y + r * ldy + q * kPanel;
      switch (std::min<int64_t>(3, rows - r)) {
        case 1: tile_avx2<BF16, 1>(xr, ldx, pq, K, bq, yr, ldy, qcols); break;
        case 2: tile_avx2<BF16, 2>(xr, ldx, pq, K, bq, yr, ldy, qcols); break;
        default: tile_avx2<BF16, 3>(xr, ldx, pq, K, bq, yr, ldy, qcols); break;
      }
    }
  }
}

// ---- portable path: the same chains, one element at a time --------------------------------

template <bool BF16>
void tile_scalar(int64_t rows, const float* x, int64_t ldx, const void* panel, int64_t K,
                 int64_t panel_bytes, const float* bias, float* y, int64_t ldy, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const char* pc = static_cast<const char*>(panel) + (c / kPanel) * panel_bytes;
      const int64_t s = slot(c % kPanel, BF16);
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k) {
        const float w = BF16 ? widen(reinterpret_cast<const uint16_t*>(pc)[k * kPanel + s])
                             : reinterpret_cast<const float*>(pc)[k * kPanel + s];
        acc = std::fma(w, x[r * ldx + k], acc);
      }
      y[r * ldy + c] = bias ? acc + bias[c] : acc;
    }
}

// Rows [r0, r0 + mb) against panels [p, p + np): near-equal tiles of at most max_rows(np) rows
// (13 rows on two panels: 5 + 5 + 3, not 6 + 6 + 1). Which chains share a tile never changes
// any chain.
template <bool BF16>
void panel_group(int64_t np, const float* x, int64_t ldx, int64_t r0, int64_t mb, int64_t K,
                 const void* panel, int64_t panel_bytes, int64_t n0, int64_t N, const float* bias,
                 float* y, int64_t ldy, Isa isa) {
  const int64_t cap = np == 2 ? max_rows(2) : max_rows(1);
  const int64_t tiles = (mb + cap - 1) / cap;
  const int64_t per_tile = (mb + tiles - 1) / tiles;
  const int64_t cols = std::min(np * kPanel, N - n0);
  const float* bp = bias ? bias + n0 : nullptr;
  for (int64_t r = r0; r < r0 + mb; r += per_tile) {
    const int64_t rows = std::min(per_tile, r0 + mb - r);
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy + n0;
    if (isa == Isa::kScalar)
      tile_scalar<BF16>(rows, xr, ldx, panel, K, panel_bytes, bp, yr, ldy, cols);
    else if (isa == Isa::kAvx2)
      tile_avx2_rows<BF16>(rows, xr, ldx, panel, np, K, panel_bytes, bp, yr, ldy, cols);
    else if (np == 2)
      tile_avx512_rows<BF16, 2>(rows, xr, ldx, panel, K, panel_bytes, bp, yr, ldy, cols);
    else
      tile_avx512_rows<BF16, 1>(rows, xr, ldx, panel, K, panel_bytes, bp, yr, ldy, cols);
  }
}

struct LinearCall {
  const float* x;
  int64_t ldx, M, K;
  const void* w;
  int64_t N;
  const float* bias;
  float* y;
  int64_t ldy;
  Isa isa;
  int64_t panels, panel_bytes, block;
};

// One chunk: the output columns of panel pair q (panels 2q, 2q+1), every row.
template <bool BF16>
void pair_chunk(void* ctx, int64_t q) {
  const LinearCall& c = *static_cast<const LinearCall*>(ctx);
  const int64_t p = 2 * q, np = std::min<int64_t>(2, c.panels - p);
  const void* panel = static_cast<const char*>(c.w) + p * c.panel_bytes;
  for (int64_t m0 = 0; m0 < c.M; m0 += c.block)
    panel_group<BF16>(np, c.x, c.ldx, m0, std::min(c.block, c.M - m0), c.K, panel, c.panel_bytes,
                      p * kPanel, c.N, c.bias, c.y, c.ldy, c.isa);
}

template <bool BF16>
void run(const float* x, int64_t ldx, int64_t M, int64_t K, const void* w, int64_t N,
         const float* bias, float* y, int64_t ldy, Isa isa) {
  const int64_t panels = (N + kPanel - 1) / kPanel;
  // Rows per cache block: a block's activations (rows x K floats) stay in L2 while the pair's
  // panels stream past them.
  const int64_t block = std::max<int64_t>(12, (262144 / std::max<int64_t>(K * 4, 1)) / 12 * 12);
  LinearCall call{x, ldx, M, K, w, N, bias, y, ldy, isa, panels, K * kPanel * (BF16 ? 2 : 4),
                  block};
  const int64_t pairs = (panels + 1) / 2;
  // Chunks are panel pairs, claimed one at a time.
  if (M * N * K < kMinParallelMacs) {
    for (int64_t q = 0; q < pairs; ++q) pair_chunk<BF16>(&call, q);
  } else {
    pool_run(pairs, &pair_chunk<BF16>, &call);
  }
}

}  // namespace

at::Tensor cpu_linear_packed(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                             const c10::optional<at::Tensor>& bias, bool portable) {
  // Checked here as well as in ops/linear/cpp.py: this is raw pointer arithmetic.
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "cpu_linear_packed: x must be a 2-D float32 tensor with contiguous rows");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.is_contiguous() &&
                  (packed.scalar_type() == at::kBFloat16 || packed.scalar_type() == at::kFloat),
              "cpu_linear_packed: packed weight must be a contiguous [P, K, 32] bf16/fp32 tensor");
  const int64_t M = x.size(0), K = x.size(1), N = out_features;
  TORCH_CHECK(packed.size(1) == K && packed.size(0) == (N + kPanel - 1) / kPanel && N > 0,
              "cpu_linear_packed: packed weight ", packed.sizes(), " does not fit x ", x.sizes(),
              " and out_features ", N);
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == at::kFloat &&
                    bias->is_contiguous(),
                "cpu_linear_packed: bias must be a contiguous float32 [out_features]");
    b = bias->data_ptr<float>();
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const Isa isa = portable ? Isa::kScalar
                  : cpu_has_avx512() ? Isa::kAvx512
                  : cpu_has_avx2() ? Isa::kAvx2
                                   : Isa::kScalar;
  // The helper threads follow torch's thread count (SPECDEC_CPU_THREADS sets it in the engine).
  const int64_t threads = at::get_num_threads();
  if (!pool_configured() || pool_threads() != threads)
    pool_configure(threads, pool_spin_us());
  if (packed.scalar_type() == at::kBFloat16)
    run<true>(x.data_ptr<float>(), x.stride(0), M, K, packed.data_ptr(), N, b,
              y.data_ptr<float>(), N, isa);
  else
    run<false>(x.data_ptr<float>(), x.stride(0), M, K, packed.data_ptr(), N, b,
               y.data_ptr<float>(), N, isa);
  return y;
}

bool cpu_linear_packed_vectorized() { return cpu_has_avx512() || cpu_has_avx2(); }

}  // namespace specdec
