// gemm_int8x on AVX2 (quant.h): the batched x_int8 product for CPUs without AVX-512.
//
// gemv_int8x_avx2 puts k in the lanes and reads W once per 4 rows of x; each run of 32 k of a
// row of W and of x ends in a vpmaddwd, a conversion and an FMA. As in quant_gemm_int8x.cc the
// lanes here are columns of W instead (8 per vector, each dword lane four consecutive k of its
// column), so a 32-k piece is one run of x and one group of W for every lane: a panel of 8
// columns is transposed from W's rows once per call (pack_panel), or taken as it is from half
// of W's own 16-column panel form where the caller keeps one (unpack_panel), and every row of x
// sums each piece in integers over its 8 code vectors, then one conversion and one FMA by the 8
// columns' scales times the run's sx.
//
// 4 bits: vpmaddubsw of the codes q + 8 (unsigned) and x's four codes broadcast (signed), summed
// in int16 over the piece (at most 8 * 2 * 15 * 127 = 30480, no saturation), one vpmaddwd, and
// the piece's start: -8 times the sum of its x codes (pack_gemm_row).
// 8 bits: both operands are signed, so the panel holds |w| (unsigned) beside w, and x takes w's
// signs (vpsignb) before vpmaddubsw; a pair reaches 2 * 128 * 127, so each product is widened
// (vpmaddwd) before the next is added.
// W's offsets add their share (times x's group sums) after the pieces, as in gemm_int8x.
//
// SmolLM2's MLP weights ([1536, 576], Q4_1) times 16 rows of x, 2 AMD EPYC (Zen 4) cores capped
// to AVX2, calls alternated: 200 us per call here, 386 in gemv_int8x_avx2's tiles
// (weight_only_linear: quantizing x and the offsets included).
#include <algorithm>
#include <vector>

#include "quant.h"
#include "simd_avx2.h"

#define QUANT_AVX2 ANYCHIP_AVX2
#define QUANT_AVX2_INLINE ANYCHIP_AVX2 inline __attribute__((always_inline))

namespace anychip::cpu::quant {
namespace {

constexpr int64_t kCols = 8;    // columns of W per panel: one per dword lane
constexpr int kRows = 4;        // rows of x per pass over a piece: their sums stay in registers

// Dwords t = 0..7 of 8 columns' 32 bytes (column c's at col[c]) as 8 vectors, vector t holding
// column c's dword t in lane c: two 4 x 4 transposes per 128-bit half, then the halves paired.
QUANT_AVX2_INLINE void transpose_block(const uint8_t* const (&col)[8], __m256i (&out)[8]) {
  __m256i z[8], t[8], u[8];
  for (int c = 0; c < 8; ++c) z[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col[c]));
  for (int c = 0; c < 8; c += 2) {
    t[c] = _mm256_unpacklo_epi32(z[c], z[c + 1]);      // per half: c, c+1 of dwords 0, 1 (4, 5)
    t[c + 1] = _mm256_unpackhi_epi32(z[c], z[c + 1]);  // ... of dwords 2, 3 (6, 7)
  }
  for (int c = 0; c < 8; c += 4)
    for (int j = 0; j < 2; ++j) {
      u[c + 2 * j] = _mm256_unpacklo_epi64(t[c + j], t[c + j + 2]);      // c..c+3 of dword 2j (2j + 4)
      u[c + 2 * j + 1] = _mm256_unpackhi_epi64(t[c + j], t[c + j + 2]);  // ... of dword 2j + 1 (2j + 5)
    }
  // u[d] (d < 4): halves (columns 0-3, dword d), (0-3, d + 4); u[4 + d] the same for columns 4-7.
  for (int d = 0; d < 4; ++d) {
    out[d] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x20);
    out[d + 4] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x31);
  }
}

