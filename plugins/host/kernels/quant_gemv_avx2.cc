// The weight-only products on AVX2 + FMA (CPUs without AVX-512: AMD before Zen 4, many Intel
// client parts): the float32-x GEMV (gemv) and the x_int8 one (gemv_int8x).
//
// Float x: the codes of 8 consecutive k are widened to dwords and converted to float as stored
// (4 bits: q + 8), then summed times x per (row of x, row of W) over a group (4 bits: the low and
// the high nibbles in two accumulators); the +8's share (-8 times the sum of x there, once per
// call) and then the group's scale are applied once when it closes (4 bits, groups of an odd
// number of 32-k halves of a block: once per half). Groups of a multiple of 32 k (4 bits) or 8 k
// (8 bits); other group sizes dequantize each row first.
//
// int8 x: integer products with vpmaddubsw / vpmaddwd, each dword lane of a product summing four
// consecutive k of one run of x; the lanes summed in float times each run's sx over a group, then
// times the group's scale. 4 bits: the codes (q + 8, unsigned) times x (signed), the +8's share
// of each run (sx * -8 * the sum of its x codes, from quantize_x) added once per group; runs of
// 64 or 128 k sum their vpmaddubsw pairs in int16 first (at most 4 * 2 * 15 * 127), one
// vpmaddwd, conversion and FMA per run, and take W one row at a time. 8 bits: |w| times x with
// w's sign, runs of 32.
#include <algorithm>
#include <vector>

#include "quant.h"
#include "simd_avx2.h"

#define QUANT_AVX2 ANYCHIP_AVX2
#define QUANT_AVX2_INLINE ANYCHIP_AVX2 inline __attribute__((always_inline))

namespace anychip::cpu::quant {
namespace {

// Each tile prefetches the same columns of the rows this many tiles ahead into L2, so that the
// next tiles' rows are streaming while this one computes.
constexpr int64_t kPrefetchTiles = 2;

template <int MR, int NR>
QUANT_AVX2_INLINE void store_sums(const __m256 (&acc)[MR][NR], int64_t n, float* y, int64_t ldy) {
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) y[i * ldy + n + r] = avx2::sum8(acc[i][r]);
}

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
  QUANT_AVX2_INLINE void prefetch(int64_t offset) const {
    for (int r = 0; r < NR; ++r) _mm_prefetch(reinterpret_cast<const char*>(ahead[r] + offset), _MM_HINT_T1);
  }
};

// The group of a row's parts (runs of 32 k, or halves of a block) as a tile walks them in
// order, counted rather than divided out: two integer divisions per block had the float-x GEMV
// on GGUF's groups of 32 at 165-225 us where counting takes 149-152 (K=576, N=3072, 1 thread).
struct GroupWalk {
  int64_t per_group, g = 0, left = per_group;  // the current group, and its parts still to come

  // `parts` more parts taken: whether they end group g (then next() moves on).
  bool ends(int64_t parts) { return (left -= parts) == 0; }
  void next() { ++g, left = per_group; }
  void step(int64_t parts) {
    if (ends(parts)) next();
  }
};

// ---- float32 x ---------------------------------------------------------------------------------

// acc[i][r] += scale[r] * sum[i][r], and sum cleared: closes a group.
template <int MR, int NR>
QUANT_AVX2_INLINE void close_group(__m256 (&acc)[MR][NR], __m256 (&sum)[MR][NR], const Rows<NR>& rows, int64_t g) {
  for (int r = 0; r < NR; ++r) {
    const __m256 s = _mm256_set1_ps(rows.sc[r][g]);
    for (int i = 0; i < MR; ++i) {
      acc[i][r] = _mm256_fmadd_ps(sum[i][r], s, acc[i][r]);
      sum[i][r] = _mm256_setzero_ps();
    }
  }
}

