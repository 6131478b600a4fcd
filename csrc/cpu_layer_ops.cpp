// The small per-layer ops of a decoder layer on the CPU, one C++ call each instead of a dozen
// torch ops: RMSNorm (optionally fused with the residual add), rotary embedding in place, and
// SiLU-and-mul. Contracts: specdec_plugin/ops/{rms_norm,rotary,activation}/reference.py.
//
// Why: at batch 1 these tensors are a few hundred floats, so each torch op costs its dispatch
// (a few microseconds), not its arithmetic; the reference rotary is ~10 ops, the fused norm ~8,
// per layer, 30 layers per step (py-spy on the EAGLE-3 benchmark: rotary + norm + activation
// about 15% of a step).
//
// Numerics: every row is computed alone, in one fixed order, whatever the number of rows or
// threads (rows are split across threads whole), so a token's values are bit-identical in a
// 1-row decode and a (1+K)-row verification. Rotary and the residual add round like torch's
// elementwise ops (each product and sum rounded to the tensor's dtype), so they equal the
// reference bit for bit; the norm's mean of squares and SiLU's exp are computed in a fixed order
// of their own (within a few float32 ulps of torch's; SiLU on float32 rows uses the AVX-512 exp
// of vec16.h where the CPU has it, libm's elsewhere: a machine always takes the same one).
#include "cpu_layer_ops.h"
#include "vec16.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace specdec {
namespace {

template <typename T>
inline float f(T x) { return static_cast<float>(x); }

// Round a float32 result to T and back (identity for float): one torch elementwise op's result.
template <typename T>
inline float r(float x) { return static_cast<float>(static_cast<T>(x)); }

// Rows [begin, end) in parallel only when there is enough of them to beat waking the pool.
template <typename F>
void for_rows(int64_t rows, int64_t row_cost, F&& fn) {
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(row_cost, 1));
  at::parallel_for(0, rows, grain, fn);
}

template <typename T>
void rms_norm_rows(const at::Tensor& x, const T* w, double eps, const at::Tensor* residual,
                   at::Tensor& out, at::Tensor* res_out) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const T* rp = residual ? residual->data_ptr<T>() : nullptr;
  T* rop = res_out ? res_out->data_ptr<T>() : nullptr;
  const int64_t xs = x.stride(0), rs = residual ? residual->stride(0) : 0;
  const float epsf = static_cast<float>(eps);
  for_rows(rows, n, [&](int64_t begin, int64_t end) {
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t i = begin; i < end; ++i) {
      const T* xi = xp + i * xs;
      for (int64_t j = 0; j < n; ++j) s[j] = f(xi[j]);
      if (rp) {
        const T* ri = rp + i * rs;
        T* roi = rop + i * n;
        for (int64_t j = 0; j < n; ++j) {
          s[j] += f(ri[j]);  // the unrounded float32 sum is normalised; x's dtype is stored
          roi[j] = static_cast<T>(s[j]);
        }
      }
      // Mean of squares: eight running sums (j mod 8), then added in order.
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t j = 0;
      for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; ++l) acc[l] += s[j + l] * s[j + l];
      float sq = 0;
      for (; j < n; ++j) sq += s[j] * s[j];
      for (int l = 0; l < 8; ++l) sq += acc[l];
      const float inv = 1.f / std::sqrt(sq / static_cast<float>(n) + epsf);
      T* oi = op + i * n;
      for (int64_t k = 0; k < n; ++k) {
        float y = s[k] * inv;
        // Rounded to the weight's dtype before the weight multiply, as vLLM and HF do.
        if (w) y = r<T>(r<T>(y) * f(w[k]));
        oi[k] = static_cast<T>(y);
      }
    }
  });
}

// One token's heads: pairs (x1, x2) at (d, d + half) (neox) or (2d, 2d + 1) (GPT-J).
template <typename T>
void rotate_heads(T* x, int64_t heads, int64_t head_size, int64_t rot, const T* cos,
                  const T* sin, bool neox) {
  const int64_t half = rot / 2;
  for (int64_t h = 0; h < heads; ++h) {
    T* xh = x + h * head_size;
    for (int64_t d = 0; d < half; ++d) {
      T* p1 = neox ? xh + d : xh + 2 * d;
      T* p2 = neox ? xh + d + half : xh + 2 * d + 1;
      const float x1 = f(*p1), x2 = f(*p2), c = f(cos[d]), s = f(sin[d]);
      // o1 = x1 * cos - x2 * sin; o2 = x2 * cos + x1 * sin, each product and sum rounded.
      *p1 = static_cast<T>(r<T>(x1 * c) - r<T>(x2 * s));
      *p2 = static_cast<T>(r<T>(x2 * c) + r<T>(x1 * s));
    }
  }
}

