// Decode-sized weight-only products (M <= kGemvRows rows of x): the weights are read once and
// dequantized in registers. With one or two rows of x this runs at the memory bandwidth; from
// three rows on, float32 FMAs are the limit (bf16 x on AMX goes to quant_gemv_amx.cc instead).
//
// 4 bits: one 32-byte block gives 64 consecutive k. Its bytes are widened to dwords twice
// (bytes 0-15, 16-31); vpermps looks up the low nibbles directly (it reads 4 index bits) and the
// high nibbles after a shift, in a 16-entry table holding (code - 8) * scale of the group.
#include <algorithm>
#include <vector>

#include "quant.h"
#include "quant_simd.h"

#define QUANT_INLINE QUANT_AVX512 inline __attribute__((always_inline))

namespace anychip::cpu::quant {
namespace {

// A tile reads NR rows side by side, which the hardware prefetcher follows poorly; so each
// tile prefetches, at its own pace, the same columns of the rows two tiles ahead into L2, and
// its own rows a few blocks ahead from L2 into L1.
constexpr int64_t kPrefetchTiles = 2;
constexpr int64_t kPrefetchNear = 512;  // bytes

template <int NR>
QUANT_INLINE void prefetch_rows(const uint8_t* const (&ahead)[NR], const uint8_t* const (&row)[NR], int64_t offset) {
  for (int r = 0; r < NR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(ahead[r] + offset), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(row[r] + offset + kPrefetchNear), _MM_HINT_T0);
  }
}

// x stays in L1 while a tile runs: the columns are done in chunks, the tiles adding each chunk's
// sums to y; with more rows of x than this many floats' worth, each chunk over all rows in turn.
constexpr int64_t kL1Floats = 8192;

// ---- scalar ------------------------------------------------------------------------------------

void gemv_scalar(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.k));
  for (int64_t n = n0; n < n1; ++n) {
    dequant_row(w, n, 0, w.k, row.data(), Isa::kScalar);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * w.k;
      float acc = 0.0f;
      for (int64_t k = 0; k < w.k; ++k) acc += xi[k] * row[k];
      y[i * ldy + n] = acc;
    }
  }
}

void gemv_grad_scalar(const QWeight& w, const float* dy, int64_t m, int64_t k0, int64_t k1, float* acc,
                      int64_t ldacc, float* row) {
  const int64_t kc = k1 - k0;
  for (int64_t n = 0; n < w.n; ++n) {
    dequant_row(w, n, k0, k1, row, Isa::kScalar);
    for (int64_t i = 0; i < m; ++i) {
      const float c = dy[i * w.n + n];
      float* a = acc + i * ldacc;
      for (int64_t k = 0; k < kc; ++k) a[k] += c * row[k];
    }
  }
}

// ---- AVX-512 -----------------------------------------------------------------------------------

template <int MR, int NR>
QUANT_INLINE void fma_step(__m512 (&acc)[MR][NR], const __m512 (&wv)[NR], const float* x, int64_t ldx) {
  for (int i = 0; i < MR; ++i) {
    const __m512 xv = _mm512_loadu_ps(x + i * ldx);
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_fmadd_ps(xv, wv[r], acc[i][r]);
  }
}

template <int MR, int NR>
QUANT_INLINE void lookup_step(__m512 (&acc)[MR][NR], const __m512i (&codes)[NR], const __m512 (&table)[NR],
                              const float* x, int64_t ldx) {
  __m512 wv[NR];
  for (int r = 0; r < NR; ++r) wv[r] = _mm512_permutexvar_ps(codes[r], table[r]);
  fma_step<MR, NR>(acc, wv, x, ldx);
}

// The scales (and offsets, 0 without them) of the group starting at k, and where the next one
// starts.
template <int NR>
struct Groups {
  const float* sc[NR];
  const float* off[NR];
  int64_t group, g, next;

  Groups(const QWeight& w, int64_t n, int64_t k) : group(w.group), g(k / w.group), next((k / w.group + 1) * w.group) {
    for (int r = 0; r < NR; ++r) {
      sc[r] = w.row_scales(n + r);
      off[r] = w.row_offsets(n + r);
    }
  }
  float scale(int r) const { return sc[r][g]; }
  float offset(int r) const { return off[r] == nullptr ? 0.0f : off[r][g]; }
  bool advance(int64_t k) {  // true when k opens a new group
    if (k != next) return false;
    ++g;
    next += group;
    return true;
  }
};

