// The AVX2 attention engine: attention_engine_portable.h compiled for AVX2 + FMA, with the steps
// that take the time written for it (scores, softmax and pv; the backward's grad_scores,
// accum_keys and accum_rows). The portable loops left the compiler little to work with there:
// scores reloaded every key vector for each query row, pv loaded and stored its accumulator row
// for every key (it cannot know acc and v do not overlap), and softmax called libm's exp2f once
// per score. Here each key (or value) vector serves 4 (2) query rows from registers. GCC 12 keeps
// such accumulator arrays in registers only when the loops over them are unrolled (hence the
// pragmas; without them it stored all 8 to the stack on every key). Causal GQA fp32 [2048, 9/3
// heads, 64] on 2 Zen 3 vCPUs: 170 -> 50-60 ms (PyTorch's scaled_dot_product_attention: 45-68 ms
// in the same runs), 2026-12-01.
#pragma GCC target("avx2,fma,f16c")  // as ANYCHIP_AVX2, so that its helpers inline here

#include "attention_engine_portable.h"
#include "elementwise_avx2.h"

namespace anychip::cpu::attn {
namespace {

// 2^x for x <= 0 (scores less the row max, in log2 units; -inf gives 0): elementwise_avx2.h's e^x.
inline __m256 exp2_8(__m256 x) { return avx2::exp8(_mm256_mul_ps(x, _mm256_set1_ps(kLn2))); }

using avx2::lanes8;

// Rows r0 .. r0 + R - 1 (R <= 4) of the scores against 16 keys from j0: R x 2 accumulators, each
// key vector loaded once for all R rows.
template <int R>
inline void scores_block(const float* x, const float* yt, int dp, int d, int r0, int j0, int n, float c, float pad,
                         float* t) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int e = 0; e < d; ++e) {
    const __m256 y0 = _mm256_loadu_ps(yt + e * kKeyTile + j0), y1 = _mm256_loadu_ps(yt + e * kKeyTile + j0 + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xe = _mm256_broadcast_ss(x + (r0 + r) * dp + e);
      acc[r][0] = _mm256_fmadd_ps(xe, y0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xe, y1, acc[r][1]);
    }
  }
  const __m256 vc = _mm256_set1_ps(c), vpad = _mm256_set1_ps(pad);
  for (int h = 0; h < 2; ++h) {
    const __m256 valid = _mm256_castsi256_ps(lanes8(n - j0 - 8 * h));  // keys below n keep their score
    for (int r = 0; r < R; ++r)
      _mm256_storeu_ps(t + (r0 + r) * kKeyTile + j0 + 8 * h,
                       _mm256_blendv_ps(vpad, _mm256_mul_ps(vc, acc[r][h]), valid));
  }
}

void scores_avx2(const void* xp, const void* kp, int m, int d, int n, float c, float pad, float* t) {
  const float* x = static_cast<const float*>(xp);
  const float* yt = static_cast<const float*>(kp);
  const int dp = dpad(d);
  for (int j0 = 0; j0 < kKeyTile; j0 += 16) {
    int r = 0;
    for (; r + 4 <= m; r += 4) scores_block<4>(x, yt, dp, d, r, j0, n, c, pad, t);
    switch (m - r) {
      case 3: scores_block<3>(x, yt, dp, d, r, j0, n, c, pad, t); break;
      case 2: scores_block<2>(x, yt, dp, d, r, j0, n, c, pad, t); break;
      case 1: scores_block<1>(x, yt, dp, d, r, j0, n, c, pad, t); break;
      default: break;
    }
  }
}

template <typename T>
void softmax_avx2(const float* t, int m, float* mx, float* l, float* alpha, void* pv) {
  float* p = static_cast<float*>(pv);
  for (int r = 0; r < m; ++r) {
    const float* tr = t + r * kKeyTile;
    __m256 vmax = _mm256_loadu_ps(tr);
    for (int j = 8; j < kKeyTile; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(tr + j));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float tmax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const float mnew = std::max(mx[r], tmax);
    const float muse = mnew == -kInf ? 0.0f : mnew;
    const float a = std::exp2(mx[r] - muse);
    const __m256 vm = _mm256_set1_ps(muse);
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < kKeyTile; j += 8) {
      const __m256 e = exp2_8(_mm256_sub_ps(_mm256_loadu_ps(tr + j), vm));
      sum = _mm256_add_ps(sum, e);
      // bf16 rounds the probabilities as operand_p<bf16> does; the other dtypes keep them
      const __m256 operand = std::is_same_v<T, bf16> ? avx2::round8(static_cast<bf16*>(nullptr), e) : e;
      _mm256_storeu_ps(p + r * kKeyTile + j, operand);
    }
    l[r] = l[r] * a + avx2::sum8(sum);
    mx[r] = mnew;
    alpha[r] = a;
  }
}

