// linear (y = x W^T + bias) and linear_grad (dx = dy W, dW = dy^T x, dbias = the column sums of
// dy) for float weights, on quant_gemm.cc's blocked products: AMX bf16 tiles when the products are
// bf16 (bf16 tensors, or float32 tensors with compute bfloat16) and the CPU has AMX, AVX-512 or
// AVX2 FMA in float32 otherwise (float32 tensors' own products stay exact float32), plain loops
// for the scalar ISA. Every path accumulates in float32.
//
// Mixed precision (float32 tensors, compute bfloat16) rounds x, dy and W to bf16 where they are
// packed for the AMX tiles and writes float32 results. Without AMX the other paths multiply
// bf16-rounded copies, so that results do not depend on the ISA beyond float32 summation order;
// dbias sums dy unrounded, as it involves no product.
//
// gemm_f32 and gemm_amx keep a block of B in cache and stream all of A past it, so the weight
// gradient puts the smaller of x and dy in A: dW^T = x^T dy when K <= N (a vocabulary head's
// 49152 x 576 gradient streams x, not dy), dW = dy^T x otherwise.
#include <algorithm>
#include <cstring>
#include <vector>

#include "linear.h"

namespace anychip::cpu::linear {
namespace {

using quant::round_up;

Matrix matrix(const AnychipTensor& t, int64_t rows, int64_t cols) { return {t.data, t.dtype, rows, cols, cols}; }

// Where the product C lands: C[i][j] in y[i][j] (+ bias[j]), or in y[j][i] when transposed;
// y's rows are `ld` elements long.
struct Target {
  const AnychipTensor* y;
  int64_t ld;
  bool transposed = false;
  const float* bias = nullptr;