template <int NR>
QUANT_INLINE void make_tables(const Groups<NR>& groups, __m512 (&table)[NR]) {
  for (int r = 0; r < NR; ++r)
    table[r] = _mm512_fmadd_ps(nibble_values(), _mm512_set1_ps(groups.scale(r)), _mm512_set1_ps(groups.offset(r)));
}

template <int NR>
QUANT_INLINE void broadcast_groups(const Groups<NR>& groups, __m512 (&scale)[NR], __m512 (&offset)[NR]) {
  for (int r = 0; r < NR; ++r) {
    scale[r] = _mm512_set1_ps(groups.scale(r));
    offset[r] = _mm512_set1_ps(groups.offset(r));
  }
}

// 16 columns from k (codes in the low 4 bits of each dword).
template <int MR, int NR, bool kSmallGroups>
QUANT_INLINE void step4(__m512 (&acc)[MR][NR], const __m512i (&codes)[NR], __m512 (&table)[NR], Groups<NR>& groups,
                        const float* x, int64_t k, int64_t ldx) {
  if (kSmallGroups && groups.advance(k)) make_tables(groups, table);
  lookup_step<MR, NR>(acc, codes, table, x + k, ldx);
}

// Rows n .. n + NR - 1 of 4-bit W against MR rows of x over the blocks [b0, b1) (64 k each).
// The group size is a multiple of 16; kSmallGroups: not of 64, so groups change inside blocks.
template <int MR, int NR, bool kSmallGroups>
QUANT_AVX512 void gemv4_tile(const QWeight& w, const float* x, int64_t n, int64_t b0, int64_t b1, float* y,
                             int64_t ldy, bool first) {
  const uint8_t* row[NR];
  const uint8_t* ahead[NR];
  for (int r = 0; r < NR; ++r) {
    row[r] = w.row(n + r);
    ahead[r] = w.row(std::min(n + r + kPrefetchTiles * NR, w.n - 1));
  }
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
  Groups<NR> groups(w, n, 64 * b0);
  __m512 table[NR];
  make_tables(groups, table);
  for (int64_t b = b0; b < b1; ++b) {
    if (!kSmallGroups && groups.advance(64 * b)) make_tables(groups, table);
    if ((b & 1) == 0) prefetch_rows<NR>(ahead, row, 32 * b);
    __m512i lo[NR], hi[NR];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* p = row[r] + 32 * b;
      lo[r] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      hi[r] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    }
    step4<MR, NR, kSmallGroups>(acc, lo, table, groups, x, 64 * b, w.k);
    step4<MR, NR, kSmallGroups>(acc, hi, table, groups, x, 64 * b + 16, w.k);
    for (int r = 0; r < NR; ++r) {
      lo[r] = _mm512_srli_epi32(lo[r], 4);
      hi[r] = _mm512_srli_epi32(hi[r], 4);
    }
    step4<MR, NR, kSmallGroups>(acc, lo, table, groups, x, 64 * b + 32, w.k);
    step4<MR, NR, kSmallGroups>(acc, hi, table, groups, x, 64 * b + 48, w.k);
  }
  store_sums<MR, NR>(acc, n, y, ldy, first);
}

// As gemv4_tile for 8 bits over the columns [k0, k1); the group size is a multiple of 16.
template <int MR, int NR>
QUANT_AVX512 void gemv8_tile(const QWeight& w, const float* x, int64_t n, int64_t k0, int64_t k1, float* y,
                             int64_t ldy, bool first) {
  const uint8_t* row[NR];
  const uint8_t* ahead[NR];
  for (int r = 0; r < NR; ++r) {
    row[r] = w.row(n + r);
    ahead[r] = w.row(std::min(n + r + kPrefetchTiles * NR, w.n - 1));
  }
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
  Groups<NR> groups(w, n, k0);
  __m512 scale[NR];
  for (int r = 0; r < NR; ++r) scale[r] = _mm512_set1_ps(groups.scale(r));
  for (int64_t k = k0; k < k1; k += 16) {
    if (groups.advance(k))
      for (int r = 0; r < NR; ++r) scale[r] = _mm512_set1_ps(groups.scale(r));
    if ((k & 63) == 0) prefetch_rows<NR>(ahead, row, k);
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) {
      const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + k)));
      wv[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale[r]);
    }
    fma_step<MR, NR>(acc, wv, x + k, w.k);
  }
  store_sums<MR, NR>(acc, n, y, ldy, first);
}

