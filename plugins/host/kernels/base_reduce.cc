// The reducing base ops (kernel.h, "Base ops"): sum, mean and max over any axes of a strided
// input; softmax and its grad over any axis; cross_entropy_with_softmax and its grad.
//
// Determinism: every output element is reduced in one fixed order. A reduction of more than
// kBlock elements is cut into fixed blocks whose partial results (computed in parallel) are then
// combined in block order, so the result never depends on the number of threads. Sums accumulate
// in double: the float32 the contract asks for, with room to spare.
#include <cmath>
#include <limits>
#include <vector>

#include "base.h"

namespace anychip::cpu::base {
namespace {

constexpr int64_t kBlock = int64_t{1} << 15;
constexpr float kInf = std::numeric_limits<float>::infinity();

// NaN-propagating max, as numpy's and Paddle's.
inline float max_nan(float m, float v) { return (v > m || v != v) && m == m ? v : m; }

// The kept and reduced dims of x, each as (shape, stride) lists.
struct Split {
  int kept = 0, reduced = 0;
  int64_t kshape[ANYCHIP_MAX_RANK], kstride[ANYCHIP_MAX_RANK];
  int64_t rshape[ANYCHIP_MAX_RANK], rstride[ANYCHIP_MAX_RANK];
  int64_t outputs = 1, count = 1;  // number of outputs; elements reduced into each
};

AnychipStatus split_axes(const AnychipKernelCall* call, const char* op, Split& s) {
  const AnychipTensor& x = in(call, 0);
  // sum, mean and max share their attrs' places
  static_assert(ANYCHIP_ATTR_MEAN_AXES == ANYCHIP_ATTR_SUM_AXES && ANYCHIP_ATTR_MAX_AXES == ANYCHIP_ATTR_SUM_AXES,
                "the reductions' attrs");
  const int n = static_cast<int>(attr(call, ANYCHIP_ATTR_SUM_N));
  if (n < 0 || n > x.rank || call->num_attrs != ANYCHIP_ATTR_SUM_AXES + n) {
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: attrs must be [keepdim, n, n axes]", op);
  }
  bool reduced[ANYCHIP_MAX_RANK] = {};
  for (int i = 0; i < n; ++i) {
    const int a = static_cast<int>(attr(call, ANYCHIP_ATTR_SUM_AXES + i));
    if (a < 0 || a >= x.rank || reduced[a]) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: bad axis %d", op, a);
    reduced[a] = true;
  }
  for (int d = 0; d < x.rank; ++d) {
    if (n == 0 || reduced[d]) {
      // merge with the previous reduced dim when contiguous with it (fewer, longer inner loops)
      if (s.reduced > 0 && s.rstride[s.reduced - 1] == x.strides[d] * x.shape[d] && x.shape[d] != 0) {
        s.rshape[s.reduced - 1] *= x.shape[d];
        s.rstride[s.reduced - 1] = x.strides[d];
      } else {
        s.rshape[s.reduced] = x.shape[d];
        s.rstride[s.reduced++] = x.strides[d];
      }
      s.count *= x.shape[d];
    } else {
      s.kshape[s.kept] = x.shape[d];
      s.kstride[s.kept++] = x.strides[d];
      s.outputs *= x.shape[d];
    }
  }
  if (numel(out(call, 0)) != s.outputs) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: out has the wrong size", op);
  return ANYCHIP_OK;
}

// Offset of kept-index o (row-major over the kept dims).
inline int64_t kept_offset(const Split& s, int64_t o) {
  int64_t off = 0;
  for (int d = s.kept - 1; d >= 0; --d) {
    off += (o % s.kshape[d]) * s.kstride[d];
    o /= s.kshape[d];
  }
  return off;
}

// f(v) over reduced elements [r0, r1) (row-major over the reduced dims) from offset `base`.
template <typename T, typename F>
void over_reduced(const Split& s, const T* x, int64_t base, int64_t r0, int64_t r1, F&& f) {
  if (r0 >= r1) return;
  if (s.reduced == 0) {
    if (r0 < r1) f(to_float(x[base]));
    return;
  }
  const int last = s.reduced - 1;
  const int64_t inner = s.rshape[last], step = s.rstride[last];
  int64_t idx[ANYCHIP_MAX_RANK] = {}, off = base;
  int64_t r = r0 / inner;
  for (int d = last - 1; d >= 0; --d) {
    idx[d] = r % s.rshape[d];
    r /= s.rshape[d];
    off += idx[d] * s.rstride[d];
  }
  int64_t pos = r0;
  int64_t i = r0 % inner;
  while (pos < r1) {
    const int64_t stop = std::min(inner, i + (r1 - pos));
    const T* p = x + off;
    if (step == 1) {
      for (int64_t j = i; j < stop; ++j) f(to_float(p[j]));
    } else {
      for (int64_t j = i; j < stop; ++j) f(to_float(p[j * step]));
    }
    pos += stop - i;
    i = 0;
    for (int d = last - 1; d >= 0; --d) {
      off += s.rstride[d];
      if (++idx[d] < s.rshape[d]) break;
      off -= idx[d] * s.rstride[d];
      idx[d] = 0;
    }
  }
}

enum class Reduce { kSum, kMean, kMax };

template <Reduce kOp>
AnychipStatus reduce(const AnychipKernelCall* call, const char* op) {
  Split s;
  if (AnychipStatus st = split_axes(call, op, s); st != ANYCHIP_OK) return st;
  return dispatch<kFloats>(call, in(call, 0).dtype, op, [&]<typename T>() {
    const T* x = data<const T>(in(call, 0));
    T* y = data<T>(out(call, 0));
    const int64_t blocks = std::max<int64_t>(1, (s.count + kBlock - 1) / kBlock);
    const int64_t items = s.outputs * blocks;
    std::vector<double> partial(static_cast<size_t>(items));
#pragma omp parallel for num_threads(threads(call)) schedule(static) if (s.outputs * s.count >= kParallelElements)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t o = item / blocks, b = item % blocks;
      const int64_t r0 = b * kBlock, r1 = std::min(s.count, r0 + kBlock);
      if constexpr (kOp == Reduce::kMax) {
        float m = -kInf;
        over_reduced(s, x, kept_offset(s, o), r0, r1, [&m](float v) { m = max_nan(m, v); });
        partial[item] = m;
      } else {
        double acc = 0.0;
        over_reduced(s, x, kept_offset(s, o), r0, r1, [&acc](float v) { acc += v; });
        partial[item] = acc;
      }
    }
    for (int64_t o = 0; o < s.outputs; ++o) {
      double acc = kOp == Reduce::kMax ? -kInf : 0.0;
      for (int64_t b = 0; b < blocks; ++b) {
        const double v = partial[o * blocks + b];
        acc = kOp == Reduce::kMax ? max_nan(static_cast<float>(acc), static_cast<float>(v)) : acc + v;
      }
      if constexpr (kOp == Reduce::kMean) acc = s.count ? acc / static_cast<double>(s.count) : std::nan("");
      y[o] = from_float<T>(static_cast<float>(acc));
    }
    return ANYCHIP_OK;
  });
}

// x viewed as [outer, len, inner] around `axis` (x dense).
struct Around {
  int64_t outer = 1, len = 1, inner = 1;
};

AnychipStatus around(const AnychipKernelCall* call, const char* op, Around& a) {
  const AnychipTensor& x = in(call, 0);
  if (AnychipStatus s = require_contiguous(call, op); s != ANYCHIP_OK) return s;
  const int rank = x.rank;
  static_assert(ANYCHIP_ATTR_SOFTMAX_AXIS == ANYCHIP_ATTR_SOFTMAX_GRAD_AXIS, "softmax's attrs");
  int axis = static_cast<int>(attr(call, ANYCHIP_ATTR_SOFTMAX_AXIS, -1));
  if (rank == 0) return ANYCHIP_OK;
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: axis out of range", op);
  for (int d = 0; d < rank; ++d) (d < axis ? a.outer : d == axis ? a.len : a.inner) *= x.shape[d];
  return ANYCHIP_OK;
}

// softmax (grad false) or softmax_grad over [outer, len, inner]; each (outer, inner-column) row
// is done by one thread, columns of one outer index together so that loads stay unit-stride.
template <typename T, bool kGrad>
void softmax_rows(const AnychipKernelCall* call, const Around& a) {
  if (a.outer * a.len * a.inner == 0) return;
  const T* x = data<const T>(in(call, 0));               // x, or out for the grad
  const T* dy = kGrad ? data<const T>(in(call, 1)) : nullptr;
  T* y = data<T>(out(call, 0));
  const int64_t cols = std::min<int64_t>(a.inner, 256);  // inner columns per work item
  const int64_t col_blocks = (a.inner + cols - 1) / cols, items = a.outer * col_blocks;
#pragma omp parallel num_threads(threads(call)) if (a.outer * a.len * a.inner >= kParallelElements)
  {
    std::vector<double> acc(static_cast<size_t>(cols));
    std::vector<float> mx(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t o = item / col_blocks, c0 = (item % col_blocks) * cols, nc = std::min(cols, a.inner - c0);
      const int64_t base = o * a.len * a.inner + c0;
      auto at = [&](int64_t l, int64_t c) { return base + l * a.inner + c; };
      if constexpr (kGrad) {
        std::fill(acc.begin(), acc.begin() + nc, 0.0);
        for (int64_t l = 0; l < a.len; ++l)
          for (int64_t c = 0; c < nc; ++c) acc[c] += static_cast<double>(to_float(x[at(l, c)])) * to_float(dy[at(l, c)]);
        for (int64_t l = 0; l < a.len; ++l)
          for (int64_t c = 0; c < nc; ++c) {
            const float o_ = to_float(x[at(l, c)]);
            y[at(l, c)] = from_float<T>(o_ * static_cast<float>(to_float(dy[at(l, c)]) - acc[c]));
          }
      } else {
        std::fill(mx.begin(), mx.begin() + nc, -kInf);
        std::fill(acc.begin(), acc.begin() + nc, 0.0);
        for (int64_t l = 0; l < a.len; ++l)
          for (int64_t c = 0; c < nc; ++c) mx[c] = max_nan(mx[c], to_float(x[at(l, c)]));
        for (int64_t l = 0; l < a.len; ++l)
          for (int64_t c = 0; c < nc; ++c) acc[c] += std::exp(to_float(x[at(l, c)]) - mx[c]);
        for (int64_t l = 0; l < a.len; ++l)
          for (int64_t c = 0; c < nc; ++c) {
            y[at(l, c)] = from_float<T>(static_cast<float>(std::exp(to_float(x[at(l, c)]) - mx[c]) / acc[c]));
          }
      }
    }
  }
}

template <bool kGrad>
AnychipStatus softmax(const AnychipKernelCall* call, const char* op) {
  Around a;
  if (AnychipStatus s = around(call, op, a); s != ANYCHIP_OK) return s;
  return dispatch<kFloats>(call, in(call, 0).dtype, op, [&]<typename T>() {
    softmax_rows<T, kGrad>(call, a);
    return ANYCHIP_OK;
  });
}

}  // namespace
}  // namespace anychip::cpu::base