template <typename T>
void rotary_rows(const at::Tensor& positions, at::Tensor& query, at::Tensor* key,
                 const at::Tensor& cache, int64_t head_size, int64_t rot, bool neox) {
  const int64_t tokens = positions.numel();
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t max_pos = cache.size(0);
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "rotary: position ", pos[t],
                " outside the cache's [0, ", max_pos, ")");
  T* q = query.data_ptr<T>();
  T* k = key ? key->data_ptr<T>() : nullptr;
  const int64_t qs = query.stride(0), ks = key ? key->stride(0) : 0;
  const int64_t qh = query.numel() / std::max<int64_t>(tokens, 1) / head_size;
  const int64_t kh = key ? key->numel() / std::max<int64_t>(tokens, 1) / head_size : 0;
  const T* c = cache.data_ptr<T>();
  const int64_t cs = cache.stride(0);
  for_rows(tokens, (qh + kh) * rot, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* cos = c + pos[t] * cs;
      rotate_heads(q + t * qs, qh, head_size, rot, cos, cos + rot / 2, neox);
      if (k) rotate_heads(k + t * ks, kh, head_size, rot, cos, cos + rot / 2, neox);
    }
  });
}

// float32 rows with AVX-512: the exp is avx512::vexp (16 lanes, ~1 ulp) instead of libm's,
// one at a time, which was most of this op (4 rows x 1536 per layer in a verification step).
SPECDEC_AVX512 void silu_and_mul_row_avx512(const float* a, const float* b, float* o, int64_t d) {
  using namespace avx512;
  for (int64_t j = 0; j < d; j += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, d - j));
    const V v = vload(a + j, n);
    const V e = vexp(vsub(vzero(), v));
    const V silu = _mm512_div_ps(v, vadd(vset1(1.f), e));
    vstore(o + j, vmul(silu, vload(b + j, n)), n);
  }
}

template <typename T>
void silu_and_mul_rows(const at::Tensor& x, at::Tensor& out) {
  const int64_t rows = x.size(0), d = out.size(1);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t xs = x.stride(0);
  const bool vec = std::is_same_v<T, float> && cpu_has_avx512f();
  for_rows(rows, 8 * d, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* a = xp + i * xs;
      const T* b = a + d;
      T* o = op + i * d;
      if constexpr (std::is_same_v<T, float>) {
        if (vec) {
          silu_and_mul_row_avx512(a, b, o, d);
          continue;
        }
      }
      for (int64_t j = 0; j < d; ++j) {
        const float v = f(a[j]);
        const float silu = r<T>(v / (1.f + std::exp(-v)));
        o[j] = static_cast<T>(silu * f(b[j]));
      }
    }
  });
}

}  // namespace

void cpu_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& weight, double eps,
                  const c10::optional<at::Tensor>& residual, at::Tensor& out,
                  c10::optional<at::Tensor> residual_out) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "cpu_rms_norm: x must be [rows, hidden], unit column stride");
  TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous() && out.scalar_type() == x.scalar_type(),
              "cpu_rms_norm: out must be a contiguous tensor like x");
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_r = residual.has_value() && residual->defined();
  if (has_w)
    TORCH_CHECK(weight->dim() == 1 && weight->size(0) == x.size(1) && weight->is_contiguous() &&
                    weight->scalar_type() == x.scalar_type(),
                "cpu_rms_norm: weight must be contiguous [hidden] in x's dtype");
  if (has_r)
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->stride(1) == 1 &&
                    residual->scalar_type() == x.scalar_type() && residual_out.has_value() &&
                    residual_out->sizes() == x.sizes() && residual_out->is_contiguous() &&
                    residual_out->scalar_type() == x.scalar_type(),
                "cpu_rms_norm: residual and residual_out must be like x (residual_out contiguous)");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "cpu_rms_norm", [&] {
    rms_norm_rows<scalar_t>(x, has_w ? weight->data_ptr<scalar_t>() : nullptr, eps,
                            has_r ? &*residual : nullptr, out, has_r ? &*residual_out : nullptr);
  });
}

void cpu_rotary(const at::Tensor& positions, at::Tensor& query, c10::optional<at::Tensor> key,
                const at::Tensor& cos_sin_cache, int64_t head_size, int64_t rotary_dim,
                bool is_neox) {
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "cpu_rotary: positions must be contiguous int64");
  const int64_t tokens = positions.numel();
  const bool has_k = key.has_value() && key->defined();
  TORCH_CHECK(query.dim() == 2 && query.size(0) == tokens && query.stride(1) == 1 &&
                  query.size(1) % head_size == 0,
              "cpu_rotary: query must be [tokens, heads * head_size], unit column stride");
  if (has_k)
    TORCH_CHECK(key->dim() == 2 && key->size(0) == tokens && key->stride(1) == 1 &&
                    key->size(1) % head_size == 0 && key->scalar_type() == query.scalar_type(),
                "cpu_rotary: key must be [tokens, heads * head_size] like query");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == rotary_dim &&
                  cos_sin_cache.stride(1) == 1 && cos_sin_cache.scalar_type() == query.scalar_type() &&
                  rotary_dim % 2 == 0 && rotary_dim <= head_size,
              "cpu_rotary: cos_sin_cache must be [max_position, rotary_dim] in query's dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "cpu_rotary", [&] {
    rotary_rows<scalar_t>(positions, query, has_k ? &*key : nullptr, cos_sin_cache, head_size,
                          rotary_dim, is_neox);
  });
}

at::Tensor cpu_silu_and_mul(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 2 == 0,
              "cpu_silu_and_mul: x must be [rows, 2 * d], unit column stride");
  at::Tensor out = at::empty({x.size(0), x.size(1) / 2}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "cpu_silu_and_mul", [&] {
    silu_and_mul_rows<scalar_t>(x, out);
  });
  return out;
}

}  // namespace specdec
