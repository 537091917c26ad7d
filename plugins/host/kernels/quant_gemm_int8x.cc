// gemv_int8x for several rows of x (quant.h): a small GEMM that sums in int32 as long as the
// scales allow, so that its float work does not grow with the products.
//
// gemv_int8x's AVX-512 tiles put k in the lanes: each vpdpbusd's lanes belong to different runs
// of x and groups of W, so every one of them is followed by a conversion, a product of the two
// scales and an FMA. At 16 rows of x that float work bounds it near float32-FMA speed.
//
// Here the lanes are 16 columns of W (rows n .. n + 15), each dword lane four consecutive k of
// its column, so a 32-k piece is one run of x and one group of W for every lane. A tile first
// packs its 16 columns into a panel (pack_panel): each piece as 8 code vectors, transposed from
// the columns' bytes with shuffles (hardware gathers instead: 1.5x slower at 16 rows). Then rows
// of x go through it in blocks of 8 (rows): for each row and piece, 8 vpdpbusd (x's four codes
// broadcast) sum in one int32 vector, then one conversion and one FMA by the 16 columns' scales
// times the run's sx. The weights are read and unpacked once for all rows of x.
// Where the caller keeps W's panel form (QWeight::panels: kernel.h's decoder_step), the rows
// read it in place instead (panel_tile): the codes already in this order, the two nibbles of a
// byte split as each vector is loaded, the scales and offsets laid out by group. Gathering the
// panels from W's rows at every step took 17% of a 16-request SmolLM2 decode step.
//
// SmolLM2's MLP weights ([1536, 576], Q4_1) times 16 rows of x, 2 AMD EPYC (Zen 4) cores:
// 135-157 GMAC/s here, 74 in gemv_int8x's tiles (33 at one row, where reading W bounds both).
//
// 4 bits: the codes are stored q + 8 (unsigned): each piece's sum starts at -8 times the sum of
// its x codes. 8 bits: the codes are signed, so x + 128 is the unsigned operand and each
// column's sum starts at -128 times the sum of its codes (in the panel, once for all rows).
// quantize_x lays out each row of x for this (pack_gemm_row): the starts, or x + 128.
// W's offsets (GGUF's Q4_1 minimum) add their share, the offsets times x's group sums, to each
// row's sums after its pieces, in the same pass (a pass of its own over y took 8% of a
// 16-request decode step).
// Integer sums are exact, so a result differs from gemv_int8x's only in float rounding: the
// pieces are added one after another here, lane by lane there.
#include <algorithm>
#include <vector>

#include "quant.h"
#include "quant_simd.h"

namespace anychip::cpu::quant {
namespace {

constexpr int64_t kCols = 16;  // columns of W per tile: one per lane
constexpr int64_t kBlock = 64;  // 4 bits: k per transposed block, 32 bytes of each column

// Dwords t = 0..7 of 16 columns' blocks (column c's 32 bytes at col[c]) as 8 vectors, vector t
// holding column c's dword t in lane c: two 8 x 8 transposes side by side (columns 0-7 in the
// low halves, 8-15 in the high), then each vector's four 128-bit lanes put in column order.
QUANT_AVX512 inline void transpose_block(const uint8_t* const (&col)[16], __m512i (&out)[8]) {
  __m512i z[8], t[8], u[8];
  for (int c = 0; c < 8; ++c)
    z[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col[c]))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col[c + 8])), 1);
  for (int c = 0; c < 8; c += 2) {
    t[c] = _mm512_unpacklo_epi32(z[c], z[c + 1]);      // per 128-bit lane: c, c+1 of dwords 0, 1 (4, 5)
    t[c + 1] = _mm512_unpackhi_epi32(z[c], z[c + 1]);  // ... of dwords 2, 3 (6, 7)
  }
  for (int c = 0; c < 8; c += 4)
    for (int j = 0; j < 2; ++j) {
      u[c + 2 * j] = _mm512_unpacklo_epi64(t[c + j], t[c + j + 2]);      // c..c+3 of dword 2j (2j + 4)
      u[c + 2 * j + 1] = _mm512_unpackhi_epi64(t[c + j], t[c + j + 2]);  // ... of dword 2j + 1 (2j + 5)
    }
  // u[d] (d < 4): 128-bit lanes (columns 0-3, dword d), (0-3, d + 4), (8-11, d), (8-11, d + 4);
  // u[4 + d] the same for columns 4-7 and 12-15.
  const __m512i first = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), second = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  for (int d = 0; d < 4; ++d) {
    out[d] = _mm512_permutex2var_epi64(u[d], first, u[4 + d]);
    out[d + 4] = _mm512_permutex2var_epi64(u[d], second, u[4 + d]);
  }
}