// One 32-byte unit of 8 columns (raw[t]: each column's dword t in its lane) into the panel's
// pieces: 4 bits, the low nibbles (piece 2u) and the high (2u + 1); 8 bits, piece u's codes
// then their absolute values (-128 becomes 128, unsigned).
template <int kBits>
QUANT_AVX2_INLINE void store_unit(const __m256i (&raw)[8], int64_t u, __m256i* panel) {
  if (kBits == 4) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i* lo = panel + 2 * u * 8;
    for (int t = 0; t < 8; ++t) {
      lo[t] = _mm256_and_si256(raw[t], low4);
      lo[8 + t] = _mm256_and_si256(_mm256_srli_epi16(raw[t], 4), low4);
    }
    return;
  }
  __m256i* piece = panel + u * 16;
  for (int t = 0; t < 8; ++t) {
    piece[t] = raw[t];
    piece[8 + t] = _mm256_abs_epi8(raw[t]);
  }
}

// Columns n .. n + 7 of W (`live` of them real; the others repeat column n) as a panel: for each
// 32-k piece p, 8 code vectors (vector t: each column's codes of k 32p + 4t .. + 3 in its lane),
// for 8 bits then 8 of their absolute values; scale_t[g][c] the scales, offset_t[g][c] the
// offsets (W with offsets). Read by every row of x from L1.
template <int kBits>
QUANT_AVX2 void pack_panel(const QWeight& w, int64_t n, int64_t live, __m256i* panel, float* scale_t,
                           float* offset_t) {
  panel_scales(w, n, live, kCols, scale_t, offset_t);
  const uint8_t* col[8];
  for (int c = 0; c < 8; ++c) col[c] = w.row(c < live ? n + c : n);
  const uint8_t* at[8];
  __m256i raw[8];
  for (int64_t u = 0; u < w.row_bytes() / 32; ++u) {
    for (int c = 0; c < 8; ++c) at[c] = col[c] + 32 * u;
    transpose_block(at, raw);
    store_unit<kBits>(raw, u, panel);
  }
}

// The same from W's panel form (QWeight::panels), n a multiple of 8: its 16-column panels hold
// these 8 columns' dwords in one half of every vector, already in place, and their scales and
// offsets in one half of each group's 16.
template <int kBits>
QUANT_AVX2 void unpack_panel(const QWeight& w, int64_t n, __m256i* panel, float* scale_t, float* offset_t) {
  const uint8_t* form = w.panels + (n / 16) * w.panel_bytes();
  const int64_t half = n % 16;  // 0 or 8: the first column's lane in the form
  const float* scales = reinterpret_cast<const float*>(form + 16 * w.row_bytes());
  for (int64_t g = 0; g < w.groups; ++g)
    for (int64_t c = 0; c < kCols; ++c) {
      scale_t[g * kCols + c] = scales[g * 16 + half + c];
      if (w.offsets != nullptr) offset_t[g * kCols + c] = scales[(w.groups + g) * 16 + half + c];
    }
  __m256i raw[8];
  for (int64_t u = 0; u < w.row_bytes() / 32; ++u) {
    for (int t = 0; t < 8; ++t)
      raw[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(form + u * 512 + t * 64 + 4 * half));
    store_unit<kBits>(raw, u, panel);
  }
}

