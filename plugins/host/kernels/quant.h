// Private to the quantized-linear kernels (quant_*.cc): the weight layouts that weight_quantize
// writes (kernel.h), their dequantization, and the GEMV / GEMM engines the kernels share.
//
// The engines work on one thread's share of the work; the kernels own the OpenMP regions,
// except gemm_f32 and gemm_amx which parallelise over output column blocks themselves.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "common.h"

namespace anychip::cpu::quant {

// Round half away from zero (std::round / lroundf semantics), exact for |v| < 2^31 and
// branch-free so that loops around it vectorise: v - trunc(v) is exact in float32.
inline float round_half_away(float v) {
  const float t = static_cast<float>(static_cast<int32_t>(v));
  const float f = v - t;
  return t + (f >= 0.5f ? 1.0f : 0.0f) - (f <= -0.5f ? 1.0f : 0.0f);
}

// A quantized weight W[N, K] as weight_quantize writes it.
struct QWeight {
  const uint8_t* q;      // bits 8: int8 [N, K]; bits 4: uint8 [N, K/2] in 64-wide nibble blocks
  const float* scales;   // [N, groups]
  const float* offsets = nullptr;  // [N, groups] or none: W = q * scale + offset (asymmetric groups)
  int64_t n = 0, k = 0;
  int64_t group = 0;     // elements per scale (K for group_size -1)
  int64_t groups = 0;
  int bits = 8;
  // Or null: the same W in panel form (kernel.h's decoder_step, attr panels), [ceil(n / 16)]
  // panels of panel_bytes(): 16 rows' codes with each 4 bytes of a row in its own dword lane,
  // then their scales and offsets by group, each group's 16 side by side. gemm_int8x reads it
  // in place of q, scales and offsets.
  const uint8_t* panels = nullptr;

  int64_t row_bytes() const { return bits == 8 ? k : k / 2; }
  int64_t panel_bytes() const { return 16 * row_bytes() + 64 * groups * (offsets != nullptr ? 2 : 1); }
  // Room for m rows of k at either bit width, so that quantize_x then allocates nothing.
  void reserve(int64_t m, int64_t k);

