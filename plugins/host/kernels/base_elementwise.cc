// The elementwise base ops (kernel.h, "Base ops"): unary math, scale, pow, binary math, compares,
// where, cast, fill and copy, over strided inputs that the caller broadcast with stride 0.
//
// Every op runs on the engine of base.h: dims are collapsed, then runs of up to kRun elements go
// to threads. A run whose tensors are all unit-stride (or stride-0 broadcasts) takes a tight loop
// that the compiler vectorises; with AVX-512 available that loop is compiled for it (isa()).
#include <cmath>
#include <cstring>

#include "base.h"
#include "elementwise_avx512.h"

namespace anychip::cpu::base {

AnychipStatus require_output_shape(const AnychipKernelCall* call, const char* op, int first_input) {
  const AnychipTensor& o = out(call, 0);
  for (int i = first_input; i < call->num_inputs; ++i) {
    const AnychipTensor& t = in(call, i);
    bool same = t.rank == o.rank;
    for (int d = 0; same && d < o.rank; ++d) same = t.shape[d] == o.shape[d];
    if (!same) {
      return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT,
                  "%s: input %d must have the output's rank and shape (broadcast with stride 0)", op, i);
    }
  }
  return ANYCHIP_OK;
}

Layout collapse(const AnychipTensor& o, const AnychipTensor* const* inputs, int num_inputs) {
  Layout l;
  l.tensors = num_inputs + 1;
  auto stride = [&](int t, int d) { return t == 0 ? o.strides[d] : inputs[t - 1]->strides[d]; };
  for (int d = 0; d < o.rank; ++d) {
    l.numel *= o.shape[d];
    if (o.shape[d] == 1) continue;
    bool merge = l.rank > 0;
    for (int t = 0; merge && t < l.tensors; ++t) merge = l.strides[t][l.rank - 1] == stride(t, d) * o.shape[d];
    if (merge) {
      l.shape[l.rank - 1] *= o.shape[d];
      for (int t = 0; t < l.tensors; ++t) l.strides[t][l.rank - 1] = stride(t, d);
    } else {
      l.shape[l.rank] = o.shape[d];
      for (int t = 0; t < l.tensors; ++t) l.strides[t][l.rank] = stride(t, d);
      ++l.rank;
    }
  }
  return l;
}

namespace {

// out[i] = f(a[i]) (a run), with the unit-stride case as its own loop.
template <typename O, typename A, typename F>
inline void map1_contiguous(int64_t n, O* o, const A* a, F& f) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
}
template <typename O, typename A, typename F>
ANYCHIP_AVX512 void map1_contiguous_avx512(int64_t n, O* o, const A* a, F& f) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
}

template <typename O, typename A, typename B, typename F>
inline void map2_contiguous(int64_t n, O* o, const A* a, int64_t sa, const B* b, int64_t sb, F& f) {
  // sa, sb in {0, 1}: the multiplications by a constant 0 or 1 fold in the two instantiations below
  for (int64_t i = 0; i < n; ++i) o[i] = f(a[i * sa], b[i * sb]);
}
template <typename O, typename A, typename B, typename F>
ANYCHIP_AVX512 void map2_contiguous_avx512(int64_t n, O* o, const A* a, int64_t sa, const B* b, int64_t sb, F& f) {
  for (int64_t i = 0; i < n; ++i) o[i] = f(a[i * sa], b[i * sb]);
}

bool vector_isa() { return isa() >= Isa::kAvx512; }

// One input: out = f(x), f from storage A to storage O.
template <typename O, typename A, typename F>
AnychipStatus map1(const AnychipKernelCall* call, F f) {
  const AnychipTensor* inputs[] = {&in(call, 0)};
  const Layout l = collapse(out(call, 0), inputs, 1);
  O* o = data<O>(out(call, 0));
  const A* a = data<const A>(in(call, 0));
  const bool vector = vector_isa();
  for_each_run(l, threads(call), [&](int64_t n, const int64_t* off, const int64_t* step) {
    if (step[0] == 1 && step[1] == 1) {
      vector ? map1_contiguous_avx512(n, o + off[0], a + off[1], f) : map1_contiguous(n, o + off[0], a + off[1], f);
    } else {
      for (int64_t i = 0; i < n; ++i) o[off[0] + i * step[0]] = f(a[off[1] + i * step[1]]);
    }
  });
  return ANYCHIP_OK;
}

