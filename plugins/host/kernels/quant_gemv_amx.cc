// Decode-sized products for bf16 x on AMX: with a few rows of x the float32 FMA GEMV runs out
// of arithmetic before memory bandwidth, while one tdpbf16ps multiplies 16 rows of W by up to 16
// rows of x. So C^T = W x^T: x^T is packed once into VNNI tiles (B), and each block of 64 rows
// of W is dequantized to bf16, a chunk of columns at a time, into an L1 scratch the A tiles are
// loaded from. The weights are rounded to bf16 (q * scale, or fma(q, scale, offset), in float32,
// then to nearest even). A bfloat16 W (gemv_amx_bf16) needs no dequantization: its A tiles load
// straight from W's rows.
#include <algorithm>
#include <vector>

#include "quant.h"
#include "quant_simd.h"

namespace anychip::cpu::quant {
namespace {

constexpr int64_t kRows = 64;     // rows of W per call: four accumulator tiles
constexpr int64_t kChunk = 128;   // columns dequantized at a time (16 KB of bf16 for 64 rows)
static_assert(kAmxGemvScratch == 2 * kRows * kChunk, "two chunk buffers");

// The bf16 lookup table of a 4-bit row's group: 16 values (code - 8) * scale + offset, twice
// over, since vpermw reads 5 index bits (the fifth being the high nibble's lowest bit for a low
// nibble).
QUANT_AMX inline __m512i nibble_table_bf16(float scale, float offset) {
  const __m512 values = _mm512_fmadd_ps(nibble_values(), _mm512_set1_ps(scale), _mm512_set1_ps(offset));
  const __m256i half = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(values));
  return _mm512_inserti64x4(_mm512_castsi256_si512(half), half, 1);
}

// Dequantizes one chunk of columns of up to 64 rows of W into bf16, some rows at a time.
class ChunkDequant {
 public:
  ChunkDequant(const QWeight& w, int64_t n0, int64_t rows) : bits_(w.bits), group_size_(w.group), k_(w.k) {
    rows_ = std::min(rows, kRows);
    for (int64_t r = 0; r < rows_; ++r) {
      row_[r] = w.row(n0 + r);
      scales_[r] = w.row_scales(n0 + r);
      offsets_[r] = w.row_offsets(n0 + r);
      low_group_[r] = high_group_[r] = -1;
    }
  }

  // Rows [r0, r1) of the columns [k0, k0 + width) into out[r][k - k0] (row stride kChunk);
  // width is kChunk, or 64 for the last chunk of a K that is an odd multiple of 64.
  QUANT_AMX void rows(int64_t k0, int64_t width, int64_t r0, int64_t r1, uint16_t* out) {
    r1 = std::min(r1, rows_);
    if (k0 != k0_) {  // the group of each 16 columns, shared by all rows
      k0_ = k0;
      for (int64_t j = 0; j < width / 16; ++j) group_[j] = (k0 + 16 * j) / group_size_;
    }
    // Each row's next-but-one chunk, which the hardware prefetcher would not find among 64 rows.
    const int64_t bytes = bits_ == 4 ? kChunk / 2 : kChunk, src0 = k0 * bytes / kChunk;
    const bool prefetch = k0 + 2 * kChunk < k_;
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* src = row_[r] + src0;
      uint16_t* dst = out + r * kChunk;
      if (prefetch)
        for (int64_t line = 0; line < bytes; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(src + 2 * bytes + line), _MM_HINT_T0);
      if (bits_ == 4) {
        for (int64_t b = 0; b < width / 64; ++b) {
          // The low nibbles hold columns 64b .. 64b + 31, the high ones the next 32: with groups
          // of 32 they have tables of their own.
          const int64_t low = group_[4 * b], high = group_[4 * b + 2];
          if (low_group_[r] != low) {
            low_[r] = high_group_[r] == low ? high_[r] : table(r, low);
            low_group_[r] = low;
          }
          if (high_group_[r] != high) {
            high_[r] = high == low ? low_[r] : table(r, high);
            high_group_[r] = high;
          }
          const __m512i codes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * b)));
          _mm512_storeu_si512(dst + 64 * b, _mm512_permutexvar_epi16(codes, low_[r]));
          _mm512_storeu_si512(dst + 64 * b + 32, _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 4), high_[r]));
        }
      } else {
        for (int64_t j = 0; j < width / 16; ++j) {
          const int64_t g = group_[j];
          const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * j)));
          const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scales_[r][g]),
                                           _mm512_set1_ps(offset(r, g)));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * j), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
        }
      }
    }
  }

 private:
  float offset(int64_t r, int64_t g) const { return offsets_[r] == nullptr ? 0.0f : offsets_[r][g]; }
  QUANT_AMX __m512i table(int64_t r, int64_t g) const { return nibble_table_bf16(scales_[r][g], offset(r, g)); }

  int bits_;
  int64_t group_size_, k_, rows_;
  int64_t k0_ = -1;
  int64_t group_[kChunk / 16] = {};
  const uint8_t* row_[kRows];
  const float* scales_[kRows];
  const float* offsets_[kRows];
  __m512i low_[kRows], high_[kRows];              // 4 bits: the tables of the low and high nibbles
  int64_t low_group_[kRows], high_group_[kRows];  // the groups they are for
};

