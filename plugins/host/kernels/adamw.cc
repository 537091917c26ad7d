// adamw_step: one AdamW update of a list of parameters in a single launch, in place.
//   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
// in float32 whatever p's dtype (a bfloat16 or float16 p is rounded once, at the end).
// Parameters range from a bias of a few elements to embedding tables, so the threads split the
// concatenation of all of them evenly rather than taking one parameter each.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"
#include "elementwise_avx512.h"
#include "elementwise_common.h"

namespace anychip::cpu {
namespace {

// The bias corrections are applied as multiplications by 1 / (1 - beta^step) (computed in
// double): vector divisions are what bounds this kernel, and this moves the result by an ulp.
struct Hyper {
  float lr, lr_wd, b1, one_minus_b1, b2, one_minus_b2, inv_bias1, inv_bias2, eps;
};

template <typename T>
struct Param {
  const T* g;
  T* p;
  float* m;
  float* v;
};

template <typename T>
void update_scalar(const Param<T>& t, int64_t i0, int64_t i1, const Hyper& h) {
  for (int64_t i = i0; i < i1; ++i) {
    const float g = to_float(t.g[i]);
    float p = to_float(t.p[i]);
    p -= h.lr_wd * p;
    const float m = h.b1 * t.m[i] + h.one_minus_b1 * g;
    const float v = h.b2 * t.v[i] + h.one_minus_b2 * (g * g);
    p -= h.lr * (m * h.inv_bias1) / (std::sqrt(v * h.inv_bias2) + h.eps);
    t.m[i] = m;
    t.v[i] = v;
    t.p[i] = from_float<T>(p);
  }
}

template <typename T>
ANYCHIP_AVX512 void update_avx512(const Param<T>& t, int64_t i0, int64_t i1, const Hyper& h) {
  using namespace avx512;
  const __m512 lr = _mm512_set1_ps(h.lr), lr_wd = _mm512_set1_ps(h.lr_wd), b1 = _mm512_set1_ps(h.b1);
  const __m512 c1 = _mm512_set1_ps(h.one_minus_b1), b2 = _mm512_set1_ps(h.b2), c2 = _mm512_set1_ps(h.one_minus_b2);
  const __m512 inv_bias1 = _mm512_set1_ps(h.inv_bias1), inv_bias2 = _mm512_set1_ps(h.inv_bias2);
  const __m512 eps = _mm512_set1_ps(h.eps);
  const T* grad = t.g + i0;
  T* param = t.p + i0;
  float *m1 = t.m + i0, *v1 = t.v + i0;
  for16<false>(param, i1 - i0, [&](int64_t i, __mmask16 k, auto store) ANYCHIP_AVX512 {
    const __m512 g = load16(grad + i, k);
    const __m512 p0 = load16(param + i, k);
    __m512 p = _mm512_fnmadd_ps(lr_wd, p0, p0);
    const __m512 m = _mm512_fmadd_ps(b1, _mm512_maskz_loadu_ps(k, m1 + i), _mm512_mul_ps(c1, g));
    const __m512 v = _mm512_fmadd_ps(b2, _mm512_maskz_loadu_ps(k, v1 + i), _mm512_mul_ps(c2, _mm512_mul_ps(g, g)));
    const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(v, inv_bias2)), eps);
    p = _mm512_fnmadd_ps(lr, _mm512_div_ps(_mm512_mul_ps(m, inv_bias1), denom), p);
    store(m1 + i, m);
    store(v1 + i, v);
    store(param + i, p);
  });
}

template <typename T>
AnychipStatus step(const AnychipKernelCall* call) {
  const int n = call->num_inputs;
  std::vector<Param<T>> params(n);
  std::vector<int64_t> start(n + 1, 0);  // of each parameter in the concatenation
  for (int j = 0; j < n; ++j) {
    if (out(call, n + j).dtype != ANYCHIP_DTYPE_FLOAT32 || out(call, 2 * n + j).dtype != ANYCHIP_DTYPE_FLOAT32) {
      return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "adamw_step: moments of parameter %d are not float32", j);
    }
    if (out(call, j).dtype != in(call, 0).dtype || in(call, j).dtype != in(call, 0).dtype) {
      return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "adamw_step: parameter %d or its grad differs in dtype from grad 0",
                  j);
    }
    params[j] = {data<const T>(in(call, j)), data<T>(out(call, j)), data<float>(out(call, n + j)),
                 data<float>(out(call, 2 * n + j))};
    start[j + 1] = start[j] + numel(in(call, j));
  }
  const double lr = attr(call, ANYCHIP_ATTR_ADAMW_STEP_LR), beta1 = attr(call, ANYCHIP_ATTR_ADAMW_STEP_BETA1);
  const double beta2 = attr(call, ANYCHIP_ATTR_ADAMW_STEP_BETA2), step = attr(call, ANYCHIP_ATTR_ADAMW_STEP_STEP);
  const Hyper h{static_cast<float>(lr), static_cast<float>(lr * attr(call, ANYCHIP_ATTR_ADAMW_STEP_WEIGHT_DECAY)), static_cast<float>(beta1),
                static_cast<float>(1.0 - beta1), static_cast<float>(beta2), static_cast<float>(1.0 - beta2),
                static_cast<float>(1.0 / (1.0 - std::pow(beta1, step))),
                static_cast<float>(1.0 / (1.0 - std::pow(beta2, step))),
                static_cast<float>(attr(call, ANYCHIP_ATTR_ADAMW_STEP_EPS))};
  const int64_t total = start[n];
  const bool vector = isa() >= Isa::kAvx512;
#pragma omp parallel num_threads(threads(call)) if (total >= kParallelElements)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t vectors = (total + 15) / 16;
    const int64_t i0 = std::min(total, part(vectors, nt, t) * 16), i1 = std::min(total, part(vectors, nt, t + 1) * 16);
    // The parameters overlapping [i0, i1), each over its own part of the range.
    int j = static_cast<int>(std::upper_bound(start.begin(), start.end(), i0) - start.begin()) - 1;
    for (; j < n && start[j] < i1; ++j) {
      const int64_t lo = std::max(i0, start[j]) - start[j], hi = std::min(i1, start[j + 1]) - start[j];
      if (lo >= hi) continue;
      if (vector) {
        update_avx512(params[j], lo, hi, h);
      } else {
        update_scalar(params[j], lo, hi, h);
      }
    }
  }
  return ANYCHIP_OK;
}

}  // namespace
}  // namespace anychip::cpu

using namespace anychip::cpu;

ANYCHIP_CPU_KERNEL(adamw_step) {
  if (call->num_outputs != 3 * call->num_inputs) {
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "adamw_step: %d grads need %d outputs (params, m's, v's), got %d",
                call->num_inputs, 3 * call->num_inputs, call->num_outputs);
  }
  if (call->num_inputs == 0) return ANYCHIP_OK;
  if (AnychipStatus s = require_contiguous(call, "adamw_step"); s != ANYCHIP_OK) return s;
  return dispatch_float(call, in(call, 0).dtype, "adamw_step", [&]<typename T>() { return step<T>(call); });
}