// -128 times each column's sum of codes of every 32-k piece (8 bits: x + 128 is the unsigned
// operand, so each column's sum starts there), from the panel's codes, 8 vectors a piece.
QUANT_AVX512 void piece_starts(const __m512i* codes, int64_t pieces, __m512i* starts) {
  const __m512i x_offset = _mm512_set1_epi8(static_cast<char>(128));
  for (int64_t p = 0; p < pieces; ++p) {
    __m512i start = _mm512_setzero_si512();
    for (int t = 0; t < 8; ++t) start = _mm512_dpbusd_epi32(start, x_offset, _mm512_loadu_si512(codes + 8 * p + t));
    starts[p] = _mm512_sub_epi32(_mm512_setzero_si512(), start);
  }
}

// Columns n .. n + 15 of W (`live` of them real; the others repeat column n) as a panel: for each
// 32-k piece p, 8 code vectors (vector t: each column's codes of k 32p + 4t .. + 3 in its lane);
// for 8 bits the pieces' starts (piece_starts); scale_t[g][c] the scales, offset_t[g][c] the
// offsets (W with offsets). Built once per tile, read by every block of rows from L1.
template <int kBits>
QUANT_AVX512 void pack_panel(const QWeight& w, int64_t n, int64_t live, __m512i* panel, __m512i* starts,
                             float* scale_t, float* offset_t) {
  panel_scales(w, n, live, kCols, scale_t, offset_t);
  const uint8_t* col[16];
  for (int c = 0; c < 16; ++c) col[c] = w.row(c < live ? n + c : n);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const uint8_t* at[16];
  __m512i raw[8];
  if (kBits == 4) {
    for (int64_t k = 0; k < w.k; k += kBlock) {  // a block of 64 k: pieces p (low nibbles), p + 1 (high)
      for (int c = 0; c < 16; ++c) at[c] = col[c] + k / 2;
      transpose_block(at, raw);
      __m512i* lo = panel + (k / 32) * 8;
      for (int t = 0; t < 8; ++t) {
        lo[t] = _mm512_and_si512(raw[t], low4);
        lo[8 + t] = _mm512_and_si512(_mm512_srli_epi16(raw[t], 4), low4);
      }
    }
    return;
  }
  for (int64_t k = 0; k < w.k; k += 32) {
    for (int c = 0; c < 16; ++c) at[c] = col[c] + k;
    transpose_block(at, raw);
    std::copy(raw, raw + 8, panel + (k / 32) * 8);
  }
  piece_starts(panel, w.k / 32, starts);
}

// W's offsets' share of rows i0 .. i0 + MR - 1: the offsets times x's group sums (W with offsets).
template <int MR>
QUANT_AVX512 inline void add_offsets_rows(const QWeight& w, const XInt8& x, int64_t i0, const float* offset_t,
                                          __m512 (&sum)[MR]) {
  if (w.offsets == nullptr) return;
  for (int64_t g = 0; g < w.groups; ++g) {
    const __m512 off = _mm512_loadu_ps(offset_t + g * kCols);
    for (int i = 0; i < MR; ++i) sum[i] = _mm512_fmadd_ps(off, _mm512_set1_ps(x.sums[(i0 + i) * w.groups + g]), sum[i]);
  }
}

