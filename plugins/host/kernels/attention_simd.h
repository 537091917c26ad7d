// AVX-512 building blocks of the attention engines: exp2, transposes, a small GEMM, the masked
// online-softmax step and dtype conversions. Included only by files compiled for AVX-512.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "attention_engine.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")

namespace anychip::cpu::attn::simd {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kKeyVecs = kKeyTile / 16;
static_assert(kKeyVecs == 4, "softmax reduces four vectors per row");

inline int dpad(int d) { return static_cast<int>(round_up(d, 32)); }
inline __mmask16 first_lanes(int count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << std::max(count, 0)) - 1);
}

// 2^x, about 2 ulp: x = n + f with |f| <= 1/2, a degree-6 polynomial for 2^f, then scalef.
// Results below 2^-125 are flushed to 0 (so exp2(-inf) = 0) rather than computed as denormals,
// which would cost a microcode assist per vector; exp2(0) = 1 exactly; NaN stays NaN.
inline __m512 exp2(__m512 x) {
  const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  x = _mm512_max_ps(_mm512_set1_ps(-125.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(128.0f), x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5353358e-04f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398876e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6184378e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503324e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022648e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(normal, p, n);
}

// In-register transpose of a 16x16 block of 32-bit lanes.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// ---- storage dtype <-> fp32 vectors (count lanes, the rest zero / untouched)

template <typename T>
inline __m512 load(const T* p, __mmask16 k) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(k, p);
  } else if constexpr (std::is_same_v<T, bf16>) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
  }
}

