// Dequantization of weight rows, float dtype conversion and a dword transpose, for the
// quantized-linear kernels. Scalar, AVX2 and AVX-512 versions give the same values:
// W = float(q) * scale, or fma(float(q), scale, offset) for asymmetric groups.
#include <algorithm>
#include <cmath>

#include "quant.h"
#include "quant_simd.h"
#include "simd_avx2.h"

namespace anychip::cpu::quant {
namespace {

inline float weight_value(int q, const float* scales, const float* offsets, int64_t g) {
  const float v = static_cast<float>(q);
  return offsets == nullptr ? v * scales[g] : std::fma(v, scales[g], offsets[g]);
}

void dequant_row_scalar(const QWeight& w, int64_t n, int64_t k0, int64_t k1, float* out) {
  const float* s = w.row_scales(n);
  const float* o = w.row_offsets(n);
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group, end = std::min(k1, (g + 1) * w.group);
    for (; k < end; ++k) out[k - k0] = weight_value(qvalue(w, n, k), s, o, g);
  }
}

QUANT_AVX512 void dequant_row_avx512(const QWeight& w, int64_t n, int64_t k0, int64_t k1, float* out) {
  const uint8_t* row = w.row(n);
  const float* s = w.row_scales(n);
  const float* o = w.row_offsets(n);
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group, end = std::min(k1, (g + 1) * w.group);
    const __m512 scale = _mm512_set1_ps(s[g]);
    if (w.bits == 8) {
      const __m512 offset = _mm512_set1_ps(o == nullptr ? 0.0f : o[g]);
      for (; k < end; k += 16) {
        const __mmask16 m = lanes16(end - k);
        const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, row + k)));
        _mm512_mask_storeu_ps(out + (k - k0), m,
                              o == nullptr ? _mm512_mul_ps(q, scale) : _mm512_fmadd_ps(q, scale, offset));
      }
    } else {
      const __m512 table = o == nullptr ? _mm512_mul_ps(nibble_values(), scale)
                                        : _mm512_fmadd_ps(nibble_values(), scale, _mm512_set1_ps(o[g]));
      for (; k < end && (k & 15) != 0; ++k) out[k - k0] = weight_value(qvalue(w, n, k), s, o, g);
      for (; k + 16 <= end; k += 16) _mm512_storeu_ps(out + (k - k0), nibbles16(row, k, table));
      for (; k < end; ++k) out[k - k0] = weight_value(qvalue(w, n, k), s, o, g);
    }
    k = end;
  }
}

// dequant_row_scalar on AVX2, 8 k at a time (the ends of a group that are not whole 8s one by one).
ANYCHIP_AVX2 void dequant_row_avx2(const QWeight& w, int64_t n, int64_t k0, int64_t k1, float* out) {
  const uint8_t* row = w.row(n);
  const float* s = w.row_scales(n);
  const float* o = w.row_offsets(n);
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group, end = std::min(k1, (g + 1) * w.group);
    const __m256 scale = _mm256_set1_ps(s[g]), offset = _mm256_set1_ps(o == nullptr ? 0.0f : o[g]);
    for (; k < end && (k & 7) != 0; ++k) out[k - k0] = weight_value(qvalue(w, n, k), s, o, g);
    for (; k + 8 <= end; k += 8) {
      __m256i q;
      if (w.bits == 8) {
        q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k)));
      } else {
        // k .. k + 7 lie in one half of block k / 64: bytes (k & 31) .., low nibbles below 32
        const __m256i b = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (k >> 6) * 32 + (k & 31))));
        q = _mm256_sub_epi32((k & 32) ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(15)),
                             _mm256_set1_epi32(8));
      }
      const __m256 v = _mm256_cvtepi32_ps(q);
      _mm256_storeu_ps(out + (k - k0), o == nullptr ? _mm256_mul_ps(v, scale) : _mm256_fmadd_ps(v, scale, offset));
    }
    for (; k < end; ++k) out[k - k0] = weight_value(qvalue(w, n, k), s, o, g);
  }
}

