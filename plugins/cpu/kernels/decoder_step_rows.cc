// The decode step's row operations: RMSNorm, RoPE and SwiGLU on one token's vectors.
#include <algorithm>
#include <cmath>

#include "decoder_step.h"
#include "elementwise_avx2.h"
#include "elementwise_avx512.h"

namespace anychip::cpu::decoder {
namespace {

ANYCHIP_AVX512 void rms_norm_avx512(const float* h, const float* weight, int64_t c, float eps, float* y) {
  __m512 ss = _mm512_setzero_ps();
  for (int64_t i = 0; i < c; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(avx512::lanes(c - i), h + i);
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(c) + eps));
  for (int64_t i = 0; i < c; i += 16) {
    const __mmask16 m = avx512::lanes(c - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, h + i), inv);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i)));
  }
}

ANYCHIP_AVX512 void swiglu_avx512(const float* gate, const float* up, int64_t n, float* y) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = avx512::lanes(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, avx512::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_mul_ps(g, s), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

// The AVX2 twins: 8 lanes, the last n % 8 through load_first / store_first. f(i, k) takes the
// elements [i, i + k) of a row of n, k = 8 but at the end.
template <typename F>
ANYCHIP_AVX2 inline void by8(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) f(i, int64_t{8});
  if (i < n) f(i, n - i);
}
ANYCHIP_AVX2 inline __m256 load(const float* p, int64_t k) {
  return k == 8 ? _mm256_loadu_ps(p) : avx2::load_first(p, k);
}
ANYCHIP_AVX2 inline void store(float* p, __m256 v, int64_t k) {
  k == 8 ? _mm256_storeu_ps(p, v) : avx2::store_first(p, v, k);
}

ANYCHIP_AVX2 void rms_norm_avx2(const float* h, const float* weight, int64_t c, float eps, float* y) {
  __m256 ss = _mm256_setzero_ps();
  by8(c, [&](int64_t i, int64_t k) ANYCHIP_AVX2 {
    const __m256 v = load(h + i, k);
    ss = _mm256_fmadd_ps(v, v, ss);
  });
  const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(avx2::sum8(ss) / static_cast<float>(c) + eps));
  by8(c, [&](int64_t i, int64_t k) ANYCHIP_AVX2 {
    store(y + i, _mm256_mul_ps(_mm256_mul_ps(load(h + i, k), inv), load(weight + i, k)), k);
  });
}

ANYCHIP_AVX2 void swiglu_avx2(const float* gate, const float* up, int64_t n, float* y) {
  const __m256 one = _mm256_set1_ps(1.0f);
  by8(n, [&](int64_t i, int64_t k) ANYCHIP_AVX2 {
    const __m256 g = load(gate + i, k);
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, avx2::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    store(y + i, _mm256_mul_ps(_mm256_mul_ps(g, s), load(up + i, k)), k);
  });
}

}  // namespace

void rms_norm_row(const float* h, const float* weight, int64_t c, float eps, float* y, Isa isa) {
  if (has_avx512(isa)) return rms_norm_avx512(h, weight, c, eps, y);
  if (isa == Isa::kAvx2) return rms_norm_avx2(h, weight, c, eps, y);
  float ss = 0.0f;
  for (int64_t i = 0; i < c; ++i) ss += h[i] * h[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(c) + eps);
  for (int64_t i = 0; i < c; ++i) y[i] = h[i] * inv * weight[i];
}

void rope_row(float* x, const float* cs, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half], c = cs[i], s = cs[half + i];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

void swiglu_row(const float* gate, const float* up, int64_t n, float* y, Isa isa) {
  if (has_avx512(isa)) return swiglu_avx512(gate, up, n, y);
  if (isa == Isa::kAvx2) return swiglu_avx2(gate, up, n, y);
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace anychip::cpu::decoder
