// Linear layers on the CPU for one token row: out[1, N] = x[1, K] @ w[N, K]^T (+ bias), fp32.
//
// Why a kernel of our own: a batch-1 decode step reads every weight once and does almost no
// arithmetic with it, so each product costs its memory traffic plus a fixed per-call overhead.
// On SmolLM2's small matrices (576-3072 rows) oneDNN's packed kernels spend more on that overhead
// than on the data (measured 2-3x slower than this loop at one token with passive OpenMP
// waiting, benchmarks/bench_cpu_linear.py); for several tokens and for the LM head oneDNN is
// faster, and ops/linear/cpp.py sends those there.
//
// Layout: the weight as torch stores it, [N, K] row-major: the layer's own tensor, no copy. Each
// thread takes a contiguous range of output rows, 4 at a time, accumulating in fp32; tiles of up
// to 4 token rows reuse each weight row from L1 (the kernel accepts any M, so the tests can
// compare it with the reference beyond M = 1).
#include "cpu_linear.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace specdec {
namespace {

constexpr int64_t kRows = 4;   // weight rows per tile (more measured no faster)
constexpr int64_t kToks = 4;   // token rows per tile (4 x 4 accumulators fit the 32 zmm)

bool cpu_has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl");
  return ok;
}

#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

SPECDEC_AVX512 inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

// out[t, r] = dot(x[t], w[r]) (+ bias[r]) for R weight rows and T token rows. The weight rows
// of the next tile are prefetched a tile ahead: each row is a short stream (K floats), too short
// for the hardware prefetcher to get ahead of on its own.
template <typename W, int R, int T>
SPECDEC_AVX512 void tile(const float* x, int64_t ldx, const W* w, int64_t K, const float* bias,
                         float* out, int64_t ldo, const W* next) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x + t * ldx + k);
    for (int r = 0; r < R; ++r) {
      if (next && (k * sizeof(W)) % 64 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(next + r * K + k), _MM_HINT_T0);
      const __m512 wv = load16(w + r * K + k, __mmask16(0xFFFF));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  if (k < K) {
    const __mmask16 m = __mmask16((1u << (K - k)) - 1);
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_maskz_loadu_ps(m, x + t * ldx + k);
    for (int r = 0; r < R; ++r) {
      const __m512 wv = load16(w + r * K + k, m);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r)
      out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]) + (bias ? bias[r] : 0.f);
}

// All token rows against weight rows [n, n + R): tiles of kToks tokens, then the rest.
template <typename W, int R>
SPECDEC_AVX512 void row_block(const float* x, int64_t ldx, int64_t M, const W* wn, int64_t K,
                              const float* bn, float* out, int64_t ldo, const W* next) {
  int64_t t = 0;
  for (; t + kToks <= M; t += kToks)
    tile<W, R, kToks>(x + t * ldx, ldx, wn, K, bn, out + t * ldo, ldo, t == 0 ? next : nullptr);
  const float* xt = x + t * ldx;
  float* ot = out + t * ldo;
  const W* nx = t == 0 ? next : nullptr;
  switch (M - t) {
    case 3: tile<W, R, 3>(xt, ldx, wn, K, bn, ot, ldo, nx); break;
    case 2: tile<W, R, 2>(xt, ldx, wn, K, bn, ot, ldo, nx); break;
    case 1: tile<W, R, 1>(xt, ldx, wn, K, bn, ot, ldo, nx); break;
    default: break;
  }
}

template <typename W>
SPECDEC_AVX512 void rows_avx512(const float* x, int64_t ldx, int64_t M, const W* w, int64_t K,
                                const float* bias, float* out, int64_t ldo, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + kRows <= n1; n += kRows) {
    const W* next = n + 2 * kRows <= n1 ? w + (n + kRows) * K : nullptr;
    row_block<W, kRows>(x, ldx, M, w + n * K, K, bias ? bias + n : nullptr, out + n, ldo, next);
  }
  for (; n < n1; ++n)  // the last rows of an N that is not a multiple of kRows
    row_block<W, 1>(x, ldx, M, w + n * K, K, bias ? bias + n : nullptr, out + n, ldo, nullptr);
}

// Portable path for CPUs without AVX-512 (same results up to summation order).
template <typename W>
void rows_scalar(const float* x, int64_t ldx, int64_t M, const W* w, int64_t K, const float* bias,
                 float* out, int64_t ldo, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t t = 0; t < M; ++t) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += static_cast<float>(w[n * K + k]) * x[t * ldx + k];
      out[t * ldo + n] = s + (bias ? bias[n] : 0.f);
    }
}

template <typename W>
void run(const at::Tensor& x, const at::Tensor& weight, const float* bias, at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const float* xp = x.data_ptr<float>();
  const W* wp = weight.data_ptr<W>();
  float* op = out.data_ptr<float>();
  const int64_t ldx = x.stride(0), ldo = out.stride(0);
  const bool vec = cpu_has_avx512();
  // One contiguous range of whole tiles per thread: parallel_for splits [0, tiles) evenly.
  const int64_t tiles = (N + kRows - 1) / kRows;
  at::parallel_for(0, tiles, 1, [&](int64_t b, int64_t e) {
    const int64_t n0 = b * kRows, n1 = std::min(N, e * kRows);
    if (vec)
      rows_avx512<W>(xp, ldx, M, wp, K, bias, op, ldo, n0, n1);
    else
      rows_scalar<W>(xp, ldx, M, wp, K, bias, op, ldo, n0, n1);
  });
}

}  // namespace

void cpu_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                at::Tensor& out) {
  // Shapes, dtypes and strides are checked by ops/linear/cpp.py before this is called.
  const float* b = bias.has_value() && bias->defined() ? bias->data_ptr<float>() : nullptr;
  if (x.size(0) == 0) return;
  run<float>(x, weight, b, out);
}

bool cpu_linear_vectorized() { return cpu_has_avx512(); }

}  // namespace specdec