template <int MR, int NR, bool kSmallGroups>
QUANT_AVX512 void gemv_cols(const QWeight& w, const float* x, int64_t n0, int64_t n1, int64_t k0, int64_t k1,
                            float* y, int64_t ldy) {
  const bool first = k0 == 0;
  int64_t n = n0;
  if (w.bits == 4) {
    for (; n + NR <= n1; n += NR) gemv4_tile<MR, NR, kSmallGroups>(w, x, n, k0 / 64, k1 / 64, y, ldy, first);
    for (; n < n1; ++n) gemv4_tile<MR, 1, kSmallGroups>(w, x, n, k0 / 64, k1 / 64, y, ldy, first);
  } else {
    for (; n + NR <= n1; n += NR) gemv8_tile<MR, NR>(w, x, n, k0, k1, y, ldy, first);
    for (; n < n1; ++n) gemv8_tile<MR, 1>(w, x, n, k0, k1, y, ldy, first);
  }
}

template <int MR, int NR>
void gemv_rows(const QWeight& w, const float* x, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  // The same k chunks whatever MR, so that a row's sums, and so its result, do not depend on how
  // many rows come with it (a decode batch gives each sequence the logits it gets alone).
  const int64_t chunk = std::max<int64_t>(64, kL1Floats / kGemvRows / 64 * 64);
  const bool small_groups = w.bits == 4 && w.group % 64 != 0;
  auto columns = [&](int64_t na, int64_t nb, int64_t k0) {
    const int64_t k1 = std::min(w.k, k0 + chunk);
    if (small_groups) {
      gemv_cols<MR, NR, true>(w, x, na, nb, k0, k1, y, ldy);
    } else {
      gemv_cols<MR, NR, false>(w, x, na, nb, k0, k1, y, ldy);
    }
  };
  if (MR * w.k <= kL1Floats) {
    // All of x fits in L1: each tile takes its chunks in turn, so W streams front to back (the
    // chunk-major order below revisits every row once per chunk: 12 -> 15 GB/s at M = 1).
    for (int64_t n = n0; n < n1; n += NR)
      for (int64_t k0 = 0; k0 < w.k; k0 += chunk) columns(n, std::min(n1, n + NR), k0);
  } else {
    for (int64_t k0 = 0; k0 < w.k; k0 += chunk) columns(n0, n1, k0);
  }
}

// Any group size: each row dequantized into a buffer first.
QUANT_AVX512 void gemv_any_group(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y,
                                 int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.k));
  for (int64_t n = n0; n < n1; ++n) {
    dequant_row(w, n, 0, w.k, row.data(), Isa::kAvx512);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * w.k;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t k = 0; k < w.k; k += 16) {
        const __mmask16 lane = lanes16(w.k - k);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lane, xi + k), _mm512_maskz_loadu_ps(lane, row.data() + k), acc);
      }
      y[i * ldy + n] = _mm512_reduce_add_ps(acc);
    }
  }
}

void gemv_avx512(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (w.group % 16 != 0) return gemv_any_group(w, x, m, n0, n1, y, ldy);
  // Accumulators: MR x NR vectors, at most 16 so that codes, tables and x stay in registers.
  switch (m) {
    case 1: return gemv_rows<1, 4>(w, x, n0, n1, y, ldy);
    case 2: return gemv_rows<2, 4>(w, x, n0, n1, y, ldy);
    case 3: return gemv_rows<3, 2>(w, x, n0, n1, y, ldy);
    case 4: return gemv_rows<4, 2>(w, x, n0, n1, y, ldy);
    case 5: return gemv_rows<5, 2>(w, x, n0, n1, y, ldy);
    case 6: return gemv_rows<6, 2>(w, x, n0, n1, y, ldy);
    case 7: return gemv_rows<7, 2>(w, x, n0, n1, y, ldy);
    default: return gemv_rows<8, 2>(w, x, n0, n1, y, ldy);
  }
}

// ---- AVX-512, grad: acc[i][k] += sum_n dy[i][n] W[n][k], the same tiles turned around ---------

// acc[i][k .. k + 16) += sum_r c[i][r] wv[r].
template <int MR, int NR>
QUANT_INLINE void axpy_step(float* acc, int64_t ldacc, const __m512 (&c)[MR][NR], const __m512 (&wv)[NR]) {
  for (int i = 0; i < MR; ++i) {
    __m512 a = _mm512_loadu_ps(acc + i * ldacc);
    for (int r = 0; r < NR; ++r) a = _mm512_fmadd_ps(c[i][r], wv[r], a);
    _mm512_storeu_ps(acc + i * ldacc, a);
  }
}

