// Single-query attention over a KV cache, in blocks of keys (flash-decoding): each block yields
// its softmax statistics and unnormalised output, and combine() merges the blocks in order, so
// that a long cache spreads over all threads and the result does not depend on who did which
// block. Within a block, two passes over the keys: the scores, then the weighted sum of V, 64
// columns of the head at a time.
#include <algorithm>
#include <cmath>

#include "decoder_step.h"
#include "elementwise_avx512.h"
#include "elementwise_avx2.h"

namespace anychip::cpu::decoder {
namespace {

// scores[j] = e^(scores[j] - m) for j < len; returns their sum.
float exponentiate(float* scores, int64_t len, float m) {
  float sum = 0.0f;
  for (int64_t j = 0; j < len; ++j) {
    scores[j] = std::exp(scores[j] - m);
    sum += scores[j];
  }
  return sum;
}

template <typename T>
void block_scalar(const Keys<T>& kv, int64_t j0, int64_t j1, const float* q, int64_t d, float scale, float* scores,
                  float* part) {
  const int64_t len = j1 - j0;
  float m = -INFINITY;
  for (int64_t j = 0; j < len; ++j) {
    const T* kj = kv.key(j0 + j);
    float s = 0.0f;
    for (int64_t t = 0; t < d; ++t) s += q[t] * to_float(kj[t]);
    scores[j] = s * scale;
    m = std::max(m, scores[j]);
  }
  const float sum = exponentiate(scores, len, m);
  for (int64_t t = 0; t < d; ++t) part[t] = 0.0f;
  for (int64_t j = 0; j < len; ++j) {
    const T* vj = kv.value(j0 + j);
    for (int64_t t = 0; t < d; ++t) part[t] += scores[j] * to_float(vj[t]);
  }
  part[d] = m;
  part[d + 1] = sum;
}

// ---- AVX2 -------------------------------------------------------------------------------------

using avx2::load8;

// Lane i of the result is the sum of the 8 lanes of a[i], in the same order for every i.
ANYCHIP_AVX2 inline __m256 sum8x8(const __m256 (&a)[8]) {
  __m256 b[4];
  for (int i = 0; i < 4; ++i) b[i] = _mm256_hadd_ps(a[2 * i], a[2 * i + 1]);
  // c0, 128-bit lane L: the lane-L half sums of a[0 .. 3]; c1 those of a[4 .. 7]
  const __m256 c0 = _mm256_hadd_ps(b[0], b[1]), c1 = _mm256_hadd_ps(b[2], b[3]);
  return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c0, c1, 0x31));
}

// scores[j, j + 8) = scale q . k_j for the keys j0 + j, j + 1, ... below j1: eight dot products
// side by side (one key at a time, each score waited on its own chain of d / 8 FMAs), summed
// across lanes together; the last d % 8 columns added one by one.
template <typename T>
ANYCHIP_AVX2 inline void scores8(const Keys<T>& kv, int64_t j, int64_t j1, const float* q, int64_t d, float scale,
                                 float* scores) {
  const int64_t count = std::min<int64_t>(8, j1 - j), d8 = d / 8 * 8;
  const T* key[8];
  for (int i = 0; i < 8; ++i) key[i] = kv.key(j + std::min<int64_t>(i, count - 1));
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t t = 0; t < d8; t += 8) {
    const __m256 qv = _mm256_loadu_ps(q + t);
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, load8(key[i] + t), acc[i]);
  }
  alignas(32) float sum[8];
  _mm256_store_ps(sum, sum8x8(acc));
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t t = d8; t < d; ++t) sum[i] += q[t] * to_float(key[i][t]);
    scores[i] = sum[i] * scale;
  }
}

// block_scalar with the scores eight keys at a time (scores8), e^(s - max) with exp8, and the
// weighted sum of V 64 columns of the head at a time in registers.
template <typename T>
ANYCHIP_AVX2 void block_avx2(const Keys<T>& kv, int64_t j0, int64_t j1, const float* q, int64_t d, float scale,
                             float* scores, float* part) {
  const int64_t len = j1 - j0, d8 = d / 8 * 8;
  for (int64_t j = 0; j < len; j += 8) scores8(kv, j0 + j, j1, q, d, scale, scores + j);
  __m256 mv = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(scores + j));
  float m = avx2::max8(mv);
  for (; j < len; ++j) m = std::max(m, scores[j]);
  __m256 total = _mm256_setzero_ps();
  for (j = 0; j + 8 <= len; j += 8) {
    const __m256 p = avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), _mm256_set1_ps(m)));
    _mm256_storeu_ps(scores + j, p);
    total = _mm256_add_ps(total, p);
  }
  if (j < len) {
    const __m256 p = avx2::exp8(_mm256_sub_ps(avx2::load_first(scores + j, len - j), _mm256_set1_ps(m)));
    avx2::store_first(scores + j, p, len - j);
    total = _mm256_add_ps(total, _mm256_and_ps(p, _mm256_castsi256_ps(avx2::lanes8(static_cast<int>(len - j)))));
  }
  const float sum = avx2::sum8(total);
  for (int64_t t0 = 0; t0 < d8; t0 += 64) {
    const int vectors = static_cast<int>(std::min<int64_t>(8, (d8 - t0) / 8));
    __m256 acc[8];
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
    for (j = 0; j < len; ++j) {
      const __m256 p = _mm256_set1_ps(scores[j]);
      const T* vj = kv.value(j0 + j) + t0;
      for (int c = 0; c < vectors; ++c) acc[c] = _mm256_fmadd_ps(p, load8(vj + 8 * c), acc[c]);
    }
    for (int c = 0; c < vectors; ++c) _mm256_storeu_ps(part + t0 + 8 * c, acc[c]);
  }
  for (int64_t t = d8; t < d; ++t) {
    float v = 0.0f;
    for (j = 0; j < len; ++j) v += scores[j] * to_float(kv.value(j0 + j)[t]);
    part[t] = v;
  }
  part[d] = m;
  part[d + 1] = sum;
}

