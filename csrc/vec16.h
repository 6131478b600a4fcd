// Sixteen float32 lanes in an AVX-512 register, for kernels compiled for avx512f behind a
// runtime check (cpu_has_avx512f), as csrc/cpu_linear_packed.cpp does.
//
// vsum reduces in one fixed tree, lane l paired with l+8, then l+4, l+2, l+1:
//   ((((l0 + l8) + (l4 + l12)) + ((l2 + l10) + (l6 + l14))) + (((l1 + l9) + ...) ...)),
// so a kernel whose rows each run their own chain of these operations gives a row the same bits
// whatever the other rows of the call (what speculative verification relies on).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#define SPECDEC_AVX512 __attribute__((target("avx512f")))

namespace specdec {

inline bool cpu_has_avx512f() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

namespace avx512 {

using V = __m512;

SPECDEC_AVX512 inline __mmask16 lanes(int n) {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}
SPECDEC_AVX512 inline V vzero() { return _mm512_setzero_ps(); }
SPECDEC_AVX512 inline V vset1(float a) { return _mm512_set1_ps(a); }
// n lanes from p, the rest +0.
SPECDEC_AVX512 inline V vload(const float* p, int n = 16) {
  return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(lanes(n), p);
}
SPECDEC_AVX512 inline void vstore(float* p, V a, int n = 16) {
  if (n >= 16)
    _mm512_storeu_ps(p, a);
  else
    _mm512_mask_storeu_ps(p, lanes(n), a);
}
// float32, bfloat16 or half, widened exactly to float32.
SPECDEC_AVX512 inline V vload_t(const float* p, int n = 16) { return vload(p, n); }
SPECDEC_AVX512 inline __m256i load16x16(const void* p, int n) {
  if (n >= 16) return _mm256_loadu_si256(static_cast<const __m256i*>(p));
  alignas(32) uint16_t tmp[16] = {0};
  std::memcpy(tmp, p, 2 * n);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
}
SPECDEC_AVX512 inline V vload_t(const c10::BFloat16* p, int n = 16) {
  const __m512i w = _mm512_cvtepu16_epi32(load16x16(p, n));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
SPECDEC_AVX512 inline V vload_t(const c10::Half* p, int n = 16) {
  return _mm512_cvtph_ps(load16x16(p, n));
}
SPECDEC_AVX512 inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
SPECDEC_AVX512 inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
SPECDEC_AVX512 inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
SPECDEC_AVX512 inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
SPECDEC_AVX512 inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
SPECDEC_AVX512 inline V vmin(V a, V b) { return _mm512_min_ps(a, b); }
SPECDEC_AVX512 inline float vsum(V a) {
  a = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(1, 0, 3, 2)));  // l + l^8
  a = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(2, 3, 0, 1)));  // l + l^4
  a = _mm512_add_ps(a, _mm512_permute_ps(a, _MM_SHUFFLE(1, 0, 3, 2)));        // l + l^2
  a = _mm512_add_ps(a, _mm512_permute_ps(a, _MM_SHUFFLE(2, 3, 0, 1)));        // l + l^1
  return _mm512_cvtss_f32(a);
}
SPECDEC_AVX512 inline float vmax_all(V a) { return _mm512_reduce_max_ps(a); }

// exp(x) (softmax weights: x <= 0): Cephes' expf, range-reduced by n = round(x log2 e), a
// degree-6 polynomial in fmas, scaled by 2^n; about 1 ulp. Inputs below -87.3 give ~2^-126
// instead of a denormal or 0 (next to a row's largest weight, 1, nothing).
SPECDEC_AVX512 inline V vexp(V x) {
  x = vmin(vmax(x, vset1(-87.3f)), vset1(88.3f));
  const V n = _mm512_roundscale_ps(vmul(x, vset1(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = vfma(n, vset1(-0.693359375f), x);
  r = vfma(n, vset1(2.12194440e-4f), r);
  V p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  const V y = vadd(vfma(p, vmul(r, r), r), vset1(1.f));
  const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  return vmul(y, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
}

}  // namespace avx512
}  // namespace specdec
