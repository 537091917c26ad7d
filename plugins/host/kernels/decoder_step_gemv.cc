// The decode step's products y = x W^T for a few rows of x: float32 W here, quantized W through
// quant::gemv (which takes at most kGemvRows rows of x at a time) or, with x_int8, through
// quant::gemv_int8x (the offsets' share included); bfloat16 W through quant::gemv_amx_bf16
// (kBf16Rows rows of x at a time), or without AMX through float32 W's tiles, widened as it is
// loaded (a scalar loop before: SmolLM2 --bf16 decoded at 14 tok/s on a Zen 3, against 69 for
// float32 W).
//
// bfloat16 W is for serving many sequences at once: at 16 rows of x the float32 GEMV spends one
// FMA per weight and row and runs out of arithmetic, while a tile product takes 16 rows of W
// times 16 rows of x, straight from memory. Every batch size, one row included, takes the same
// path, so that a sequence's logits do not depend on what else is decoding.
//
// Float32 W (and bfloat16 W without AMX) is streamed once: a tile of four rows of W meets up to
// four rows of x at a time, the tile staying in L1 while further rows of x pass. Every (x row,
// W row) pair sums its products in one vector accumulator in k order, whatever the tile, so
// results do not depend on where the caller cuts the rows.
#include <algorithm>

#include "decoder_step.h"
#include "elementwise_avx2.h"
#include "elementwise_avx512.h"

namespace anychip::cpu::decoder {
namespace {

// A tile's rows of W stream from memory side by side, which the hardware prefetcher follows
// poorly: each tile also asks for the same columns of the rows this many tiles ahead (5-10%
// faster on SmolLM2's float32 weights).
constexpr int64_t kPrefetchTiles = 2;

void gemv_f32_scalar(const Lin& w, const float* x, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* row = w.w + n * w.k;
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * w.k;
      float acc = 0.0f;
      for (int64_t k = 0; k < w.k; ++k) acc += xi[k] * row[k];
      y[i * ldy + n] = acc;
    }
  }
}

// Rows n .. n + NR - 1 of W [N][K] (float32 or bfloat16 storage T) against rows 0 .. MR - 1 of
// x (float32).
template <int MR, int NR, typename T>
ANYCHIP_AVX512 void tile_avx512(const T* w, int64_t wn, int64_t k_len, const float* x, int64_t n, float* y,
                                int64_t ldy) {
  const T* row[NR];
  const T* ahead[NR];
  for (int r = 0; r < NR; ++r) {
    row[r] = w + (n + r) * k_len;
    ahead[r] = w + std::min(n + r + kPrefetchTiles * NR, wn - 1) * k_len;
  }
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_len; k += 16) {
    const __mmask16 lane = avx512::lanes(k_len - k);
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) {
      if (sizeof(T) == 4 || (k & 31) == 0) _mm_prefetch(reinterpret_cast<const char*>(ahead[r] + k), _MM_HINT_T1);
      wv[r] = avx512::load16(row[r] + k, lane);
    }
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(lane, x + i * k_len + k);
      for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_fmadd_ps(xv, wv[r], acc[i][r]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) y[i * ldy + n + r] = _mm512_reduce_add_ps(acc[i][r]);
}

// The same tiles on AVX2: 8 lanes, the last K % 8 columns added one by one.
template <int MR, int NR, typename T>
ANYCHIP_AVX2 void tile_avx2(const T* w, int64_t wn, int64_t k_len, const float* x, int64_t n, float* y,
                            int64_t ldy) {
  const T* row[NR];
  const T* ahead[NR];
  for (int r = 0; r < NR; ++r) {
    row[r] = w + (n + r) * k_len;
    ahead[r] = w + std::min(n + r + kPrefetchTiles * NR, wn - 1) * k_len;
  }
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm256_setzero_ps();
  const int64_t k8 = k_len / 8 * 8;
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 wv[NR];
    for (int r = 0; r < NR; ++r) {
      if ((k * static_cast<int64_t>(sizeof(T)) & 63) == 0)
        _mm_prefetch(reinterpret_cast<const char*>(ahead[r] + k), _MM_HINT_T1);
      wv[r] = avx2::load8(row[r] + k);
    }
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * k_len + k);
      for (int r = 0; r < NR; ++r) acc[i][r] = _mm256_fmadd_ps(xv, wv[r], acc[i][r]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) {
      float sum = avx2::sum8(acc[i][r]);
      for (int64_t k = k8; k < k_len; ++k) sum += x[i * k_len + k] * to_float(row[r][k]);
      y[i * ldy + n + r] = sum;
    }
}

// Rows n .. n + NR - 1 of W against MR rows of x, on the AVX-512 or the AVX2 tile.
template <int MR, int NR, typename T>
void tile(bool avx512, const T* w, int64_t wn, int64_t k, const float* x, int64_t n, float* y, int64_t ldy) {
  avx512 ? tile_avx512<MR, NR>(w, wn, k, x, n, y, ldy) : tile_avx2<MR, NR>(w, wn, k, x, n, y, ldy);
}

// The same against all m rows of x, four at a time.
template <int NR, typename T>
void tile_all_rows(bool avx512, const T* w, int64_t wn, int64_t k, const float* x, int64_t m, int64_t n, float* y,
                   int64_t ldy) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) tile<4, NR>(avx512, w, wn, k, x + i * k, n, y + i * ldy, ldy);
  switch (m - i) {
    case 3: return tile<3, NR>(avx512, w, wn, k, x + i * k, n, y + i * ldy, ldy);
    case 2: return tile<2, NR>(avx512, w, wn, k, x + i * k, n, y + i * ldy, ldy);
    case 1: return tile<1, NR>(avx512, w, wn, k, x + i * k, n, y + i * ldy, ldy);
    default: return;
  }
}

