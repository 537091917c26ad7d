// weight_only_linear's x_int8 products (kernel.h): x quantized to int8 per run (x_run: 32 elements,
// or up to 128 for 4-bit W), integer dot products against the weight codes with AVX-512 VNNI
// (vpdpbusd: unsigned bytes times signed bytes, four products summed into each dword lane), then
// each lane times its run's scale.
//
// 4 bits: a 64-byte load holds two 32-byte blocks, k = 128c + [0, 128). Its low nibbles are the
// codes q + 8 (unsigned) of k 0-31 and 64-95, its high nibbles those of 32-63 and 96-127; x is
// stored in that order, so each dword lane of a product belongs to one piece of 32 k, and so to
// one run. The +8 of the codes is taken back by starting each lane's sum at -8 times the sum of
// its four x codes.
// 8 bits: the weights are the signed operand and x + 128 the unsigned one; each lane's sum starts
// at -128 times the sum of its four weights (a product of the weights with 128s).
//
// The rest of each product is float: lane by lane, sum * (sx * scale of the lane's group); with
// 4-bit groups of a multiple of 128 k, a chunk's two halves are summed times sx first and the
// row's one scale applied once (8 vector operations per chunk and row instead of 13: from L2,
// 35 -> 44 GB/s).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "quant.h"
#include "quant_simd.h"

#define QUANT_INLINE QUANT_AVX512 inline __attribute__((always_inline))

namespace anychip::cpu::quant {
namespace {

// The layout places x in pieces of 32 k, each filling 8 dword lanes (runs are whole pieces).
constexpr int64_t kPiece = XInt8::kMinRun;

// k per chunk of the AVX-512 layout (one 64-byte load of weights), and a row's bytes per chunk:
// 4 bits: the codes of the low and the high nibbles (64 bytes each), each half's lane starts
// (16 int32), each half's lane scales sx (16 floats); 8 bits: x + 128, the lane scales.
int64_t chunk_k(int bits) { return bits == 4 ? 128 : 64; }
int64_t chunk_bytes(int bits) { return bits == 4 ? 384 : 128; }
int64_t chunks(int bits, int64_t k) { return (k + chunk_k(bits) - 1) / chunk_k(bits); }

// Where piece j of a chunk's layout comes from: its first k within the chunk (4 bits: the low
// nibbles' pieces 0 and 2, then the high nibbles' 1 and 3).
int64_t piece_source(int bits, int64_t j) {
  constexpr int64_t kLowHigh[4] = {0, 64, 32, 96};
  return bits == 4 ? kLowHigh[j] : kPiece * j;
}

// Row i of x, quantized (q, sx per run of `run`), in the AVX-512 layout; zeros past K.
void pack_row(const int8_t* q, const float* sx, int64_t k, int bits, int64_t run, uint8_t* out) {
  const int64_t ck = chunk_k(bits);
  for (int64_t c = 0; c < chunks(bits, k); ++c) {
    uint8_t* codes = out + c * chunk_bytes(bits);
    int32_t start[2][16];
    float lanes[2][16];
    for (int64_t j = 0; j < ck / kPiece; ++j) {
      // Piece j fills 8 dword lanes: lanes 8 (j % 2) .. of half j / 2.
      const int64_t src = c * ck + piece_source(bits, j), half = bits == 4 ? j / 2 : 0, lane0 = 8 * (j % 2);
      uint8_t* dst = codes + kPiece * j;
      const bool real = src < k;
      for (int64_t t = 0; t < kPiece; ++t) {
        const int v = real ? q[src + t] : 0;
        dst[t] = static_cast<uint8_t>(bits == 8 ? v + 128 : v);
      }
      for (int64_t l = 0; l < 8; ++l) {
        start[half][lane0 + l] = 0;
        lanes[half][lane0 + l] = 0.0f;
        if (!real) continue;
        const int8_t* four = q + src + 4 * l;
        start[half][lane0 + l] = -8 * (four[0] + four[1] + four[2] + four[3]);
        lanes[half][lane0 + l] = sx[src / run];
      }
    }
    if (bits == 4) {
      std::memcpy(codes + ck, start, sizeof start);
      std::memcpy(codes + ck + sizeof start, lanes, sizeof lanes);
    } else {
      std::memcpy(codes + ck, lanes[0], sizeof lanes[0]);
    }
  }
}

// ---- quantizing x ------------------------------------------------------------------------------

void quantize_runs_scalar(const float* x, int64_t runs, int64_t run, int8_t* q, float* sx) {
  for (int64_t r = 0; r < runs; ++r) {
    const float* v = x + r * run;
    float amax = 0.0f;
    for (int64_t j = 0; j < run; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float s = amax / 127.0f;
    sx[r] = s;
    for (int64_t j = 0; j < run; ++j)
      q[r * run + j] = s == 0.0f ? 0 : static_cast<int8_t>(std::clamp(round_half_away(v[j] / s), -127.0f, 127.0f));
  }
}

QUANT_INLINE void store_codes(__m512 v, __m512 s, int8_t* q) {
  const __m512 t = round_half_away16(_mm512_div_ps(v, s));
  const __m512 c = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(c)));
}

QUANT_AVX512 void quantize_runs_avx512(const float* x, int64_t runs, int64_t run, int8_t* q, float* sx) {
  for (int64_t r = 0; r < runs; ++r) {
    const float* v = x + r * run;
    __m512 amax = _mm512_setzero_ps();
    // a NaN lane keeps amax, as std::max in the scalar loop (vmaxps returns its second operand)
    for (int64_t j = 0; j < run; j += 16) amax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v + j)), amax);
    const float s = _mm512_reduce_max_ps(amax) / 127.0f;
    sx[r] = s;
    if (s == 0.0f) {
      std::memset(q + r * run, 0, static_cast<size_t>(run));
      continue;
    }
    for (int64_t j = 0; j < run; j += 16) store_codes(_mm512_loadu_ps(v + j), _mm512_set1_ps(s), q + r * run + j);
  }
}

