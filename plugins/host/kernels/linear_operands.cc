// Operands of the float linear kernels' blocked products: float32 and bf16 copies (padded or
// transposed) for A, and the packs of B that gemm_f32 and gemm_amx ask for block by block.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "linear.h"
#include "quant_simd.h"

namespace anychip::cpu::linear {
namespace {

using quant::round_up;

// Square blocks of the transposes, so that both sides stay in L1.
constexpr int64_t kBlock = 32;

template <typename T>
void transpose_block_f32(const Matrix& m, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* src = static_cast<const T*>(m.at(r, 0));
    for (int64_t c = c0; c < c1; ++c) out[c * m.rows + r] = to_float(src[c]);
  }
}

// 16 bf16 of row r of m from column c0 (float32 m rounded to bf16), zeros past m.
QUANT_AVX512 inline __m256i load16(const Matrix& m, int64_t r, int64_t c0) {
  const __mmask16 mask = r < m.rows ? quant::lanes16(m.cols - c0) : __mmask16(0);
  if (mask == 0) return _mm256_setzero_si256();
  if (m.dtype == ANYCHIP_DTYPE_FLOAT32)
    return quant::bf16x16(_mm512_maskz_loadu_ps(mask, static_cast<const float*>(m.at(r, c0))));
  return _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(m.at(r, c0)));
}

// n elements of row r of m from column c0 as bf16 (float32 rounded to nearest even).
void row_bf16(const Matrix& m, int64_t r, int64_t c0, int64_t n, uint16_t* dst, Isa isa) {
  if (m.dtype == ANYCHIP_DTYPE_FLOAT32) {
    quant::from_f32(static_cast<const float*>(m.at(r, c0)), n, ANYCHIP_DTYPE_BFLOAT16, dst, isa);
  } else {
    std::memcpy(dst, m.at(r, c0), static_cast<size_t>(n) * 2);
  }
}

template <typename T>
void transpose_block_bf16(const Matrix& m, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t rows_p,
                          uint16_t* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* src = static_cast<const T*>(m.at(r, 0));
    for (int64_t c = c0; c < c1; ++c) {
      if constexpr (std::is_same_v<T, float>) {
        out[c * rows_p + r] = from_float<bf16>(src[c]).bits;
      } else {
        out[c * rows_p + r] = src[c];
      }
    }
  }
}

}  // namespace

const float* as_f32(const Matrix& m, std::vector<float>& buffer, Isa isa, int threads) {
  if (m.dtype == ANYCHIP_DTYPE_FLOAT32 && m.ld == m.cols) return static_cast<const float*>(m.data);
  buffer.resize(static_cast<size_t>(m.rows * m.cols));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < m.rows; ++r) quant::to_f32(m.at(r, 0), m.dtype, m.cols, buffer.data() + r * m.cols, isa);
  return buffer.data();
}

std::vector<float> transposed_f32(const Matrix& m, Isa isa, int threads) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  const int64_t blocks = (m.cols + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kBlock, c1 = std::min(m.cols, c0 + kBlock);
    for (int64_t r0 = 0; r0 < m.rows; r0 += kBlock) {
      const int64_t r1 = std::min(m.rows, r0 + kBlock);
      if (has_avx512(isa) && m.dtype == ANYCHIP_DTYPE_FLOAT32 && r1 - r0 == kBlock && c1 - c0 == kBlock) {  // 16 x 16 at a time
        for (int64_t r = r0; r < r1; r += 16)
          for (int64_t c = c0; c < c1; c += 16)
            quant::transpose16(static_cast<const uint32_t*>(m.at(r, c)), m.ld,
                               reinterpret_cast<uint32_t*>(out.data() + c * m.rows + r), m.rows);
        continue;
      }
      switch (m.dtype) {
        case ANYCHIP_DTYPE_BFLOAT16: transpose_block_f32<bf16>(m, r0, r1, c0, c1, out.data()); break;
        case ANYCHIP_DTYPE_FLOAT16: transpose_block_f32<fp16>(m, r0, r1, c0, c1, out.data()); break;
        default: transpose_block_f32<float>(m, r0, r1, c0, c1, out.data());
      }
    }
  }
  return out;
}