  const uint8_t* row(int64_t i) const { return q + i * row_bytes(); }
  const float* row_scales(int64_t i) const { return scales + i * groups; }
  const float* row_offsets(int64_t i) const { return offsets == nullptr ? nullptr : offsets + i * groups; }
  // The same weight without its offsets: the symmetric part q * scale.
  QWeight symmetric() const {
    QWeight s = *this;
    s.offsets = nullptr;
    return s;
  }
};

// q[n][k] without its scale. 4 bits: block b = k / 64 is 32 bytes, byte i holding k = 64b + i
// (low nibble) and 64b + 32 + i (high nibble), each stored as q + 8.
inline int qvalue(const QWeight& w, int64_t n, int64_t k) {
  const uint8_t* r = w.row(n);
  if (w.bits == 8) return static_cast<int8_t>(r[k]);
  const uint8_t b = r[(k >> 6) * 32 + (k & 31)];
  return ((k & 32) ? (b >> 4) : (b & 15)) - 8;
}

// W[n][k0, k1) into out[0, k1 - k0): q * scale (the float32 product), or with offsets
// fma(q, scale, offset) (one rounding).
void dequant_row(const QWeight& w, int64_t n, int64_t k0, int64_t k1, float* out, Isa isa);

// ---- float tensors -----------------------------------------------------------------------------

inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
inline bool is_float(int32_t dtype) {
  return dtype == ANYCHIP_DTYPE_FLOAT32 || dtype == ANYCHIP_DTYPE_BFLOAT16 || dtype == ANYCHIP_DTYPE_FLOAT16;
}
// Element i of a float tensor.
inline char* at(const AnychipTensor& t, int64_t i) {
  return static_cast<char*>(t.data) + static_cast<size_t>(i) * (t.dtype == ANYCHIP_DTYPE_FLOAT32 ? 4 : 2);
}

// n elements of a float dtype to / from float32.
void to_f32(const void* src, int32_t dtype, int64_t n, float* dst, Isa isa);
void from_f32(const float* src, int64_t n, int32_t dtype, void* dst, Isa isa);
float load_f32(const void* src, int32_t dtype, int64_t i);

// Writes acc[i * ldacc + c] (+ bias[c0 + c]) into y[(r0 + i) * ld + c0 + c], i < rows, c < cols.
void store_rows(const AnychipTensor& y, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                const float* acc, int64_t ldacc, const float* bias, Isa isa);

// ---- decode-sized products (M <= kGemvRows): stream W once -----------------------------------

constexpr int64_t kGemvRows = 8;

// y[m][n] = sum_k x[m][k] q[n][k] scales[n][k / group] for m < M, n in [n0, n1): the symmetric
// part of x W^T (offsets are ignored; add_offsets adds their share). x float32 [M][K], y float32
// [M][ldy].
void gemv(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy, Isa isa);

// y[m][n] += sum_g offsets[n][g] * (sum of x[m] over group g), for n in [n0, n1): the offsets'
// share of x W^T, added after gemv (or any product over the symmetric part). No-op without
// offsets.
void add_offsets(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy);

// add_offsets in two steps, for callers that split N into many ranges: the group sums of x once
// (sums[i * groups + g], M x groups floats), then the ranges. Same results as add_offsets.
void group_sums(const QWeight& w, const float* x, int64_t m, float* sums);
void add_offsets_sums(const QWeight& w, const float* sums, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy);

// ---- int8 activations (weight_only_linear's x_int8) --------------------------------------------

// x_int8's run length (kernel.h): 8-bit W, 32; 4-bit W, the largest of 128, 64 and 32 that
// divides the group size (K for one group per row). A run lies in one group; a longer run is
// one float scaling per 128 k instead of four, while the 4-bit codes' own rounding costs 7-20x
// the error of int8 x in runs of 128 (heavy-tailed to Gaussian x, K = 4096).
constexpr int64_t x_run(int bits, int64_t group) {
  if (bits != 4) return 32;
  return group % 128 == 0 ? 128 : group % 64 == 0 ? 64 : 32;
}

// M rows of x quantized per run of `run` elements (x_run): sx = absmax / 127, xq =
// clamp(round_half_away(x / sx), -127, 127) (sx 0: xq 0); for W with offsets also the group
// sums of float x, their share. quantize_x builds it for the weights it is to meet; gemv_int8x
// then reads it on any number of row ranges. K must be a multiple of the run.
struct XInt8 {
  static constexpr int64_t kMinRun = 32;  // every run is a multiple of it
  int bits = 4;
  int64_t run = kMinRun;
  int64_t m = 0, k = 0;
  std::vector<int8_t> q;       // [m][k]
  std::vector<float> scale;    // [m][k / run]: sx of each run
  std::vector<float> sums;     // W with offsets: [m][groups], group_sums of float x; else empty
  // The same rows laid out for the AVX-512 products (quant_gemv_int8x.cc's tiles, or from
  // kGemmInt8xRows rows gemm_int8x's: pack_gemm_row), or for 4 bits on AVX2 each run's share of
  // the codes' +8 (quant_gemv_avx2.cc; from kGemmInt8xRows rows pack_gemm_row's, as gemm_int8x),
  // row_bytes each from the first 64-byte boundary of `packed`.
  std::vector<uint8_t> packed;
  int64_t row_bytes = 0;

  int64_t runs() const { return k / run; }
  // Room for m rows of k at either bit width and any run, so that quantize_x then allocates nothing.
  void reserve(int64_t m, int64_t k);

