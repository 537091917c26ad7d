// The AVX2 attention engine: attention_engine_portable.h compiled for AVX2 + FMA, with the steps
// that take the time written for it (key packing, scores, softmax and pv; the backward's
// grad_scores, accum_keys and accum_rows). The portable loops left the compiler little to work
// with there: scores reloaded every key vector for each query row, pv loaded and stored its
// accumulator row for every key (it cannot know acc and v do not overlap), softmax called libm's
// exp2f once per score, and keys were transposed one element at a time. Here each key vector
// serves 4 query rows and each value vector 6 from registers. GCC 12 keeps such accumulator
// arrays in registers only when the loops over them are unrolled (hence the pragmas; without
// them it stored them all to the stack on every key). Causal GQA fp32 [2048, 9/3 heads, 64] on
// 2 Zen 3 vCPUs: 170 -> 50-60 ms with the register blocking, then 54-65 -> 36-47 ms with the
// 8x8 key transposes, the short exp2, eight softmax rows at a time and 6-row pv blocks
// (PyTorch's scaled_dot_product_attention: 52-60 ms on the same machine), 2026-12-01.
#pragma GCC target("avx2,fma,f16c")  // as ANYCHIP_AVX2, so that its helpers inline here

#include "attention_engine_portable.h"
#include "elementwise_avx2.h"

namespace anychip::cpu::attn {
namespace {

// 2^x for x <= 0 (scores less the row max, in log2 units), relative error below 2e-7: 2^k as
// exponent bits times a degree-6 polynomial for 2^f, f = x - k in [-0.5, 0.5] (coefficients fitted
// to the relative error at Chebyshev nodes, 2e-9 in exact arithmetic). Below 2^-126.5 it gives 0,
// as -inf must (k = -127 makes the scale 0); NaN stays NaN. Half the instructions of
// elementwise_avx2.h's general e^x, which softmax spent a sixth of the tile's time in.
inline __m256 exp2_8(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);  // NaN: max returns x
  const __m256i ki = _mm256_cvtps_epi32(x);      // round to nearest
  const __m256 f = _mm256_sub_ps(x, _mm256_cvtepi32_ps(ki));
  __m256 p = _mm256_set1_ps(1.5370705e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3399848e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6183736e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503290e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022648e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ki, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(p, scale);
}

using avx2::lanes8;

// In-register transpose of an 8x8 block of 32-bit lanes.
inline void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}

// Columns [c, c + 8) of a row as float32, those past d 0 (nothing past the row is read).
template <typename T>
inline __m256 load_columns(const T* row, int c, int d) {
  if (c + 8 <= d) return avx2::load8(row + c);
  return c < d ? avx2::load_first(row + c, d - c) : _mm256_setzero_ps();
}

// The key pack: keys [n][d] transposed to [d][kKeyTile] by 8x8 blocks (keys n.. zero). The
// portable element-by-element copy took a tenth of a causal tile's time.
template <typename T>
void pack_k_avx2(const void* x, int64_t ld, int n, int d, void* kp) {
  const T* src = static_cast<const T*>(x);
  float* xt = static_cast<float*>(kp);
  for (int k0 = 0; k0 < kKeyTile; k0 += 8)
    for (int c0 = 0; c0 < d; c0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = k0 + i < n ? load_columns(src + (k0 + i) * ld, c0, d) : _mm256_setzero_ps();
      transpose8(r);
      for (int i = 0; i < 8 && c0 + i < d; ++i) _mm256_storeu_ps(xt + (c0 + i) * kKeyTile + k0, r[i]);
    }
}

// The backward's key pack: pack_k's transposed keys, then the keys as rows [kKeyTile][Dp].
template <typename T>
void pack_keys_avx2(const void* x, int64_t ld, int n, int d, void* kp) {
  pack_k_avx2<T>(x, ld, n, d, kp);
  const int dp = dpad(d);
  float* rows = static_cast<float*>(kp) + kKeyTile * dp;
  const T* src = static_cast<const T*>(x);
  for (int j = 0; j < kKeyTile; ++j)
    for (int c = 0; c < dp; c += 8)
      _mm256_storeu_ps(rows + j * dp + c, j < n ? load_columns(src + j * ld, c, d) : _mm256_setzero_ps());
}

// The q pack: M rows [Dp] as float32 (rows M..roundup(M, 32)-1 and columns d.. zero).
template <typename T>
void pack_q_avx2(const void* const* rows, int m, int d, void* qp) {
  float* out = static_cast<float*>(qp);
  const int dp = dpad(d);
  for (int r = 0; r < round_up(m, 32); ++r)
    for (int c = 0; c < dp; c += 8)
      _mm256_storeu_ps(out + r * dp + c, r < m ? load_columns(static_cast<const T*>(rows[r]), c, d) : _mm256_setzero_ps());
}

// Values for pv: float32 ones in place, the others widened to float32 rows [n][Dp].
template <typename T>
const void* pack_v_avx2(const void* v, int64_t ld, int n, int d, void* vp, int64_t* ldv) {
  if constexpr (std::is_same_v<T, float>) {
    *ldv = ld;
    return v;
  } else {
    const T* src = static_cast<const T*>(v);
    float* out = static_cast<float*>(vp);
    const int dp = dpad(d);
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < d; c += 8) _mm256_storeu_ps(out + j * dp + c, load_columns(src + j * ld, c, d));
    *ldv = dp;
    return out;
  }
}

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