// Asks for rows [r0, r1) of m, columns [c0, c1), to be brought into L2: gemm_f32 asks for the
// next block of B right after this one, and a block of a large weight comes from memory, its rows
// kilobytes apart, where the hardware prefetchers do not follow.
void prefetch_block(const Matrix& m, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  r1 = std::min(r1, m.rows);
  c1 = std::min(c1, m.cols);
  const int64_t bytes = (c1 - c0) * (m.dtype == ANYCHIP_DTYPE_FLOAT32 ? 4 : 2);
  for (int64_t r = r0; r < r1; ++r) {
    const char* row = static_cast<const char*>(m.at(r, c0));
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
  }
}

QUANT_AVX512 void pack_rows_f32_avx512(const Matrix& m, int64_t j0, int64_t l0, int64_t lb, float* bp) {
  const int64_t cols = std::min<int64_t>(64, m.cols - j0);
  // gemm_f32 goes down the contraction, then to the next 64 columns
  if (l0 + lb < m.rows) {
    prefetch_block(m, l0 + lb, l0 + 2 * lb, j0, j0 + 64);
  } else {
    prefetch_block(m, 0, lb, j0 + 64, j0 + 128);
  }
  if (m.dtype == ANYCHIP_DTYPE_FLOAT32) {  // 64 floats a row: inline, a memcpy call costs as much
    for (int64_t l = 0; l < lb; ++l) {
      const auto* src = static_cast<const float*>(m.at(l0 + l, j0));
      for (int64_t c = 0; c < 64; c += 16)
        _mm512_storeu_ps(bp + l * 64 + c, _mm512_maskz_loadu_ps(quant::lanes16(cols - c), src + c));
    }
    return;
  }
  for (int64_t l = 0; l < lb; ++l) {
    quant::to_f32(m.at(l0 + l, j0), m.dtype, cols, bp + l * 64, Isa::kAvx512);
    std::fill(bp + l * 64 + cols, bp + l * 64 + 64, 0.0f);
  }
}

void pack_rows_f32(const Matrix& m, int64_t j0, int64_t l0, int64_t lb, float* bp, Isa isa) {
  if (has_avx512(isa)) return pack_rows_f32_avx512(m, j0, l0, lb, bp);
  const int64_t cols = std::min<int64_t>(64, m.cols - j0);
  for (int64_t l = 0; l < lb; ++l) {
    quant::to_f32(m.at(l0 + l, j0), m.dtype, cols, bp + l * 64, isa);
    std::fill(bp + l * 64 + cols, bp + l * 64 + 64, 0.0f);
  }
}