// sum[i][r] += v[i * ld] in lane 0, for every r: a share of row i's product that is the same
// for all rows of W (the codes' +8), added once to the partial sums it belongs to.
template <int MR, int NR>
QUANT_AVX2_INLINE void add_lane0(__m256 (&sum)[MR][NR], const float* v, int64_t ld) {
  for (int i = 0; i < MR; ++i) {
    const __m256 lane0 = _mm256_setr_ps(v[i * ld], 0, 0, 0, 0, 0, 0, 0);
    for (int r = 0; r < NR; ++r) sum[i][r] = _mm256_add_ps(sum[i][r], lane0);
  }
}

// The codes' +8, taken back once per span of x instead of once per weight: shift[i * spans + s]
// = -8 * the sum of x[i][s * span, (s + 1) * span), span a multiple of 32 dividing K.
// Subtracting 8 from every code before converting it cost step4 two of its nine instructions
// per 8 k and row of W (float-x 4-bit GEMV from L2: 3.9 -> 3.2 ns per 64 k and row).
QUANT_AVX2 std::vector<float> code_shifts(const float* x, int64_t m, int64_t k, int64_t span) {
  const int64_t spans = k / span;
  std::vector<float> shift(static_cast<size_t>(m * spans));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t s = 0; s < spans; ++s) {
      const float* v = x + i * k + s * span;
      __m256 a = _mm256_loadu_ps(v), b = _mm256_loadu_ps(v + 8), c = _mm256_loadu_ps(v + 16),
             d = _mm256_loadu_ps(v + 24);
      for (int64_t j = 32; j < span; j += 32) {
        a = _mm256_add_ps(a, _mm256_loadu_ps(v + j));
        b = _mm256_add_ps(b, _mm256_loadu_ps(v + j + 8));
        c = _mm256_add_ps(c, _mm256_loadu_ps(v + j + 16));
        d = _mm256_add_ps(d, _mm256_loadu_ps(v + j + 24));
      }
      shift[static_cast<size_t>(i * spans + s)] = -8.0f * avx2::sum8(_mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    }
  return shift;
}

// 16 k of block b of 4-bit rows, from k = 64 b + 8 h (low nibbles) and 64 b + 32 + 8 h (high):
// lo[i][r] += codes (q + 8, as stored) times x, hi[i][r] likewise.
template <int MR, int NR>
QUANT_AVX2_INLINE void step4(__m256 (&lo)[MR][NR], __m256 (&hi)[MR][NR], const Rows<NR>& rows, const float* x,
                             int64_t ldx, int64_t b, int h) {
  const __m256i low4 = _mm256_set1_epi32(15);
  __m256 xl[MR], xh[MR];
  for (int i = 0; i < MR; ++i) {
    xl[i] = _mm256_loadu_ps(x + i * ldx + 64 * b + 8 * h);
    xh[i] = _mm256_loadu_ps(x + i * ldx + 64 * b + 32 + 8 * h);
  }
  for (int r = 0; r < NR; ++r) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows.row[r] + 32 * b + 8 * h)));
    const __m256 l = _mm256_cvtepi32_ps(_mm256_and_si256(v, low4));
    const __m256 u = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
    for (int i = 0; i < MR; ++i) {
      lo[i][r] = _mm256_fmadd_ps(l, xl[i], lo[i][r]);
      hi[i][r] = _mm256_fmadd_ps(u, xh[i], hi[i][r]);
    }
  }
}