// ---- AVX-512 -----------------------------------------------------------------------------------

// Lane i of the result is the sum of the 16 lanes of a[i]: interleaving pairs of vectors and
// adding halves the vectors while doubling the sums each holds.
ANYCHIP_AVX512 inline __m512 sum16(const __m512 (&a)[16]) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // c[i], 128-bit lane L: the lane-L sums of a[4i .. 4i + 3]
  const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
  const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xdd));
}

// scores[j, j + 16) = scale q . k_j for the keys j0 + j, j + 1, ... below j1: sixteen dot
// products side by side, summed across lanes together.
template <typename T>
ANYCHIP_AVX512 inline void scores16(const Keys<T>& kv, int64_t j, int64_t j1, const float* q, int64_t d, float scale,
                                    float* scores) {
  const int64_t count = std::min<int64_t>(16, j1 - j);
  const T* key[16];
  for (int i = 0; i < 16; ++i) key[i] = kv.key(j + std::min<int64_t>(i, count - 1));
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < d; t += 16) {
    const __mmask16 m = avx512::lanes(d - t);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + t);
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(qv, avx512::load16(key[i] + t, m), acc[i]);
  }
  _mm512_mask_storeu_ps(scores, avx512::lanes(count), _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
}

template <typename T>
ANYCHIP_AVX512 void block_avx512(const Keys<T>& kv, int64_t j0, int64_t j1, const float* q, int64_t d, float scale,
                                 float* scores, float* part) {
  using avx512::lanes;
  const int64_t len = j1 - j0;
  for (int64_t j = 0; j < len; j += 16) scores16(kv, j0 + j, j1, q, d, scale, scores + j);
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < len; j += 16)
    mv = _mm512_mask_max_ps(mv, lanes(len - j), mv, _mm512_maskz_loadu_ps(lanes(len - j), scores + j));
  const float top = _mm512_reduce_max_ps(mv);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 m = lanes(len - j);
    const __m512 s = _mm512_maskz_loadu_ps(m, scores + j);
    const __m512 p = _mm512_maskz_mov_ps(m, avx512::exp16(_mm512_sub_ps(s, _mm512_set1_ps(top))));
    _mm512_mask_storeu_ps(scores + j, m, p);
    sum = _mm512_add_ps(sum, p);
  }
  // Four keys at a time into their own accumulators, so that the FMAs do not wait on each other.
  for (int64_t t0 = 0; t0 < d; t0 += 64) {
    __mmask16 m[4];
    __m512 acc[4][4];
    for (int c = 0; c < 4; ++c) {
      m[c] = lanes(d - t0 - 16 * c);
      for (int r = 0; r < 4; ++r) acc[r][c] = _mm512_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 4 <= len; j += 4)
      for (int r = 0; r < 4; ++r) {
        const __m512 p = _mm512_set1_ps(scores[j + r]);
        const T* vj = kv.value(j0 + j + r) + t0;
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(p, avx512::load16(vj + 16 * c, m[c]), acc[r][c]);
      }
    for (; j < len; ++j) {
      const __m512 p = _mm512_set1_ps(scores[j]);
      const T* vj = kv.value(j0 + j) + t0;
      for (int c = 0; c < 4; ++c) acc[0][c] = _mm512_fmadd_ps(p, avx512::load16(vj + 16 * c, m[c]), acc[0][c]);
    }
    for (int c = 0; c < 4; ++c) {
      const __m512 total = _mm512_add_ps(_mm512_add_ps(acc[0][c], acc[1][c]), _mm512_add_ps(acc[2][c], acc[3][c]));
      _mm512_mask_storeu_ps(part + t0 + 16 * c, m[c], total);
    }
  }
  part[d] = top;
  part[d + 1] = _mm512_reduce_add_ps(sum);
}

}  // namespace

template <typename T>
void attend_block(const Keys<T>& kv, int64_t j0, int64_t j1, const float* q, int64_t d, float scale, float* scores,
                  float* part, Isa isa) {
  if (isa == Isa::kAvx2) {
    block_avx2(kv, j0, j1, q, d, scale, scores, part);
  } else if (!has_avx512(isa)) {
    block_scalar(kv, j0, j1, q, d, scale, scores, part);
  } else {
    block_avx512(kv, j0, j1, q, d, scale, scores, part);
  }
}

template void attend_block(const Keys<float>&, int64_t, int64_t, const float*, int64_t, float, float*, float*, Isa);
template void attend_block(const Keys<bf16>&, int64_t, int64_t, const float*, int64_t, float, float*, float*, Isa);
template void attend_block(const Keys<fp16>&, int64_t, int64_t, const float*, int64_t, float, float*, float*, Isa);

void combine(const float* parts, int64_t count, int64_t d, float* o) {
  float top = -INFINITY;
  for (int64_t c = 0; c < count; ++c) top = std::max(top, parts[c * (d + 2) + d]);
  float sum = 0.0f;
  for (int64_t t = 0; t < d; ++t) o[t] = 0.0f;
  for (int64_t c = 0; c < count; ++c) {
    const float* part = parts + c * (d + 2);
    const float w = std::exp(part[d] - top);
    sum += w * part[d + 1];
    for (int64_t t = 0; t < d; ++t) o[t] += w * part[t];
  }
  const float inv = 1.0f / sum;
  for (int64_t t = 0; t < d; ++t) o[t] *= inv;
}

}  // namespace anychip::cpu::decoder
