// AVX2 building blocks of the row-wise and elementwise kernels (rms_norm, swiglu, and the decode
// step's attention): 8 lanes of float32 loaded from and stored to any float storage type, a
// vector exp, and for8, the loop that writes outputs (optionally streamed past the caches); the
// AVX2 twin of elementwise_avx512.h. Only for functions compiled with ANYCHIP_AVX2, which
// isa() >= Isa::kAvx2 guarantees the CPU runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common.h"
#include "simd_avx2.h"

namespace anychip::cpu::avx2 {

inline const __m128i* half_vector(const void* p) { return reinterpret_cast<const __m128i*>(p); }
inline __m128i* half_vector(void* p) { return reinterpret_cast<__m128i*>(p); }

// Loads of 8 elements.
ANYCHIP_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
ANYCHIP_AVX2 inline __m256 load8(const bf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(half_vector(p))), 16));
}
ANYCHIP_AVX2 inline __m256 load8(const fp16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(half_vector(p))); }

// The first k < 8 elements, the other lanes 0 (a row's end: nothing past it is read).
template <typename T>
ANYCHIP_AVX2 inline __m256 load_first(const T* p, int64_t k) {
  T part[8] = {};
  std::memcpy(part, p, static_cast<size_t>(k) * sizeof(T));
  return load8(part);
}

// Round to nearest even with NaNs kept quiet, bit for bit as from_float<bf16> (the integer
// route of elementwise_avx512.h's to_bf16).
ANYCHIP_AVX2 inline __m128i to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
  // 16-bit values in dwords: pack within each 128-bit lane, then gather the two lanes' halves.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
ANYCHIP_AVX2 inline __m128i to_fp16(__m256 v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

// Stores of 8 elements.
ANYCHIP_AVX2 inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
ANYCHIP_AVX2 inline void store8(bf16* p, __m256 v) { _mm_storeu_si128(half_vector(p), to_bf16(v)); }
ANYCHIP_AVX2 inline void store8(fp16* p, __m256 v) { _mm_storeu_si128(half_vector(p), to_fp16(v)); }

// Stores of the first k < 8 elements (nothing past them is written).
template <typename T>
ANYCHIP_AVX2 inline void store_first(T* p, __m256 v, int64_t k) {
  T part[8];
  store8(part, v);
  std::memcpy(p, part, static_cast<size_t>(k) * sizeof(T));
}

// v rounded to T's precision and back, as a store and a load would give.
ANYCHIP_AVX2 inline __m256 round8(float*, __m256 v) { return v; }
ANYCHIP_AVX2 inline __m256 round8(bf16*, __m256 v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(to_bf16(v)), 16));
}
ANYCHIP_AVX2 inline __m256 round8(fp16*, __m256 v) { return _mm256_cvtph_ps(to_fp16(v)); }

// Non-temporal stores of 8 elements; `p` is 32-byte (float) or 16-byte (16-bit) aligned.
ANYCHIP_AVX2 inline void stream8(float* p, __m256 v) { _mm256_stream_ps(p, v); }
ANYCHIP_AVX2 inline void stream8(bf16* p, __m256 v) { _mm_stream_si128(half_vector(p), to_bf16(v)); }
ANYCHIP_AVX2 inline void stream8(fp16* p, __m256 v) { _mm_stream_si128(half_vector(p), to_fp16(v)); }

// Makes this thread's non-temporal stores visible before the kernel returns.
ANYCHIP_AVX2 inline void stream_fence() { _mm_sfence(); }

// Runs f(std::true_type{}) (a loop that streams its outputs) and fences, when `stream`; else
// f(std::false_type{}).
template <typename F>
inline void with_streaming(bool stream, F&& f) {
  if (stream) {
    f(std::true_type{});
    stream_fence();
  } else {
    f(std::false_type{});
  }
}

// Elements before p reaches a 32-byte boundary, at most n; all n when p is not even
// element-aligned and so never gets there.
template <typename T>
inline int64_t head_to_align32(const T* p, int64_t n) {
  const auto misalign = reinterpret_cast<uintptr_t>(p) & 31u;
  if (misalign % sizeof(T) != 0) return n;
  return std::min(misalign == 0 ? int64_t{0} : static_cast<int64_t>((32u - misalign) / sizeof(T)), n);
}

// How for8's callback gets its inputs and writes each output vector: whole (streamed or not),
// or the first k elements.
template <bool kStream>
struct Whole {
  template <typename T>
  ANYCHIP_AVX2 __m256 load(const T* p) const { return load8(p); }
  template <typename T>
  ANYCHIP_AVX2 void store(T* p, __m256 v) const {
    if constexpr (kStream) {
      stream8(p, v);
    } else {
      store8(p, v);
    }
  }
};
struct First {
  int64_t k;
  template <typename T>
  ANYCHIP_AVX2 __m256 load(const T* p) const { return load_first(p, k); }
  template <typename T>
  ANYCHIP_AVX2 void store(T* p, __m256 v) const { store_first(p, v, k); }
};

// Calls f(c, io) for c = 0, 8, ... < n: f computes elements c .. c+7, reading each input with
// io.load(p) and writing each output with io.store(p, v); at the ends io covers only the
// elements there are. With kStream the whole steps start after a peel to the 32-byte
// alignment of `aligned`, and are streamed: every output f stores must then share `aligned`'s
// alignment.
template <bool kStream, typename T, typename F>
ANYCHIP_AVX2 inline void for8(const T* aligned, int64_t n, F&& f) {
  int64_t c = 0;
  if constexpr (kStream) {
    const int64_t head = head_to_align32(aligned, n);
    for (; c < head; c += 8) f(c, First{std::min<int64_t>(8, head - c)});
    c = head;
  }
  for (; c + 8 <= n; c += 8) f(c, Whole<kStream>{});
  if (c < n) f(c, First{n - c});
}

// e^x as elementwise_avx512.h's exp16 computes it (the same polynomial and order), 2^k applied
// in two halves, so that overflow gives inf and underflow 0 (AVX2 has no scalef).
ANYCHIP_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(100.0f), _mm256_max_ps(_mm256_set1_ps(-110.0f), x));  // NaN: min returns x
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), x);  // ln2 in two parts
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860682030941723e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // k in [-159, 145]: 2^k as 2^(k/2) 2^(k - k/2), each a normal float.
  const __m256i ki = _mm256_cvtps_epi32(k), k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

}  // namespace anychip::cpu::avx2