// Rows n .. n + NR - 1 of 4-bit W against MR rows of x (row stride K). Block b (32 bytes) holds
// k = 64 b + [0, 32) in its low nibbles and 64 b + [32, 64) in its high ones. kHalves: the group
// size is an odd multiple of 32, so each half block is scaled on its own; otherwise a multiple
// of 64, and each group's sums are scaled when it closes. shift: code_shifts of these rows of x
// over each half block (kHalves) or group, row stride `spans`.
template <int MR, int NR, bool kHalves>
QUANT_AVX2 void tile4(const QWeight& w, const float* x, const float* shift, int64_t spans, int64_t n, float* y,
                      int64_t ldy) {
  const Rows<NR> rows(w, n);
  __m256 acc[MR][NR], lo[MR][NR], hi[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = lo[i][r] = hi[i][r] = _mm256_setzero_ps();
  if (kHalves) {
    GroupWalk halves{w.group / 32};
    for (int64_t b = 0; b < w.k / 64; ++b) {
      if ((b & 1) == 0) rows.prefetch(32 * b);
      for (int h = 0; h < 4; ++h) step4<MR, NR>(lo, hi, rows, x, w.k, b, h);
      add_lane0<MR, NR>(lo, shift + 2 * b, spans);
      close_group<MR, NR>(acc, lo, rows, halves.g);
      halves.step(1);
      add_lane0<MR, NR>(hi, shift + 2 * b + 1, spans);
      close_group<MR, NR>(acc, hi, rows, halves.g);
      halves.step(1);
    }
  } else {
    const int64_t blocks_per_group = w.group / 64;
    for (int64_t g = 0; g < w.groups; ++g) {
      for (int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b) {
        if ((b & 1) == 0) rows.prefetch(32 * b);
        for (int h = 0; h < 4; ++h) step4<MR, NR>(lo, hi, rows, x, w.k, b, h);
      }
      for (int i = 0; i < MR; ++i)
        for (int r = 0; r < NR; ++r) {
          lo[i][r] = _mm256_add_ps(lo[i][r], hi[i][r]);
          hi[i][r] = _mm256_setzero_ps();
        }
      add_lane0<MR, NR>(lo, shift + g, spans);
      close_group<MR, NR>(acc, lo, rows, g);
    }
  }
  store_sums<MR, NR>(acc, n, y, ldy);
}

// As tile4 for 8-bit W; the group size is a multiple of 8.
template <int MR, int NR>
QUANT_AVX2 void tile8(const QWeight& w, const float* x, int64_t n, float* y, int64_t ldy) {
  const Rows<NR> rows(w, n);
  __m256 acc[MR][NR], sum[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = sum[i][r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.groups; ++g) {
    for (int64_t k = g * w.group; k < (g + 1) * w.group; k += 8) {
      if ((k & 63) == 0) rows.prefetch(k);
      __m256 xv[MR];
      for (int i = 0; i < MR; ++i) xv[i] = _mm256_loadu_ps(x + i * w.k + k);
      for (int r = 0; r < NR; ++r) {
        const __m256 q = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows.row[r] + k))));
        for (int i = 0; i < MR; ++i) sum[i][r] = _mm256_fmadd_ps(q, xv[i], sum[i][r]);
      }
    }
    close_group<MR, NR>(acc, sum, rows, g);
  }
  store_sums<MR, NR>(acc, n, y, ldy);
}

// Any group size: each row dequantized first.
QUANT_AVX2 void gemv_any_group(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y,
                               int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.k));
  for (int64_t n = n0; n < n1; ++n) {
    dequant_row(w, n, 0, w.k, row.data(), Isa::kAvx2);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * w.k;
      __m256 acc = _mm256_setzero_ps();
      int64_t k = 0;
      for (; k + 8 <= w.k; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(xi + k), _mm256_loadu_ps(row.data() + k), acc);
      float tail = 0.0f;
      for (; k < w.k; ++k) tail += xi[k] * row[k];
      y[i * ldy + n] = avx2::sum8(acc) + tail;
    }
  }
}

// shift: code_shifts of these rows of x (4 bits), row stride `spans`.
template <int MR, int NR>
void rows_f32(const QWeight& w, const float* x, const float* shift, int64_t spans, int64_t n0, int64_t n1, float* y,
              int64_t ldy) {
  int64_t n = n0;
  if (w.bits == 4 && w.group % 64 != 0) {
    for (; n + NR <= n1; n += NR) tile4<MR, NR, true>(w, x, shift, spans, n, y, ldy);
    for (; n < n1; ++n) tile4<MR, 1, true>(w, x, shift, spans, n, y, ldy);
  } else if (w.bits == 4) {
    for (; n + NR <= n1; n += NR) tile4<MR, NR, false>(w, x, shift, spans, n, y, ldy);
    for (; n < n1; ++n) tile4<MR, 1, false>(w, x, shift, spans, n, y, ldy);
  } else {
    for (; n + NR <= n1; n += NR) tile8<MR, NR>(w, x, n, y, ldy);
    for (; n < n1; ++n) tile8<MR, 1>(w, x, n, y, ldy);
  }
}