template <int MR, int NR, bool kSmallGroups>
QUANT_INLINE void grad_step4(float* acc, int64_t ldacc, const __m512 (&c)[MR][NR], const __m512i (&codes)[NR],
                             __m512 (&table)[NR], Groups<NR>& groups, int64_t k) {
  if (kSmallGroups && groups.advance(k)) make_tables(groups, table);
  __m512 wv[NR];
  for (int r = 0; r < NR; ++r) wv[r] = _mm512_permutexvar_ps(codes[r], table[r]);
  axpy_step<MR, NR>(acc, ldacc, c, wv);
}

template <int MR, int NR>
QUANT_INLINE void coefficients(const float* dy, int64_t ldy, int64_t n, __m512 (&c)[MR][NR]) {
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) c[i][r] = _mm512_set1_ps(dy[i * ldy + n + r]);
}

// Rows n .. n + NR - 1 of 4-bit W into the columns [64 b0, 64 b1) of acc (acc points at 64 b0).
template <int MR, int NR, bool kSmallGroups>
QUANT_AVX512 void grad4_tile(const QWeight& w, const float* dy, int64_t n, int64_t b0, int64_t b1, float* acc,
                             int64_t ldacc) {
  const uint8_t* row[NR];
  const uint8_t* ahead[NR];
  for (int r = 0; r < NR; ++r) {
    row[r] = w.row(n + r);
    ahead[r] = w.row(std::min(n + r + kPrefetchTiles * NR, w.n - 1));
  }
  __m512 c[MR][NR];
  coefficients<MR, NR>(dy, w.n, n, c);
  Groups<NR> groups(w, n, 64 * b0);
  __m512 table[NR];
  make_tables(groups, table);
  for (int64_t b = b0; b < b1; ++b) {
    if (!kSmallGroups && groups.advance(64 * b)) make_tables(groups, table);
    if ((b & 1) == 0) prefetch_rows<NR>(ahead, row, 32 * b);
    __m512i lo[NR], hi[NR];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* p = row[r] + 32 * b;
      lo[r] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      hi[r] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    }
    float* a = acc + 64 * (b - b0);
    grad_step4<MR, NR, kSmallGroups>(a, ldacc, c, lo, table, groups, 64 * b);
    grad_step4<MR, NR, kSmallGroups>(a + 16, ldacc, c, hi, table, groups, 64 * b + 16);
    for (int r = 0; r < NR; ++r) {
      lo[r] = _mm512_srli_epi32(lo[r], 4);
      hi[r] = _mm512_srli_epi32(hi[r], 4);
    }
    grad_step4<MR, NR, kSmallGroups>(a + 32, ldacc, c, lo, table, groups, 64 * b + 32);
    grad_step4<MR, NR, kSmallGroups>(a + 48, ldacc, c, hi, table, groups, 64 * b + 48);
  }
}

// As grad4_tile for 8 bits over the columns [k0, k1); the group size is a multiple of 16.
template <int MR, int NR>
QUANT_AVX512 void grad8_tile(const QWeight& w, const float* dy, int64_t n, int64_t k0, int64_t k1, float* acc,
                             int64_t ldacc) {
  const uint8_t* row[NR];
  const uint8_t* ahead[NR];
  for (int r = 0; r < NR; ++r) {
    row[r] = w.row(n + r);
    ahead[r] = w.row(std::min(n + r + kPrefetchTiles * NR, w.n - 1));
  }
  __m512 c[MR][NR];
  coefficients<MR, NR>(dy, w.n, n, c);
  Groups<NR> groups(w, n, k0);
  __m512 scale[NR], offset[NR];
  broadcast_groups(groups, scale, offset);
  for (int64_t k = k0; k < k1; k += 16) {
    if (groups.advance(k)) broadcast_groups(groups, scale, offset);
    if ((k & 63) == 0) prefetch_rows<NR>(ahead, row, k);
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) {
      const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + k)));
      wv[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), scale[r], offset[r]);
    }
    axpy_step<MR, NR>(acc + (k - k0), ldacc, c, wv);
  }
}

template <int MR, int NR, bool kSmallGroups>
QUANT_AVX512 void grad_rows(const QWeight& w, const float* dy, int64_t k0, int64_t k1, float* acc, int64_t ldacc) {
  int64_t n = 0;
  if (w.bits == 4) {
    for (; n + NR <= w.n; n += NR) grad4_tile<MR, NR, kSmallGroups>(w, dy, n, k0 / 64, k1 / 64, acc, ldacc);
    for (; n < w.n; ++n) grad4_tile<MR, 1, kSmallGroups>(w, dy, n, k0 / 64, k1 / 64, acc, ldacc);
  } else {
    for (; n + NR <= w.n; n += NR) grad8_tile<MR, NR>(w, dy, n, k0, k1, acc, ldacc);
    for (; n < w.n; ++n) grad8_tile<MR, 1>(w, dy, n, k0, k1, acc, ldacc);
  }
}

