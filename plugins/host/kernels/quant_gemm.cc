// Blocked products for prefill / training sizes: B (the dequantized weights) is packed into a
// small scratch, a block of columns at a time, and multiplied by all of A (a chunk of its rows)
// before the next block. Each task owns whole column blocks of its rows, so C needs no reduction.
// The float32 tiles come in AVX-512 and AVX2 versions; the blocking is the same.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "quant.h"
#include "quant_simd.h"
#include "simd_avx2.h"

namespace anychip::cpu::quant {
namespace {

// ---- AVX-512 FMA: 6 x 64 register tile, A broadcast, B packed [l][64] --------------------------

constexpr int64_t kCols = 64;     // packed B width
constexpr int64_t kDepth = 128;   // contraction per packed block: 32 KB of B, which stays in L1
constexpr int64_t kRows = 512;    // rows of A per pass over a block of B
constexpr int kTile = 6;
// A thread's A rows (a chunk, over the whole contraction) stay in its 2 MB of L2 up to kL2A
// bytes, beside B's block and C's scratch; its C accumulators take up to kL2C when a long
// contraction makes it take several column blocks at once.
constexpr int64_t kL2A = int64_t{3} << 19, kL2C = int64_t{1} << 19;

// Where a tile's finished C goes when gemm_f32 writes it itself: rows of y, `cols` of its 64
// columns, plus bias.
struct TileOut {
  float* y = nullptr;
  int64_t ld = 0, cols = 0;
  const float* bias = nullptr;
};

// C (+)= A B for MR rows, into c (rows kCols apart), or into out.y when it is set (the last
// stretch of the contraction).
template <int MR>
QUANT_AVX512 void tile_f32(const float* a, int64_t lda, const float* bp, int64_t lb, float* c, bool first,
                           const TileOut& out) {
  // The next tile's C (right after this one's) is in L2: ask for it now, not when its loads stall.
  for (int i = 0; i < MR * 4; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + MR * kCols + 16 * i), _MM_HINT_T0);
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
  if (out.y == nullptr) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(c + i * kCols + 16 * j, acc[i][j]);
    return;
  }
  __mmask16 mask[4];
  __m512 bias[4];
  for (int j = 0; j < 4; ++j) {
    mask[j] = lanes16(out.cols - 16 * j);
    bias[j] = out.bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[j], out.bias + 16 * j);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j)
      _mm512_mask_storeu_ps(out.y + i * out.ld + 16 * j, mask[j], _mm512_add_ps(acc[i][j], bias[j]));
}

// n floats on a 64-byte boundary inside `storage`: the packed B rows and the C rows are read
// and written a cache line per vector, never split across two.
float* aligned_floats(std::vector<float>& storage, int64_t n) {
  storage.resize(static_cast<size_t>(n + 16));
  const auto p = reinterpret_cast<uintptr_t>(storage.data());
  return storage.data() + ((64 - p % 64) % 64) / sizeof(float);
}

// rows x n floats from a (rows lda apart) into dst (rows n apart): the copies are short, a call
// of memcpy per row would cost as much as the copy.
QUANT_AVX512 void copy_rows(const float* a, int64_t lda, int64_t rows, int64_t n, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < n; c += 16) {
      const __mmask16 mask = lanes16(n - c);
      _mm512_mask_storeu_ps(dst + i * n + c, mask, _mm512_maskz_loadu_ps(mask, a + i * lda + c));
    }
}

// ---- AVX2 FMA: the same 64-column tiles, a 16-column slice at a time (MR x 2 registers) -----

template <int MR>
ANYCHIP_AVX2 void tile_f32_avx2(const float* a, int64_t lda, const float* bp, int64_t lb, float* c, bool first,
                              const TileOut& out) {
  for (int64_t s = 0; s < kCols; s += 16) {
    const int64_t cols = out.y == nullptr ? 16 : std::min<int64_t>(16, out.cols - s);
    if (cols <= 0) break;
    __m256 acc[MR][2];
    for (int i = 0; i < MR; ++i)
      for (int h = 0; h < 2; ++h)
        acc[i][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + i * kCols + s + 8 * h);
    for (int64_t l = 0; l < lb; ++l) {
      const __m256 b0 = _mm256_loadu_ps(bp + l * kCols + s), b1 = _mm256_loadu_ps(bp + l * kCols + s + 8);
      for (int i = 0; i < MR; ++i) {
        const __m256 av = _mm256_broadcast_ss(a + i * lda + l);
        acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
      }
    }
    if (out.y == nullptr) {
      for (int i = 0; i < MR; ++i)
        for (int h = 0; h < 2; ++h) _mm256_storeu_ps(c + i * kCols + s + 8 * h, acc[i][h]);
      continue;
    }
    // Lanes of each half below `cols`, and the bias under them.
    __m256i mask[2];
    __m256 bias[2];
    for (int h = 0; h < 2; ++h) {
      mask[h] = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols - 8 * h)),
                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      bias[h] = out.bias == nullptr ? _mm256_setzero_ps() : _mm256_maskload_ps(out.bias + s + 8 * h, mask[h]);
    }
    for (int i = 0; i < MR; ++i)
      for (int h = 0; h < 2; ++h)
        _mm256_maskstore_ps(out.y + i * out.ld + s + 8 * h, mask[h], _mm256_add_ps(acc[i][h], bias[h]));
  }
}