// ---- int8 x ------------------------------------------------------------------------------------

// 8 lane sums of the 32 bytes of 4-bit codes `codes` (unsigned, q + 8) times the 32 x codes at xq.
QUANT_AVX2_INLINE __m256i dot4(__m256i codes, const int8_t* xq) {
  const __m256i pairs = _mm256_maddubs_epi16(codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// 8 lane sums of 32 signed weights times 32 x codes: |w| (unsigned, 128 for -128) times x with
// w's sign (x never -128), so each int16 pair is at most 2 * 128 * 127 and vpmaddubsw cannot
// saturate.
QUANT_AVX2_INLINE __m256i dot8(const uint8_t* wq, const int8_t* xq) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq));
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(v, w));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// sum[i][r] += float(lane sums s[i]) * sx of run `run` of row i0 + i.
template <int MR, int NR>
QUANT_AVX2_INLINE void add_run(__m256 (&sum)[MR][NR], int r, const __m256i (&s)[MR], const float* const (&sx)[MR],
                               int64_t run) {
  for (int i = 0; i < MR; ++i)
    sum[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_broadcast_ss(sx[i] + run), sum[i][r]);
}

template <int MR, int NR>
QUANT_AVX2_INLINE void zero(__m256 (&acc)[MR][NR], __m256 (&sum)[MR][NR]) {
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = sum[i][r] = _mm256_setzero_ps();
}

// The rows i0 .. i0 + MR - 1 of x that a tile meets: their codes and their runs' sx.
template <int MR>
struct XRows {
  const int8_t* q[MR];
  const float* sx[MR];

  XRows(const QWeight& w, const XInt8& x, int64_t i0) {
    for (int i = 0; i < MR; ++i) {
      q[i] = x.q.data() + (i0 + i) * w.k;
      sx[i] = x.scale.data() + (i0 + i) * x.runs();
    }
  }
};

// A 4-bit int8-x tile's groups, closed where its runs end them (groups of an odd number of runs
// end mid-block).
struct Groups {
  GroupWalk walk;

  // After `runs` runs: where they end their group, the group's +8 share (offsets[i * groups +
  // g], see group_offsets) added to lane 0 of its sums, and the sums times the group's scale.
  template <int MR, int NR>
  QUANT_AVX2_INLINE void runs_done(int64_t runs, __m256 (&acc)[MR][NR], __m256 (&sum)[MR][NR], const Rows<NR>& rows,
                                   const float* offsets, int64_t groups) {
    if (!walk.ends(runs)) return;
    add_lane0<MR, NR>(sum, offsets + walk.g, groups);
    close_group<MR, NR>(acc, sum, rows, walk.g);
    walk.next();
  }
};

// sum[i][r] += the high nibbles of row r's block `blk` (run 2 blk + 1) against x row i.
template <int MR, int NR>
QUANT_AVX2_INLINE void add_high(__m256 (&sum)[MR][NR], int r, __m256i block, const XRows<MR>& xr, int64_t blk) {
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(block, 4), _mm256_set1_epi8(15));
  __m256i s[MR];
  for (int i = 0; i < MR; ++i) s[i] = dot4(hi, xr.q[i] + 64 * blk + 32);
  add_run<MR, NR>(sum, r, s, xr.sx, 2 * blk + 1);
}