using namespace anychip::cpu;
using namespace anychip::cpu::base;

ANYCHIP_CPU_KERNEL(sum) { return reduce<Reduce::kSum>(call, "sum"); }
ANYCHIP_CPU_KERNEL(mean) { return reduce<Reduce::kMean>(call, "mean"); }
ANYCHIP_CPU_KERNEL(max) { return reduce<Reduce::kMax>(call, "max"); }
ANYCHIP_CPU_KERNEL(softmax) { return softmax<false>(call, "softmax"); }
ANYCHIP_CPU_KERNEL(softmax_grad) { return softmax<true>(call, "softmax_grad"); }

// logits[R, V], label int64[R] -> softmax[R, V], loss[R]; rows with label == ignore_index get loss 0.
ANYCHIP_CPU_KERNEL(cross_entropy_with_softmax) {
  if (AnychipStatus s = require_contiguous(call, "cross_entropy_with_softmax"); s != ANYCHIP_OK) return s;
  const AnychipTensor& logits = in(call, 0);
  const int64_t v = last_dim(logits), r = rows(logits);
  const int64_t* label = data<const int64_t>(in(call, 1));
  const int64_t ignore = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_CROSS_ENTROPY_WITH_SOFTMAX_IGNORE_INDEX, -100));
  for (int64_t i = 0; i < r; ++i) {
    if (label[i] != ignore && (label[i] < 0 || label[i] >= v)) {
      return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT,
                  "cross_entropy_with_softmax: label %lld of row %lld is outside [0, %lld)",
                  static_cast<long long>(label[i]), static_cast<long long>(i), static_cast<long long>(v));
    }
  }
  return dispatch<kFloats>(call, logits.dtype, "cross_entropy_with_softmax", [&]<typename T>() {
    const T* x = data<const T>(logits);
    T *sm = data<T>(out(call, 0)), *loss = data<T>(out(call, 1));
#pragma omp parallel for num_threads(threads(call)) schedule(static) if (r * v >= kParallelElements)
    for (int64_t i = 0; i < r; ++i) {
      const T* row = x + i * v;
      float m = -kInf;
      for (int64_t j = 0; j < v; ++j) m = max_nan(m, to_float(row[j]));
      double sum = 0.0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(to_float(row[j]) - m);
      const double lse = m + std::log(sum);
      for (int64_t j = 0; j < v; ++j) sm[i * v + j] = from_float<T>(static_cast<float>(std::exp(to_float(row[j]) - lse)));
      loss[i] = from_float<T>(label[i] == ignore ? 0.0f : static_cast<float>(lse - to_float(row[label[i]])));
    }
    return ANYCHIP_OK;
  });
}