  void put(int64_t m0, int64_t mb, int64_t j0, int64_t jb, const float* c, int64_t ldc, Isa isa) const {
    if (transposed) {
      store_transposed(*y, ld, m0, mb, j0, jb, c, ldc, isa);
    } else {
      quant::store_rows(*y, ld, m0, mb, j0, jb, c, ldc, bias, isa);
    }
  }
};

// C = A B with A float32 [m][L] (contiguous) and B = b, or b^T when `b_transposed`.
void product_f32(const float* a, int64_t m, const Matrix& b, bool b_transposed, const Target& out, Isa isa,
                 int threads) {
  const int64_t l = b_transposed ? b.cols : b.rows, j = b_transposed ? b.rows : b.cols;
  auto pack = [&b, b_transposed, isa](int64_t j0, int64_t l0, int64_t lb, float* bp, float* scratch) {
    if (b_transposed) {
      pack_cols_f32(b, j0, l0, lb, bp, scratch, isa);
    } else {
      pack_rows_f32(b, j0, l0, lb, bp, isa);
    }
  };
  auto store = [&out, j, isa](int64_t m0, int64_t mb, int64_t j0, const float* c) {
    out.put(m0, mb, j0, std::min<int64_t>(64, j - j0), c, 64, isa);
  };
  quant::DirectF32 direct;  // float32 rows of y: written straight from the product's registers
  if (out.y->dtype == ANYCHIP_DTYPE_FLOAT32 && !out.transposed)
    direct = {static_cast<float*>(out.y->data), out.ld, out.bias};
  quant::gemm_f32(a, l, m, l, j, pack, store, threads, isa, direct);
}

// gemm_amx multiplies the whole contraction of each 32 x 32 tile in one go, its packed B tiles
// (lp / 32 KB per 16 columns) kept in L2: longer contractions run in chunks of this depth, summed
// in float32.
constexpr int64_t kAmxDepth = 4096;

// C = A B with A bf16 [round_up(m, 32)][lp] (zero-padded, lp = round_up(L, 32)) and B = b, or
// b^T when `b_transposed` (b bf16, or float32 rounded to bf16 by the packs).
void product_amx(const uint16_t* a, int64_t m, int64_t lp, const Matrix& b, bool b_transposed,
                 const Target& out, Isa isa, int threads) {
  const int64_t j = b_transposed ? b.rows : b.cols;
  auto multiply = [&](int64_t l0, int64_t lc, const quant::StoreAmx& store) {
    // b's share of the contraction [l0, l0 + lc)
    Matrix part = b;
    if (b_transposed) {
      part.data = b.at(0, l0);
      part.cols = std::min(lc, b.cols - l0);
    } else {
      part.data = b.at(l0, 0);
      part.rows = std::min(lc, b.rows - l0);
    }
    auto pack = [&part, lc, b_transposed](int64_t j0, int64_t nt, uint8_t* tiles, float* scratch) {
      if (b_transposed) {
        pack_cols_amx(part, lc, j0, nt, tiles, scratch);
      } else {
        pack_rows_amx(part, lc, j0, nt, tiles);
      }
    };
    quant::gemm_amx(reinterpret_cast<const uint8_t*>(a + l0), lp * 2, false, m, lc, j, pack, store, threads);
  };
  if (lp <= kAmxDepth) {
    const int32_t dtype = out.y->dtype;
    multiply(0, lp, [&out, m, j, isa, dtype](int64_t m0, int64_t j0, const void* c) {
      const auto* cf = static_cast<const float*>(c);
      const int64_t mb = std::min<int64_t>(32, m - m0), jb = std::min<int64_t>(32, j - j0);
      if (mb < 32 || jb < 32) {
        out.put(m0, mb, j0, jb, cf, 32, isa);
      } else if (out.transposed) {
        store_tile(cf, quant::at(*out.y, j0 * out.ld + m0), dtype, out.ld, nullptr, true);
      } else {
        store_tile(cf, quant::at(*out.y, m0 * out.ld + j0), dtype, out.ld,
                   out.bias == nullptr ? nullptr : out.bias + j0, false);
      }
    });
    return;
  }
  std::vector<float> acc(static_cast<size_t>(m * j));
  for (int64_t l0 = 0; l0 < lp; l0 += kAmxDepth) {
    const bool first = l0 == 0;
    multiply(l0, std::min(kAmxDepth, lp - l0), [&acc, m, j, first](int64_t m0, int64_t j0, const void* c) {
      const auto* cf = static_cast<const float*>(c);
      const int64_t mb = std::min<int64_t>(32, m - m0), jb = std::min<int64_t>(32, j - j0);
      for (int64_t i = 0; i < mb; ++i) {
        float* dst = acc.data() + (m0 + i) * j + j0;
        for (int64_t jj = 0; jj < jb; ++jj) dst[jj] = first ? cf[i * 32 + jj] : dst[jj] + cf[i * 32 + jj];
      }
    });
  }
  constexpr int64_t kRowsPerStore = 32;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r0 = 0; r0 < m; r0 += kRowsPerStore)
    out.put(r0, std::min(kRowsPerStore, m - r0), 0, j, acc.data() + r0 * j, j, isa);
}

// m as gemm_amx's A, [round_up(rows, 32)][round_up(cols, 32)] bf16: m itself when it is bf16 and
// its sizes are multiples of 32 (as a training step's usually are), else a zero-padded bf16 copy
// in `buffer`.
const uint16_t* amx_a(const Matrix& m, std::vector<uint16_t>& buffer, int threads) {
  if (m.dtype == ANYCHIP_DTYPE_BFLOAT16 && m.rows % 32 == 0 && m.cols % 32 == 0 && m.ld == m.cols)
    return static_cast<const uint16_t*>(m.data);
  buffer = padded_bf16(m, round_up(m.rows, 32), round_up(m.cols, 32), threads, Isa::kAmx);
  return buffer.data();
}

// ---- scalar ISA: plain loops over float32 copies --------------------------------------------------

void forward_scalar(const Matrix& x, const Matrix& w, const float* bias, const AnychipTensor& y, int threads) {
  std::vector<float> xb, wb;
  const float* xf = as_f32(x, xb, Isa::kScalar, threads);
  const float* wf = as_f32(w, wb, Isa::kScalar, threads);
  const int64_t k = x.cols, n = w.rows;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> row(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < x.rows; ++i) {
      for (int64_t c = 0; c < n; ++c) {
        float acc = 0.0f;
        for (int64_t l = 0; l < k; ++l) acc += xf[i * k + l] * wf[c * k + l];
        row[c] = acc;
      }
      quant::store_rows(y, n, i, 1, 0, n, row.data(), n, bias, Isa::kScalar);
    }
  }
}