// Rows n .. n + NR - 1 of 4-bit W against rows i0 .. i0 + MR - 1 of x quantized in runs of 32,
// a block (runs 2b and 2b + 1, the low and the high nibbles) at a time: each run's lane sums
// times its sx added to its group's sums, closed where the run ends the group (Groups). kOdd:
// groups of an odd number of runs, which may end after a block's low nibbles (a branchy
// run-by-run loop for those made GGUF's groups of 32 slower with int8 x than with float x);
// otherwise a group ends only after a block's high nibbles, and each row's block is taken whole.
template <int MR, int NR, bool kOdd>
QUANT_AVX2 void tile_int8x4(const QWeight& w, const XInt8& x, const float* group_offset, int64_t i0, int64_t n,
                            float* y, int64_t ldy) {
  const Rows<NR> rows(w, n);
  const XRows<MR> xr(w, x, i0);
  __m256 acc[MR][NR], sum[MR][NR];
  zero(acc, sum);
  const int64_t group_runs = w.group / x.run;
  const __m256i low4 = _mm256_set1_epi8(15);
  Groups groups{GroupWalk{group_runs}};
  const float* offsets = group_offset + i0 * w.groups;
  for (int64_t blk = 0; blk < w.k / 64; ++blk) {
    const int64_t k = 64 * blk;
    if ((blk & 1) == 0) rows.prefetch(32 * blk);
    __m256i b[NR];
    for (int r = 0; r < NR; ++r) {
      b[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.row[r] + 32 * blk));
      __m256i s[MR];
      for (int i = 0; i < MR; ++i) s[i] = dot4(_mm256_and_si256(b[r], low4), xr.q[i] + k);
      add_run<MR, NR>(sum, r, s, xr.sx, 2 * blk);
      if (!kOdd) add_high<MR, NR>(sum, r, b[r], xr, blk);
    }
    if (kOdd) {
      groups.runs_done<MR, NR>(1, acc, sum, rows, offsets, w.groups);
      for (int r = 0; r < NR; ++r) add_high<MR, NR>(sum, r, b[r], xr, blk);
    }
    groups.runs_done<MR, NR>(kOdd ? 1 : 2, acc, sum, rows, offsets, w.groups);
  }
  store_sums<MR, NR>(acc, n, y + i0 * ldy, ldy);
}

// Bytes ahead of the weights being read that the runs' loop prefetches into L2 (rows are
// contiguous, so past a row's end it reaches into the next; past W's end a prefetch is dropped,
// never a fault). K=N=4096 from DRAM, 2 threads, four builds alternated call by call
// (2026-12-02, medians of three runs): 2 KB 307-362 us, 4 KB (two rows, as the tiles) 312-363,
// 1 KB 320-373.
constexpr int64_t kRunPrefetchBytes = 2048;

// s[i] = the 8 lane sums of run `run` (kRunBlocks blocks) of a 4-bit row against x row i: each
// block's low and high vpmaddubsw products added in int16 (at most 4 * 2 * 15 * 127, no
// saturation), then one vpmaddwd.
template <int MR, int kRunBlocks>
QUANT_AVX2_INLINE void run_sums(__m256i (&s)[MR], const uint8_t* row, const XRows<MR>& xr, int64_t run) {
  const __m256i low4 = _mm256_set1_epi8(15);
  __m256i pairs[MR];
  for (int j = 0; j < kRunBlocks; ++j) {
    const int64_t blk = run * kRunBlocks + j;
    if (blk % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(row + 32 * blk + kRunPrefetchBytes), _MM_HINT_T1);
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * blk));
    const __m256i lo = _mm256_and_si256(b, low4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
    for (int i = 0; i < MR; ++i) {
      const int8_t* xq = xr.q[i] + 64 * blk;
      const __m256i p =
          _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq))),
                           _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32))));
      pairs[i] = j == 0 ? p : _mm256_add_epi16(pairs[i], p);
    }
  }
  for (int i = 0; i < MR; ++i) s[i] = _mm256_madd_epi16(pairs[i], _mm256_set1_epi16(1));
}