// Two inputs: out = f(x, y).
template <typename O, typename A, typename B, typename F>
AnychipStatus map2(const AnychipKernelCall* call, F f) {
  const AnychipTensor* inputs[] = {&in(call, 0), &in(call, 1)};
  const Layout l = collapse(out(call, 0), inputs, 2);
  O* o = data<O>(out(call, 0));
  const A* a = data<const A>(in(call, 0));
  const B* b = data<const B>(in(call, 1));
  const bool vector = vector_isa();
  for_each_run(l, threads(call), [&](int64_t n, const int64_t* off, const int64_t* step) {
    const bool tight = step[0] == 1 && (step[1] | 1) == 1 && (step[2] | 1) == 1;
    if (tight && step[1] == 1 && step[2] == 1) {
      vector ? map2_contiguous_avx512(n, o + off[0], a + off[1], 1, b + off[2], 1, f)
             : map2_contiguous(n, o + off[0], a + off[1], 1, b + off[2], 1, f);
    } else if (tight && step[1] == 1) {
      vector ? map2_contiguous_avx512(n, o + off[0], a + off[1], 1, b + off[2], 0, f)
             : map2_contiguous(n, o + off[0], a + off[1], 1, b + off[2], 0, f);
    } else if (tight && step[2] == 1) {
      vector ? map2_contiguous_avx512(n, o + off[0], a + off[1], 0, b + off[2], 1, f)
             : map2_contiguous(n, o + off[0], a + off[1], 0, b + off[2], 1, f);
    } else {
      for (int64_t i = 0; i < n; ++i) o[off[0] + i * step[0]] = f(a[off[1] + i * step[1]], b[off[2] + i * step[2]]);
    }
  });
  return ANYCHIP_OK;
}

// ---- math -----------------------------------------------------------------------------------------

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline bool is_nan(float x) { return x != x; }

enum class Unary { kExp, kLog, kSqrt, kRsqrt, kSilu, kSigmoid, kTanh, kAbs, kNeg, kSin, kCos, kScale, kPow };

template <Unary kOp>
AnychipStatus unary(const AnychipKernelCall* call, const char* name) {
  if (AnychipStatus s = require_output_shape(call, name); s != ANYCHIP_OK) return s;
  // scale's attrs (pow reads its factor where scale has its own): the other ops ignore them
  static_assert(ANYCHIP_ATTR_POW_FACTOR == ANYCHIP_ATTR_SCALE_SCALE, "pow's factor is read as a0");
  const float a0 = static_cast<float>(attr(call, ANYCHIP_ATTR_SCALE_SCALE, 1.0));
  const float a1 = static_cast<float>(attr(call, ANYCHIP_ATTR_SCALE_BIAS, 0.0));
  const bool after = attr(call, ANYCHIP_ATTR_SCALE_BIAS_AFTER_SCALE, 1.0) != 0.0;
  return dispatch<kFloats>(call, in(call, 0).dtype, name, [&]<typename T>() {
    return map1<T, T>(call, [=](T v) {
      const float x = to_float(v);
      float y;
      if constexpr (kOp == Unary::kExp) y = std::exp(x);
      if constexpr (kOp == Unary::kLog) y = std::log(x);
      if constexpr (kOp == Unary::kSqrt) y = std::sqrt(x);
      if constexpr (kOp == Unary::kRsqrt) y = 1.0f / std::sqrt(x);
      if constexpr (kOp == Unary::kSilu) y = x * sigmoid(x);
      if constexpr (kOp == Unary::kSigmoid) y = sigmoid(x);
      if constexpr (kOp == Unary::kTanh) y = std::tanh(x);
      if constexpr (kOp == Unary::kAbs) y = std::fabs(x);
      if constexpr (kOp == Unary::kNeg) y = -x;
      if constexpr (kOp == Unary::kSin) y = std::sin(x);
      if constexpr (kOp == Unary::kCos) y = std::cos(x);
      if constexpr (kOp == Unary::kScale) y = after ? a0 * x + a1 : a0 * (x + a1);
      if constexpr (kOp == Unary::kPow) y = std::pow(x, a0);
      return from_float<T>(y);
    });
  });
}

enum class Binary { kAdd, kSubtract, kMultiply, kDivide, kMaximum, kMinimum, kPow };