  const uint8_t* row(int64_t i) const {
    const auto base = (reinterpret_cast<uintptr_t>(packed.data()) + 63) & ~uintptr_t{63};
    return reinterpret_cast<const uint8_t*>(base) + i * row_bytes;
  }
};

// x [m][w.k] quantized for W (its bits and groups: runs of x_run(w.bits, w.group)).
void quantize_x(const float* x, int64_t m, const QWeight& w, XInt8* out, Isa isa);

// y[i][n] = sum over runs r of scales[n][g(r)] * sx[i][r] * sum_{k in r} q[n][k] xq[i][k] for
// i < x.m, n in [n0, n1), plus with offsets sum_g offsets[n][g] * x.sums[i][g]: the x_int8
// product. The integer sums are exact; each output's float arithmetic depends only on whether M
// reaches kGemmInt8xRows, not on [n0, n1) or the other rows. x quantized for w (quantize_x).
void gemv_int8x(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy, Isa isa);

// gemv_int8x for x.m >= kGemmInt8xRows rows on AVX-512 (quant_gemm_int8x.cc, which
// says why): 16 columns of W in the lanes, each 32-k piece summed in int32 for every row of x,
// the offsets' share added in the same pass (gemm_int8x_avx2 the same on AVX2, 8 columns).
// A row's float arithmetic is its own, so it gets the same bits in any batch of kGemmInt8xRows
// or more rows (and in any of fewer, from the tiles), not across the two.
constexpr int64_t kGemmInt8xRows = 4;  // below it, transposing the panels costs more than it saves
void gemm_int8x(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy);
// A row of x's codes q [k] as gemm_int8x reads it (gemm_row_bytes(bits, k) bytes at out): 4 bits,
// each 32-k piece's sum start, -8 times the sum of its codes (int32); 8 bits, the codes + 128.
constexpr int64_t gemm_row_bytes(int bits, int64_t k) { return bits == 4 ? k / 32 * 4 : k; }
void pack_gemm_row(const int8_t* q, int64_t k, int bits, uint8_t* out);

// What the two GEMMs share outside their vectors. Their panels hold `cols` columns of W, n ..
// n + cols - 1, of which the first `live` are real and the others repeat column n.
// Lane c of each group's scales (and offsets) in scale_t[g * cols + c] (offset_t).
inline void panel_scales(const QWeight& w, int64_t n, int64_t live, int64_t cols, float* scale_t, float* offset_t) {
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t cn = c < live ? n + c : n;
    for (int64_t g = 0; g < w.groups; ++g) scale_t[g * cols + c] = w.row_scales(cn)[g];
    if (w.offsets != nullptr)
      for (int64_t g = 0; g < w.groups; ++g) offset_t[g * cols + c] = w.row_offsets(cn)[g];
  }
}
// The next panel's columns into L1, on their way from memory while this one's rows multiply:
// the packing would otherwise wait on DRAM with nothing else to do (without it, packing took
// 40% of gemm_int8x_avx2's time at 16 rows).
inline void prefetch_next_panel(const QWeight& w, int64_t n, int64_t cols) {
  const int64_t bytes = w.row_bytes();
  for (int64_t c = 0; c < cols; ++c) {
    const char* row = reinterpret_cast<const char*>(w.row(std::min(n + cols + c, w.n - 1)));
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 3);
  }
}
// rows(std::integral_constant<int, MR>(), i0) for the m rows of x in blocks of kMax, the last
// one shorter: a block's sums stay in registers, so MR is a template constant.
template <int MR, int kMax, typename Rows>
void row_block(int64_t count, int64_t i0, Rows& rows) {
  if constexpr (MR < kMax) {
    if (count != MR) return row_block<MR + 1, kMax>(count, i0, rows);
  }
  rows(std::integral_constant<int, MR>(), i0);
}
template <int kMax, typename Rows>
void row_blocks(int64_t m, Rows&& rows) {
  for (int64_t i0 = 0; i0 < m; i0 += kMax) row_block<1, kMax>(std::min<int64_t>(kMax, m - i0), i0, rows);
}

// gemv and gemv_int8x on AVX2 + FMA (quant_gemv_avx2.cc), for the symmetric part of W (4 bits:
// K a multiple of 64). Every row of x any M, each row's sums the same whatever M.
void gemv_avx2(const QWeight& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy);
void gemv_int8x_avx2(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy);
// gemm_int8x on AVX2 (quant_gemm_int8x_avx2.cc): 8 columns of W in the lanes; x quantized for
// it (quantize_x: for 4 bits pack_gemm_row's layout). A row's float arithmetic is its own, as
// in gemm_int8x.
void gemm_int8x_avx2(const QWeight& w, const XInt8& x, int64_t n0, int64_t n1, float* y, int64_t ldy);
// quantize_x's runs on AVX2, bit for bit as its scalar loop: `runs` runs of `run` (a multiple of
// 32) of x into their codes q and scales sx, and with `offsets` each run's share of the 4-bit
// codes' +8 (sx * -8 * the sum of its codes).
void quantize_runs_avx2(const float* x, int64_t runs, int64_t run, int8_t* q, float* sx, float* offsets);

// acc[i * ldacc + k - k0] += sum_n dy[i][n] W[n][k] for i < M, k in [k0, k1), W with its offsets;
// dy float32 [M][N]. scratch holds 4 * (k1 - k0) floats.
void gemv_grad(const QWeight& w, const float* dy, int64_t m, int64_t k0, int64_t k1, float* acc, int64_t ldacc,
               float* scratch, Isa isa);