// One step of 32 columns: the four tiles of 16 rows of A (row stride lda elements) times x^T (16
// rows of ldx bytes), into accumulators 0 to 3.
QUANT_AMX inline void tile_step(const uint16_t* a, int64_t lda, const uint8_t* xt_tile, int64_t ldx) {
  const int64_t ld = 2 * lda;
  _tile_loadd(6, xt_tile, ldx);
  _tile_loadd(4, a, ld);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(5, a + 16 * lda, ld);
  _tile_dpbf16ps(1, 5, 6);
  _tile_loadd(4, a + 32 * lda, ld);
  _tile_dpbf16ps(2, 4, 6);
  _tile_loadd(5, a + 48 * lda, ld);
  _tile_dpbf16ps(3, 5, 6);
}

// The four accumulators (64 rows of W) into y[i * ldy + r] for r < rows, i < m.
QUANT_AMX inline void store_accumulators(int64_t m, int64_t rows, float* y, int64_t ldy) {
  alignas(64) float c[kRows * 16];
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 16 * 16, 64);
  _tile_stored(2, c + 32 * 16, 64);
  _tile_stored(3, c + 48 * 16, 64);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < m; ++i) y[i * ldy + r] = c[r * 16 + i];
}

// Rows [n0, n1) (at most 64). The dequantization of the next chunk of columns is spread over
// the steps of the current one, so that it runs while the tile unit multiplies. Rows of the
// buffers past n1 hold garbage, which reaches only rows of C that are dropped.
QUANT_AMX void gemv_amx_block(const QWeight& w, const uint8_t* xt, int64_t m, int64_t n0, int64_t n1, float* y,
                              int64_t ldy, uint16_t* buffers) {
  const int64_t chunks = (w.k + kChunk - 1) / kChunk, ldx = 4 * m;
  auto width = [&](int64_t chunk) { return std::min(kChunk, w.k - chunk * kChunk); };
  ChunkDequant dequant(w, n0, n1 - n0);
  dequant.rows(0, width(0), 0, kRows, buffers);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t chunk = 0, step = 0; chunk < chunks; ++chunk) {
    QUANT_TILE_BARRIER();
    const uint16_t* a = buffers + (chunk & 1) * kRows * kChunk;
    uint16_t* next = buffers + ((chunk + 1) & 1) * kRows * kChunk;
    const int64_t steps = width(chunk) / 32, rows_per_step = (kRows + steps - 1) / steps;
    for (int64_t s = 0; s < steps; ++s, ++step) {
      const uint8_t* xs = xt + step * 16 * ldx;
      if (step + 1 < w.k / 32)  // x^T is in L2; its next tile into L1
        for (int64_t line = 0; line < 16 * ldx; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(xs + 16 * ldx + line), _MM_HINT_T0);
      tile_step(a + 32 * s, kChunk, xs, ldx);
      if (chunk + 1 < chunks)
        dequant.rows((chunk + 1) * kChunk, width(chunk + 1), s * rows_per_step, (s + 1) * rows_per_step, next);
    }
  }
  store_accumulators(m, n1 - n0, y + n0, ldy);
}

