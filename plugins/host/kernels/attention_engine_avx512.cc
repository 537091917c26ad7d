// AVX-512 attention engine: fp32 FMA microkernels for every dtype (bf16 and fp16 are widened to
// fp32 as they are packed; bf16 probabilities are rounded to bf16 before the PV product).
#include "attention_simd.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")

namespace anychip::cpu::attn {
namespace {

using simd::dpad;
using simd::first_lanes;

int round4(int m) { return static_cast<int>(round_up(m, 4)); }

template <typename T>
void rows_f32(const void* const* rows, int m, int d, float* out) {
  const int dp = dpad(d);
  const int mp = static_cast<int>(round_up(m, 32));
  for (int r = 0; r < mp; ++r) {
    const T* src = r < m ? static_cast<const T*>(rows[r]) : nullptr;
    for (int c = 0; c < dp; c += 16) {
      const __m512 v = src != nullptr ? simd::load(src + c, first_lanes(d - c)) : _mm512_setzero_ps();
      _mm512_storeu_ps(out + r * dp + c, v);
    }
  }
}

template <typename T>
void transpose_f32(const void* x, int64_t ld, int n, int d, float* xt) {
  const T* src = static_cast<const T*>(x);
  for (int k0 = 0; k0 < kKeyTile; k0 += 16)
    for (int c0 = 0; c0 < d; c0 += 16) {
      __m512 r[16];
      const __mmask16 cols = first_lanes(d - c0);
      for (int i = 0; i < 16; ++i)
        r[i] = k0 + i < n ? simd::load(src + (k0 + i) * ld + c0, cols) : _mm512_setzero_ps();
      simd::transpose16(r);
      for (int i = 0; i < 16 && c0 + i < d; ++i) _mm512_storeu_ps(xt + (c0 + i) * kKeyTile + k0, r[i]);
    }
}

// Keys [n][d] as float rows [n][Dp]; float32 keys are used in place (*ldo = ld).
template <typename T>
const float* keys_f32(const void* x, int64_t ld, int n, int d, float* buf, int64_t* ldo) {
  if constexpr (std::is_same_v<T, float>) {
    *ldo = ld;
    return static_cast<const float*>(x);
  } else {
    const T* src = static_cast<const T*>(x);
    const int dp = dpad(d);
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < d; c += 16)
        _mm512_storeu_ps(buf + j * dp + c, simd::load(src + j * ld + c, first_lanes(d - c)));
    *ldo = dp;
    return buf;
  }
}

// The transposed keys, then the keys as rows [kKeyTile][Dp] (keys n.. zero).
template <typename T>
void pack_keys(const void* x, int64_t ld, int n, int d, void* kp) {
  float* out = static_cast<float*>(kp);
  const int dp = dpad(d);
  transpose_f32<T>(x, ld, n, d, out);
  float* rows = out + kKeyTile * dp;
  const T* src = static_cast<const T*>(x);
  for (int j = 0; j < kKeyTile; ++j)
    for (int c = 0; c < dp; c += 16)
      _mm512_storeu_ps(rows + j * dp + c, j < n ? simd::load(src + j * ld + c, first_lanes(d - c)) : _mm512_setzero_ps());
}

template <typename T>
float row_dot(const void* a, const void* b, int d) {
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  __m512 s = _mm512_setzero_ps();
  for (int c = 0; c < d; c += 16) {
    const __mmask16 k = first_lanes(d - c);
    s = _mm512_fmadd_ps(simd::load(x + c, k), simd::load(y + c, k), s);
  }
  return _mm512_reduce_add_ps(s);
}

void scores(const void* xp, const void* kp, int m, int d, int n, float c, float pad, float* t) {
  simd::gemm<false, 0>(round4(m), kKeyTile, static_cast<const float*>(xp), dpad(d), static_cast<const float*>(kp),
                       kKeyTile, d, t, kKeyTile, c);
  simd::pad_keys(t, m, n, pad);
}

bool apply_mask(const TileMask& mask, float* t) { return simd::apply_mask(mask, t); }

template <typename T>
void softmax(const float* t, int m, float* mx, float* l, float* alpha, void* p) {
  simd::softmax<std::is_same_v<T, bf16> ? 1 : 0>(t, m, mx, l, alpha, p);
}

void pv(const void* p, const void* v, int64_t ldv, int m, int n, int d, const float* alpha, float* acc) {
  simd::gemm<false, 1>(round4(m), d, static_cast<const float*>(p), kKeyTile, static_cast<const float*>(v), ldv, n,
                       acc, dpad(d), 1.0f, alpha);
}

template <typename T>
void pack_q(const void* const* rows, int m, int d, void* qp) {
  rows_f32<T>(rows, m, d, static_cast<float*>(qp));
}

template <typename T>
void pack_k(const void* k, int64_t ld, int n, int d, void* kp) {
  transpose_f32<T>(k, ld, n, d, static_cast<float*>(kp));
}

template <typename T>
const void* pack_v(const void* v, int64_t ld, int n, int d, void* vp, int64_t* ldv) {
  return keys_f32<T>(v, ld, n, d, static_cast<float*>(vp), ldv);
}

template <typename T>
void finalize(const float* acc, const float* mx, const float* l, int m, int d, void* const* o_rows,
              float* const* lse) {
  simd::finalize<T>(acc, mx, l, m, d, o_rows, lse);
}

void grad_scores(float* t, float* dp, int m, const float* lse, const float* delta) {
  for (int r = 0; r < m; ++r) {
    const __m512 lse2 = _mm512_set1_ps(lse[r] == -simd::kInf ? simd::kInf : lse[r] * simd::kLog2e);
    const __m512 dr = _mm512_set1_ps(delta[r]);
    for (int c = 0; c < kKeyTile; c += 16) {
      const __m512 p = simd::exp2(_mm512_sub_ps(_mm512_loadu_ps(t + r * kKeyTile + c), lse2));
      _mm512_storeu_ps(t + r * kKeyTile + c, p);
      _mm512_storeu_ps(dp + r * kKeyTile + c,
                       _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + r * kKeyTile + c), dr)));
    }
  }
}

