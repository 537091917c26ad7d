// Shared by the base-op kernels (base_*.cc, anychip/kernel.h section "Base ops"): storage types of
// every dtype and conversions between them, dtype dispatch, and the strided elementwise engine.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "common.h"
#include "elementwise_common.h"

namespace anychip::cpu::base {

// bool storage: one byte, 0 or 1 (a struct, so that it is a distinct type from uint8).
struct b8 {
  uint8_t v;
};

template <typename T>
constexpr bool kIsFloat = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

// The value a kernel computes with: float for float storage, the integer itself otherwise.
template <typename T>
using Compute = std::conditional_t<kIsFloat<T>, float, std::conditional_t<std::is_same_v<T, b8>, int32_t, T>>;

template <typename T>
inline Compute<T> load(T v) {
  if constexpr (kIsFloat<T>) {
    return to_float(v);
  } else if constexpr (std::is_same_v<T, b8>) {
    return v.v != 0;
  } else {
    return v;
  }
}

// Float to integer: toward zero, NaN to 0, saturating (never undefined behaviour).
template <typename I>
inline I truncate(double f) {
  if (!(f == f)) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<I>::max());
  const double d = std::trunc(f);
  if (d <= lo) return std::numeric_limits<I>::min();
  if (d >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(d);
}

// A value of compute type S stored as D (the cast rules of kernel.h).
template <typename D, typename S>
inline D store(S v) {
  if constexpr (std::is_same_v<D, b8>) {
    return b8{static_cast<uint8_t>(v != S(0))};
  } else if constexpr (kIsFloat<D>) {
    return from_float<D>(static_cast<float>(v));
  } else if constexpr (std::is_floating_point_v<S>) {
    return truncate<D>(static_cast<double>(v));
  } else {
    return static_cast<D>(v);
  }
}

// Calls body.template operator()<T>() with T the storage type of `dtype`, one of `kinds`.
enum Kinds : unsigned { kFloats = 1, kInts = 2, kBool = 4, kAll = 7, kInt8 = 8 };  // kInt8: cast only

template <unsigned kKinds, typename Body>
AnychipStatus dispatch(const AnychipKernelCall* call, int32_t dtype, const char* what, Body&& body) {
  if constexpr ((kKinds & kFloats) != 0) {
    switch (dtype) {
      case ANYCHIP_DTYPE_FLOAT32: return body.template operator()<float>();
      case ANYCHIP_DTYPE_BFLOAT16: return body.template operator()<bf16>();
      case ANYCHIP_DTYPE_FLOAT16: return body.template operator()<fp16>();
      default: break;
    }
  }
  if constexpr ((kKinds & kInts) != 0) {
    switch (dtype) {
      case ANYCHIP_DTYPE_INT32: return body.template operator()<int32_t>();
      case ANYCHIP_DTYPE_INT64: return body.template operator()<int64_t>();
      default: break;
    }
  }
  if constexpr ((kKinds & kBool) != 0) {
    if (dtype == ANYCHIP_DTYPE_BOOL) return body.template operator()<b8>();
  }
  if constexpr ((kKinds & kInt8) != 0) {
    if (dtype == ANYCHIP_DTYPE_INT8) return body.template operator()<int8_t>();
  }
  return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: dtype %d is not supported", what, dtype);
}

// Checks that every input has the output's rank and shape (the caller broadcasts).
AnychipStatus require_output_shape(const AnychipKernelCall* call, const char* op, int first_input = 0);

// ---- the strided elementwise engine --------------------------------------------------------------

constexpr int kMaxTensors = 4;  // the output and up to three inputs

// The iteration space of one output and its inputs after dropping size-1 dims and merging dims
// that are contiguous with their inner neighbour in every tensor: usually one or two dims.
struct Layout {
  int rank = 0;   // after collapsing; 0 means one element
  int tensors = 0;
  int64_t shape[ANYCHIP_MAX_RANK] = {};
  int64_t strides[kMaxTensors][ANYCHIP_MAX_RANK] = {};
  int64_t numel = 1;
};

// The layout of `out` with `inputs` (each of out's shape). Tensor 0 of the layout is the output.
Layout collapse(const AnychipTensor& out, const AnychipTensor* const* inputs, int num_inputs);

// Inner runs of this many elements are the unit of work (so a few long rows still split).
constexpr int64_t kRun = 4096;

// Calls run(n, offsets, steps) for runs covering the layout, in parallel: elements i < n of the
// run are at offsets[t] + i * steps[t] of tensor t (in elements).
template <typename Run>
void for_each_run(const Layout& l, int threads, Run&& run) {
  if (l.numel == 0) return;
  const int r = l.rank;
  const int64_t inner = r == 0 ? 1 : l.shape[r - 1];
  const int64_t chunks = (inner + kRun - 1) / kRun;
  const int64_t outer = l.numel / inner;
  const int64_t items = outer * chunks;
  int64_t steps[kMaxTensors] = {};
  for (int t = 0; t < l.tensors; ++t) steps[t] = r == 0 ? 0 : l.strides[t][r - 1];
#pragma omp parallel num_threads(threads) if (l.numel >= kParallelElements && items > 1)
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t i0 = part(items, nt, tid), i1 = part(items, nt, tid + 1);
    if (i0 < i1) {
      // The outer index of item i0, as an odometer over dims 0 .. r-2, and its offsets.
      int64_t idx[ANYCHIP_MAX_RANK] = {}, base[kMaxTensors] = {};
      int64_t o = i0 / chunks;
      for (int d = r - 2; d >= 0; --d) {
        idx[d] = o % l.shape[d];
        o /= l.shape[d];
        for (int t = 0; t < l.tensors; ++t) base[t] += idx[d] * l.strides[t][d];
      }
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t c = item % chunks;
        if (c == 0 && item != i0) {  // the next outer index
          for (int d = r - 2; d >= 0; --d) {
            for (int t = 0; t < l.tensors; ++t) base[t] += l.strides[t][d];
            if (++idx[d] < l.shape[d]) break;
            for (int t = 0; t < l.tensors; ++t) base[t] -= idx[d] * l.strides[t][d];
            idx[d] = 0;
          }
        }
        const int64_t start = c * kRun, n = std::min(kRun, inner - start);
        int64_t offsets[kMaxTensors];
        for (int t = 0; t < l.tensors; ++t) offsets[t] = base[t] + start * steps[t];
        run(n, offsets, steps);
      }
    }
  }
}

}  // namespace anychip::cpu::base