template <typename T>
inline void store(T* p, __m512 v, __mmask16 k) {
  if constexpr (std::is_same_v<T, float>) {
    _mm512_mask_storeu_ps(p, k, v);
  } else if constexpr (std::is_same_v<T, bf16>) {
    _mm256_mask_storeu_epi16(p, k, (__m256i)_mm512_cvtneps_pbh(v));
  } else {
    _mm256_mask_storeu_epi16(p, k, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

inline __m512 round_bf16(__m512 v) {
  const __m256i b = (__m256i)_mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// ---- C[R rows][NV vectors] (op)= sum_k A(r, k) * B[k][0 : 16 NV]
// A(r, k) is a[r * lda + k], or a[k * lda + r] when kTransA. The last vector of B and C holds
// only the lanes in `tail`. kMode 0: C = scale * sum; 1: C = C * rscale[r] + sum; 2: C += sum.
template <int R, int NV, bool kTransA, int kMode>
inline void micro(const float* a, int64_t lda, const float* b, int64_t ldb, int kn, __mmask16 tail, float* c,
                  int64_t ldc, float scale, const float* rscale) {
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      if constexpr (kMode == 0) {
        acc[r][v] = _mm512_setzero_ps();
      } else {
        acc[r][v] = _mm512_maskz_loadu_ps(v == NV - 1 ? tail : 0xffff, c + r * ldc + 16 * v);
        if constexpr (kMode == 1) acc[r][v] = _mm512_mul_ps(acc[r][v], _mm512_set1_ps(rscale[r]));
      }
    }
  for (int k = 0; k < kn; ++k) {
    const float* bk = b + k * ldb;
    __m512 bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? tail : 0xffff, bk + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(kTransA ? a[k * lda + r] : a[r * lda + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      __m512 x = acc[r][v];
      if constexpr (kMode == 0) x = _mm512_mul_ps(x, _mm512_set1_ps(scale));
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, v == NV - 1 ? tail : 0xffff, x);
    }
}

// R rows of C, their columns in blocks of up to 4 vectors (6 x 4 = 24 accumulators at most).
template <int R, bool kTransA, int kMode>
inline void gemm_rows(int vecs, int cols, const float* a, int64_t lda, const float* b, int64_t ldb, int kn, float* c,
                      int64_t ldc, float scale, const float* rscale) {
  for (int v0 = 0; v0 < vecs; v0 += 4) {
    const int nv = std::min(4, vecs - v0);
    const __mmask16 tail = first_lanes(cols - 16 * (v0 + nv - 1));
    const float* bv = b + 16 * v0;
    float* cv = c + 16 * v0;
    switch (nv) {
      case 4: micro<R, 4, kTransA, kMode>(a, lda, bv, ldb, kn, tail, cv, ldc, scale, rscale); break;
      case 3: micro<R, 3, kTransA, kMode>(a, lda, bv, ldb, kn, tail, cv, ldc, scale, rscale); break;
      case 2: micro<R, 2, kTransA, kMode>(a, lda, bv, ldb, kn, tail, cv, ldc, scale, rscale); break;
      default: micro<R, 1, kTransA, kMode>(a, lda, bv, ldb, kn, tail, cv, ldc, scale, rscale); break;
    }
  }
}

// The same over `rows` (a multiple of 4) x `cols` columns of C: blocks of 6 rows, then 4.
template <bool kTransA, int kMode>
inline void gemm(int rows, int cols, const float* a, int64_t lda, const float* b, int64_t ldb, int kn, float* c,
                 int64_t ldc, float scale = 1.0f, const float* rscale = nullptr) {
  const int vecs = (cols + 15) / 16;
  auto at = [&](int r) { return kTransA ? a + r : a + r * lda; };
  auto rs = [&](int r) { return rscale != nullptr ? rscale + r : nullptr; };
  int sixes = rows / 6;
  while ((rows - 6 * sixes) % 4 != 0) --sixes;
  int r0 = 0;
  for (; r0 < 6 * sixes; r0 += 6)
    gemm_rows<6, kTransA, kMode>(vecs, cols, at(r0), lda, b, ldb, kn, c + r0 * ldc, ldc, scale, rs(r0));
  for (; r0 < rows; r0 += 4)
    gemm_rows<4, kTransA, kMode>(vecs, cols, at(r0), lda, b, ldb, kn, c + r0 * ldc, ldc, scale, rs(r0));
}

// Sets keys n.. of rows < m to `pad`.
inline void pad_keys(float* t, int m, int n, float pad) {
  if (n >= kKeyTile) return;
  for (int r = 0; r < m; ++r)
    for (int v = n / 16; v < kKeyVecs; ++v) {
      const __mmask16 keep = first_lanes(n - 16 * v);
      float* x = t + r * kKeyTile + 16 * v;
      _mm512_storeu_ps(x, _mm512_mask_blend_ps(keep, _mm512_set1_ps(pad), _mm512_loadu_ps(x)));
    }
}

// Lanes of keys j0 + c .. j0 + c + 15 that FlashMask hides from query row i.
inline __mmask16 flash_hidden(int rule, const int32_t* col0, int64_t ld, __mmask16 valid, __m512i i) {
  const __m512i a = _mm512_maskz_loadu_epi32(valid, col0);
  if (rule == kFlashLower) return _mm512_cmple_epi32_mask(a, i);
  const __m512i b = _mm512_maskz_loadu_epi32(valid, col0 + ld);
  if (rule == kFlashLowerBand) return _mm512_cmple_epi32_mask(a, i) & _mm512_cmpgt_epi32_mask(b, i);
  if (rule == kFlashLowerUpper) return _mm512_cmple_epi32_mask(a, i) | _mm512_cmpgt_epi32_mask(b, i);
  const __m512i c = _mm512_maskz_loadu_epi32(valid, col0 + 2 * ld);
  const __m512i d = _mm512_maskz_loadu_epi32(valid, col0 + 3 * ld);
  return (_mm512_cmple_epi32_mask(a, i) & _mm512_cmpgt_epi32_mask(b, i)) |
         (_mm512_cmple_epi32_mask(c, i) & _mm512_cmpgt_epi32_mask(d, i));
}

inline bool apply_mask(const TileMask& tm, float* t) {
  const __m512 ninf = _mm512_set1_ps(-kInf);
  const int rows = tm.heads * tm.positions;
  __mmask16 any = 0;
  for (int r = 0; r < rows; ++r) {
    const int h = r / tm.positions;
    const int64_t i = tm.i0 + r % tm.positions;
    const __m512i vi = _mm512_set1_epi32(static_cast<int32_t>(i));
    // Keys of this tile the causal rule lets row i see: j0 + c with c < limit.
    const int64_t limit = tm.causal ? std::clamp<int64_t>(i + tm.causal_offset - tm.j0 + 1, 0, kKeyTile) : kKeyTile;
    float* tr = t + r * kKeyTile;
    for (int c = 0; c < tm.n; c += 16) {
      const __mmask16 valid = first_lanes(tm.n - c);
      __mmask16 vis = valid & first_lanes(static_cast<int>(limit) - c);
      if (tm.has_dense) {
        const __m128i bytes = _mm_maskz_loadu_epi8(valid, tm.dense[h] + i * tm.dense_ld + tm.j0 + c);
        vis &= _mm_test_epi8_mask(bytes, bytes);
      }
      if (tm.rule != kFlashNone) vis &= ~flash_hidden(tm.rule, tm.bounds[h] + tm.j0 + c, tm.bounds_ld, valid, vi);
      _mm512_storeu_ps(tr + c, _mm512_mask_blend_ps(vis, ninf, _mm512_loadu_ps(tr + c)));
      any |= vis;
    }
  }
  return any != 0;
}

// The online softmax step over rows < m of t (see Engine::softmax). kP: how p is stored —
// 0: fp32, 1: fp32 holding bf16-rounded values, 2: bf16 (the AMX operand).
template <int kP>
inline void softmax(const float* t, int m, float* mx, float* l, float* alpha, void* p) {
  for (int r = 0; r < m; ++r) {
    const float* tr = t + r * kKeyTile;
    __m512 x[kKeyVecs];
    for (int v = 0; v < kKeyVecs; ++v) x[v] = _mm512_loadu_ps(tr + 16 * v);
    const float tmax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3])));
    const float mnew = std::max(mx[r], tmax);
    const float muse = mnew == -kInf ? 0.0f : mnew;
    const __m512 vm = _mm512_set1_ps(muse);
    // exp2(0) is exactly 1: a row whose max did not move skips the exp.
    const float a = mnew == mx[r] ? 1.0f : _mm512_cvtss_f32(exp2(_mm512_set1_ps(mx[r] - muse)));
    for (int v = 0; v < kKeyVecs; ++v) x[v] = exp2(_mm512_sub_ps(x[v], vm));
    const float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(x[0], x[1]), _mm512_add_ps(x[2], x[3])));
    l[r] = l[r] * a + sum;
    mx[r] = mnew;
    alpha[r] = a;
    if constexpr (kP == 2) {
      auto* pr = static_cast<uint16_t*>(p) + r * kKeyTile;
      for (int v = 0; v < kKeyVecs; v += 2)
        _mm512_storeu_si512(pr + 16 * v, (__m512i)_mm512_cvtne2ps_pbh(x[v + 1], x[v]));
    } else {
      float* pr = static_cast<float*>(p) + r * kKeyTile;
      for (int v = 0; v < kKeyVecs; ++v) _mm512_storeu_ps(pr + 16 * v, kP == 1 ? round_bf16(x[v]) : x[v]);
    }
  }
}

template <typename T>
inline void finalize(const float* acc, const float* mx, const float* l, int m, int d, void* const* o_rows,
                     float* const* lse) {
  const int dp = dpad(d);
  for (int r = 0; r < m; ++r) {
    T* o = static_cast<T*>(o_rows[r]);
    const __m512 inv = _mm512_set1_ps(l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
    for (int c = 0; c < d; c += 16)
      store(o + c, _mm512_mul_ps(_mm512_loadu_ps(acc + r * dp + c), inv), first_lanes(d - c));
    *lse[r] = l[r] > 0.0f ? (mx[r] + std::log2(l[r])) * kLn2 : -kInf;
  }
}

}  // namespace anychip::cpu::attn::simd

#pragma GCC pop_options