// Rows i0 .. i0 + MR - 1 of x against a panel's codes (8 vectors a piece), into acc[i][16].
// 4 bits: x.q with each piece's sum start from x.row(i); 8 bits: x.row(i), x.q + 128
// (pack_gemm_row), each column's sum starting at the piece's start.
template <int kBits, int MR>
QUANT_AVX512 void rows(const QWeight& w, const XInt8& x, int64_t i0, const __m512i* codes, const __m512i* starts,
                       const float* scale_t, const float* offset_t, float* acc) {
  const int64_t runs = x.runs(), pieces = w.k / 32;
  __m512 sum[MR];
  for (int i = 0; i < MR; ++i) sum[i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t k0 = 32 * p, g = k0 / w.group, r = k0 / x.run;
    const __m512i* piece = codes + p * 8;
    const __m512 sw = _mm512_loadu_ps(scale_t + g * kCols);
    // t outer, rows inner: MR independent chains of vpdpbusd. With the rows outer, GCC kept one
    // row's 8 dependent vpdpbusd in a loop, their latency bounding it (weight_only_linear, SmolLM2's
    // [1536, 576] Q4_1, builds alternated: 16 rows 106 -> 96 us, 8 rows 76 -> 66).
    const int32_t* xq[MR];
    __m512i s[MR];
    for (int i = 0; i < MR; ++i) {
      xq[i] = reinterpret_cast<const int32_t*>(kBits == 4 ? x.q.data() + (i0 + i) * w.k + k0
                                                           : reinterpret_cast<const int8_t*>(x.row(i0 + i)) + k0);
      s[i] = kBits == 4 ? _mm512_set1_epi32(reinterpret_cast<const int32_t*>(x.row(i0 + i))[p])
                        : _mm512_load_si512(starts + p);
    }
    for (int t = 0; t < 8; ++t) {
      const __m512i v = _mm512_loadu_si512(piece + t);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i)
        s[i] = kBits == 4 ? _mm512_dpbusd_epi32(s[i], v, _mm512_set1_epi32(xq[i][t]))
                          : _mm512_dpbusd_epi32(s[i], _mm512_set1_epi32(xq[i][t]), v);
    }
    for (int i = 0; i < MR; ++i)
      sum[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), _mm512_mul_ps(sw, _mm512_set1_ps(x.scale[(i0 + i) * runs + r])),
                               sum[i]);
  }
  add_offsets_rows<MR>(w, x, i0, offset_t, sum);
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(acc + (i0 + i) * kCols, sum[i]);
}

// rows<4, MR> on W's own panel form (QWeight::panels), whose 32 bytes of a unit hold two pieces,
// the low nibbles and the high: each vector is split as it is loaded, for both pieces' sums.
template <int MR>
QUANT_AVX512 void rows_split(const QWeight& w, const XInt8& x, int64_t i0, const __m512i* codes, const float* scale_t,
                             const float* offset_t, float* acc) {
  const int64_t runs = x.runs(), units = w.k / kBlock;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 sum[MR];
  for (int i = 0; i < MR; ++i) sum[i] = _mm512_setzero_ps();
  for (int64_t u = 0; u < units; ++u) {
    const int64_t k0 = kBlock * u, p = 2 * u;
    const int32_t* xq[MR];
    __m512i lo[MR], hi[MR];  // the sums of pieces p and p + 1
    for (int i = 0; i < MR; ++i) {
      xq[i] = reinterpret_cast<const int32_t*>(x.q.data() + (i0 + i) * w.k + k0);
      const int32_t* start = reinterpret_cast<const int32_t*>(x.row(i0 + i));
      lo[i] = _mm512_set1_epi32(start[p]);
      hi[i] = _mm512_set1_epi32(start[p + 1]);
    }
    for (int t = 0; t < 8; ++t) {
      const __m512i raw = _mm512_loadu_si512(codes + 8 * u + t);
      const __m512i cl = _mm512_and_si512(raw, low4), ch = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        lo[i] = _mm512_dpbusd_epi32(lo[i], cl, _mm512_set1_epi32(xq[i][t]));
        hi[i] = _mm512_dpbusd_epi32(hi[i], ch, _mm512_set1_epi32(xq[i][8 + t]));
      }
    }
    // the pieces' float steps in piece order, as rows<4, MR> takes them
    const __m512 s0 = _mm512_loadu_ps(scale_t + (k0 / w.group) * kCols);
    const __m512 s1 = _mm512_loadu_ps(scale_t + ((k0 + 32) / w.group) * kCols);
    for (int i = 0; i < MR; ++i) {
      const float* sx = x.scale.data() + (i0 + i) * runs;
      sum[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[i]), _mm512_mul_ps(s0, _mm512_set1_ps(sx[k0 / x.run])), sum[i]);
      sum[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[i]), _mm512_mul_ps(s1, _mm512_set1_ps(sx[(k0 + 32) / x.run])),
                               sum[i]);
    }
  }
  add_offsets_rows<MR>(w, x, i0, offset_t, sum);
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(acc + (i0 + i) * kCols, sum[i]);
}

constexpr int kRows = 8;  // rows of x per block: their sums and the piece's codes stay in registers

