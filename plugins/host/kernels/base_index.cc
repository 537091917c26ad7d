// The indexing base ops (kernel.h, "Base ops"): embedding and its grad, index_select, arange.
// Ids and indices are checked against their range: a bad one is an error naming it, never a
// read outside the tensor.
#include <cstring>
#include <vector>

#include "base.h"

namespace anychip::cpu::base {
namespace {

int element_bytes(int32_t dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT64: case ANYCHIP_DTYPE_INT64: return 8;
    case ANYCHIP_DTYPE_FLOAT32: case ANYCHIP_DTYPE_INT32: return 4;
    case ANYCHIP_DTYPE_FLOAT16: case ANYCHIP_DTYPE_BFLOAT16: case ANYCHIP_DTYPE_INT16: return 2;
    default: return 1;
  }
}

// The first index outside [0, limit), or -1. (A padding_idx lies inside or is -1: none.)
int64_t bad_index(const int64_t* idx, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= limit) return i;
  }
  return -1;
}

}  // namespace
}  // namespace anychip::cpu::base

using namespace anychip::cpu;
using namespace anychip::cpu::base;

// ids int64[...], weight[V, C] -> out[..., C]; rows of padding_idx are zero.
ANYCHIP_CPU_KERNEL(embedding) {
  if (AnychipStatus s = require_contiguous(call, "embedding"); s != ANYCHIP_OK) return s;
  const AnychipTensor &ids_t = in(call, 0), &w = in(call, 1);
  const int64_t n = numel(ids_t), v = w.shape[0], c = w.shape[1];
  const int64_t* ids = data<const int64_t>(ids_t);
  const int64_t pad = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_EMBEDDING_PADDING_IDX, -1));
  if (const int64_t i = bad_index(ids, n, v); i >= 0) {
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "embedding: id %lld at %lld is outside [0, %lld)",
                static_cast<long long>(ids[i]), static_cast<long long>(i), static_cast<long long>(v));
  }
  const size_t row = static_cast<size_t>(c) * element_bytes(w.dtype);
  const char* src = data<const char>(w);
  char* dst = data<char>(out(call, 0));
#pragma omp parallel for num_threads(threads(call)) schedule(static) if (n * c >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] == pad) {
      std::memset(dst + i * row, 0, row);  // +0.0 in every float dtype
    } else {
      std::memcpy(dst + i * row, src + ids[i] * row, row);
    }
  }
  return ANYCHIP_OK;
}

// ids int64[...], dout[..., C] -> dweight[V, C]: each thread owns a range of dweight's rows and
// adds, in id order, the rows of dout whose id falls in it (deterministic, no atomics).
ANYCHIP_CPU_KERNEL(embedding_grad) {
  if (AnychipStatus s = require_contiguous(call, "embedding_grad"); s != ANYCHIP_OK) return s;
  const AnychipTensor &ids_t = in(call, 0), &dw = out(call, 0);
  const int64_t n = numel(ids_t), v = dw.shape[0], c = dw.shape[1];
  const int64_t* ids = data<const int64_t>(ids_t);
  const int64_t pad = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_EMBEDDING_GRAD_PADDING_IDX, -1));
  if (const int64_t i = bad_index(ids, n, v); i >= 0) {
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "embedding_grad: id %lld at %lld is outside [0, %lld)",
                static_cast<long long>(ids[i]), static_cast<long long>(i), static_cast<long long>(v));
  }
  return dispatch<kFloats>(call, in(call, 1).dtype, "embedding_grad", [&]<typename T>() {
    const T* dout = data<const T>(in(call, 1));
    T* out_w = data<T>(dw);
#pragma omp parallel num_threads(threads(call)) if (v * c + n * c >= kParallelElements)
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t r0 = part(v, nt, t), r1 = part(v, nt, t + 1);
      std::vector<float> acc(static_cast<size_t>((r1 - r0) * c), 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t id = ids[i];
        if (id == pad || id < r0 || id >= r1) continue;
        float* a = acc.data() + (id - r0) * c;
        const T* g = dout + i * c;
        for (int64_t j = 0; j < c; ++j) a[j] += to_float(g[j]);
      }
      for (int64_t k = 0; k < (r1 - r0) * c; ++k) out_w[r0 * c + k] = from_float<T>(acc[k]);
    }
    return ANYCHIP_OK;
  });
}

// x (dense), index int64[n] -> out: x's slices at index along axis (dtype-agnostic byte copies).
ANYCHIP_CPU_KERNEL(index_select) {
  if (AnychipStatus s = require_contiguous(call, "index_select"); s != ANYCHIP_OK) return s;
  const AnychipTensor& x = in(call, 0);
  int axis = static_cast<int>(attr(call, ANYCHIP_ATTR_INDEX_SELECT_AXIS));
  if (axis < 0) axis += x.rank;
  if (axis < 0 || axis >= x.rank) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "index_select: axis out of range");
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < x.rank; ++d) {
    if (d < axis) outer *= x.shape[d];
    if (d > axis) inner *= x.shape[d];
  }
  const int64_t len = x.shape[axis], n = numel(in(call, 1));
  const int64_t* index = data<const int64_t>(in(call, 1));
  if (const int64_t i = bad_index(index, n, len); i >= 0) {
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "index_select: index %lld at %lld is outside [0, %lld)",
                static_cast<long long>(index[i]), static_cast<long long>(i), static_cast<long long>(len));
  }
  const size_t slice = static_cast<size_t>(inner) * element_bytes(x.dtype);
  const char* src = data<const char>(x);
  char* dst = data<char>(out(call, 0));
#pragma omp parallel for num_threads(threads(call)) schedule(static) if (outer * n * inner >= kParallelElements)
  for (int64_t k = 0; k < outer * n; ++k) {
    const int64_t o = k / n, j = k % n;
    std::memcpy(dst + k * slice, src + (o * len + index[j]) * slice, slice);
  }
  return ANYCHIP_OK;
}

// -> out[n] = start + i * step in out's dtype (computed in double, then converted).
ANYCHIP_CPU_KERNEL(arange) {
  const AnychipTensor& o = out(call, 0);
  const double start = attr(call, ANYCHIP_ATTR_ARANGE_START), step = attr(call, ANYCHIP_ATTR_ARANGE_STEP, 1.0);
  const int64_t n = numel(o);
  return dispatch<kFloats | kInts>(call, o.dtype, "arange", [&]<typename T>() {
    T* y = data<T>(o);
    const int64_t stride = o.rank ? o.strides[0] : 1;
    for (int64_t i = 0; i < n; ++i) y[i * stride] = store<T>(start + static_cast<double>(i) * step);
    return ANYCHIP_OK;
  });
}
