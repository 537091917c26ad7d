// AVX-512 building blocks of the row-wise and elementwise kernels (rms_norm, rotary, swiglu,
// adamw): 16 lanes of float32 loaded from and stored to any float storage type, and a vector
// exp, and for16, the loop that writes outputs (optionally streamed past the caches). Only for
// functions compiled with ANYCHIP_AVX512, which isa() >= Isa::kAvx512 guarantees the CPU runs.
#pragma once

// GCC 12 reports the intrinsics' own `__Y = __Y` placeholders as uninitialised (PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstdint>

#include "common.h"

#define ANYCHIP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")))

namespace anychip::cpu::avx512 {

// Lanes [0, n) of 16, for the partial vectors at the ends of a row.
inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
}

// Elements before `p` reaches a 64-byte boundary, at most n: written with ordinary stores so
// that the full vectors after them can be streamed (non-temporal stores must be aligned). All n
// when p is not even element-aligned and so never gets there.
template <typename T>
inline int64_t head_to_align(const T* p, int64_t n) {
  const auto misalign = reinterpret_cast<uintptr_t>(p) & 63u;
  if (misalign % sizeof(T) != 0) return n;
  const int64_t head = misalign == 0 ? 0 : static_cast<int64_t>((64u - misalign) / sizeof(T));
  return std::min(head, n);
}

ANYCHIP_AVX512 inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
ANYCHIP_AVX512 inline __m512 load16(const bf16* p, __mmask16 m) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
ANYCHIP_AVX512 inline __m512 load16(const fp16* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

// Round to nearest even with NaNs kept quiet, bit for bit as from_float<bf16>. vcvtneps2bf16
// does exactly that for every input but the subnormals, which it flushes to zero (checked over
// all 2^32 inputs); a vector holding one takes the integer route.
ANYCHIP_AVX512 inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i magnitude = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 subnormal = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(magnitude, _mm512_set1_epi32(1)),
                                                      _mm512_set1_epi32(0x007fffff));
  if (__builtin_expect(subnormal == 0, 1)) return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}
ANYCHIP_AVX512 inline __m256i to_fp16(__m512 v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// Stores of the lanes of m.
ANYCHIP_AVX512 inline void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
ANYCHIP_AVX512 inline void store16(bf16* p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, to_bf16(v)); }
ANYCHIP_AVX512 inline void store16(fp16* p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, to_fp16(v)); }

// v rounded to T's precision and back, as a store and a load would give.
ANYCHIP_AVX512 inline __m512 round16(float*, __m512 v) { return v; }
ANYCHIP_AVX512 inline __m512 round16(bf16*, __m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(v)), 16));
}
ANYCHIP_AVX512 inline __m512 round16(fp16*, __m512 v) { return _mm512_cvtph_ps(to_fp16(v)); }

// Makes this thread's non-temporal stores visible before the kernel returns.
ANYCHIP_AVX512 inline void stream_fence() { _mm_sfence(); }

inline __m256i* half_vector(void* p) { return reinterpret_cast<__m256i*>(p); }

// Non-temporal stores of 16 elements; `p` is 64-byte (float) or 32-byte (16-bit) aligned.
ANYCHIP_AVX512 inline void stream16(float* p, __m512 v) { _mm512_stream_ps(p, v); }
ANYCHIP_AVX512 inline void stream16(bf16* p, __m512 v) { _mm256_stream_si256(half_vector(p), to_bf16(v)); }
ANYCHIP_AVX512 inline void stream16(fp16* p, __m512 v) { _mm256_stream_si256(half_vector(p), to_fp16(v)); }

// Stores of 16 elements.
ANYCHIP_AVX512 inline void storeu16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
ANYCHIP_AVX512 inline void storeu16(bf16* p, __m512 v) { _mm256_storeu_si256(half_vector(p), to_bf16(v)); }
ANYCHIP_AVX512 inline void storeu16(fp16* p, __m512 v) { _mm256_storeu_si256(half_vector(p), to_fp16(v)); }

// How for16's callback writes a vector: whole (streamed or not), or the lanes of a mask.
template <bool kStream>
struct WholeStore {
  template <typename T>
  ANYCHIP_AVX512 void operator()(T* p, __m512 v) const {
    if constexpr (kStream) {
      stream16(p, v);
    } else {
      storeu16(p, v);
    }
  }
};
struct MaskedStore {
  __mmask16 mask;
  template <typename T>
  ANYCHIP_AVX512 void operator()(T* p, __m512 v) const { store16(p, v, mask); }
};

// Calls f(c, mask, store) for c = 0, 16, ... < n: f computes elements c .. c+15 (the lanes in
// mask; loads under it give 0 elsewhere) and writes each output vector with store(p, v). The
// full steps get a constant mask, so their loads and stores compile unmasked. With kStream the
// steps start after a peel to the 64-byte alignment of `aligned`, and full vectors are
// streamed: every output f stores must then share `aligned`'s alignment.
template <bool kStream, typename T, typename F>
ANYCHIP_AVX512 inline void for16(const T* aligned, int64_t n, F&& f) {
  int64_t c = 0;
  if constexpr (kStream) {
    const int64_t head = head_to_align(aligned, n);
    for (; c < head; c += 16) f(c, lanes(head - c), MaskedStore{lanes(head - c)});
    c = head;
  }
  for (; c + 16 <= n; c += 16) f(c, lanes(16), WholeStore<kStream>{});
  if (c < n) f(c, lanes(n - c), MaskedStore{lanes(n - c)});
}

// Whether a and b lie equally far from a 64-byte boundary (so one peel aligns both).
inline bool same_alignment(const void* a, const void* b) {
  return ((reinterpret_cast<uintptr_t>(a) ^ reinterpret_cast<uintptr_t>(b)) & 63u) == 0;
}

// e^x: x = k ln2 + r with |r| <= ln2/2, e^r by its degree-7 Taylor polynomial (truncation
// error below 1e-8 relative), 2^k applied by scalef so that overflow gives inf and underflow 0.
ANYCHIP_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(100.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x));  // NaN passes
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);  // ln2 in two parts
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860682030941723e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

}  // namespace anychip::cpu::avx512
