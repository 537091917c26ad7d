// matmul and matmul_grad (kernel.h, "Base ops"): batched products over strided operands.
//
// Every product here is C[b] (+)= A[b] B[b] with each operand an (r, c) view of a tensor by two
// strides, so transposes are stride swaps: out = A B, dA = dO B^T, dB = A^T dO. matmul_grad's
// dx and dy have x's and y's own (un-broadcast) batch shapes: the out batches that land on one
// dx batch are summed, in batch order, by the thread that owns that block of dx.
//
// Work items are (C batch, 32-row block, 256-column block); B of every out batch is first
// converted to dense float32, A's rows per item. Each C element is summed over the contraction
// in order by one thread, so results do not depend on the number of threads. The inner loop is
// compiled for AVX-512 and for AVX2 as well and chosen by isa() (with FMA: one rounding per term).
#include <algorithm>
#include <vector>

#include "base.h"
#include "elementwise_avx512.h"
#include "simd_avx2.h"

namespace anychip::cpu::base {
namespace {

constexpr int64_t kRows = 32, kCols = 256;

// A tensor as a batch of (r, c) matrices: element (b, r, c) at batch_offset(b) + r*rs + c*cs.
struct View {
  const AnychipTensor* t = nullptr;
  int64_t rs = 0, cs = 0;
  int64_t rows = 0, cols = 0;
};

// A matrix of the last two dims of t, transposed when `swap`.
View matrix(const AnychipTensor& t, bool swap) {
  const int r = t.rank;
  View v{&t, t.strides[r - 2], t.strides[r - 1], t.shape[r - 2], t.shape[r - 1]};
  if (swap) {
    std::swap(v.rs, v.cs);
    std::swap(v.rows, v.cols);
  }
  return v;
}
View transposed(View v) {
  std::swap(v.rs, v.cs);
  std::swap(v.rows, v.cols);
  return v;
}

// The out batch dims (out's leading dims) and where batch b of them lies in tensor t, whose batch
// dims are right-aligned with them; a dim t lacks or has as 1 stays at offset 0 (broadcast).
struct Batches {
  int rank = 0;
  int64_t shape[ANYCHIP_MAX_RANK] = {};
  int64_t count = 1;

  int64_t offset(const AnychipTensor& t, int64_t b) const {
    const int tb = t.rank - 2;
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t i = b % shape[d];
      b /= shape[d];
      const int e = d - (rank - tb);
      if (e >= 0 && t.shape[e] != 1) off += i * t.strides[e];
    }
    return off;
  }
};

template <typename T>
inline float at(const View& v, int64_t base, int64_t r, int64_t c) {
  return to_float(data<const T>(*v.t)[base + r * v.rs + c * v.cs]);
}

// acc[i][0, nc) += sum over l of a[i][l] * b[l][0, nc); a is [mb][L], b rows `ldb` apart. Inlined
// into one caller per ISA, each compiling the loop for its own instruction set.
__attribute__((always_inline)) inline void micro_body(int64_t mb, int64_t nc, int64_t len, const float* a,
                                                      const float* b, int64_t ldb, float* acc) {
  for (int64_t l = 0; l < len; ++l) {
    const float* brow = b + l * ldb;
    for (int64_t i = 0; i < mb; ++i) {
      const float ai = a[i * len + l];
      float* ci = acc + i * kCols;
      for (int64_t j = 0; j < nc; ++j) ci[j] += ai * brow[j];
    }
  }
}
void micro(int64_t mb, int64_t nc, int64_t len, const float* a, const float* b, int64_t ldb, float* acc) {
  micro_body(mb, nc, len, a, b, ldb, acc);
}
ANYCHIP_AVX512 void micro_avx512(int64_t mb, int64_t nc, int64_t len, const float* a, const float* b, int64_t ldb,
                                 float* acc) {
  micro_body(mb, nc, len, a, b, ldb, acc);
}
ANYCHIP_AVX2 void micro_avx2(int64_t mb, int64_t nc, int64_t len, const float* a, const float* b, int64_t ldb,
                              float* acc) {
  micro_body(mb, nc, len, a, b, ldb, acc);
}

// C[cb(b)] = sum over out batches b of A[b] B[b], C an (r, c) view of output `c` whose batch
// offsets group the out batches (equal offsets are summed).
template <typename T>
void product(const AnychipKernelCall* call, const Batches& bt, const View& a, const View& b, const View& c) {
  const int64_t m = a.rows, len = a.cols, n = b.cols;
  if (m == 0 || n == 0) return;
  // groups of out batches by their C batch, in order of first appearance
  std::vector<int64_t> keys, order;
  std::vector<std::vector<int64_t>> groups;
  for (int64_t i = 0; i < bt.count; ++i) {
    const int64_t key = bt.offset(*c.t, i);
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(key);
      groups.push_back({i});
    } else {
      groups[it - keys.begin()].push_back(i);
    }
  }
  const int nt = threads(call);
  // B of every out batch as dense float32 [len][n]
  std::vector<float> bp(static_cast<size_t>(bt.count * len * n));
#pragma omp parallel for num_threads(nt) schedule(static) if (bt.count * len * n >= kParallelElements)
  for (int64_t bl = 0; bl < bt.count * len; ++bl) {
    const int64_t i = bl / len, l = bl % len, base = bt.offset(*b.t, i);
    float* dst = bp.data() + bl * n;
    for (int64_t j = 0; j < n; ++j) dst[j] = at<T>(b, base, l, j);
  }
  const int64_t row_blocks = (m + kRows - 1) / kRows, col_blocks = (n + kCols - 1) / kCols;
  const int64_t items = static_cast<int64_t>(groups.size()) * row_blocks * col_blocks;
  const Isa chosen = isa();
  T* cdata = data<T>(*c.t);
#pragma omp parallel num_threads(nt) if (bt.count * m * n * std::max<int64_t>(len, 1) >= kParallelElements)
  {
    std::vector<float> ap(static_cast<size_t>(kRows * std::max<int64_t>(len, 1)));
    std::vector<float> acc(static_cast<size_t>(kRows * kCols));
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t g = item / (row_blocks * col_blocks), rest = item % (row_blocks * col_blocks);
      const int64_t m0 = (rest / col_blocks) * kRows, n0 = (rest % col_blocks) * kCols;
      const int64_t mb = std::min(kRows, m - m0), nc = std::min(kCols, n - n0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t batch : groups[g]) {
        const int64_t abase = bt.offset(*a.t, batch);
        for (int64_t i = 0; i < mb; ++i)
          for (int64_t l = 0; l < len; ++l) ap[i * len + l] = at<T>(a, abase, m0 + i, l);
        const float* bsrc = bp.data() + batch * len * n + n0;
        if (has_avx512(chosen)) {
          micro_avx512(mb, nc, len, ap.data(), bsrc, n, acc.data());
        } else if (chosen == Isa::kAvx2) {
          micro_avx2(mb, nc, len, ap.data(), bsrc, n, acc.data());
        } else {
          micro(mb, nc, len, ap.data(), bsrc, n, acc.data());
        }
      }
      for (int64_t i = 0; i < mb; ++i)
        for (int64_t j = 0; j < nc; ++j) cdata[keys[g] + (m0 + i) * c.rs + (n0 + j) * c.cs] = from_float<T>(acc[i * kCols + j]);
    }
  }
}