// AMX bf16 version of x W^T, W with its offsets, for bf16 x with at most 16 rows, K a multiple
// of 64 and groups of whole 32 (4 bits) or 16 (8 bits) columns, as gemv_amx_fits checks:
// x^T packed once by pack_xt (or pack_xt_f32 from float32 x, rounded to bf16 to nearest even),
// then gemv_amx on any number of row ranges, on threads between amx_thread_begin(M) and
// amx_thread_end(), each with its own scratch of kAmxGemvScratch elements. Each output sums
// its products in the same order whatever M and the row range, so results do not depend on
// how the caller cuts rows of x or of W.
constexpr int64_t kAmxGemvScratch = 2 * 64 * 128;
bool gemv_amx_fits(const QWeight& w, int64_t m);
std::vector<uint8_t> pack_xt(const uint16_t* x, int64_t m, int64_t k);
constexpr int64_t packed_xt_bytes(int64_t m, int64_t k) { return 2 * m * k; }
void pack_xt_f32(const float* x, int64_t m, int64_t k, uint8_t* out);  // packed_xt_bytes(m, k)
void gemv_amx(const QWeight& w, const uint8_t* xt, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy,
              uint16_t* scratch);
// The same for a bfloat16 W [N][K] (row-major, K a multiple of 32), its tiles loaded straight
// from W: y[i][n] = sum_k bf16(x[i][k]) W[n][k] in float32, for n in [n0, n1). tail holds 64 K
// elements, for the last rows of W zero-padded to a whole block.
void gemv_amx_bf16(const uint16_t* w, int64_t n, int64_t k, const uint8_t* xt, int64_t m, int64_t n0, int64_t n1,
                   float* y, int64_t ldy, uint16_t* tail);
void amx_thread_begin(int64_t m);
void amx_thread_end();

// ---- blocked products: C[M][J] = A[M][L] B[L][J] ----------------------------------------------

// FMA, AVX-512 or (isa kAvx2) AVX2. A is float32 (row stride lda). B is packed on demand, 64
// columns at a time:
// pack(j0, l0, lb, bp, scratch) writes bp[l][jj] = B[l0 + l][j0 + jj] for l < lb, jj < 64
// (zeros for columns past J); scratch holds 16 * lb floats. store(m0, mb, j0, c) receives
// C[m0 + i][j0 + jj] = c[i * 64 + jj] for i < mb and the columns jj < 64 that exist.
// With direct.y set, gemm_f32 writes C itself instead, from the registers it sums in:
// y[i * ld + jj] = C[i][jj] + bias[jj] (bias optional), and never calls store.
using PackF32 = std::function<void(int64_t j0, int64_t l0, int64_t lb, float* bp, float* scratch)>;
using StoreF32 = std::function<void(int64_t m0, int64_t mb, int64_t j0, const float* c)>;
struct DirectF32 {
  float* y = nullptr;
  int64_t ld = 0;
  const float* bias = nullptr;
};
void gemm_f32(const float* a, int64_t lda, int64_t m, int64_t l, int64_t j, const PackF32& pack,
              const StoreF32& store, int threads, Isa isa, const DirectF32& direct = {});

// AMX. A is bf16 (tdpbf16ps) or int8 (tdpbssd), row stride lda bytes, with round_up(M, 32)
// rows and the contraction padded with zeros to lp, a multiple of the tile depth d (32 bf16 or
// 64 int8). pack(j0, nt, tiles, scratch) writes the B tiles of the nt column tiles from j0:
// column tile t at tiles + t * (lp / d) KB holds, for each step s < lp / d, a 16 x 64-byte tile
// whose row r, dword c packs the pair (bf16) or quad (int8) of contraction indices s * d +
// (2 or 4) * r + 0, 1, ... of column j0 + 16 t + c; zeros for columns past J. scratch holds
// 16 * lp floats.
// store(m0, j0, c) receives the float32 or int32 C[m0 + i][j0 + jj] = c[i * 32 + jj], i, jj < 32
// (rows past M and columns past J hold garbage and must be skipped).
using PackAmx = std::function<void(int64_t j0, int64_t nt, uint8_t* tiles, float* scratch)>;
using StoreAmx = std::function<void(int64_t m0, int64_t j0, const void* c)>;
void gemm_amx(const uint8_t* a, int64_t lda, bool int8, int64_t m, int64_t lp, int64_t j, const PackAmx& pack,
              const StoreAmx& store, int threads);

// Transposes a 16 x 16 block of dwords: dst[c * ld_dst + r] = src[r * ld_src + c] (AVX-512).
void transpose16(const uint32_t* src, int64_t ld_src, uint32_t* dst, int64_t ld_dst);

}  // namespace anychip::cpu::quant