// For row n of W and x row i: mul[run] = the run's sx times its group's scale, for every run,
// and the return value: the +8's shares of the groups (offsets[g], group_offsets) times their
// scales, in lanes to be summed with the products'.
QUANT_AVX2_INLINE __m256 run_scales(const QWeight& w, int64_t n, const float* sx, const float* offsets, int64_t runs,
                                    int64_t per_group, float* mul) {
  const float* sc = w.row_scales(n);
  if (per_group == 1) {
    int64_t run = 0;
    for (; run + 8 <= runs; run += 8)
      _mm256_storeu_ps(mul + run, _mm256_mul_ps(_mm256_loadu_ps(sx + run), _mm256_loadu_ps(sc + run)));
    for (; run < runs; ++run) mul[run] = sx[run] * sc[run];
  } else {
    for (int64_t g = 0, run = 0; g < w.groups; ++g) {
      const int64_t end = run + per_group;
      for (; run + 8 <= end; run += 8)
        _mm256_storeu_ps(mul + run, _mm256_mul_ps(_mm256_loadu_ps(sx + run), _mm256_set1_ps(sc[g])));
      for (; run < end; ++run) mul[run] = sx[run] * sc[g];
    }
  }
  __m256 shares = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= w.groups; g += 8)
    shares = _mm256_fmadd_ps(_mm256_loadu_ps(sc + g), _mm256_loadu_ps(offsets + g), shares);
  float tail = 0.0f;
  for (; g < w.groups; ++g) tail += sc[g] * offsets[g];
  return _mm256_add_ps(shares, _mm256_setr_ps(tail, 0, 0, 0, 0, 0, 0, 0));
}

// acc[i][a] += run `run`'s lane sums times mul[i * runs + run]. `a` is a constant where this is
// inlined: indexed by a variable, the accumulators went through the stack, each FMA waiting on
// the last one's store (1.2x the time from L3).
template <int MR, int kRunBlocks>
QUANT_AVX2_INLINE void scaled_run(__m256 (&acc)[MR][2], int a, const uint8_t* row, const XRows<MR>& xr,
                                  const float* mul, int64_t runs, int64_t run) {
  __m256i s[MR];
  run_sums<MR, kRunBlocks>(s, row, xr, run);
  for (int i = 0; i < MR; ++i)
    acc[i][a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_broadcast_ss(mul + i * runs + run), acc[i][a]);
}

// Rows [n0, n1) of 4-bit W, one at a time, against rows i0 .. i0 + MR - 1 of x quantized in runs
// of 64 kRunBlocks k (a group holds whole runs). Per row, first each run's scale (run_scales);
// then per run one vpmaddwd, conversion and FMA by that scale, broadcast from memory (a load,
// not a vector operation), into two accumulators in turn. Summing each group's runs apart and
// scaling the group as it closed took 1.2x as long from L3 (K=N=4096, 2 threads: 259-269 us
// against 217-226; per-channel scales the same either way), on a Zen 3 server whose two cores
// stream DRAM at about that rate, so that the arithmetic was showing. One row of W at a time
// streams W front to back: with 4 rows at a time (4 streams 2 KB apart at K = 4096) the GEMV
// from DRAM took 1.2x as long, with 2 sharing their loads of x 1.15x as long from L3.
template <int MR, int kRunBlocks>
QUANT_AVX2 void rows_int8x4_runs(const QWeight& w, const XInt8& x, const float* group_offset, int64_t i0, int64_t n0,
                                 int64_t n1, float* y, int64_t ldy) {
  const XRows<MR> xr(w, x, i0);
  const float* offsets = group_offset + i0 * w.groups;
  const int64_t runs = w.k / (64 * kRunBlocks), per_group = w.group / (64 * kRunBlocks);
  std::vector<float> mul(static_cast<size_t>(MR * runs));
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.row(n);
    __m256 acc[MR][2];
    for (int i = 0; i < MR; ++i) {
      acc[i][0] = run_scales(w, n, xr.sx[i], offsets + i * w.groups, runs, per_group, mul.data() + i * runs);
      acc[i][1] = _mm256_setzero_ps();
    }
    int64_t run = 0;
    for (; run + 2 <= runs; run += 2) {
      scaled_run<MR, kRunBlocks>(acc, 0, row, xr, mul.data(), runs, run);
      scaled_run<MR, kRunBlocks>(acc, 1, row, xr, mul.data(), runs, run + 1);
    }
    if (run < runs) scaled_run<MR, kRunBlocks>(acc, 0, row, xr, mul.data(), runs, run);
    for (int i = 0; i < MR; ++i) y[(i0 + i) * ldy + n] = avx2::sum8(_mm256_add_ps(acc[i][0], acc[i][1]));
  }
}