// Rows go eight at a time: their maxima, rescale factors and sums as lanes of one vector, so
// that the per-row scalar work (a libm exp2, two horizontal reductions) does not rival the 64
// exponentials of the row.
template <typename T>
void softmax_avx2(const float* t, int m, float* mx, float* l, float* alpha, void* pv) {
  float* p = static_cast<float*>(pv);
  for (int r0 = 0; r0 < m; r0 += 8) {
    const int rows = std::min(8, m - r0);
    alignas(32) float top[8], use[8], sum[8] = {};
    for (int r = 0; r < 8; ++r) {
      if (r >= rows) {
        top[r] = -kInf;
        continue;
      }
      const float* tr = t + (r0 + r) * kKeyTile;
      __m256 vmax = _mm256_loadu_ps(tr);
      for (int j = 8; j < kKeyTile; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(tr + j));
      top[r] = avx2::max8(vmax);
    }
    const __m256i live = lanes8(rows);  // the lanes of rows < m: only they are read or written
    const __m256 old = _mm256_maskload_ps(mx + r0, live);
    const __m256 mnew = _mm256_max_ps(old, _mm256_load_ps(top));
    const __m256 muse = _mm256_andnot_ps(_mm256_cmp_ps(mnew, _mm256_set1_ps(-kInf), _CMP_EQ_OQ), mnew);
    _mm256_store_ps(use, muse);
    for (int r = 0; r < rows; ++r) {
      const float* tr = t + (r0 + r) * kKeyTile;
      float* pr = p + (r0 + r) * kKeyTile;
      const __m256 vm = _mm256_set1_ps(use[r]);
      __m256 s = _mm256_setzero_ps();
      for (int j = 0; j < kKeyTile; j += 8) {
        const __m256 e = exp2_8(_mm256_sub_ps(_mm256_loadu_ps(tr + j), vm));
        s = _mm256_add_ps(s, e);
        // bf16 rounds the probabilities as operand_p<bf16> does; the other dtypes keep them
        _mm256_storeu_ps(pr + j, std::is_same_v<T, bf16> ? avx2::round8(static_cast<bf16*>(nullptr), e) : e);
      }
      sum[r] = avx2::sum8(s);
    }
    const __m256 a = exp2_8(_mm256_sub_ps(old, muse));  // -inf (no visible key yet) gives 0
    _mm256_maskstore_ps(l + r0, live, _mm256_fmadd_ps(_mm256_maskload_ps(l + r0, live), a, _mm256_load_ps(sum)));
    _mm256_maskstore_ps(mx + r0, live, mnew);
    _mm256_maskstore_ps(alpha + r0, live, a);
  }
}

// The products that add rows of a matrix to accumulator rows, pv's shape: for output rows
// o = o0 .. o0 + R - 1 (R <= 6), acc[o] = acc[o] * alpha[o] (kScale; else no scaling) +
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

// Six output rows by 16 columns: 12 accumulators, so the two FMA pipes never wait on one
// another's latency (2 rows by 32 columns, 8 accumulators, ran pv 25% slower on Zen 3).
constexpr int kAxpyRows = 6, kAxpyVectors = 2;

template <int SO, int SI, bool kScale, bool kFull>
void axpy_columns(const float* coef, const float* v, int64_t ldv, int rows, int n, int c0, int d, const float* alpha,
                  float* acc, int dp) {
  constexpr int V = kAxpyVectors;
  int o = 0;
  for (; o + kAxpyRows <= rows; o += kAxpyRows)
    axpy_block<SO, SI, kScale, kAxpyRows, V, kFull>(coef, v, ldv, o, n, c0, d, alpha, acc, dp);
  switch (rows - o) {
    case 5: axpy_block<SO, SI, kScale, 5, V, kFull>(coef, v, ldv, o, n, c0, d, alpha, acc, dp); break;
    case 4: axpy_block<SO, SI, kScale, 4, V, kFull>(coef, v, ldv, o, n, c0, d, alpha, acc, dp); break;
    case 3: axpy_block<SO, SI, kScale, 3, V, kFull>(coef, v, ldv, o, n, c0, d, alpha, acc, dp); break;
    case 2: axpy_block<SO, SI, kScale, 2, V, kFull>(coef, v, ldv, o, n, c0, d, alpha, acc, dp); break;
    case 1: axpy_block<SO, SI, kScale, 1, V, kFull>(coef, v, ldv, o, n, c0, d, alpha, acc, dp); break;
    default: break;
  }
}

// axpy_block over output rows [0, rows) and all d columns, 16 at a time.
template <int SO, int SI, bool kScale>
void axpy(const float* coef, const float* v, int64_t ldv, int rows, int n, int d, const float* alpha, float* acc) {
  const int dp = dpad(d);
  constexpr int W = 8 * kAxpyVectors;
  for (int c0 = 0; c0 < d; c0 += W) {
    if (c0 + W <= d) {
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
    x.pack_q = pack_q_avx2<T>;
    x.pack_k = pack_k_avx2<T>;
    x.pack_v = pack_v_avx2<T>;
    x.pack_rows = pack_q_avx2<T>;
    x.pack_keys = pack_keys_avx2<T>;
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