// x W^T for rows [n0, n1) of a float32 or bfloat16 W [wn][k], on AVX-512 or (avx512 false) AVX2
// tiles.
template <typename T>
void gemv_tiles(bool avx512, const T* w, int64_t wn, int64_t k, const float* x, int64_t m, int64_t n0, int64_t n1,
                float* y, int64_t ldy) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) tile_all_rows<4>(avx512, w, wn, k, x, m, n, y, ldy);
  for (; n < n1; ++n) tile_all_rows<1>(avx512, w, wn, k, x, m, n, y, ldy);
}

}  // namespace

namespace {

bool has_bf16_lins(const Model& model) {
  if (model.head.bits == 16) return true;
  for (const Layer& l : model.layer)
    if (l.qkv.bits == 16 || l.o.bits == 16 || l.gate_up.bits == 16 || l.down.bits == 16) return true;
  return false;
}

// A bfloat16 W on the scalar tier: x rounded to bf16, float32 sums in k order.
void gemv_bf16_scalar(const Input& in, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const Lin& w = *in.w;
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* row = w.w16 + n * w.k;
    for (int64_t i = 0; i < in.m; ++i) {
      const float* xi = in.rounded + i * w.k;
      float acc = 0.0f;
      for (int64_t k = 0; k < w.k; ++k) acc += xi[k] * to_float(bf16{row[k]});
      y[i * ldy + n] = acc;
    }
  }
}

// Tiles configured for `rows` rows of x on this thread.
void configure_tiles(Input& in, int64_t rows) {
  if (in.tile_rows == rows) return;
  if (in.tile_rows != 0) quant::amx_thread_end();
  quant::amx_thread_begin(rows);
  in.tile_rows = rows;
}

}  // namespace

Input::Input(const Model& model, int64_t m, int64_t max_k, Isa isa) : m(m), isa(isa), x_int8_(model.x_int8) {
  if (x_int8_) int8_buffer_.reserve(m, max_k);
  if (!has_bf16_lins(model)) return;
  if (isa == Isa::kAmx) {
    xt_buffer_.resize(static_cast<size_t>((m + kBf16Rows - 1) / kBf16Rows * quant::packed_xt_bytes(kBf16Rows, max_k)));
    tail.resize(static_cast<size_t>(64 * max_k));
  } else {
    rounded_buffer_.resize(static_cast<size_t>(m * max_k));
  }
}

Input::~Input() {
  if (tile_rows != 0) quant::amx_thread_end();
}

void Input::set(const Lin& lin, const float* in) {
  w = &lin;
  x = in;
  int8 = nullptr;
  xt = nullptr;
  rounded = nullptr;
  const int64_t k = lin.k;
  if (lin.bits == 16 && isa == Isa::kAmx) {
    for (int64_t i = 0; i < m; i += kBf16Rows)
      quant::pack_xt_f32(in + i * k, std::min(kBf16Rows, m - i), k,
                         xt_buffer_.data() + i / kBf16Rows * quant::packed_xt_bytes(kBf16Rows, k));
    xt = xt_buffer_.data();
  } else if (lin.bits == 16) {
    for (int64_t i = 0; i < m * k; ++i) rounded_buffer_[i] = to_float(from_float<bf16>(in[i]));
    rounded = rounded_buffer_.data();
  } else if (lin.bits != 0 && x_int8_) {
    quant::quantize_x(in, m, lin.q, &int8_buffer_, isa);
    int8 = &int8_buffer_;
  }
}

void gemv(Input& in, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (n0 >= n1) return;
  const Lin& w = *in.w;
  const float* x = in.x;
  const int64_t m = in.m;
  if (in.xt != nullptr) {
    for (int64_t i = 0; i < m; i += kBf16Rows) {
      const int64_t rows = std::min(kBf16Rows, m - i);
      configure_tiles(in, rows);
      quant::gemv_amx_bf16(w.w16, w.n, w.k, in.xt + i / kBf16Rows * quant::packed_xt_bytes(kBf16Rows, w.k), rows,
                           n0, n1, y + i * ldy, ldy, in.tail.data());
    }
    return;
  }
  if (in.rounded != nullptr) {
    if (in.isa == Isa::kScalar) return gemv_bf16_scalar(in, n0, n1, y, ldy);
    return gemv_tiles(has_avx512(in.isa), reinterpret_cast<const bf16*>(w.w16), w.n, w.k, in.rounded, m, n0, n1, y,
                      ldy);
  }
  if (in.int8 != nullptr) {
    quant::gemv_int8x(w.q, *in.int8, n0, n1, y, ldy, in.isa);
    return;
  }
  if (w.bits == 0) {
    if (in.isa == Isa::kScalar) {
      gemv_f32_scalar(w, x, m, n0, n1, y, ldy);
    } else {
      gemv_tiles(has_avx512(in.isa), w.w, w.n, w.k, x, m, n0, n1, y, ldy);
    }
    return;
  }
  for (int64_t i = 0; i < m; i += quant::kGemvRows) {
    const int64_t rows = std::min(quant::kGemvRows, m - i);
    quant::gemv(w.q, x + i * w.k, rows, n0, n1, y + i * ldy, ldy, in.isa);
    quant::add_offsets(w.q, x + i * w.k, rows, n0, n1, y + i * ldy, ldy);
  }
}

}  // namespace anychip::cpu::decoder