// The same for 8-bit W, a run at a time.
template <int MR, int NR>
QUANT_AVX2 void tile_int8x8(const QWeight& w, const XInt8& x, int64_t i0, int64_t n, float* y, int64_t ldy) {
  const Rows<NR> rows(w, n);
  const XRows<MR> xr(w, x, i0);
  __m256 acc[MR][NR], sum[MR][NR];
  zero(acc, sum);
  const int64_t group_runs = w.group / x.run;
  for (int64_t g = 0; g < w.groups; ++g) {
    for (int64_t run = g * group_runs; run < (g + 1) * group_runs; ++run) {
      const int64_t k = run * x.run;
      if ((run & 1) == 0) rows.prefetch(k);
      for (int r = 0; r < NR; ++r) {
        __m256i s[MR];
        for (int i = 0; i < MR; ++i) s[i] = dot8(rows.row[r] + k, xr.q[i] + k);
        add_run<MR, NR>(sum, r, s, xr.sx, run);
      }
    }
    close_group<MR, NR>(acc, sum, rows, g);
  }
  store_sums<MR, NR>(acc, n, y + i0 * ldy, ldy);
}

template <int MR, int NR>
void rows_int8x(const QWeight& w, const XInt8& x, const float* group_offset, int64_t i0, int64_t n0, int64_t n1,
                float* y, int64_t ldy) {
  int64_t n = n0;
  if (w.bits == 4 && x.run == 128) {
    rows_int8x4_runs<MR, 2>(w, x, group_offset, i0, n0, n1, y, ldy);
  } else if (w.bits == 4 && x.run == 64) {
    rows_int8x4_runs<MR, 1>(w, x, group_offset, i0, n0, n1, y, ldy);
  } else if (w.bits == 4 && w.group / x.run % 2 != 0) {
    for (; n + NR <= n1; n += NR) tile_int8x4<MR, NR, true>(w, x, group_offset, i0, n, y, ldy);
    for (; n < n1; ++n) tile_int8x4<MR, 1, true>(w, x, group_offset, i0, n, y, ldy);
  } else if (w.bits == 4) {
    for (; n + NR <= n1; n += NR) tile_int8x4<MR, NR, false>(w, x, group_offset, i0, n, y, ldy);
    for (; n < n1; ++n) tile_int8x4<MR, 1, false>(w, x, group_offset, i0, n, y, ldy);
  } else {
    for (; n + NR <= n1; n += NR) tile_int8x8<MR, NR>(w, x, i0, n, y, ldy);
    for (; n < n1; ++n) tile_int8x8<MR, 1>(w, x, i0, n, y, ldy);
  }
}

// 4 bits: the +8's share of each group of each row of x, [m][groups], from each run's
// (quantize_x): summed once per call, not once per tile (a scalar chain of group / 32 adds per
// group, per 4 rows of W: ~15% of a 4-bit GEMV's time at K=N=4096).
std::vector<float> group_offsets(const QWeight& w, const XInt8& x) {
  if (w.bits != 4) return {};
  std::vector<float> out(static_cast<size_t>(x.m * w.groups));
  const int64_t group_runs = w.group / x.run;
  for (int64_t i = 0; i < x.m; ++i) {
    const float* offset = reinterpret_cast<const float*>(x.row(i));
    for (int64_t g = 0; g < w.groups; ++g) {
      float total = 0.0f;
      for (int64_t run = g * group_runs; run < (g + 1) * group_runs; ++run) total += offset[run];
      out[static_cast<size_t>(i * w.groups + g)] = total;
    }
  }
  return out;
}

// Round half away from zero, as round_half_away().
QUANT_AVX2_INLINE __m256 round_half_away8(__m256 v) {
  const __m256 t = _mm256_cvtepi32_ps(_mm256_cvttps_epi32(v));
  const __m256 f = _mm256_sub_ps(v, t), one = _mm256_set1_ps(1.0f);
  const __m256 up = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
  const __m256 down = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(-0.5f), _CMP_LE_OQ), one);
  return _mm256_sub_ps(_mm256_add_ps(t, up), down);
}

}  // namespace