// Integer add, subtract, multiply, maximum, minimum (index arithmetic; Paddle's cross_entropy
// multiplies its int64 labels): exact, wrapping on overflow as two's complement does.
template <Binary kOp, typename T>
inline T integer_binary(T a, T b) {
  using U = std::make_unsigned_t<T>;
  if constexpr (kOp == Binary::kAdd) return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  if constexpr (kOp == Binary::kSubtract) return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  if constexpr (kOp == Binary::kMultiply) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  if constexpr (kOp == Binary::kMaximum) return a > b ? a : b;
  if constexpr (kOp == Binary::kMinimum) return a < b ? a : b;
}

constexpr bool has_integer_form(Binary op) {
  return op == Binary::kAdd || op == Binary::kSubtract || op == Binary::kMultiply || op == Binary::kMaximum ||
         op == Binary::kMinimum;
}

template <Binary kOp>
AnychipStatus binary(const AnychipKernelCall* call, const char* name) {
  if (AnychipStatus s = require_output_shape(call, name); s != ANYCHIP_OK) return s;
  constexpr unsigned kKinds = has_integer_form(kOp) ? (kFloats | kInts) : kFloats;
  return dispatch<kKinds>(call, in(call, 0).dtype, name, [&]<typename T>() {
    if constexpr (!kIsFloat<T>) {
      return map2<T, T, T>(call, [](T a, T b) { return integer_binary<kOp>(a, b); });
    } else {
      return map2<T, T, T>(call, [](T va, T vb) {
        const float a = to_float(va), b = to_float(vb);
        float y;
        if constexpr (kOp == Binary::kAdd) y = a + b;
        if constexpr (kOp == Binary::kSubtract) y = a - b;
        if constexpr (kOp == Binary::kMultiply) y = a * b;
        if constexpr (kOp == Binary::kDivide) y = a / b;
        if constexpr (kOp == Binary::kMaximum) y = is_nan(a) || is_nan(b) ? a + b : (a > b ? a : b);
        if constexpr (kOp == Binary::kMinimum) y = is_nan(a) || is_nan(b) ? a + b : (a < b ? a : b);
        if constexpr (kOp == Binary::kPow) y = std::pow(a, b);
        return from_float<T>(y);
      });
    }
  });
}

enum class Compare { kEq, kNe, kLt, kLe, kGt, kGe };

template <Compare kOp>
AnychipStatus compare(const AnychipKernelCall* call, const char* name) {
  if (AnychipStatus s = require_output_shape(call, name); s != ANYCHIP_OK) return s;
  if (out(call, 0).dtype != ANYCHIP_DTYPE_BOOL) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: out must be bool", name);
  return dispatch<kFloats | kInts>(call, in(call, 0).dtype, name, [&]<typename T>() {
    return map2<b8, T, T>(call, [](T va, T vb) {
      const auto a = load(va), b = load(vb);
      bool y;
      if constexpr (kOp == Compare::kEq) y = a == b;
      if constexpr (kOp == Compare::kNe) y = a != b;
      if constexpr (kOp == Compare::kLt) y = a < b;
      if constexpr (kOp == Compare::kLe) y = a <= b;
      if constexpr (kOp == Compare::kGt) y = a > b;
      if constexpr (kOp == Compare::kGe) y = a >= b;
      return b8{static_cast<uint8_t>(y)};
    });
  });
}

// Same-sized raw element type: copies and selections move bits, whatever the dtype.
template <int kBytes>
using Raw = std::conditional_t<kBytes == 1, uint8_t,
            std::conditional_t<kBytes == 2, uint16_t, std::conditional_t<kBytes == 4, uint32_t, uint64_t>>>;

int element_bytes(int32_t dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT64: case ANYCHIP_DTYPE_INT64: return 8;
    case ANYCHIP_DTYPE_FLOAT32: case ANYCHIP_DTYPE_INT32: return 4;
    case ANYCHIP_DTYPE_FLOAT16: case ANYCHIP_DTYPE_BFLOAT16: case ANYCHIP_DTYPE_INT16: return 2;
    default: return 1;
  }
}

template <typename Body>
AnychipStatus dispatch_bytes(int32_t dtype, Body&& body) {
  switch (element_bytes(dtype)) {
    case 8: return body.template operator()<uint64_t>();
    case 4: return body.template operator()<uint32_t>();
    case 2: return body.template operator()<uint16_t>();
    default: return body.template operator()<uint8_t>();
  }
}

}  // namespace
}  // namespace anychip::cpu::base