// ---- scalar product ----------------------------------------------------------------------------

void gemv_scalar(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t runs = x.runs();
  std::vector<int32_t> codes(static_cast<size_t>(w.k));
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < w.k; ++k) codes[k] = qvalue(w, n, k);
    const float* sc = w.row_scales(n);
    for (int64_t i = 0; i < x.m; ++i) {
      const int8_t* xq = x.q.data() + i * w.k;
      float acc = 0.0f;
      for (int64_t r = 0; r < runs; ++r) {
        int32_t sum = 0;
        for (int64_t j = r * x.run; j < (r + 1) * x.run; ++j) sum += codes[j] * xq[j];
        acc += static_cast<float>(sum) * (x.scale[i * runs + r] * sc[r * x.run / w.group]);
      }
      y[i * ldy + n] = acc;
    }
  }
}

// ---- AVX-512 VNNI ------------------------------------------------------------------------------

// As in quant_gemv.cc: each tile prefetches the rows two tiles ahead into L2, and its own rows a
// few lines ahead into L1.
constexpr int64_t kPrefetchTiles = 2;
constexpr int64_t kPrefetchNear = 512;  // bytes

// A pass over the columns keeps the rows of x it reads within about this many bytes (L1); when
// all of x fits, each tile takes every pass before the next tile, otherwise each pass goes over
// all rows in turn.
constexpr int64_t kXBytes = 24 * 1024;

template <int NR>
struct Rows {
  const uint8_t* row[NR];
  const uint8_t* ahead[NR];
  const float* sc[NR];

  Rows(const QWeight& w, int64_t n) {
    for (int r = 0; r < NR; ++r) {
      row[r] = w.row(n + r);
      ahead[r] = w.row(std::min(n + r + kPrefetchTiles * NR, w.n - 1));
      sc[r] = w.row_scales(n + r);
    }
  }
  QUANT_INLINE void prefetch(int64_t offset) const {
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead[r] + offset), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(row[r] + offset + kPrefetchNear), _MM_HINT_T0);
    }
  }
  // Lanes 0-7 the scale of group ga, lanes 8-15 that of gb.
  QUANT_INLINE __m512 scales(int r, int32_t ga, int32_t gb) const {
    return _mm512_mask_blend_ps(__mmask16(0xff00), _mm512_set1_ps(sc[r][ga]), _mm512_set1_ps(sc[r][gb]));
  }
};

