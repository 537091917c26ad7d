// AVX-512 pieces of the quantized-linear kernels. Functions here may only be called from code
// compiled with QUANT_AVX512 (or QUANT_AMX), and only when isa() allows it.
#pragma once

// GCC 12 reports the intrinsics' own `__Y = __Y` placeholders as uninitialised (PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "quant.h"

#define QUANT_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,fma,f16c")))
#define QUANT_AMX \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,fma,f16c,amx-tile,amx-bf16,amx-int8")))

namespace anychip::cpu::quant {

// Lanes [0, n) of 16.
inline __mmask16 lanes16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
}
inline __mmask64 lanes64(int64_t n) {
  return n >= 64 ? ~__mmask64(0) : n <= 0 ? __mmask64(0) : (__mmask64(1) << n) - 1u;
}

// Each GEMV accumulator acc[i][r] (row i of x, row n + r of W) reduced into y, added to what y
// holds unless this is the first pass over the columns.
template <int MR, int NR>
QUANT_AVX512 inline void store_sums(const __m512 (&acc)[MR][NR], int64_t n, float* y, int64_t ldy, bool first) {
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) {
      const float sum = _mm512_reduce_add_ps(acc[i][r]);
      y[i * ldy + n + r] = first ? sum : y[i * ldy + n + r] + sum;
    }
}

// The 16 values a 4-bit code stands for (code - 8), as vpermps indexes them.
QUANT_AVX512 inline __m512 nibble_values() {
  return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}

// The 16 codes of a 4-bit row at k, k + 16 (k a multiple of 16) looked up in `table`
// (nibble_values() times the group's scale). vpermps reads only the low 4 bits of each index,
// so the low nibble needs no mask.
QUANT_AVX512 inline __m512 nibbles16(const uint8_t* row, int64_t k, __m512 table) {
  const uint8_t* p = row + (k >> 6) * 32 + (k & 16);
  __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  if (k & 32) d = _mm512_srli_epi32(d, 4);
  return _mm512_permutexvar_ps(d, table);
}

// Round half away from zero, as round_half_away().
QUANT_AVX512 inline __m512 round_half_away16(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(v, t);
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 r = _mm512_mask_add_ps(t, _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ), t, one);
  return _mm512_mask_sub_ps(r, _mm512_cmp_ps_mask(f, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), r, one);
}

// float32 -> bf16, round to nearest even with NaNs kept quiet, bit for bit as from_float<bf16>.
QUANT_AVX512 inline __m256i bf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

// GCC 12's tile intrinsics do not tell the compiler what memory they read (_tile_loadconfig
// claims 8 bytes, _tile_loadd none), so stores to it could be dropped or sunk past them: put
// this between writing a buffer and loading tiles from it.
#define QUANT_TILE_BARRIER() asm volatile("" ::: "memory")

// Configures `tiles` AMX tiles as 16 rows each, tile t `colsb(t)` bytes wide (default: all eight
// 64 bytes wide). Each thread loads it before its first tile instruction and releases the tiles
// (_tile_release) when done.
template <typename ColumnBytes>
QUANT_AMX inline void load_tile_config(int tiles, ColumnBytes colsb) {
  struct alignas(64) {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < tiles; ++t) {
    cfg.colsb[t] = static_cast<uint16_t>(colsb(t));
    cfg.rows[t] = 16;
  }
  asm volatile("ldtilecfg %0" ::"m"(cfg));
}
QUANT_AMX inline void load_tile_config() {
  load_tile_config(8, [](int) { return 64; });
}

}  // namespace anychip::cpu::quant