QUANT_AVX512 void to_f32_avx512(const void* src, int32_t dtype, int64_t n, float* dst) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    const __m256i v = _mm256_maskz_loadu_epi16(m, h + i);
    const __m512 f = dtype == ANYCHIP_DTYPE_FLOAT16
                         ? _mm512_cvtph_ps(v)
                         : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    _mm512_mask_storeu_ps(dst + i, m, f);
  }
}

QUANT_AVX512 void from_f32_avx512(const float* src, int64_t n, int32_t dtype, void* dst) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    const __m512 f = _mm512_maskz_loadu_ps(m, src + i);
    const __m256i v = dtype == ANYCHIP_DTYPE_FLOAT16 ? _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                                     : bf16x16(f);
    _mm256_mask_storeu_epi16(h + i, m, v);
  }
}

// 16 x 16 dwords in three rounds of 2 x 2 block swaps (32-bit, 64-bit, then 128-bit lanes twice).
QUANT_AVX512 void transpose16_avx512(const uint32_t* src, int64_t ld_src, uint32_t* dst, int64_t ld_dst) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ld_src);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4q + c] now holds, in 128-bit lane L, rows 4q..4q+3 of column 4L + c. Gathering lane L
  // of r[c], r[4 + c], r[8 + c], r[12 + c] into one vector gives column 4L + c.
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
    t[8 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
    r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * ld_dst, r[i]);
}

}  // namespace

void dequant_row(const QWeight& w, int64_t n, int64_t k0, int64_t k1, float* out, Isa isa) {
  if (isa == Isa::kAvx2) {
    dequant_row_avx2(w, n, k0, k1, out);
  } else if (!has_avx512(isa)) {
    dequant_row_scalar(w, n, k0, k1, out);
  } else {
    dequant_row_avx512(w, n, k0, k1, out);
  }
}

void to_f32(const void* src, int32_t dtype, int64_t n, float* dst, Isa isa) {
  if (dtype == ANYCHIP_DTYPE_FLOAT32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (has_avx512(isa)) {
    to_f32_avx512(src, dtype, n, dst);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = load_f32(src, dtype, i);
  }
}

void from_f32(const float* src, int64_t n, int32_t dtype, void* dst, Isa isa) {
  if (dtype == ANYCHIP_DTYPE_FLOAT32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (has_avx512(isa)) {
    from_f32_avx512(src, n, dtype, dst);
  } else if (dtype == ANYCHIP_DTYPE_BFLOAT16) {
    for (int64_t i = 0; i < n; ++i) static_cast<bf16*>(dst)[i] = from_float<bf16>(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) static_cast<fp16*>(dst)[i] = from_float<fp16>(src[i]);
  }
}

float load_f32(const void* src, int32_t dtype, int64_t i) {
  switch (dtype) {
    case ANYCHIP_DTYPE_BFLOAT16: return to_float(static_cast<const bf16*>(src)[i]);
    case ANYCHIP_DTYPE_FLOAT16: return to_float(static_cast<const fp16*>(src)[i]);
    default: return static_cast<const float*>(src)[i];
  }
}

void store_rows(const AnychipTensor& y, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                const float* acc, int64_t ldacc, const float* bias, Isa isa) {
  float tmp[128];
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < cols; c += 128) {
      const int64_t n = std::min<int64_t>(128, cols - c);
      const float* src = acc + i * ldacc + c;
      if (bias != nullptr) {
        for (int64_t j = 0; j < n; ++j) tmp[j] = src[j] + bias[c0 + c + j];
        src = tmp;
      }
      from_f32(src, n, y.dtype, at(y, (r0 + i) * ld + c0 + c), isa);
    }
  }
}

void transpose16(const uint32_t* src, int64_t ld_src, uint32_t* dst, int64_t ld_dst) {
  transpose16_avx512(src, ld_src, dst, ld_dst);
}

}  // namespace anychip::cpu::quant