// c = a b, or a^T b when `a_t`, with a float32 [a_rows][a_cols]: row i of c is the sum over r of
// a[i][r] (a^T: a[r][i]) times row r of b (b_cols wide).
void axpy_rows(const float* a, bool a_t, int64_t a_rows, int64_t a_cols, const float* b, int64_t b_cols,
               const AnychipTensor& c, int threads) {
  const int64_t out_rows = a_t ? a_cols : a_rows, inner = a_t ? a_rows : a_cols;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> acc(static_cast<size_t>(b_cols));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < out_rows; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t r = 0; r < inner; ++r) {
        const float coef = a_t ? a[r * a_cols + i] : a[i * a_cols + r];
        const float* src = b + r * b_cols;
        for (int64_t l = 0; l < b_cols; ++l) acc[l] += coef * src[l];
      }
      quant::store_rows(c, b_cols, i, 1, 0, b_cols, acc.data(), b_cols, nullptr, Isa::kScalar);
    }
  }
}

// ---- the kernels' parts ---------------------------------------------------------------------------

// `amx`: the products are bf16 and the CPU has AMX.
void forward(const Matrix& x, const Matrix& w, const float* bias, const AnychipTensor& y, bool amx, Isa isa,
             int threads) {
  const Target out{&y, w.rows, false, bias};
  if (amx) {
    std::vector<uint16_t> buffer;
    product_amx(amx_a(x, buffer, threads), x.rows, round_up(x.cols, 32), w, true, out, isa, threads);
  } else if (isa != Isa::kScalar) {
    std::vector<float> buffer;
    product_f32(as_f32(x, buffer, isa, threads), x.rows, w, true, out, isa, threads);
  } else {
    forward_scalar(x, w, bias, y, threads);
  }
}

// dx = dy W.
void grad_x(const Matrix& dy, const Matrix& w, const AnychipTensor& dx, bool amx, Isa isa, int threads) {
  const Target out{&dx, w.cols};
  if (amx) {
    std::vector<uint16_t> buffer;
    product_amx(amx_a(dy, buffer, threads), dy.rows, round_up(dy.cols, 32), w, false, out, isa, threads);
    return;
  }
  std::vector<float> dyb;
  const float* dyf = as_f32(dy, dyb, isa, threads);
  if (isa != Isa::kScalar) {
    product_f32(dyf, dy.rows, w, false, out, isa, threads);
  } else {
    std::vector<float> wb;
    axpy_rows(dyf, false, dy.rows, dy.cols, as_f32(w, wb, isa, threads), w.cols, dx, threads);
  }
}

// dW = dy^T x, as (x^T dy)^T when K <= N (see the top).
void grad_weight(const Matrix& dy, const Matrix& x, const AnychipTensor& dw, bool amx, Isa isa, int threads) {
  const bool via_transpose = x.cols <= dy.cols;
  const Matrix& p = via_transpose ? x : dy;  // A = p^T
  const Matrix& q = via_transpose ? dy : x;  // B = q
  const Target out{&dw, x.cols, via_transpose};
  if (amx) {
    const int64_t mp = round_up(p.rows, 32);
    product_amx(transposed_bf16(p, round_up(p.cols, 32), mp, threads).data(), p.cols, mp, q, false, out, isa,
                threads);
  } else if (isa != Isa::kScalar) {
    product_f32(transposed_f32(p, isa, threads).data(), p.cols, q, false, out, isa, threads);
  } else {
    std::vector<float> dyb, xb;
    axpy_rows(as_f32(dy, dyb, isa, threads), true, dy.rows, dy.cols, as_f32(x, xb, isa, threads), x.cols, dw,
              threads);
  }
}