template <int MR>
void tile(bool avx512, const float* a, int64_t lda, const float* bp, int64_t lb, float* c, bool first,
          const TileOut& out) {
  avx512 ? tile_f32<MR>(a, lda, bp, lb, c, first, out) : tile_f32_avx2<MR>(a, lda, bp, lb, c, first, out);
}

void tile_rows(bool avx512, int64_t mr, const float* a, int64_t lda, const float* bp, int64_t lb, float* c,
               bool first, const TileOut& out) {
  switch (mr) {
    case 1: return tile<1>(avx512, a, lda, bp, lb, c, first, out);
    case 2: return tile<2>(avx512, a, lda, bp, lb, c, first, out);
    case 3: return tile<3>(avx512, a, lda, bp, lb, c, first, out);
    case 4: return tile<4>(avx512, a, lda, bp, lb, c, first, out);
    case 5: return tile<5>(avx512, a, lda, bp, lb, c, first, out);
    default: return tile<kTile>(avx512, a, lda, bp, lb, c, first, out);
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
              const StoreF32& store, int threads, Isa isa, const DirectF32& direct) {
  const bool avx512 = has_avx512(isa);
  const int64_t blocks = (j + kCols - 1) / kCols;
  // A task is a group of column blocks times a chunk of rows, the chunks as equal as whole tiles
  // allow (600 rows: 300 + 300, not 512 + 88). Few column blocks (N = 576: 9) would leave a
  // thread idle for the last one, so take more chunks when that makes the tasks split evenly.
  int64_t chunks = (m + kRows - 1) / kRows;
  if (blocks * chunks < 8 * threads) {
    for (int64_t c = chunks; c <= chunks + threads && m / c >= 4 * kTile; ++c) {
      if (blocks * c % threads == 0) {
        chunks = c;
        break;
      }
    }
  }
  const int64_t chunk_rows = round_up((m + chunks - 1) / chunks, kTile);
  // A chunk too long to stay in L2 (a long contraction: dx of a vocabulary head) would come from
  // memory again for every column block: then the task takes a group of blocks and runs the
  // contraction outermost, so that each slice of A is read once for all of them, and copies that
  // slice into a contiguous panel first (a copy loop streams it from memory far better than
  // tiles reading 6 rows kilobytes apart).
  int64_t group = 1;
  if (std::min(chunk_rows, m) * l * 4 > kL2A) {
    const int64_t most = std::max<int64_t>(1, kL2C / (chunk_rows * kCols * 4));
    const int64_t groups = (blocks + most - 1) / most;
    group = (blocks + groups - 1) / groups;
  }
  const int64_t groups = (blocks + group - 1) / group;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> bp_storage, c_storage, scratch(static_cast<size_t>(16 * kDepth));
    float* bp = aligned_floats(bp_storage, kDepth * kCols);
    float* c = aligned_floats(c_storage, chunk_rows * kCols * group);
    std::vector<float> panel(static_cast<size_t>(group > 1 ? chunk_rows * kDepth : 0));
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < groups * chunks; ++task) {
      const int64_t b0 = task / chunks * group, nb = std::min(group, blocks - b0);
      const int64_t m0 = task % chunks * chunk_rows, mb = std::min(chunk_rows, m - m0);
      if (mb <= 0) continue;
      for (int64_t l0 = 0; l0 < l; l0 += kDepth) {
        const int64_t lb = std::min(kDepth, l - l0);
        const float* as = a + m0 * lda + l0;
        int64_t ld = lda;
        if (group > 1) {
          if (avx512) {
            copy_rows(as, lda, mb, lb, panel.data());
          } else {
            for (int64_t i = 0; i < mb; ++i) std::copy(as + i * lda, as + i * lda + lb, panel.data() + i * lb);
          }
          as = panel.data();
          ld = lb;
        }
        const bool last = l0 + lb >= l;
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t j0 = (b0 + b) * kCols;
          pack(j0, l0, lb, bp, scratch.data());
          float* cb = c + b * chunk_rows * kCols;
          TileOut out;
          if (last && direct.y != nullptr)
            out = {direct.y + m0 * direct.ld + j0, direct.ld, std::min(kCols, j - j0),
                   direct.bias == nullptr ? nullptr : direct.bias + j0};
          for (int64_t i = 0; i < mb; i += kTile) {
            tile_rows(avx512, std::min<int64_t>(kTile, mb - i), as + i * ld, ld, bp, lb, cb + i * kCols, l0 == 0,
                      out);
            if (out.y != nullptr) out.y += kTile * out.ld;
          }
        }
      }
      if (direct.y == nullptr)
        for (int64_t b = 0; b < nb; ++b) store(m0, mb, (b0 + b) * kCols, c + b * chunk_rows * kCols);
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
