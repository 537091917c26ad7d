// What the AVX2 tier's kernels share: the target they are compiled for (callable only when
// isa() == Isa::kAvx2 or above, which checks the CPU has AVX2, FMA and F16C), the sum and the
// maximum of a vector's 8 lanes, and a mask of its first lanes.
#pragma once

// GCC 12 reports the intrinsics' own `__Y = __Y` placeholders as uninitialised (PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#define ANYCHIP_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace anychip::cpu::avx2 {

ANYCHIP_AVX2 inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

ANYCHIP_AVX2 inline float max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// Lanes [0, k) of 8 set: a row's or a tile's end.
ANYCHIP_AVX2 inline __m256i lanes8(int k) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace anychip::cpu::avx2
