// The decode step's row operations: RMSNorm, RoPE and SwiGLU on one token's vectors.
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

// The AVX2 twins, on elementwise_avx2.h's for8 (the row's last n % 8 through io's partial
// loads and stores).
ANYCHIP_AVX2 void rms_norm_avx2(const float* h, const float* weight, int64_t c, float eps, float* y) {
  __m256 ss = _mm256_setzero_ps();
  avx2::for8<false>(h, c, [&](int64_t i, auto io) ANYCHIP_AVX2 {
    const __m256 v = io.load(h + i);
    ss = _mm256_fmadd_ps(v, v, ss);
  });
  const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(avx2::sum8(ss) / static_cast<float>(c) + eps));
  avx2::for8<false>(y, c, [&](int64_t i, auto io) ANYCHIP_AVX2 {
    io.store(y + i, _mm256_mul_ps(_mm256_mul_ps(io.load(h + i), inv), io.load(weight + i)));
  });
}

ANYCHIP_AVX2 void swiglu_avx2(const float* gate, const float* up, int64_t n, float* y) {
  const __m256 one = _mm256_set1_ps(1.0f);
  avx2::for8<false>(y, n, [&](int64_t i, auto io) ANYCHIP_AVX2 {
    const __m256 g = io.load(gate + i);
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, avx2::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    io.store(y + i, _mm256_mul_ps(_mm256_mul_ps(g, s), io.load(up + i)));
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