// Rows [0, rows) of a block of 64 rows of a bfloat16 W (row stride k), all of which exist.
QUANT_AMX void gemv_amx_bf16_block(const uint16_t* w, int64_t k, const uint8_t* xt, int64_t m, int64_t rows,
                                   float* y, int64_t ldy) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = 0; s < k / 32; ++s) tile_step(w + 32 * s, k, xt + s * 16 * 4 * m, 4 * m);
  store_accumulators(m, rows, y, ldy);
}

// Accumulators and x^T as 16 rows of M dwords, W as 16 rows of 32 bf16.
QUANT_AMX void tiles_begin(int64_t m) {
  load_tile_config(7, [m](int t) { return t == 4 || t == 5 ? 64 : 4 * m; });
}
QUANT_AMX void tiles_end() { _tile_release(); }

}  // namespace

bool gemv_amx_fits(const QWeight& w, int64_t m) {
  return m <= 16 && w.k % 64 == 0 && w.group % (w.bits == 4 ? 32 : 16) == 0;
}

std::vector<uint8_t> pack_xt(const uint16_t* x, int64_t m, int64_t k) {
  std::vector<uint16_t> rows(static_cast<size_t>(16 * k), 0);
  std::copy(x, x + m * k, rows.begin());
  std::vector<uint32_t> tile(256);
  std::vector<uint8_t> tiles(static_cast<size_t>(k / 32 * 16 * 4 * m));
  for (int64_t s = 0; s < k / 32; ++s) {
    transpose16(reinterpret_cast<const uint32_t*>(rows.data()) + 16 * s, k / 2, tile.data(), 16);
    for (int64_t r = 0; r < 16; ++r)
      std::memcpy(tiles.data() + (s * 16 + r) * 4 * m, tile.data() + 16 * r, static_cast<size_t>(4 * m));
  }
  return tiles;
}

// Row r of step s's tile holds, for each row i of x, the dword (x[i][32 s + 2 r], x[i][32 s + 2 r + 1]).
void pack_xt_f32(const float* x, int64_t m, int64_t k, uint8_t* out) {
  auto* dwords = reinterpret_cast<uint32_t*>(out);
  for (int64_t s = 0; s < k / 32; ++s)
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t i = 0; i < m; ++i) {
        const float* pair = x + i * k + 32 * s + 2 * r;
        const uint32_t lo = from_float<bf16>(pair[0]).bits, hi = from_float<bf16>(pair[1]).bits;
        dwords[(s * 16 + r) * m + i] = lo | hi << 16;
      }
}

void gemv_amx(const QWeight& w, const uint8_t* xt, int64_t m, int64_t n0, int64_t n1, float* y, int64_t ldy,
              uint16_t* scratch) {
  for (int64_t n = n0; n < n1; n += kRows) gemv_amx_block(w, xt, m, n, std::min(n1, n + kRows), y, ldy, scratch);
}

void gemv_amx_bf16(const uint16_t* w, int64_t n, int64_t k, const uint8_t* xt, int64_t m, int64_t n0, int64_t n1,
                   float* y, int64_t ldy, uint16_t* tail) {
  for (int64_t b = n0; b < n1; b += kRows) {
    const int64_t rows = std::min(n1, b + kRows) - b;
    if (b + kRows <= n) {
      gemv_amx_bf16_block(w + b * k, k, xt, m, rows, y + b, ldy);
    } else {  // tiles would read past W's last row
      const int64_t have = n - b;
      std::copy(w + b * k, w + n * k, tail);
      std::fill(tail + have * k, tail + kRows * k, uint16_t{0});
      QUANT_TILE_BARRIER();
      gemv_amx_bf16_block(tail, k, xt, m, rows, y + b, ldy);
    }
  }
}

void amx_thread_begin(int64_t m) { tiles_begin(m); }
void amx_thread_end() { tiles_end(); }

}  // namespace anychip::cpu::quant