// label int64[R], softmax[R, V], dloss[R] -> dlogits[R, V] = (softmax - onehot) * dloss.
ANYCHIP_CPU_KERNEL(cross_entropy_with_softmax_grad) {
  if (AnychipStatus s = require_contiguous(call, "cross_entropy_with_softmax_grad"); s != ANYCHIP_OK) return s;
  const AnychipTensor& smt = in(call, 1);
  const int64_t v = last_dim(smt), r = rows(smt);
  const int64_t* label = data<const int64_t>(in(call, 0));
  const int64_t ignore = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_CROSS_ENTROPY_WITH_SOFTMAX_GRAD_IGNORE_INDEX, -100));
  return dispatch<kFloats>(call, smt.dtype, "cross_entropy_with_softmax_grad", [&]<typename T>() {
    const T *sm = data<const T>(smt), *dloss = data<const T>(in(call, 2));
    T* dx = data<T>(out(call, 0));
#pragma omp parallel for num_threads(threads(call)) schedule(static) if (r * v >= kParallelElements)
    for (int64_t i = 0; i < r; ++i) {
      const bool skip = label[i] == ignore;
      const float d = skip ? 0.0f : to_float(dloss[i]);
      for (int64_t j = 0; j < v; ++j) {
        const float p = to_float(sm[i * v + j]) - (j == label[i] ? 1.0f : 0.0f);
        dx[i * v + j] = from_float<T>(skip ? 0.0f : p * d);
      }
    }
    return ANYCHIP_OK;
  });
}
