// The asymmetric part of a quantized product: offsets[n][g] times the sum of x over group g.
//
// Per row of x the group sums come first (M x G floats); then each output is a dot product of
// length G, which for GGUF's groups of 32 is short (G = K / 32), so the AVX-512 version does 16
// outputs at a time and sums their 16 accumulators with one transposing reduction instead of 16
// horizontal ones. Each output's arithmetic does not depend on [n0, n1) or on its place in the
// batch of 16, so results do not depend on how callers split the rows among threads.
#include <algorithm>
#include <vector>

#include "quant.h"
#include "quant_simd.h"

namespace anychip::cpu::quant {
namespace {

// Group sums of the m rows of x fit this many floats on the stack; more go to the heap.
constexpr int64_t kStackSums = 1024;

void group_sums_scalar(const QWeight& w, const float* x, int64_t m, float* sums) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < w.groups; ++g) {
      const float* xg = x + i * w.k + g * w.group;
      float s = 0.0f;
      for (int64_t k = 0; k < w.group; ++k) s += xg[k];
      sums[i * w.groups + g] = s;
    }
}

void add_offsets_scalar(const QWeight& w, const float* sums, int64_t m, int64_t n0, int64_t n1, float* y,
                        int64_t ldy) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = n0; n < n1; ++n) {
      const float* off = w.offsets + n * w.groups;
      const float* si = sums + i * w.groups;
      float s = 0.0f;
      for (int64_t g = 0; g < w.groups; ++g) s += off[g] * si[g];
      y[i * ldy + n] += s;
    }
}

QUANT_AVX512 void group_sums_avx512(const QWeight& w, const float* x, int64_t m, float* sums) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < w.groups; ++g) {
      const float* xg = x + i * w.k + g * w.group;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t k = 0; k < w.group; k += 16)
        acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(lanes16(w.group - k), xg + k));
      sums[i * w.groups + g] = _mm512_reduce_add_ps(acc);
    }
}

// Lane j of the result is the sum of the 16 lanes of a[j]: pairs of vectors are interleaved and
// added, halving the count of vectors while doubling the outputs each holds.
QUANT_AVX512 inline __m512 sum16(__m512 (&a)[16]) {
  __m512 b[8], c[4];
  for (int j = 0; j < 8; ++j)
    b[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]), _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
  for (int j = 0; j < 4; ++j) {
    const __m512d p = _mm512_castps_pd(b[2 * j]), q = _mm512_castps_pd(b[2 * j + 1]);
    c[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p, q)), _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)));
  }
  // c[j], 128-bit lane L: the lane-L sums of a[4j .. 4j + 3].
  const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
  const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xdd));
}

QUANT_AVX512 void add_offsets_avx512(const QWeight& w, const float* sums, int64_t m, int64_t n0, int64_t n1, float* y,
                                     int64_t ldy) {
  const int64_t groups = w.groups;
  for (int64_t n = n0; n < n1; n += 16) {
    const int64_t count = std::min<int64_t>(16, n1 - n);
    const float* off = w.offsets + n * groups;
    for (int64_t i = 0; i < m; ++i) {
      const float* si = sums + i * groups;
      __m512 acc[16];
      for (int64_t j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; g += 16) {
        const __mmask16 lane = lanes16(groups - g);
        const __m512 sv = _mm512_maskz_loadu_ps(lane, si + g);
        for (int64_t j = 0; j < 16; ++j)  // rows past n1 (j >= count) load nothing
          acc[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(j < count ? lane : 0, off + j * groups + g), sv, acc[j]);
      }
      float* yi = y + i * ldy + n;
      const __mmask16 lane = lanes16(count);
      _mm512_mask_storeu_ps(yi, lane, _mm512_add_ps(_mm512_maskz_loadu_ps(lane, yi), sum16(acc)));
    }
  }
}

}  // namespace

void group_sums(const QWeight& w, const float* x, int64_t m, float* sums) {
  if (!has_avx512(isa())) {
    group_sums_scalar(w, x, m, sums);
  } else {
    group_sums_avx512(w, x, m, sums);
  }
}

void add_offsets_sums(const QWeight& w, const float* sums, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (w.offsets == nullptr || m <= 0 || n0 >= n1) return;
  if (!has_avx512(isa())) {
    add_offsets_scalar(w, sums, m, n0, n1, y, ldy);
  } else {
    add_offsets_avx512(w, sums, m, n0, n1, y, ldy);
  }
}

void add_offsets(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (w.offsets == nullptr || m <= 0 || n0 >= n1) return;
  float stack[kStackSums];
  std::vector<float> heap;
  float* sums = stack;
  if (m * w.groups > kStackSums) {
    heap.resize(static_cast<size_t>(m * w.groups));
    sums = heap.data();
  }
  group_sums(w, x, m, sums);
  add_offsets_sums(w, sums, m, n0, n1, y, ldy);
}

}  // namespace anychip::cpu::quant