// Rows i0 .. i0 + MR - 1 of x against a panel, into acc[i][8]: x.q, and for 4 bits each piece's
// sum start from x.row(i) (pack_gemm_row).
template <int kBits, int MR>
QUANT_AVX2 void rows(const QWeight& w, const XInt8& x, int64_t i0, const __m256i* panel, const float* scale_t,
                     const float* offset_t, float* acc) {
  constexpr int kStride = kBits == 4 ? 8 : 16;
  const int64_t runs = x.runs(), pieces = w.k / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 sum[MR];
  for (int i = 0; i < MR; ++i) sum[i] = _mm256_setzero_ps();
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t k0 = 32 * p, g = k0 / w.group, r = k0 / x.run;
    const __m256i* piece = panel + p * kStride;
    const int32_t* xq[MR];
    for (int i = 0; i < MR; ++i) xq[i] = reinterpret_cast<const int32_t*>(x.q.data() + (i0 + i) * w.k + k0);
    __m256i s[MR];
    if (kBits == 4) {
      __m256i pairs[MR];
      for (int i = 0; i < MR; ++i) pairs[i] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t) {
        const __m256i codes = _mm256_load_si256(piece + t);
        for (int i = 0; i < MR; ++i)
          pairs[i] = _mm256_add_epi16(pairs[i], _mm256_maddubs_epi16(codes, _mm256_set1_epi32(xq[i][t])));
      }
      for (int i = 0; i < MR; ++i)
        s[i] = _mm256_add_epi32(_mm256_madd_epi16(pairs[i], ones),
                                _mm256_set1_epi32(reinterpret_cast<const int32_t*>(x.row(i0 + i))[p]));
    } else {
      for (int i = 0; i < MR; ++i) s[i] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t) {
        const __m256i codes = _mm256_load_si256(piece + t), magnitudes = _mm256_load_si256(piece + 8 + t);
        for (int i = 0; i < MR; ++i) {
          const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(xq[i][t]), codes);
          s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes, signed_x), ones));
        }
      }
    }
    const __m256 sw = _mm256_loadu_ps(scale_t + g * kCols);
    for (int i = 0; i < MR; ++i)
      sum[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(sw, _mm256_set1_ps(x.scale[(i0 + i) * runs + r])),
                               sum[i]);
  }
  if (w.offsets != nullptr)
    for (int64_t g = 0; g < w.groups; ++g) {
      const __m256 off = _mm256_loadu_ps(offset_t + g * kCols);
      for (int i = 0; i < MR; ++i)
        sum[i] = _mm256_fmadd_ps(off, _mm256_set1_ps(x.sums[(i0 + i) * w.groups + g]), sum[i]);
    }
  for (int i = 0; i < MR; ++i) _mm256_storeu_ps(acc + (i0 + i) * kCols, sum[i]);
}

template <int kBits>
QUANT_AVX2 void tile(const QWeight& w, const XInt8& x, int64_t n, int64_t live, bool from_panels, __m256i* panel,
                     float* scale_t, float* offset_t, float* acc, float* y, int64_t ldy) {
  if (from_panels) {
    unpack_panel<kBits>(w, n, panel, scale_t, offset_t);
  } else {
    pack_panel<kBits>(w, n, live, panel, scale_t, offset_t);
    prefetch_next_panel(w, n, kCols);
  }
  row_blocks<kRows>(x.m, [&](auto mr, int64_t i0) { rows<kBits, decltype(mr)::value>(w, x, i0, panel, scale_t, offset_t, acc); });
  for (int64_t i = 0; i < x.m; ++i)
    _mm256_maskstore_ps(y + i * ldy + n, avx2::lanes8(static_cast<int>(live)), _mm256_loadu_ps(acc + i * kCols));
}

}  // namespace

QUANT_AVX2 void gemm_int8x_avx2(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  std::vector<float> acc(static_cast<size_t>(x.m * kCols)), scale_t(static_cast<size_t>(w.groups * kCols));
  std::vector<float> offset_t(static_cast<size_t>(w.offsets != nullptr ? w.groups * kCols : 0));
  std::vector<uint8_t> bytes(static_cast<size_t>(w.k / 32 * 16 * 32 + 32));
  auto* panel = reinterpret_cast<__m256i*>((reinterpret_cast<uintptr_t>(bytes.data()) + 31) & ~uintptr_t{31});
  const bool from_panels = w.panels != nullptr && n0 % kCols == 0;
  for (int64_t n = n0; n < n1; n += kCols) {
    const int64_t live = std::min(kCols, n1 - n);
    if (w.bits == 4) {
      tile<4>(w, x, n, live, from_panels, panel, scale_t.data(), offset_t.data(), acc.data(), y, ldy);
    } else {
      tile<8>(w, x, n, live, from_panels, panel, scale_t.data(), offset_t.data(), acc.data(), y, ldy);
    }
  }
}

}  // namespace anychip::cpu::quant