template <int MR, int NR>
QUANT_INLINE void lane_fma(__m512 (&acc)[MR][NR], int i, int r, __m512i sums, __m512 sx, __m512 sw) {
  acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(sx, sw), acc[i][r]);
}

// Rows n .. n + NR - 1 of 4-bit W against rows i0 .. i0 + MR - 1 of x over the chunks [c0, c1).
// group[4c + j] is the group of piece 4c + j. kChunkGroups: the group size is a multiple of 128,
// so a chunk's pieces share one scale per row, applied once to the chunk's two halves' lane sums.
template <int MR, int NR, bool kChunkGroups>
QUANT_AVX512 void tile4(const QWeight& w, const XInt8& x, const int32_t* group, int64_t i0, int64_t n, int64_t c0,
                        int64_t c1, float* y, int64_t ldy, bool first) {
  const Rows<NR> rows(w, n);
  const uint8_t* xr[MR];
  for (int i = 0; i < MR; ++i) xr[i] = x.row(i0 + i);
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const int64_t bytes = w.row_bytes();
  for (int64_t c = c0; c < c1; ++c) {
    const __mmask64 mask = lanes64(bytes - 64 * c);  // K % 128 == 64: the last chunk is half
    rows.prefetch(64 * c);
    const int32_t* g = group + 4 * c;
    __m512i lo[NR], hi[NR];
    __m512 slo[NR], shi[NR];
    for (int r = 0; r < NR; ++r) {
      const __m512i b = _mm512_maskz_loadu_epi8(mask, rows.row[r] + 64 * c);
      lo[r] = _mm512_and_si512(b, low4);
      hi[r] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
      if (!kChunkGroups) {
        slo[r] = rows.scales(r, g[0], g[2]);
        shi[r] = rows.scales(r, g[1], g[3]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      const uint8_t* p = xr[i] + chunk_bytes(4) * c;
      const __m512i xlo = _mm512_load_si512(p), xhi = _mm512_load_si512(p + 64);
      const __m512i start_lo = _mm512_load_si512(p + 128), start_hi = _mm512_load_si512(p + 192);
      const __m512 sx_lo = _mm512_load_ps(p + 256), sx_hi = _mm512_load_ps(p + 320);
      for (int r = 0; r < NR; ++r) {
        if (kChunkGroups) {
          __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start_lo, lo[r], xlo)), sx_lo);
          t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start_hi, hi[r], xhi)), sx_hi, t);
          acc[i][r] = _mm512_fmadd_ps(t, _mm512_set1_ps(rows.sc[r][g[0]]), acc[i][r]);
        } else {
          lane_fma<MR, NR>(acc, i, r, _mm512_dpbusd_epi32(start_lo, lo[r], xlo), sx_lo, slo[r]);
          lane_fma<MR, NR>(acc, i, r, _mm512_dpbusd_epi32(start_hi, hi[r], xhi), sx_hi, shi[r]);
        }
      }
    }
  }
  store_sums<MR, NR>(acc, n, y + i0 * ldy, ldy, first);
}

// As tile4 for 8-bit W: chunks of 64 k, group[2c + j] the group of piece 2c + j.
template <int MR, int NR>
QUANT_AVX512 void tile8(const QWeight& w, const XInt8& x, const int32_t* group, int64_t i0, int64_t n, int64_t c0,
                        int64_t c1, float* y, int64_t ldy, bool first) {
  const Rows<NR> rows(w, n);
  const uint8_t* xr[MR];
  for (int i = 0; i < MR; ++i) xr[i] = x.row(i0 + i);
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
  const __m512i x_offset = _mm512_set1_epi8(static_cast<char>(128));
  for (int64_t c = c0; c < c1; ++c) {
    const __mmask64 mask = lanes64(w.k - 64 * c);  // K % 64 == 32: the last chunk is half
    rows.prefetch(64 * c);
    const int32_t* g = group + 2 * c;
    __m512i q[NR], start[NR];
    __m512 sw[NR];
    for (int r = 0; r < NR; ++r) {
      q[r] = _mm512_maskz_loadu_epi8(mask, rows.row[r] + 64 * c);
      start[r] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), x_offset, q[r]));
      sw[r] = rows.scales(r, g[0], g[1]);
    }
    for (int i = 0; i < MR; ++i) {
      const uint8_t* p = xr[i] + chunk_bytes(8) * c;
      const __m512i xu = _mm512_load_si512(p);
      const __m512 sx = _mm512_load_ps(p + 64);
      for (int r = 0; r < NR; ++r) lane_fma<MR, NR>(acc, i, r, _mm512_dpbusd_epi32(start[r], xu, q[r]), sx, sw[r]);
    }
  }
  store_sums<MR, NR>(acc, n, y + i0 * ldy, ldy, first);
}