template <int MR, int NR>
void grad_groups(const QWeight& w, const float* dy, int64_t k0, int64_t k1, float* acc, int64_t ldacc) {
  if (w.bits == 4 && w.group % 64 != 0) {
    grad_rows<MR, NR, true>(w, dy, k0, k1, acc, ldacc);
  } else {
    grad_rows<MR, NR, false>(w, dy, k0, k1, acc, ldacc);
  }
}

// Any group size: four rows of W at a time dequantized into scratch, then acc += dy W.
QUANT_AVX512 void gemv_grad_any_group(const QWeight& w, const float* dy, int64_t m, int64_t k0, int64_t k1, float* acc,
                                   int64_t ldacc, float* scratch) {
  const int64_t kc = k1 - k0;
  for (int64_t n = 0; n < w.n; n += 4) {
    const int64_t nr = std::min<int64_t>(4, w.n - n);
    for (int64_t r = 0; r < nr; ++r) dequant_row(w, n + r, k0, k1, scratch + r * kc, Isa::kAvx512);
    const float* wr[4];
    for (int64_t r = 0; r < 4; ++r) wr[r] = scratch + (r < nr ? r : 0) * kc;
    for (int64_t i = 0; i < m; ++i) {
      __m512 c[4];
      for (int64_t r = 0; r < 4; ++r) c[r] = _mm512_set1_ps(r < nr ? dy[i * w.n + n + r] : 0.0f);
      float* a = acc + i * ldacc;
      for (int64_t k = 0; k < kc; k += 16) {
        const __mmask16 lane = lanes16(kc - k);
        __m512 v = _mm512_maskz_loadu_ps(lane, a + k);
        v = _mm512_fmadd_ps(c[0], _mm512_maskz_loadu_ps(lane, wr[0] + k), v);
        v = _mm512_fmadd_ps(c[1], _mm512_maskz_loadu_ps(lane, wr[1] + k), v);
        v = _mm512_fmadd_ps(c[2], _mm512_maskz_loadu_ps(lane, wr[2] + k), v);
        v = _mm512_fmadd_ps(c[3], _mm512_maskz_loadu_ps(lane, wr[3] + k), v);
        _mm512_mask_storeu_ps(a + k, lane, v);
      }
    }
  }
}


void gemv_grad_avx512(const QWeight& w, const float* dy, int64_t m, int64_t k0, int64_t k1, float* acc, int64_t ldacc,
                      float* scratch) {
  if (w.group % 16 != 0 || m > kGemvRows) return gemv_grad_any_group(w, dy, m, k0, k1, acc, ldacc, scratch);
  // Coefficients MR x NR and NR tables stay in registers.
  switch (m) {
    case 1: return grad_groups<1, 4>(w, dy, k0, k1, acc, ldacc);
    case 2: return grad_groups<2, 4>(w, dy, k0, k1, acc, ldacc);
    case 3: return grad_groups<3, 4>(w, dy, k0, k1, acc, ldacc);
    case 4: return grad_groups<4, 2>(w, dy, k0, k1, acc, ldacc);
    case 5: return grad_groups<5, 2>(w, dy, k0, k1, acc, ldacc);
    case 6: return grad_groups<6, 2>(w, dy, k0, k1, acc, ldacc);
    case 7: return grad_groups<7, 2>(w, dy, k0, k1, acc, ldacc);
    default: return grad_groups<8, 2>(w, dy, k0, k1, acc, ldacc);
  }
}

}  // namespace

void gemv(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy, Isa isa) {
  const QWeight sym = w.symmetric();
  if (isa == Isa::kAvx2) {
    gemv_avx2(sym, x, m, n0, n1, y, ldy);
  } else if (!has_avx512(isa)) {
    gemv_scalar(sym, x, m, n0, n1, y, ldy);
  } else {
    gemv_avx512(sym, x, m, n0, n1, y, ldy);
  }
}

void gemv_grad(const QWeight& w, const float* dy, int64_t m, int64_t k0, int64_t k1, float* acc, int64_t ldacc,
               float* scratch, Isa isa) {
  if (!has_avx512(isa)) {
    gemv_grad_scalar(w, dy, m, k0, k1, acc, ldacc, scratch);
  } else {
    gemv_grad_avx512(w, dy, m, k0, k1, acc, ldacc, scratch);
  }
}

}  // namespace anychip::cpu::quant