// dbias = the column sums of dy, in float32.
void grad_bias(const Matrix& dy, const AnychipTensor& db, Isa isa, int threads) {
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (dy.cols + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t c0 = ch * kChunk, n = std::min(kChunk, dy.cols - c0);
    float acc[kChunk] = {}, row[kChunk];
    for (int64_t r = 0; r < dy.rows; ++r) {
      quant::to_f32(dy.at(r, c0), dy.dtype, n, row, isa);
      for (int64_t i = 0; i < n; ++i) acc[i] += row[i];
    }
    quant::from_f32(acc, n, db.dtype, quant::at(db, c0), isa);
  }
}

void fill_zero(const AnychipTensor& t) {
  std::memset(t.data, 0, static_cast<size_t>(numel(t)) * (t.dtype == ANYCHIP_DTYPE_FLOAT32 ? 4 : 2));
}

// A flag attr (absent: 1), or -1 if it is neither 0 nor 1.
int flag(const AnychipKernelCall* call, int i) {
  const double v = attr(call, i, 1.0);
  return v == 0.0 ? 0 : v == 1.0 ? 1 : -1;
}

// How a call multiplies, from its tensors' dtype and its `compute` attr (an AnychipDtype; absent:
// the tensors' dtype).
struct Compute {
  bool valid = true;
  bool mixed = false;  // float32 tensors, bf16 products
  bool amx = false;    // bf16 products on AMX tiles

  Compute(const AnychipKernelCall* call, int i, int32_t dtype, Isa isa) {
    const double c = attr(call, i, static_cast<double>(dtype));
    mixed = dtype == ANYCHIP_DTYPE_FLOAT32 && c == ANYCHIP_DTYPE_BFLOAT16;
    valid = mixed || c == static_cast<double>(dtype);
    amx = isa == Isa::kAmx && (mixed || dtype == ANYCHIP_DTYPE_BFLOAT16);
  }

  // m as the products see it: without AMX, mixed precision multiplies a bf16 copy (in `buffer`).
  Matrix operand(const Matrix& m, std::vector<uint16_t>& buffer, Isa isa, int threads) const {
    if (!mixed || amx) return m;
    buffer = padded_bf16(m, m.rows, m.cols, threads, isa);
    return {buffer.data(), ANYCHIP_DTYPE_BFLOAT16, m.rows, m.cols, m.cols};
  }
};

constexpr const char* kComputeError = "compute must be the tensors' dtype, or bfloat16 for float32 tensors";

}  // namespace
}  // namespace anychip::cpu::linear

using namespace anychip::cpu;
using namespace anychip::cpu::linear;

ANYCHIP_CPU_KERNEL(linear) {
  const char* what = "linear";
  if (call->num_inputs < 2 || call->num_outputs < 1)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects x, weight, bias? -> y", what);
  const AnychipTensor& x = in(call, 0);
  const AnychipTensor& w = in(call, 1);
  const AnychipTensor* bias = call->num_inputs > 2 ? &in(call, 2) : nullptr;
  const AnychipTensor& y = out(call, 0);
  if (!quant::is_float(x.dtype) || w.dtype != x.dtype || y.dtype != x.dtype ||
      (bias != nullptr && bias->dtype != x.dtype))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: x, weight, bias and y must share a float dtype", what);
  if (!is_contiguous(x) || !is_contiguous(w) || !is_contiguous(y) || (bias != nullptr && !is_contiguous(*bias)))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: tensors must be contiguous", what);
  const int64_t m = rows(x), k = last_dim(x);
  if (w.rank != 2 || w.shape[1] != k || last_dim(y) != w.shape[0] || rows(y) != m ||
      (bias != nullptr && numel(*bias) != w.shape[0]))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: weight must be [N, %lld], bias [N], y [..., N]", what,
                static_cast<long long>(k));
  const int64_t n = w.shape[0];
  const Isa isa = anychip::cpu::isa();
  const Compute compute(call, ANYCHIP_ATTR_LINEAR_COMPUTE, x.dtype, isa);
  if (!compute.valid) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: %s", what, kComputeError);
  if (m == 0 || n == 0) return ANYCHIP_OK;
  std::vector<float> bias_f;
  if (bias != nullptr) {
    bias_f.resize(static_cast<size_t>(n));
    quant::to_f32(bias->data, bias->dtype, n, bias_f.data(), isa);
  }
  const float* b = bias != nullptr ? bias_f.data() : nullptr;
  if (k == 0) {  // an empty sum: y is the bias
    const std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
    quant::store_rows(y, n, 0, m, 0, n, zeros.data(), 0, b, isa);
    return ANYCHIP_OK;
  }
  const int nt = threads(call);
  std::vector<uint16_t> xb, wb;
  forward(compute.operand(matrix(x, m, k), xb, isa, nt), compute.operand(matrix(w, n, k), wb, isa, nt), b, y, compute.amx, isa,
          nt);
  return ANYCHIP_OK;
}