template <int MR, int NR>
void rows_avx512(const QWeight& w, const XInt8& x, const int32_t* group, int64_t i0, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  const int64_t total = chunks(w.bits, w.k);
  // Passes of the same chunks whatever MR: a row's result must not depend on the rows beside it.
  const int64_t per_pass = std::max<int64_t>(1, kXBytes / (kGemvRows * chunk_bytes(w.bits)));
  const bool chunk_groups = w.group % chunk_k(4) == 0;
  auto pass = [&](int64_t na, int64_t nb, int64_t c0) {
    const int64_t c1 = std::min(total, c0 + per_pass);
    int64_t n = na;
    auto tiles4 = [&](auto kChunkGroups) {
      for (; n + NR <= nb; n += NR) tile4<MR, NR, kChunkGroups>(w, x, group, i0, n, c0, c1, y, ldy, c0 == 0);
      for (; n < nb; ++n) tile4<MR, 1, kChunkGroups>(w, x, group, i0, n, c0, c1, y, ldy, c0 == 0);
    };
    if (w.bits == 4 && chunk_groups) {
      tiles4(std::true_type{});
    } else if (w.bits == 4) {
      tiles4(std::false_type{});
    } else {
      for (; n + NR <= nb; n += NR) tile8<MR, NR>(w, x, group, i0, n, c0, c1, y, ldy, c0 == 0);
      for (; n < nb; ++n) tile8<MR, 1>(w, x, group, i0, n, c0, c1, y, ldy, c0 == 0);
    }
  };
  if (MR * total * chunk_bytes(w.bits) <= kXBytes) {
    // All of x fits in L1: each tile takes the passes in turn, so W streams front to back.
    for (int64_t n = n0; n < n1; n += NR)
      for (int64_t c0 = 0; c0 < total; c0 += per_pass) pass(n, std::min(n1, n + NR), c0);
  } else {
    for (int64_t c0 = 0; c0 < total; c0 += per_pass) pass(n0, n1, c0);
  }
}

void gemv_avx512(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  // The group of every piece, padded to whole chunks (the padding's lanes are zero).
  const int64_t pieces = w.k / kPiece, padded = chunks(w.bits, w.k) * chunk_k(w.bits) / kPiece;
  std::vector<int32_t> group(static_cast<size_t>(padded), 0);
  for (int64_t r = 0; r < pieces; ++r) group[r] = static_cast<int32_t>(r * kPiece / w.group);
  // Accumulators MR x NR; with the codes and lane scales of NR rows, all in registers.
  for (int64_t i0 = 0; i0 < x.m; i0 += kGemvRows) {
    switch (std::min(kGemvRows, x.m - i0)) {
      case 1: rows_avx512<1, 4>(w, x, group.data(), i0, n0, n1, y, ldy); break;
      case 2: rows_avx512<2, 4>(w, x, group.data(), i0, n0, n1, y, ldy); break;
      case 3: rows_avx512<3, 2>(w, x, group.data(), i0, n0, n1, y, ldy); break;
      case 4: rows_avx512<4, 2>(w, x, group.data(), i0, n0, n1, y, ldy); break;
      case 5: rows_avx512<5, 2>(w, x, group.data(), i0, n0, n1, y, ldy); break;
      case 6: rows_avx512<6, 2>(w, x, group.data(), i0, n0, n1, y, ldy); break;
      case 7: rows_avx512<7, 2>(w, x, group.data(), i0, n0, n1, y, ldy); break;
      default: rows_avx512<8, 2>(w, x, group.data(), i0, n0, n1, y, ldy); break;
    }
  }
}

}  // namespace