void pack_cols_f32(const Matrix& m, int64_t j0, int64_t l0, int64_t lb, float* bp, float* scratch, Isa isa) {
  if (!has_avx512(isa)) {  // a row of m (a column of B) at a time into scratch, then into its column
    for (int64_t r = 0; r < 64; ++r) {
      const int64_t n = j0 + r;
      if (n < m.rows) quant::to_f32(m.at(n, l0), m.dtype, lb, scratch, isa);
      for (int64_t l = 0; l < lb; ++l) bp[l * 64 + r] = n < m.rows ? scratch[l] : 0.0f;
    }
    return;
  }
  // 16 rows of m (columns of B) at a time into scratch, then 16 x 16 transposes into the panel;
  // float32 rows that all exist, whole 16s of them, are transposed in place.
  const int64_t ld = round_up(lb, 16);
  if (l0 + lb < m.cols) {
    prefetch_block(m, j0, j0 + 64, l0 + lb, l0 + 2 * lb);
  } else {
    prefetch_block(m, j0 + 64, j0 + 128, 0, lb);
  }
  for (int64_t r0 = 0; r0 < 64; r0 += 16) {
    if (m.dtype == ANYCHIP_DTYPE_FLOAT32 && lb % 16 == 0 && j0 + r0 + 16 <= m.rows) {
      for (int64_t l = 0; l < lb; l += 16)
        quant::transpose16(static_cast<const uint32_t*>(m.at(j0 + r0, l0 + l)), m.ld,
                           reinterpret_cast<uint32_t*>(bp + l * 64 + r0), 64);
      continue;
    }
    for (int64_t r = 0; r < 16; ++r) {
      const int64_t n = j0 + r0 + r;
      float* dst = scratch + r * ld;
      if (n < m.rows) {
        quant::to_f32(m.at(n, l0), m.dtype, lb, dst, Isa::kAvx512);
        std::fill(dst + lb, dst + ld, 0.0f);
      } else {
        std::fill(dst, dst + ld, 0.0f);
      }
    }
    for (int64_t l = 0; l < lb; l += 16)
      quant::transpose16(reinterpret_cast<const uint32_t*>(scratch + l), ld,
                         reinterpret_cast<uint32_t*>(bp + l * 64 + r0), 64);
  }
}

std::vector<uint16_t> padded_bf16(const Matrix& m, int64_t rows_p, int64_t cols_p, int threads, Isa isa) {
  std::vector<uint16_t> out(static_cast<size_t>(rows_p * cols_p), 0);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < m.rows; ++r) row_bf16(m, r, 0, m.cols, out.data() + r * cols_p, isa);
  return out;
}

std::vector<uint16_t> transposed_bf16(const Matrix& m, int64_t cols_p, int64_t rows_p, int threads) {
  std::vector<uint16_t> out(static_cast<size_t>(cols_p * rows_p), 0);
  const int64_t blocks = (m.cols + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kBlock, c1 = std::min(m.cols, c0 + kBlock);
    for (int64_t r0 = 0; r0 < m.rows; r0 += kBlock) {
      const int64_t r1 = std::min(m.rows, r0 + kBlock);
      if (m.dtype == ANYCHIP_DTYPE_FLOAT32) {
        transpose_block_bf16<float>(m, r0, r1, c0, c1, rows_p, out.data());
      } else {
        transpose_block_bf16<uint16_t>(m, r0, r1, c0, c1, rows_p, out.data());
      }
    }
  }
  return out;
}

QUANT_AVX512 void pack_rows_amx(const Matrix& m, int64_t lp, int64_t j0, int64_t nt, uint8_t* tiles) {
  // Tile row p % 16 of step p / 16 holds rows 2p and 2p + 1 of m interleaved: word 2c is
  // m[2p][c], word 2c + 1 is m[2p + 1][c].
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                           21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const int64_t steps = lp / 32;
  for (int64_t p = 0; p < lp / 2; ++p) {
    uint8_t* row = tiles + (p / 16) * 1024 + (p % 16) * 64;
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t c0 = j0 + 16 * t;
      const __m512i pair =
          _mm512_inserti64x4(_mm512_castsi256_si512(load16(m, 2 * p, c0)), load16(m, 2 * p + 1, c0), 1);
      _mm512_storeu_si512(row + t * steps * 1024, _mm512_permutexvar_epi16(interleave, pair));
    }
  }
}

void pack_cols_amx(const Matrix& m, int64_t lp, int64_t j0, int64_t nt, uint8_t* tiles, float* scratch) {
  // 16 rows of m, zero-padded to lp, then 16 x 16 dword (bf16 pair) transposes per step.
  auto* rows = reinterpret_cast<uint16_t*>(scratch);  // [16][lp]
  for (int64_t t = 0; t < nt; ++t) {
    for (int64_t r = 0; r < 16; ++r) {
      const int64_t n = j0 + 16 * t + r;
      uint16_t* dst = rows + r * lp;
      if (n < m.rows) {
        row_bf16(m, n, 0, m.cols, dst, Isa::kAvx512);
        std::fill(dst + m.cols, dst + lp, uint16_t{0});
      } else {
        std::fill(dst, dst + lp, uint16_t{0});
      }
    }
    uint8_t* out = tiles + t * (lp / 32) * 1024;
    for (int64_t s = 0; s < lp / 32; ++s)
      quant::transpose16(reinterpret_cast<const uint32_t*>(rows) + 16 * s, lp / 2,
                         reinterpret_cast<uint32_t*>(out + s * 1024), 16);
  }
}