ANYCHIP_CPU_KERNEL(linear_grad) {
  const char* what = "linear_grad";
  const int needs_dx = flag(call, ANYCHIP_ATTR_LINEAR_GRAD_NEEDS_DX), needs_dw = flag(call, ANYCHIP_ATTR_LINEAR_GRAD_NEEDS_DWEIGHT);
  if (needs_dx < 0 || needs_dw < 0)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: needs_dx and needs_dweight must be 0 or 1", what);
  if (call->num_inputs < 3 || call->num_outputs < 2)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects dy, x, weight -> dx, dweight, dbias?", what);
  const AnychipTensor& dy = in(call, 0);
  const AnychipTensor& x = in(call, 1);
  const AnychipTensor& w = in(call, 2);
  const AnychipTensor& dx = out(call, 0);
  const AnychipTensor& dw = out(call, 1);
  const AnychipTensor* db = call->num_outputs > 2 ? &out(call, 2) : nullptr;
  const int32_t dtype = dy.dtype;
  if (!quant::is_float(dtype) || x.dtype != dtype || w.dtype != dtype ||
      (needs_dx == 1 && dx.dtype != dtype) || (needs_dw == 1 && dw.dtype != dtype) ||
      (db != nullptr && db->dtype != dtype))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: all tensors must share a float dtype", what);
  if (!is_contiguous(dy) || !is_contiguous(x) || !is_contiguous(w) || (needs_dx == 1 && !is_contiguous(dx)) ||
      (needs_dw == 1 && !is_contiguous(dw)) || (db != nullptr && !is_contiguous(*db)))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: tensors must be contiguous", what);
  const int64_t m = rows(x), k = last_dim(x);
  if (w.rank != 2 || w.shape[1] != k || rows(dy) != m || last_dim(dy) != w.shape[0] ||
      (needs_dx == 1 && (rows(dx) != m || last_dim(dx) != k)) || (needs_dw == 1 && numel(dw) != numel(w)) ||
      (db != nullptr && numel(*db) != w.shape[0]))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: expects dy [..., N], x [..., K], weight [N, K] -> dx like x, "
                "dweight like weight, dbias [N]", what);
  const int64_t n = w.shape[0];
  const Isa isa = anychip::cpu::isa();
  const Compute compute(call, ANYCHIP_ATTR_LINEAR_GRAD_COMPUTE, dtype, isa);
  if (!compute.valid) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: %s", what, kComputeError);
  const int nt = threads(call);
  const Matrix dym = matrix(dy, m, n);
  const bool products = m > 0 && n > 0 && k > 0;
  std::vector<uint16_t> dyb, xb, wb;
  const Matrix dyp = products ? compute.operand(dym, dyb, isa, nt) : dym;
  // Empty sums (over N for dx, over the rows for dweight and dbias) are zeros.
  if (needs_dx == 1) {
    if (n == 0 && m * k > 0) fill_zero(dx);
    if (products) grad_x(dyp, compute.operand(matrix(w, n, k), wb, isa, nt), dx, compute.amx, isa, nt);
  }
  if (needs_dw == 1) {
    if (m == 0) fill_zero(dw);
    if (products) grad_weight(dyp, compute.operand(matrix(x, m, k), xb, isa, nt), dw, compute.amx, isa, nt);
  }
  if (db != nullptr) {
    if (m == 0) fill_zero(*db);
    if (m > 0 && n > 0) grad_bias(dym, *db, isa, nt);
  }
  return ANYCHIP_OK;
}
