// Blocked products for prefill / training sizes: B (the dequantized weights) is packed into a
// small scratch, a block of columns at a time, and multiplied by all of A before the next block.
// Each thread owns whole column blocks, so C needs no reduction.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "quant.h"
#include "quant_simd.h"

namespace anychip::cpu::quant {
namespace {

// ---- AVX-512 FMA: 6 x 64 register tile, A broadcast, B packed [l][64] --------------------------

constexpr int64_t kCols = 64;     // packed B width
constexpr int64_t kDepth = 256;   // contraction per packed block (64 KB of B)
constexpr int64_t kRows = 480;    // rows of A per pass over a block of B (C scratch 120 KB)
constexpr int kTile = 6;

template <int MR>
QUANT_AVX512 void tile_f32(const float* a, int64_t lda, const float* bp, int64_t lb, float* c, bool first) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * kCols + 16 * j);
  for (int64_t l = 0; l < lb; ++l) {
    const float* b = bp + l * kCols;
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), b2 = _mm512_loadu_ps(b + 32),
                 b3 = _mm512_loadu_ps(b + 48);
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * lda + l]);
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(av, b2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(av, b3, acc[i][3]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(c + i * kCols + 16 * j, acc[i][j]);
}

void tile_rows(int64_t mr, const float* a, int64_t lda, const float* bp, int64_t lb, float* c, bool first) {
  switch (mr) {
    case 1: return tile_f32<1>(a, lda, bp, lb, c, first);
    case 2: return tile_f32<2>(a, lda, bp, lb, c, first);
    case 3: return tile_f32<3>(a, lda, bp, lb, c, first);
    case 4: return tile_f32<4>(a, lda, bp, lb, c, first);
    case 5: return tile_f32<5>(a, lda, bp, lb, c, first);
    default: return tile_f32<kTile>(a, lda, bp, lb, c, first);
  }
}

// ---- AMX: 2 x 2 tiles of 16 x 16 accumulators (tiles 0-3), A in tiles 4-5, B in tiles 6-7 -----

constexpr int64_t kTileBytes = 1024;

// C[m0 .. m0 + 32][two column tiles] over the whole contraction, into c (32 x 32, ld 32).
template <bool kInt8>
QUANT_AMX void tile_amx(const uint8_t* a, int64_t lda, const uint8_t* b0, const uint8_t* b1, int64_t steps,
                        void* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, a + s * 64, lda);
    _tile_loadd(5, a + 16 * lda + s * 64, lda);
    _tile_loadd(6, b0 + s * kTileBytes, 64);
    _tile_loadd(7, b1 + s * kTileBytes, 64);
    if constexpr (kInt8) {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  auto* out = static_cast<uint8_t*>(c);
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 64, 128);
  _tile_stored(2, out + 16 * 128, 128);
  _tile_stored(3, out + 16 * 128 + 64, 128);
}

QUANT_AMX void gemm_amx_thread(const uint8_t* a, int64_t lda, bool int8, int64_t m, int64_t lp, int64_t j,
                               int64_t tiles_per_task, const PackAmx& pack, const StoreAmx& store) {
  load_tile_config();
  const int64_t steps = lp / (int8 ? 64 : 32);
  const int64_t tasks = (j + 16 * tiles_per_task - 1) / (16 * tiles_per_task);
  std::vector<uint8_t> tiles(static_cast<size_t>(tiles_per_task * steps * kTileBytes));
  std::vector<float> scratch(static_cast<size_t>(16 * lp));
  alignas(64) float c[32 * 32];
#pragma omp for schedule(dynamic)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t j0 = task * 16 * tiles_per_task;
    const int64_t nt = std::min(tiles_per_task, (j - j0 + 15) / 16);
    pack(j0, nt, tiles.data(), scratch.data());
    QUANT_TILE_BARRIER();
    for (int64_t m0 = 0; m0 < m; m0 += 32) {
      for (int64_t t = 0; t < nt; t += 2) {
        const uint8_t* b0 = tiles.data() + t * steps * kTileBytes;
        // tiles_per_task is even: an odd last tile pairs with a stale one, columns past J.
        const uint8_t* b1 = b0 + steps * kTileBytes;
        if (int8) {
          tile_amx<true>(a + m0 * lda, lda, b0, b1, steps, c);
        } else {
          tile_amx<false>(a + m0 * lda, lda, b0, b1, steps, c);
        }
        store(m0, j0 + 16 * t, c);
      }
    }
  }
  _tile_release();
}

}  // namespace

void gemm_f32(const float* a, int64_t lda, int64_t m, int64_t l, int64_t j, const PackF32& pack,
              const StoreF32& store, int threads) {
  const int64_t blocks = (j + kCols - 1) / kCols;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> bp(static_cast<size_t>(kDepth * kCols)), scratch(static_cast<size_t>(16 * kDepth));
    std::vector<float> c(static_cast<size_t>(kRows * kCols));
#pragma omp for schedule(dynamic)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t j0 = block * kCols;
      for (int64_t m0 = 0; m0 < m; m0 += kRows) {
        const int64_t mb = std::min(kRows, m - m0);
        for (int64_t l0 = 0; l0 < l; l0 += kDepth) {
          const int64_t lb = std::min(kDepth, l - l0);
          pack(j0, l0, lb, bp.data(), scratch.data());
          for (int64_t i = 0; i < mb; i += kTile)
            tile_rows(std::min<int64_t>(kTile, mb - i), a + (m0 + i) * lda + l0, lda, bp.data(), lb,
                      c.data() + i * kCols, l0 == 0);
        }
        store(m0, mb, j0, c.data());
      }
    }
  }
}

void gemm_amx(const uint8_t* a, int64_t lda, bool int8, int64_t m, int64_t lp, int64_t j, const PackAmx& pack,
              const StoreAmx& store, int threads) {
  // Up to 8 column tiles (128 columns) per task while their packed B stays within ~1 MB of L2,
  // so that each 32-row slice of A is read from L2 for all of them; fewer when that would leave
  // threads idle.
  const int64_t tile_bytes = lp / (int8 ? 64 : 32) * kTileBytes;
  int64_t per_task = std::clamp<int64_t>((int64_t{1} << 20) / tile_bytes / 2 * 2, 2, 8);
  while (per_task > 2 && (j + 16 * per_task - 1) / (16 * per_task) < threads) per_task -= 2;
#pragma omp parallel num_threads(threads)
  gemm_amx_thread(a, lda, int8, m, lp, j, per_task, pack, store);
}

}  // namespace anychip::cpu::quant