using namespace anychip::cpu;
using namespace anychip::cpu::base;

#define BASE_UNARY(name, op) \
  ANYCHIP_CPU_KERNEL(name) { return unary<Unary::op>(call, #name); }
BASE_UNARY(exp, kExp)
BASE_UNARY(log, kLog)
BASE_UNARY(sqrt, kSqrt)
BASE_UNARY(rsqrt, kRsqrt)
BASE_UNARY(silu, kSilu)
BASE_UNARY(sigmoid, kSigmoid)
BASE_UNARY(tanh, kTanh)
BASE_UNARY(abs, kAbs)
BASE_UNARY(neg, kNeg)
BASE_UNARY(sin, kSin)
BASE_UNARY(cos, kCos)
BASE_UNARY(scale, kScale)
BASE_UNARY(pow, kPow)

#define BASE_BINARY(name, op) \
  ANYCHIP_CPU_KERNEL(name) { return binary<Binary::op>(call, #name); }
BASE_BINARY(add, kAdd)
BASE_BINARY(subtract, kSubtract)
BASE_BINARY(multiply, kMultiply)
BASE_BINARY(divide, kDivide)
BASE_BINARY(maximum, kMaximum)
BASE_BINARY(minimum, kMinimum)
BASE_BINARY(elementwise_pow, kPow)

#define BASE_COMPARE(name, op) \
  ANYCHIP_CPU_KERNEL(name) { return compare<Compare::op>(call, #name); }
BASE_COMPARE(equal, kEq)
BASE_COMPARE(not_equal, kNe)
BASE_COMPARE(less_than, kLt)
BASE_COMPARE(less_equal, kLe)
BASE_COMPARE(greater_than, kGt)
BASE_COMPARE(greater_equal, kGe)

ANYCHIP_CPU_KERNEL(where) {
  if (AnychipStatus s = require_output_shape(call, "where"); s != ANYCHIP_OK) return s;
  const AnychipTensor* inputs[] = {&in(call, 0), &in(call, 1), &in(call, 2)};
  const Layout l = collapse(out(call, 0), inputs, 3);
  return dispatch_bytes(in(call, 1).dtype, [&]<typename T>() {
    T* o = data<T>(out(call, 0));
    const uint8_t* c = data<const uint8_t>(in(call, 0));
    const T *x = data<const T>(in(call, 1)), *y = data<const T>(in(call, 2));
    for_each_run(l, threads(call), [&](int64_t n, const int64_t* off, const int64_t* st) {
      for (int64_t i = 0; i < n; ++i) {
        o[off[0] + i * st[0]] = c[off[1] + i * st[1]] ? x[off[2] + i * st[2]] : y[off[3] + i * st[3]];
      }
    });
    return ANYCHIP_OK;
  });
}

ANYCHIP_CPU_KERNEL(cast) {
  if (AnychipStatus s = require_output_shape(call, "cast"); s != ANYCHIP_OK) return s;
  return dispatch<kAll | kInt8>(call, in(call, 0).dtype, "cast (input)", [&]<typename S>() {
    return dispatch<kAll | kInt8>(call, out(call, 0).dtype, "cast (output)", [&]<typename D>() {
      return map1<D, S>(call, [](S v) { return store<D>(load(v)); });
    });
  });
}

ANYCHIP_CPU_KERNEL(fill) {
  const double value = attr(call, ANYCHIP_ATTR_FILL_VALUE);
  const Layout l = collapse(out(call, 0), nullptr, 0);
  return dispatch<kAll>(call, out(call, 0).dtype, "fill", [&]<typename T>() {
    const T v = store<T>(value);
    T* o = data<T>(out(call, 0));
    for_each_run(l, threads(call), [&](int64_t n, const int64_t* off, const int64_t* st) {
      for (int64_t i = 0; i < n; ++i) o[off[0] + i * st[0]] = v;
    });
    return ANYCHIP_OK;
  });
}

ANYCHIP_CPU_KERNEL(copy) {
  if (AnychipStatus s = require_output_shape(call, "copy"); s != ANYCHIP_OK) return s;
  if (in(call, 0).dtype != out(call, 0).dtype) {
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "copy: out must have x's dtype (use cast to convert)");
  }
  return dispatch_bytes(in(call, 0).dtype, [&]<typename T>() {
    return map1<T, T>(call, [](T v) { return v; });
  });
}
