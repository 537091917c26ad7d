// The portable attention engine (fp32 compute for every dtype): plain C++ whose inner loops run
// over independent keys or columns, so that the compiler vectorises them. Included by
// attention_engine_scalar.cc (the scalar engine) and attention_engine_avx2.cc (the same code
// compiled for AVX2 + FMA); each gets its own copy, in an anonymous namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "attention_engine.h"

namespace anychip::cpu::attn {
namespace {


constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

int dpad(int d) { return static_cast<int>(round_up(d, 32)); }

// bfloat16 attention multiplies the probabilities in bf16 precision (as AMX does), so every ISA
// rounds them the same way.
template <typename T>
float operand_p(float p) {
  return p;
}
template <>
float operand_p<bf16>(float p) {
  return to_float(from_float<bf16>(p));
}

template <typename T>
void rows_f32(const void* const* rows, int m, int d, float* out) {
  const int dp = dpad(d);
  const int mp = static_cast<int>(round_up(m, 32));
  for (int r = 0; r < mp; ++r) {
    float* dst = out + static_cast<int64_t>(r) * dp;
    const T* src = r < m ? static_cast<const T*>(rows[r]) : nullptr;
    for (int x = 0; x < dp; ++x) dst[x] = (src != nullptr && x < d) ? to_float(src[x]) : 0.0f;
  }
}

template <typename T>
void transpose_f32(const void* x, int64_t ld, int n, int d, float* xt) {
  const T* src = static_cast<const T*>(x);
  for (int c = 0; c < d; ++c)
    for (int j = 0; j < kKeyTile; ++j) xt[c * kKeyTile + j] = j < n ? to_float(src[j * ld + c]) : 0.0f;
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
      for (int c = 0; c < d; ++c) buf[j * dp + c] = to_float(src[j * ld + c]);
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
    for (int c = 0; c < dp; ++c) rows[j * dp + c] = j < n && c < d ? to_float(src[j * ld + c]) : 0.0f;
}

template <typename T>
float row_dot(const void* a, const void* b, int d) {
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  float s = 0.0f;
  for (int c = 0; c < d; ++c) s += to_float(x[c]) * to_float(y[c]);
  return s;
}

// Each score sums over e in order; the keys side by side (a loop the compiler vectorises).
void scores(const void* xp, const void* kp, int m, int d, int n, float c, float pad, float* t) {
  const float* x = static_cast<const float*>(xp);
  const float* yt = static_cast<const float*>(kp);
  const int dp = dpad(d);
  for (int r = 0; r < m; ++r) {
    float s[kKeyTile] = {};
    for (int e = 0; e < d; ++e) {
      const float xe = x[r * dp + e];
      for (int j = 0; j < kKeyTile; ++j) s[j] += xe * yt[e * kKeyTile + j];
    }
    float* tr = t + r * kKeyTile;
    for (int j = 0; j < kKeyTile; ++j) tr[j] = j < n ? c * s[j] : pad;
  }
}

bool flash_hidden(int rule, const int32_t* const* col, int64_t i) {
  switch (rule) {
    case kFlashLower: return i >= *col[0];
    case kFlashLowerBand: return *col[0] <= i && i < *col[1];
    case kFlashLowerUpper: return i >= *col[0] || i < *col[1];
    case kFlashTwoBands: return (*col[0] <= i && i < *col[1]) || (*col[2] <= i && i < *col[3]);
    default: return false;
  }
}

bool apply_mask(const TileMask& tm, float* t) {
  bool any = false;
  const int rows = tm.heads * tm.positions;
  for (int r = 0; r < rows; ++r) {
    const int h = r / tm.positions;
    const int64_t i = tm.i0 + r % tm.positions;
    float* tr = t + r * kKeyTile;
    for (int j = 0; j < tm.n; ++j) {
      const int64_t key = tm.j0 + j;
      bool visible = !tm.causal || key <= i + tm.causal_offset;
      if (visible && tm.has_dense) visible = tm.dense[h][i * tm.dense_ld + key] != 0;
      if (visible && tm.rule != kFlashNone) {
        const int32_t* col[4] = {};
        const int columns = tm.rule == kFlashLower ? 1 : tm.rule == kFlashTwoBands ? 4 : 2;
        for (int e = 0; e < columns; ++e) col[e] = tm.bounds[h] + e * tm.bounds_ld + key;
        visible = !flash_hidden(tm.rule, col, i);
      }
      if (visible) {
        any = true;
      } else {
        tr[j] = -kInf;
      }
    }
  }
  return any;
}

template <typename T>
void softmax(const float* t, int m, float* mx, float* l, float* alpha, void* pv) {
  float* p = static_cast<float*>(pv);
  for (int r = 0; r < m; ++r) {
    const float* tr = t + r * kKeyTile;
    float tmax = -kInf;
    for (int j = 0; j < kKeyTile; ++j) tmax = std::max(tmax, tr[j]);
    const float mnew = std::max(mx[r], tmax);
    const float muse = mnew == -kInf ? 0.0f : mnew;
    const float a = std::exp2(mx[r] - muse);
    float sum = 0.0f;
    for (int j = 0; j < kKeyTile; ++j) {
      const float e = std::exp2(tr[j] - muse);
      sum += e;
      p[r * kKeyTile + j] = operand_p<T>(e);
    }
    l[r] = l[r] * a + sum;
    mx[r] = mnew;
    alpha[r] = a;
  }
}

void pv(const void* pp, const void* vv, int64_t ldv, int m, int n, int d, const float* alpha, float* acc) {
  const float* p = static_cast<const float*>(pp);
  const float* v = static_cast<const float*>(vv);
  const int dp = dpad(d);
  for (int r = 0; r < m; ++r) {
    float* ar = acc + r * dp;
    for (int c = 0; c < d; ++c) ar[c] *= alpha[r];
    for (int j = 0; j < n; ++j) {
      const float pj = p[r * kKeyTile + j];
      for (int c = 0; c < d; ++c) ar[c] += pj * v[j * ldv + c];
    }
  }
}

template <typename T>
const void* pack_v(const void* v, int64_t ld, int n, int d, void* vp, int64_t* ldv) {
  return keys_f32<T>(v, ld, n, d, static_cast<float*>(vp), ldv);
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
void finalize(const float* acc, const float* mx, const float* l, int m, int d, void* const* o_rows,
              float* const* lse) {
  const int dp = dpad(d);
  for (int r = 0; r < m; ++r) {
    T* o = static_cast<T*>(o_rows[r]);
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int c = 0; c < d; ++c) o[c] = from_float<T>(acc[r * dp + c] * inv);
    *lse[r] = l[r] > 0.0f ? (mx[r] + std::log2(l[r])) * kLn2 : -kInf;
  }
}

void grad_scores(float* t, float* dp, int m, const float* lse, const float* delta) {
  for (int r = 0; r < m; ++r) {
    const float lse2 = lse[r] == -kInf ? kInf : lse[r] * kLog2e;
    for (int j = 0; j < kKeyTile; ++j) {
      const float p = std::exp2(t[r * kKeyTile + j] - lse2);
      t[r * kKeyTile + j] = p;
      dp[r * kKeyTile + j] = p * (dp[r * kKeyTile + j] - delta[r]);
    }
  }
}

void accum_keys(const float* a, const void* xp, int m, int d, float* acc) {
  const float* x = static_cast<const float*>(xp);
  const int dp = dpad(d);
  for (int j = 0; j < kKeyTile; ++j)
    for (int r = 0; r < m; ++r) {
      const float w = a[r * kKeyTile + j];
      for (int c = 0; c < d; ++c) acc[j * dp + c] += w * x[r * dp + c];
    }
}

void accum_rows(const float* a, const void* kp, int m, int n, int d, float* acc) {
  const int dp = dpad(d);
  const float* y = static_cast<const float*>(kp) + kKeyTile * dp;
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < n; ++j) {
      const float w = a[r * kKeyTile + j];
      for (int c = 0; c < d; ++c) acc[r * dp + c] += w * y[j * dp + c];
    }
}

template <typename T>
void store_rows(const float* acc, int n, int d, float s, void* out, int64_t ld) {
  const int dp = dpad(d);
  T* o = static_cast<T*>(out);
  for (int j = 0; j < n; ++j)
    for (int c = 0; c < d; ++c) o[j * ld + c] = from_float<T>(acc[j * dp + c] * s);
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
}  // namespace anychip::cpu::attn