// The products that add rows of a matrix to accumulator rows, pv's shape: for output rows
// o = o0 .. o0 + R - 1 (R <= 2), acc[o] = acc[o] * alpha[o] (kScale; else no scaling) +
// sum_{i < n} coef[o * SO + i * SI] v_i over columns [c0, c0 + 8 V), v_i at v + i * ldv. The
// accumulators stay in registers over all n rows of v. kFull: every column is below d; else
// lanes past d are masked, so that no load reaches past a row (float32 values are read in
// place). Strides and scaling are compile-time: as run-time values they cost pv 5-10%.
template <int SO, int SI, bool kScale, int R, int V, bool kFull>
inline void axpy_block(const float* coef, const float* v, int64_t ldv, int o0, int n, int c0, int d,
                       const float* alpha, float* acc, int dp) {
  __m256i mask[V];
  __m256 a[R][V];
#pragma GCC unroll 8
  for (int u = 0; u < V; ++u) mask[u] = kFull ? _mm256_set1_epi32(-1) : lanes8(d - c0 - 8 * u);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 al = kScale ? _mm256_set1_ps(alpha[o0 + r]) : _mm256_set1_ps(1.0f);
#pragma GCC unroll 8
    for (int u = 0; u < V; ++u) {
      const float* x = acc + (o0 + r) * dp + c0 + 8 * u;
      a[r][u] = kFull ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, mask[u]);
      if (kScale) a[r][u] = _mm256_mul_ps(a[r][u], al);
    }
  }
  for (int i = 0; i < n; ++i) {
    __m256 vv[V];
#pragma GCC unroll 8
    for (int u = 0; u < V; ++u) {
      const float* x = v + i * ldv + c0 + 8 * u;
      vv[u] = kFull ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, mask[u]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 c = _mm256_broadcast_ss(coef + (o0 + r) * SO + i * SI);
#pragma GCC unroll 8
      for (int u = 0; u < V; ++u) a[r][u] = _mm256_fmadd_ps(c, vv[u], a[r][u]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int u = 0; u < V; ++u) {
      float* out = acc + (o0 + r) * dp + c0 + 8 * u;
      if (kFull) {
        _mm256_storeu_ps(out, a[r][u]);
      } else {
        _mm256_maskstore_ps(out, mask[u], a[r][u]);
      }
    }
}

template <int SO, int SI, bool kScale, bool kFull>
void axpy_columns(const float* coef, const float* v, int64_t ldv, int rows, int n, int c0, int d, const float* alpha,
                  float* acc, int dp) {
  int o = 0;
  for (; o + 2 <= rows; o += 2) axpy_block<SO, SI, kScale, 2, 4, kFull>(coef, v, ldv, o, n, c0, d, alpha, acc, dp);
  if (o < rows) axpy_block<SO, SI, kScale, 1, 4, kFull>(coef, v, ldv, o, n, c0, d, alpha, acc, dp);
}

// axpy_block over output rows [0, rows) and all d columns, 32 at a time.
template <int SO, int SI, bool kScale>
void axpy(const float* coef, const float* v, int64_t ldv, int rows, int n, int d, const float* alpha, float* acc) {
  const int dp = dpad(d);
  for (int c0 = 0; c0 < d; c0 += 32) {
    if (c0 + 32 <= d) {
      axpy_columns<SO, SI, kScale, true>(coef, v, ldv, rows, n, c0, d, alpha, acc, dp);
    } else {
      axpy_columns<SO, SI, kScale, false>(coef, v, ldv, rows, n, c0, d, alpha, acc, dp);
    }
  }
}

void pv_avx2(const void* pp, const void* vv, int64_t ldv, int m, int n, int d, const float* alpha, float* acc) {
  axpy<kKeyTile, 1, true>(static_cast<const float*>(pp), static_cast<const float*>(vv), ldv, m, n, d, alpha, acc);
}

// ---- backward

void grad_scores_avx2(float* t, float* dp, int m, const float* lse, const float* delta) {
  for (int r = 0; r < m; ++r) {
    const __m256 lse2 = _mm256_set1_ps(lse[r] == -kInf ? kInf : lse[r] * kLog2e);
    const __m256 dl = _mm256_set1_ps(delta[r]);
    for (int j = 0; j < kKeyTile; j += 8) {
      float* tj = t + r * kKeyTile + j;
      float* dj = dp + r * kKeyTile + j;
      const __m256 p = exp2_8(_mm256_sub_ps(_mm256_loadu_ps(tj), lse2));
      _mm256_storeu_ps(tj, p);
      _mm256_storeu_ps(dj, _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dj), dl)));
    }
  }
}

void accum_keys_avx2(const float* a, const void* xp, int m, int d, float* acc) {
  axpy<1, kKeyTile, false>(a, static_cast<const float*>(xp), dpad(d), kKeyTile, m, d, nullptr, acc);
}

void accum_rows_avx2(const float* a, const void* kp, int m, int n, int d, float* acc) {
  const float* y = static_cast<const float*>(kp) + kKeyTile * dpad(d);
  axpy<kKeyTile, 1, false>(a, y, dpad(d), m, n, d, nullptr, acc);
}

template <typename T>
const Engine* make_avx2() {
  static const Engine e = [] {
    Engine x = *make<T>();
    x.scores = scores_avx2;
    x.softmax = softmax_avx2<T>;
    x.pv = pv_avx2;
    x.grad_scores = grad_scores_avx2;
    x.accum_keys = accum_keys_avx2;
    x.accum_rows = accum_rows_avx2;
    return x;
  }();
  return &e;
}

}  // namespace

const Engine* avx2_engine(int32_t dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT32: return make_avx2<float>();
    case ANYCHIP_DTYPE_BFLOAT16: return make_avx2<bf16>();
    case ANYCHIP_DTYPE_FLOAT16: return make_avx2<fp16>();
    default: return nullptr;
  }
}

}  // namespace anychip::cpu::attn
