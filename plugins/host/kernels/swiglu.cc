// swiglu and swiglu_grad, elementwise over any shape:
//   y = silu(gate) * up with silu(g) = g * s, s = sigmoid(g) = 1 / (1 + e^-g);
//   dup = dy * silu(g), dgate = dy * up * s * (1 + g (1 - s)) = dy * up * (s + silu(g) (1 - s)).
// Each thread takes one contiguous range of elements; the kernels are memory bound, so large
// outputs are streamed (see kStreamBytes).
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "common.h"
#include "elementwise_avx2.h"
#include "elementwise_avx512.h"
#include "elementwise_common.h"

namespace anychip::cpu {
namespace {

template <typename T>
struct Args {
  const T* dy;  // grad only
  const T* gate;
  const T* up;
  T* out0;  // y, or dgate
  T* out1;  // dup (grad only)
};

inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

template <typename T>
void forward_scalar(const Args<T>& a, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float g = to_float(a.gate[i]);
    a.out0[i] = from_float<T>(g * sigmoid(g) * to_float(a.up[i]));
  }
}

template <typename T>
void backward_scalar(const Args<T>& a, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float g = to_float(a.gate[i]), u = to_float(a.up[i]), dy = to_float(a.dy[i]);
    const float s = sigmoid(g), silu = g * s;
    a.out0[i] = from_float<T>(dy * u * (s + silu * (1.0f - s)));
    a.out1[i] = from_float<T>(dy * silu);
  }
}

ANYCHIP_AVX2 inline __m256 sigmoid8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, avx2::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}

template <typename T, bool kStream>
ANYCHIP_AVX2 void forward_avx2(const Args<T>& a, int64_t i0, int64_t i1) {
  const T *gate = a.gate + i0, *up = a.up + i0;
  T* y = a.out0 + i0;
  avx2::for8<kStream>(y, i1 - i0, [&](int64_t c, auto io) ANYCHIP_AVX2 {
    const __m256 g = io.load(gate + c);
    io.store(y + c, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), io.load(up + c)));
  });
}

template <typename T, bool kStream>
ANYCHIP_AVX2 void backward_avx2(const Args<T>& a, int64_t i0, int64_t i1) {
  const T *dy = a.dy + i0, *gate = a.gate + i0, *up = a.up + i0;
  T *dgate = a.out0 + i0, *dup = a.out1 + i0;
  const __m256 one = _mm256_set1_ps(1.0f);
  avx2::for8<kStream>(dgate, i1 - i0, [&](int64_t c, auto io) ANYCHIP_AVX2 {
    const __m256 g = io.load(gate + c), d = io.load(dy + c);
    const __m256 s = sigmoid8(g), silu = _mm256_mul_ps(g, s);
    const __m256 ds = _mm256_fmadd_ps(silu, _mm256_sub_ps(one, s), s);  // d silu / dg
    io.store(dgate + c, _mm256_mul_ps(_mm256_mul_ps(d, io.load(up + c)), ds));
    io.store(dup + c, _mm256_mul_ps(d, silu));
  });
}

ANYCHIP_AVX512 inline __m512 sigmoid16(__m512 g) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, avx512::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

template <typename T, bool kStream>
ANYCHIP_AVX512 void forward_avx512(const Args<T>& a, int64_t i0, int64_t i1) {
  using namespace avx512;
  const T *gate = a.gate + i0, *up = a.up + i0;
  T* y = a.out0 + i0;
  for16<kStream>(y, i1 - i0, [&](int64_t c, __mmask16 m, auto store) ANYCHIP_AVX512 {
    const __m512 g = load16(gate + c, m);
    store(y + c, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid16(g)), load16(up + c, m)));
  });
}

template <typename T, bool kStream>
ANYCHIP_AVX512 void backward_avx512(const Args<T>& a, int64_t i0, int64_t i1) {
  using namespace avx512;
  const T *dy = a.dy + i0, *gate = a.gate + i0, *up = a.up + i0;
  T *dgate = a.out0 + i0, *dup = a.out1 + i0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for16<kStream>(dgate, i1 - i0, [&](int64_t c, __mmask16 m, auto store) ANYCHIP_AVX512 {
    const __m512 g = load16(gate + c, m), d = load16(dy + c, m);
    const __m512 s = sigmoid16(g), silu = _mm512_mul_ps(g, s);
    const __m512 ds = _mm512_fmadd_ps(silu, _mm512_sub_ps(one, s), s);  // d silu / dg
    store(dgate + c, _mm512_mul_ps(_mm512_mul_ps(d, load16(up + c, m)), ds));
    store(dup + c, _mm512_mul_ps(d, silu));
  });
}

template <typename T>
AnychipStatus run(const AnychipKernelCall* call, bool grad) {
  const int base = grad ? 1 : 0;
  const Args<T> a{grad ? data<const T>(in(call, 0)) : nullptr, data<const T>(in(call, base)),
                  data<const T>(in(call, base + 1)), data<T>(out(call, 0)), grad ? data<T>(out(call, 1)) : nullptr};
  const int64_t n = numel(in(call, base));
  const bool vector = isa() >= Isa::kAvx512;
  // Streaming needs the grad's two outputs equally aligned (one peel serves both).
  const bool stream = n * static_cast<int64_t>(sizeof(T)) >= kStreamBytes &&
                      (!grad || avx512::same_alignment(a.out0, a.out1));
#pragma omp parallel num_threads(threads(call)) if (n >= kParallelElements)
  {
    // Ranges in whole vectors, so only the last thread has a partial one.
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t vectors = (n + 15) / 16;
    const int64_t i0 = std::min(n, part(vectors, nt, t) * 16), i1 = std::min(n, part(vectors, nt, t + 1) * 16);
    if (isa() == Isa::kAvx2) {
      avx2::with_streaming(stream, [&](auto s) {
        constexpr bool kStream = decltype(s)::value;
        grad ? backward_avx2<T, kStream>(a, i0, i1) : forward_avx2<T, kStream>(a, i0, i1);
      });
    } else if (!vector) {
      grad ? backward_scalar(a, i0, i1) : forward_scalar(a, i0, i1);
    } else if (stream) {
      grad ? backward_avx512<T, true>(a, i0, i1) : forward_avx512<T, true>(a, i0, i1);
      avx512::stream_fence();
    } else {
      grad ? backward_avx512<T, false>(a, i0, i1) : forward_avx512<T, false>(a, i0, i1);
    }
  }
  return ANYCHIP_OK;
}

}  // namespace
}  // namespace anychip::cpu

using namespace anychip::cpu;

ANYCHIP_CPU_KERNEL(swiglu) {
  if (AnychipStatus s = require_contiguous(call, "swiglu"); s != ANYCHIP_OK) return s;
  return dispatch_float(call, in(call, 0).dtype, "swiglu", [&]<typename T>() { return run<T>(call, false); });
}

ANYCHIP_CPU_KERNEL(swiglu_grad) {
  if (AnychipStatus s = require_contiguous(call, "swiglu_grad"); s != ANYCHIP_OK) return s;
  return dispatch_float(call, in(call, 0).dtype, "swiglu_grad", [&]<typename T>() { return run<T>(call, true); });
}
