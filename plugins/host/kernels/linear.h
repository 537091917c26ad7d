// Private to the float linear kernels (linear*.cc): the operands of quant_gemm.cc's blocked
// products (gemm_f32, gemm_amx) built from plain float matrices instead of quantized weights.
//
// Every product of linear and linear_grad is C = A B with A's rows contiguous in the
// contraction; each operand is a row-major matrix used as it is (B "by rows") or transposed
// (B "by columns", or A copied transposed).
#pragma once

#include <cstdint>
#include <vector>

#include "quant.h"

namespace anychip::cpu::linear {

// A row-major float matrix of `rows` x `cols` elements of `dtype`, rows `ld` elements apart.
struct Matrix {
  const void* data = nullptr;
  int32_t dtype = ANYCHIP_DTYPE_FLOAT32;
  int64_t rows = 0, cols = 0, ld = 0;

  const void* at(int64_t r, int64_t c) const {
    return static_cast<const char*>(data) + static_cast<size_t>(r * ld + c) * (dtype == ANYCHIP_DTYPE_FLOAT32 ? 4 : 2);
  }
};

// ---- float32 operands (gemm_f32) ----------------------------------------------------------------

// m as contiguous float32 (m itself when it is float32 already; else converted into `buffer`).
const float* as_f32(const Matrix& m, std::vector<float>& buffer, Isa isa, int threads);
// m^T as contiguous float32 [cols][rows] (float32 blocks of 16 x 16 transposed with AVX-512 where
// the ISA has it, element by element otherwise).
std::vector<float> transposed_f32(const Matrix& m, Isa isa, int threads);

// gemm_f32 packs of B: by rows, B = m (bp[l][jj] = m[l0 + l][j0 + jj]); by columns, B = m^T
// (bp[l][jj] = m[j0 + jj][l0 + l]; scratch of 16 * round_up(lb, 16) floats). Zeros past m.
void pack_rows_f32(const Matrix& m, int64_t j0, int64_t l0, int64_t lb, float* bp, Isa isa);
void pack_cols_f32(const Matrix& m, int64_t j0, int64_t l0, int64_t lb, float* bp, float* scratch, Isa isa);

// ---- bf16 operands (gemm_amx) -------------------------------------------------------------------
// m is bf16, or float32 rounded to bf16 (nearest even) as it is copied or packed: mixed
// precision (compute bfloat16 on float32 tensors) costs no separate pass over memory.

// m as bf16 zero-padded to [rows_p][cols_p]; transposed_bf16: m^T zero-padded to [cols_p][rows_p].
std::vector<uint16_t> padded_bf16(const Matrix& m, int64_t rows_p, int64_t cols_p, int threads, Isa isa);
std::vector<uint16_t> transposed_bf16(const Matrix& m, int64_t cols_p, int64_t rows_p, int threads);

// gemm_amx packs of the nt column tiles of B from column j0, contraction padded to lp: by rows,
// B = m (pairs of rows of m interleaved); by columns, B = m^T (16 x 16 dword transposes of m's
// rows; scratch of 8 * lp floats). Zeros past m.
void pack_rows_amx(const Matrix& m, int64_t lp, int64_t j0, int64_t nt, uint8_t* tiles);
void pack_cols_amx(const Matrix& m, int64_t lp, int64_t j0, int64_t nt, uint8_t* tiles, float* scratch);

// ---- results ------------------------------------------------------------------------------------

// A whole 32 x 32 tile of C (float32, rows 32 apart) into y (bf16 or float32 `dtype`) at `dst`,
// y's rows `ld` elements apart: dst[i * ld + c] = c[i][c] (+ bias[c]), or, transposed,
// dst[c * ld + i] = c[i][c]. AVX-512.
void store_tile(const float* c, void* dst, int32_t dtype, int64_t ld, const float* bias, bool transposed);

// store_rows (quant.h) transposed: y[(c0 + c) * ld + r0 + i] = acc[i * ldacc + c], i < rows, c < cols.
void store_transposed(const AnychipTensor& y, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                      const float* acc, int64_t ldacc, Isa isa);

}  // namespace anychip::cpu::linear