void accum_keys(const float* a, const void* xp, int m, int d, float* acc) {
  simd::gemm<true, 2>(kKeyTile, d, a, kKeyTile, static_cast<const float*>(xp), dpad(d), m, acc, dpad(d));
}

void accum_rows(const float* a, const void* kp, int m, int n, int d, float* acc) {
  const float* rows = static_cast<const float*>(kp) + kKeyTile * dpad(d);
  simd::gemm<false, 2>(round4(m), d, a, kKeyTile, rows, dpad(d), n, acc, dpad(d));
}

template <typename T>
void store_rows(const float* acc, int n, int d, float s, void* out, int64_t ld) {
  const int dp = dpad(d);
  T* o = static_cast<T*>(out);
  const __m512 vs = _mm512_set1_ps(s);
  for (int j = 0; j < n; ++j)
    for (int c = 0; c < d; c += 16)
      simd::store(o + j * ld + c, _mm512_mul_ps(_mm512_loadu_ps(acc + j * dp + c), vs), first_lanes(d - c));
}

template <typename T>
const Engine* make() {
  static const Engine e = {
      nullptr,       nullptr,      pack_q<T>,  pack_k<T>,  pack_v<T>,     scores,        apply_mask,
      softmax<T>,    pv,           finalize<T>, combine_scalar<T>,
      pack_q<T>,     pack_keys<T>, row_dot<T>, grad_scores, accum_keys,   accum_rows,    store_rows<T>,
  };
  return &e;
}

}  // namespace

const Engine* avx512_engine(int32_t dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT32: return make<float>();
    case ANYCHIP_DTYPE_BFLOAT16: return make<bf16>();
    case ANYCHIP_DTYPE_FLOAT16: return make<fp16>();
    default: return nullptr;
  }
}

}  // namespace anychip::cpu::attn

#pragma GCC pop_options