void XInt8::reserve(int64_t rows, int64_t cols) {
  q.reserve(static_cast<size_t>(rows * cols));
  scale.reserve(static_cast<size_t>(rows * (cols / kMinRun)));
  sums.reserve(static_cast<size_t>(rows * (cols / kMinRun)));
  const int64_t widest = std::max(chunks(4, cols) * chunk_bytes(4), chunks(8, cols) * chunk_bytes(8));
  packed.reserve(static_cast<size_t>(rows * widest + 64));
}

void quantize_x(const float* x, int64_t m, const QWeight& w, XInt8* out, Isa isa) {
  const int64_t k = w.k;
  const int bits = w.bits;
  out->bits = bits;
  out->run = x_run(bits, w.group);
  out->m = m;
  out->k = k;
  const int64_t runs = out->runs();
  out->q.resize(static_cast<size_t>(m * k));
  out->scale.resize(static_cast<size_t>(m * runs));
  out->sums.resize(static_cast<size_t>(w.offsets != nullptr ? m * w.groups : 0));
  if (w.offsets != nullptr) group_sums(w, x, m, out->sums.data());
  // AVX-512: the GEMV tiles' layout below kGemmInt8xRows rows, gemm_int8x's from it; AVX2,
  // 4 bits: the tiles' +8 shares below, gemm_int8x_avx2's layout (gemm_int8x's) from it; AVX2,
  // 8 bits: x.q alone.
  const bool batch = m >= kGemmInt8xRows, tiles = has_avx512(isa) && !batch;
  const bool gemm = batch && (has_avx512(isa) || (isa == Isa::kAvx2 && bits == 4));
  const bool avx2_offsets = isa == Isa::kAvx2 && bits == 4 && !gemm;
  out->row_bytes = tiles ? chunks(bits, k) * chunk_bytes(bits) : gemm ? gemm_row_bytes(bits, k)
                   : avx2_offsets ? runs * 4 : 0;
  out->packed.resize(static_cast<size_t>(m * out->row_bytes + 64));
  for (int64_t i = 0; i < m; ++i) {
    int8_t* q = out->q.data() + i * k;
    float* sx = out->scale.data() + i * runs;
    if (isa == Isa::kAvx2) {
      quantize_runs_avx2(x + i * k, runs, out->run, q, sx,
                         avx2_offsets ? reinterpret_cast<float*>(const_cast<uint8_t*>(out->row(i))) : nullptr);
      if (gemm) pack_gemm_row(q, k, bits, const_cast<uint8_t*>(out->row(i)));
    } else if (!has_avx512(isa)) {
      quantize_runs_scalar(x + i * k, runs, out->run, q, sx);
    } else {
      quantize_runs_avx512(x + i * k, runs, out->run, q, sx);
      if (tiles) pack_row(q, sx, k, bits, out->run, const_cast<uint8_t*>(out->row(i)));
      if (gemm) pack_gemm_row(q, k, bits, const_cast<uint8_t*>(out->row(i)));
    }
  }
}

void gemv_int8x(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy, Isa isa) {
  if (n0 >= n1 || x.m == 0) return;
  // The GEMMs add the offsets' share as they go; the GEMVs' tiles take the symmetric part.
  if (isa == Isa::kAvx2 && x.m >= kGemmInt8xRows) return gemm_int8x_avx2(w, x, n0, n1, y, ldy);
  if (has_avx512(isa) && x.m >= kGemmInt8xRows) return gemm_int8x(w, x, n0, n1, y, ldy);
  const QWeight sym = w.symmetric();
  if (isa == Isa::kAvx2) {
    gemv_int8x_avx2(sym, x, n0, n1, y, ldy);
  } else if (!has_avx512(isa)) {
    gemv_scalar(sym, x, n0, n1, y, ldy);
  } else {
    gemv_avx512(sym, x, n0, n1, y, ldy);
  }
  add_offsets_sums(w, x.sums.data(), x.m, n0, n1, y, ldy);
}

}  // namespace anychip::cpu::quant