// acc's rows into y's columns n .. n + live - 1.
QUANT_AVX512 inline void store_tile(const XInt8& x, const float* acc, int64_t n, int64_t live, float* y, int64_t ldy) {
  for (int64_t i = 0; i < x.m; ++i)
    _mm512_mask_storeu_ps(y + i * ldy + n, lanes16(live), _mm512_loadu_ps(acc + i * kCols));
}

template <int kBits>
QUANT_AVX512 void tile(const QWeight& w, const XInt8& x, int64_t n, int64_t live, __m512i* panel, __m512i* starts,
                       float* scale_t, float* offset_t, float* acc, float* y, int64_t ldy) {
  pack_panel<kBits>(w, n, live, panel, starts, scale_t, offset_t);
  prefetch_next_panel(w, n, kCols);
  row_blocks<kRows>(x.m, [&](auto mr, int64_t i0) {
    rows<kBits, decltype(mr)::value>(w, x, i0, panel, starts, scale_t, offset_t, acc);
  });
  store_tile(x, acc, n, live, y, ldy);
}

// The same from W's panel form: nothing to gather (8 bits: the pieces' starts).
template <int kBits>
QUANT_AVX512 void panel_tile(const QWeight& w, const XInt8& x, int64_t n, int64_t live, __m512i* starts, float* acc,
                             float* y, int64_t ldy) {
  const uint8_t* panel = w.panels + (n / kCols) * w.panel_bytes();
  const auto* codes = reinterpret_cast<const __m512i*>(panel);
  const auto* scale_t = reinterpret_cast<const float*>(panel + kCols * w.row_bytes());
  const float* offset_t = scale_t + w.groups * kCols;
  if (kBits == 8) piece_starts(codes, w.k / 32, starts);
  row_blocks<kRows>(x.m, [&](auto mr, int64_t i0) {
    if constexpr (kBits == 4) {
      rows_split<decltype(mr)::value>(w, x, i0, codes, scale_t, offset_t, acc);
    } else {
      rows<8, decltype(mr)::value>(w, x, i0, codes, starts, scale_t, offset_t, acc);
    }
  });
  store_tile(x, acc, n, live, y, ldy);
}

}  // namespace

void pack_gemm_row(const int8_t* q, int64_t k, int bits, uint8_t* out) {
  if (bits == 8) {
    for (int64_t j = 0; j < k; ++j) out[j] = static_cast<uint8_t>(q[j] + 128);
    return;
  }
  auto* start = reinterpret_cast<int32_t*>(out);
  for (int64_t p = 0; p < k / 32; ++p) {
    int32_t s = 0;
    for (int64_t j = 0; j < 32; ++j) s += q[32 * p + j];
    start[p] = -8 * s;
  }
}

QUANT_AVX512 void gemm_int8x(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t pieces = w.k / 32;
  std::vector<float> acc(static_cast<size_t>(x.m * kCols));
  // 64-byte vectors: the 8-bit pieces' starts, then a panel's codes (not with W's panels)
  const bool from_panels = w.panels != nullptr && n0 % kCols == 0;  // the panels start at tiles
  const int64_t vectors = (w.bits == 8 ? pieces : 0) + (from_panels ? 0 : pieces * 8);
  std::vector<uint8_t> bytes(static_cast<size_t>(vectors * 64 + 64));
  auto* starts = reinterpret_cast<__m512i*>((reinterpret_cast<uintptr_t>(bytes.data()) + 63) & ~uintptr_t{63});
  __m512i* panel = starts + (w.bits == 8 ? pieces : 0);
  if (from_panels) {
    for (int64_t n = n0; n < n1; n += kCols) {
      const int64_t live = std::min(kCols, n1 - n);
      if (w.bits == 4) {
        panel_tile<4>(w, x, n, live, starts, acc.data(), y, ldy);
      } else {
        panel_tile<8>(w, x, n, live, starts, acc.data(), y, ldy);
      }
    }
    return;
  }
  std::vector<float> scale_t(static_cast<size_t>(w.groups * kCols));
  std::vector<float> offset_t(static_cast<size_t>(w.offsets != nullptr ? w.groups * kCols : 0));
  for (int64_t n = n0; n < n1; n += kCols) {
    const int64_t live = std::min(kCols, n1 - n);
    if (w.bits == 4) {
      tile<4>(w, x, n, live, panel, starts, scale_t.data(), offset_t.data(), acc.data(), y, ldy);
    } else {
      tile<8>(w, x, n, live, panel, starts, scale_t.data(), offset_t.data(), acc.data(), y, ldy);
    }
  }
}

}  // namespace anychip::cpu::quant