QUANT_AVX2 void quantize_runs_avx2(const float* x, int64_t runs, int64_t run, int8_t* q, float* sx, float* offsets) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  for (int64_t r = 0; r < runs; ++r) {
    const float* v = x + r * run;
    __m256 amax = _mm256_setzero_ps();
    // a NaN lane keeps amax, as std::max
    for (int64_t j = 0; j < run; j += 8) amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + j), abs_mask), amax);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float s = _mm_cvtss_f32(m) / 127.0f;
    sx[r] = s;
    __m256i sum = _mm256_setzero_si256();
    for (int64_t j0 = 0; j0 < run; j0 += 32) {
      __m256i c[4];
      for (int j = 0; j < 4; ++j) {
        const __m256 t = round_half_away8(_mm256_div_ps(_mm256_loadu_ps(v + j0 + 8 * j), _mm256_set1_ps(s)));
        c[j] = s == 0.0f ? _mm256_setzero_si256() : _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi));
      }
      // int32 -> int8 packs within 128-bit lanes: dwords come out in the order 0 4 1 5 2 6 3 7.
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + r * run + j0),
                          _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3])));
    }
    if (offsets != nullptr) {
      __m128i h = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
      h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
      offsets[r] = s * static_cast<float>(-8 * _mm_cvtsi128_si32(h));
    }
  }
}

void gemv_avx2(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (w.group % (w.bits == 4 ? 32 : 8) != 0) return gemv_any_group(w, x, m, n0, n1, y, ldy);
  // 4 bits: the codes' +8 per half block (groups of an odd number of halves) or per group.
  const int64_t span = w.group % 64 != 0 ? 32 : w.group, spans = w.bits == 4 ? w.k / span : 0;
  const std::vector<float> shifts = w.bits == 4 ? code_shifts(x, m, w.k, span) : std::vector<float>();
  // Rows of x four at a time, then two, then one: a row's sums are the same in each. 4 bits
  // keep 3 MR x NR accumulators in registers.
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    if (w.bits == 4) {
      rows_f32<4, 1>(w, x + i * w.k, shifts.data() + i * spans, spans, n0, n1, y + i * ldy, ldy);
    } else {
      rows_f32<4, 2>(w, x + i * w.k, nullptr, 0, n0, n1, y + i * ldy, ldy);
    }
  }
  for (; i + 2 <= m; i += 2) rows_f32<2, 2>(w, x + i * w.k, shifts.data() + i * spans, spans, n0, n1, y + i * ldy, ldy);
  // One row of x: 4-bit W two rows at a time (fewer weight streams: a 4096 x 4096 GEMV from
  // DRAM took 0.57-0.83 ms for 4 at a time, 0.51-0.77 for 2), 8-bit W four (2 took 1.2x as long).
  for (; i < m; ++i) {
    if (w.bits == 4) {
      rows_f32<1, 2>(w, x + i * w.k, shifts.data() + i * spans, spans, n0, n1, y + i * ldy, ldy);
    } else {
      rows_f32<1, 4>(w, x + i * w.k, nullptr, 0, n0, n1, y + i * ldy, ldy);
    }
  }
}

void gemv_int8x_avx2(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const std::vector<float> offsets = group_offsets(w, x);
  int64_t i = 0;
  for (; i + 4 <= x.m; i += 4) rows_int8x<4, 2>(w, x, offsets.data(), i, n0, n1, y, ldy);
  for (; i + 2 <= x.m; i += 2) rows_int8x<2, 2>(w, x, offsets.data(), i, n0, n1, y, ldy);
  // One row of x: 4-bit W in runs of 32 two rows at a time, as the float-x GEMV (groups of 32 from
  // DRAM, K=N=4096: 0.61 ms for 4 at a time, 0.54 for 2); 8-bit W four (2: 1.03-1.05x as long).
  for (; i < x.m; ++i) {
    if (w.bits == 4) {
      rows_int8x<1, 2>(w, x, offsets.data(), i, n0, n1, y, ldy);
    } else {
      rows_int8x<1, 4>(w, x, offsets.data(), i, n0, n1, y, ldy);
    }
  }
}

}  // namespace anychip::cpu::quant