Batches batches_of(const AnychipTensor& o) {
  Batches bt;
  bt.rank = o.rank - 2;
  for (int d = 0; d < bt.rank; ++d) {
    bt.shape[d] = o.shape[d];
    bt.count *= o.shape[d];
  }
  return bt;
}

AnychipStatus check_ranks(const AnychipKernelCall* call, const char* op, int tensors_in) {
  for (int i = 0; i < tensors_in; ++i) {
    if (in(call, i).rank < 2) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: input %d must be at least 2-D", op, i);
  }
  for (int i = 0; i < call->num_outputs; ++i) {
    if (out(call, i).rank < 2) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: output %d must be at least 2-D", op, i);
  }
  return ANYCHIP_OK;
}

}  // namespace
}  // namespace anychip::cpu::base

using namespace anychip::cpu;
using namespace anychip::cpu::base;

ANYCHIP_CPU_KERNEL(matmul) {
  if (AnychipStatus s = check_ranks(call, "matmul", 2); s != ANYCHIP_OK) return s;
  const bool tx = attr(call, ANYCHIP_ATTR_MATMUL_TRANSPOSE_X) != 0.0, ty = attr(call, ANYCHIP_ATTR_MATMUL_TRANSPOSE_Y) != 0.0;
  const AnychipTensor& o = out(call, 0);
  const View a = matrix(in(call, 0), tx), b = matrix(in(call, 1), ty), c = matrix(o, false);
  if (a.cols != b.rows || a.rows != c.rows || b.cols != c.cols) {
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "matmul: operand shapes do not match the output");
  }
  return dispatch<kFloats>(call, o.dtype, "matmul", [&]<typename T>() {
    product<T>(call, batches_of(o), a, b, c);
    return ANYCHIP_OK;
  });
}

// x, y, dout -> dx, dy: with A = op(x), B = op(y): dA = dO B^T, dB = A^T dO, written through
// the transposed views when x or y is stored transposed.
ANYCHIP_CPU_KERNEL(matmul_grad) {
  if (AnychipStatus s = check_ranks(call, "matmul_grad", 3); s != ANYCHIP_OK) return s;
  const bool tx = attr(call, ANYCHIP_ATTR_MATMUL_GRAD_TRANSPOSE_X) != 0.0;
  const bool ty = attr(call, ANYCHIP_ATTR_MATMUL_GRAD_TRANSPOSE_Y) != 0.0;
  const AnychipTensor& dout = in(call, 2);
  const View a = matrix(in(call, 0), tx), b = matrix(in(call, 1), ty), d = matrix(dout, false);
  const View da = matrix(out(call, 0), tx), db = matrix(out(call, 1), ty);
  if (a.cols != b.rows || a.rows != d.rows || b.cols != d.cols || da.rows != a.rows || da.cols != a.cols ||
      db.rows != b.rows || db.cols != b.cols) {
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "matmul_grad: operand shapes do not match");
  }
  return dispatch<kFloats>(call, dout.dtype, "matmul_grad", [&]<typename T>() {
    const Batches bt = batches_of(dout);
    product<T>(call, bt, d, transposed(b), da);
    product<T>(call, bt, transposed(a), d, db);
    return ANYCHIP_OK;
  });
}