QUANT_AVX512 void store_tile(const float* c, void* dst, int32_t dtype, int64_t ld, const float* bias,
                             bool transposed) {
  alignas(64) float t[32 * 32];
  if (transposed) {
    for (int bi = 0; bi < 2; ++bi)
      for (int bj = 0; bj < 2; ++bj)
        quant::transpose16(reinterpret_cast<const uint32_t*>(c + bi * 16 * 32 + bj * 16), 32,
                           reinterpret_cast<uint32_t*>(t + bj * 16 * 32 + bi * 16), 32);
    c = t;
  }
  const __m512 b0 = bias == nullptr ? _mm512_setzero_ps() : _mm512_loadu_ps(bias);
  const __m512 b1 = bias == nullptr ? _mm512_setzero_ps() : _mm512_loadu_ps(bias + 16);
  for (int i = 0; i < 32; ++i) {
    const __m512 lo = _mm512_add_ps(_mm512_loadu_ps(c + i * 32), b0);
    const __m512 hi = _mm512_add_ps(_mm512_loadu_ps(c + i * 32 + 16), b1);
    if (dtype == ANYCHIP_DTYPE_FLOAT32) {
      float* row = static_cast<float*>(dst) + i * ld;
      _mm512_storeu_ps(row, lo);
      _mm512_storeu_ps(row + 16, hi);
    } else {
      _mm512_storeu_si512(static_cast<uint16_t*>(dst) + i * ld,
                          _mm512_inserti64x4(_mm512_castsi256_si512(quant::bf16x16(lo)), quant::bf16x16(hi), 1));
    }
  }
}

void store_transposed(const AnychipTensor& y, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                      const float* acc, int64_t ldacc, Isa isa) {
  // Whole 16 x 16 blocks by AVX-512 transposes (through t unless y is float32), the rest below.
  const int64_t rows16 = !has_avx512(isa) ? 0 : rows / 16 * 16, cols16 = !has_avx512(isa) ? 0 : cols / 16 * 16;
  alignas(64) float t[16 * 16];
  for (int64_t c = 0; c < cols16; c += 16) {
    for (int64_t i = 0; i < rows16; i += 16) {
      const auto* src = reinterpret_cast<const uint32_t*>(acc + i * ldacc + c);
      char* dst = quant::at(y, (c0 + c) * ld + r0 + i);
      if (y.dtype == ANYCHIP_DTYPE_FLOAT32) {
        quant::transpose16(src, ldacc, reinterpret_cast<uint32_t*>(dst), ld);
        continue;
      }
      quant::transpose16(src, ldacc, reinterpret_cast<uint32_t*>(t), 16);
      for (int64_t cc = 0; cc < 16; ++cc) quant::from_f32(t + cc * 16, 16, y.dtype, dst + cc * ld * 2, isa);
    }
  }
  // columns past cols16 for every row, then rows past rows16 for the columns before
  float tmp[128];
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t i0 = c < cols16 ? rows16 : 0; i0 < rows; i0 += 128) {
      const int64_t n = std::min<int64_t>(128, rows - i0);
      for (int64_t i = 0; i < n; ++i) tmp[i] = acc[(i0 + i) * ldacc + c];
      quant::from_f32(tmp, n, y.dtype, quant::at(y, (c0 + c) * ld + r0 + i0), isa);
    }
  }
}

}  // namespace anychip::cpu::linear
