// rms_norm and rms_norm_grad over the last dim: y = h * inv_rms * weight, where h is x or, with
// a residual, x + residual (rounded to the storage dtype, as it is stored and later fed back).
//
// Rows are independent and small (a 4096-wide float32 row is 16 KB), so each thread takes a
// contiguous block of rows and makes two passes over each row: the first brings it in from
// memory and reduces, the second reads it back from L1/L2 and writes the result. DRAM traffic
// is then one read of every input and one write of every output; large outputs go out with
// non-temporal stores so that the lines they overwrite are not read first.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "common.h"
#include "elementwise_common.h"
#include "elementwise_avx2.h"
#include "elementwise_avx512.h"

namespace anychip::cpu {
namespace {

// dweight is reduced over this many fixed row blocks (fewer when there are fewer rows), so the
// sum's order, and with it the result, is the same whatever the thread count.
constexpr int64_t kGradBlocks = 64;
constexpr int64_t kColumnChunk = 256;

// The weight as float32: the float32 tensor itself, or a converted copy in `buffer`.
template <typename T>
const float* weight_f32(const T* w, int64_t n, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return w;
  } else {
    buffer.resize(n);
    for (int64_t i = 0; i < n; ++i) buffer[i] = to_float(w[i]);
    return buffer.data();
  }
}

template <typename T>
struct Forward {
  const T* x;
  const T* residual;  // null without a residual
  const float* w;
  T* y;
  float* inv_rms;
  T* h;  // null without a residual
  int64_t C;
  float eps;
};

template <typename T>
struct Backward {
  const T* dy;
  const T* h;
  const float* w;
  const float* inv_rms;
  const T* dh_extra;  // may be null
  T* dh;
  int64_t C;
};

// ---- scalar -----------------------------------------------------------------------------------

template <typename T>
void forward_scalar(const Forward<T>& a, int64_t r0, int64_t r1, float* hbuf) {
  const int64_t C = a.C;
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = a.x + r * C;
    T* y = a.y + r * C;
    float ss = 0.0f;
    if (a.residual != nullptr) {
      const T* res = a.residual + r * C;
      T* h = a.h + r * C;
      for (int64_t c = 0; c < C; ++c) {
        h[c] = from_float<T>(to_float(x[c]) + to_float(res[c]));
        hbuf[c] = to_float(h[c]);
        ss += hbuf[c] * hbuf[c];
      }
    } else {
      for (int64_t c = 0; c < C; ++c) {
        hbuf[c] = to_float(x[c]);
        ss += hbuf[c] * hbuf[c];
      }
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(C) + a.eps);
    a.inv_rms[r] = inv;
    for (int64_t c = 0; c < C; ++c) y[c] = from_float<T>(hbuf[c] * inv * a.w[c]);
  }
}

// dh = inv * (g - h * inv^2 * mean(g * h)) + dh_extra with g = dy * weight;
// dweight += dy * h * inv, into the caller's partial sums.
template <typename T>
void backward_scalar(const Backward<T>& a, int64_t r0, int64_t r1, float* dw) {
  const int64_t C = a.C;
  for (int64_t r = r0; r < r1; ++r) {
    const T* dy = a.dy + r * C;
    const T* h = a.h + r * C;
    T* dh = a.dh + r * C;
    const float inv = a.inv_rms[r];
    float dot = 0.0f;
    for (int64_t c = 0; c < C; ++c) dot += to_float(dy[c]) * a.w[c] * to_float(h[c]);
    const float k = inv * inv * inv * dot / static_cast<float>(C);
    for (int64_t c = 0; c < C; ++c) {
      const float dyc = to_float(dy[c]), hc = to_float(h[c]);
      float d = inv * dyc * a.w[c] - k * hc;
      if (a.dh_extra != nullptr) d += to_float(a.dh_extra[r * C + c]);
      dh[c] = from_float<T>(d);
      dw[c] += dyc * hc * inv;
    }
  }
}

// ---- AVX2 -------------------------------------------------------------------------------------

template <typename T>
ANYCHIP_AVX2 float sum_squares_avx2(const T* x, int64_t C) {
  using namespace avx2;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= C; c += 16) {
    const __m256 v0 = load8(x + c), v1 = load8(x + c + 8);
    acc0 = _mm256_fmadd_ps(v0, v0, acc0);
    acc1 = _mm256_fmadd_ps(v1, v1, acc1);
  }
  for (; c < C; c += 8) {
    const __m256 v = C - c >= 8 ? load8(x + c) : load_first(x + c, C - c);
    acc0 = _mm256_fmadd_ps(v, v, acc0);
  }
  return sum8(_mm256_add_ps(acc0, acc1));
}

// The forward on AVX2, as forward_avx512: two passes over each row, with kStream the outputs'
// whole vectors streamed past the caches.
template <typename T, bool kStream>
ANYCHIP_AVX2 void forward_avx2(const Forward<T>& a, int64_t r0, int64_t r1, float* hbuf) {
  using namespace avx2;
  const int64_t C = a.C;
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = a.x + r * C;
    T* y = a.y + r * C;
    float ss;
    if (a.residual != nullptr) {
      const T* res = a.residual + r * C;
      T* h = a.h + r * C;
      __m256 acc = _mm256_setzero_ps();
      for8<kStream>(h, C, [&](int64_t c, auto io) ANYCHIP_AVX2 {
        const __m256 v = round8(h, _mm256_add_ps(io.load(x + c), io.load(res + c)));
        io.store(h + c, v);
        _mm256_storeu_ps(hbuf + c, v);  // whole vectors: hbuf has room for 8 past C
        acc = _mm256_fmadd_ps(v, v, acc);
      });
      ss = sum8(acc);
    } else {
      ss = sum_squares_avx2(x, C);
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(C) + a.eps);
    a.inv_rms[r] = inv;
    const __m256 vinv = _mm256_set1_ps(inv);
    const float* w = a.w;
    const bool residual = a.residual != nullptr;
    for8<kStream>(y, C, [&](int64_t c, auto io) ANYCHIP_AVX2 {
      const __m256 hv = residual ? io.load(hbuf + c) : io.load(x + c);
      io.store(y + c, _mm256_mul_ps(_mm256_mul_ps(hv, vinv), io.load(w + c)));
    });
  }
}

// The backward on AVX2, as backward_avx512: the first pass (bound by the loads) takes the
// row's dot product and its share of dweight, the second writes dh.
template <typename T, bool kStream>
ANYCHIP_AVX2 void backward_avx2(const Backward<T>& a, int64_t r0, int64_t r1, float* dw) {
  using namespace avx2;
  const int64_t C = a.C;
  const float* w = a.w;
  for (int64_t r = r0; r < r1; ++r) {
    const T* dy = a.dy + r * C;
    const T* h = a.h + r * C;
    const T* extra = a.dh_extra != nullptr ? a.dh_extra + r * C : nullptr;
    T* dh = a.dh + r * C;
    const float inv = a.inv_rms[r];
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256 acc = _mm256_setzero_ps();
    for8<false>(dh, C, [&](int64_t c, auto io) ANYCHIP_AVX2 {
      const __m256 dyv = io.load(dy + c), hv = io.load(h + c);
      acc = _mm256_fmadd_ps(_mm256_mul_ps(dyv, io.load(w + c)), hv, acc);
      io.store(dw + c, _mm256_fmadd_ps(_mm256_mul_ps(dyv, hv), vinv, io.load(dw + c)));
    });
    const __m256 vk = _mm256_set1_ps(inv * inv * inv * sum8(acc) / static_cast<float>(C));
    for8<kStream>(dh, C, [&](int64_t c, auto io) ANYCHIP_AVX2 {
      const __m256 dyv = io.load(dy + c), hv = io.load(h + c);
      __m256 d = _mm256_fmsub_ps(_mm256_mul_ps(vinv, dyv), io.load(w + c), _mm256_mul_ps(vk, hv));
      if (extra != nullptr) d = _mm256_add_ps(d, io.load(extra + c));
      io.store(dh + c, d);
    });
  }
}

// Below AVX-512: AVX2 where the CPU has it, else scalar. hbuf holds C + 8 floats.
template <typename T>
void forward_below_avx512(const Forward<T>& a, int64_t r0, int64_t r1, float* hbuf, bool stream) {
  if (isa() != Isa::kAvx2) return forward_scalar(a, r0, r1, hbuf);
  avx2::with_streaming(stream, [&](auto s) { forward_avx2<T, decltype(s)::value>(a, r0, r1, hbuf); });
}

template <typename T>
void backward_below_avx512(const Backward<T>& a, int64_t r0, int64_t r1, float* dw, bool stream) {
  if (isa() != Isa::kAvx2) return backward_scalar(a, r0, r1, dw);
  avx2::with_streaming(stream, [&](auto s) { backward_avx2<T, decltype(s)::value>(a, r0, r1, dw); });
}

// ---- AVX-512 ----------------------------------------------------------------------------------

template <typename T>
ANYCHIP_AVX512 float sum_squares_avx512(const T* x, int64_t C) {
  using namespace avx512;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  const __mmask16 all = lanes(16);
  int64_t c = 0;
  for (; c + 64 <= C; c += 64) {
    const __m512 v0 = load16(x + c, all), v1 = load16(x + c + 16, all);
    const __m512 v2 = load16(x + c + 32, all), v3 = load16(x + c + 48, all);
    acc0 = _mm512_fmadd_ps(v0, v0, acc0);
    acc1 = _mm512_fmadd_ps(v1, v1, acc1);
    acc2 = _mm512_fmadd_ps(v2, v2, acc2);
    acc3 = _mm512_fmadd_ps(v3, v3, acc3);
  }
  for (; c < C; c += 16) {
    const __m512 v = load16(x + c, lanes(C - c));
    acc0 = _mm512_fmadd_ps(v, v, acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

// h = x + residual into `hbuf` (float32) and the h output; returns sum(h^2).
template <typename T, bool kStream>
ANYCHIP_AVX512 float add_residual_avx512(const T* x, const T* res, T* h, float* hbuf, int64_t C) {
  using namespace avx512;
  __m512 acc = _mm512_setzero_ps();
  for16<kStream>(h, C, [&](int64_t c, __mmask16 m, auto store) ANYCHIP_AVX512 {
    const __m512 v = round16(h, _mm512_add_ps(load16(x + c, m), load16(res + c, m)));
    store(h + c, v);
    _mm512_mask_storeu_ps(hbuf + c, m, v);
    acc = _mm512_fmadd_ps(v, v, acc);
  });
  return _mm512_reduce_add_ps(acc);
}

// The streaming forward without a residual, for rows of whole 64-element chunks whose outputs
// are 64-byte aligned (every Llama hidden size): each row is walked as 4 interleaved quarters,
// and while row r is scaled and streamed out, row r + 1 is read and reduced. Four concurrent
// streams in each direction keep more DRAM banks busy than one sequential stream (glibc's
// large memcpy interleaves 4 pages for the same reason), and reading during the write pass
// removes the per-row alternation between read-only and write-only phases: about 44 GB/s
// instead of 33 on [4096, 4096] fp32, where a 4-page-interleaved copy reaches 44.
inline bool interleavable(const void* y, int64_t C) {
  return C % 64 == 0 && reinterpret_cast<uintptr_t>(y) % 64 == 0;
}

template <typename T>
ANYCHIP_AVX512 void forward_interleaved_avx512(const Forward<T>& a, int64_t r0, int64_t r1) {
  using namespace avx512;
  const int64_t C = a.C, Q = C / 4;
  const __mmask16 all = lanes(16);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  if (r0 < r1) {
    const T* x = a.x + r0 * C;
    for (int64_t off = 0; off < Q; off += 16) {
      for (int p = 0; p < 4; ++p) {
        const __m512 v = load16(x + p * Q + off, all);
        acc[p] = _mm512_fmadd_ps(v, v, acc[p]);
      }
    }
  }
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = a.x + r * C;
    T* y = a.y + r * C;
    const float ss = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(C) + a.eps);
    a.inv_rms[r] = inv;
    const __m512 vinv = _mm512_set1_ps(inv);
    const T* next = r + 1 < r1 ? x + C : nullptr;
    for (int p = 0; p < 4; ++p) acc[p] = _mm512_setzero_ps();
    for (int64_t off = 0; off < Q; off += 16) {
      for (int p = 0; p < 4; ++p) {
        const int64_t c = p * Q + off;
        if (next != nullptr) {
          const __m512 v = load16(next + c, all);
          acc[p] = _mm512_fmadd_ps(v, v, acc[p]);
        }
        stream16(y + c, _mm512_mul_ps(_mm512_mul_ps(load16(x + c, all), vinv), _mm512_loadu_ps(a.w + c)));
      }
    }
  }
}

template <typename T, bool kStream>
ANYCHIP_AVX512 void forward_avx512(const Forward<T>& a, int64_t r0, int64_t r1, float* hbuf) {
  using namespace avx512;
  const int64_t C = a.C;
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = a.x + r * C;
    T* y = a.y + r * C;
    const float ss = a.residual != nullptr
                         ? add_residual_avx512<T, kStream>(x, a.residual + r * C, a.h + r * C, hbuf, C)
                         : sum_squares_avx512(x, C);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(C) + a.eps);
    a.inv_rms[r] = inv;
    const __m512 vinv = _mm512_set1_ps(inv);
    const float* w = a.w;
    const bool residual = a.residual != nullptr;
    for16<kStream>(y, C, [&](int64_t c, __mmask16 m, auto store) ANYCHIP_AVX512 {
      const __m512 hv = residual ? _mm512_maskz_loadu_ps(m, hbuf + c) : load16(x + c, m);
      store(y + c, _mm512_mul_ps(_mm512_mul_ps(hv, vinv), _mm512_maskz_loadu_ps(m, w + c)));
    });
  }
}

template <typename T, bool kStream>
ANYCHIP_AVX512 void backward_avx512(const Backward<T>& a, int64_t r0, int64_t r1, float* dw) {
  using namespace avx512;
  const int64_t C = a.C;
  const float* w = a.w;
  for (int64_t r = r0; r < r1; ++r) {
    const T* dy = a.dy + r * C;
    const T* h = a.h + r * C;
    const T* extra = a.dh_extra != nullptr ? a.dh_extra + r * C : nullptr;
    T* dh = a.dh + r * C;
    const float inv = a.inv_rms[r];
    const __m512 vinv = _mm512_set1_ps(inv);
    // The first pass, bound by the loads from memory, also takes dweight's share of the row.
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= C; c += 32) {
      const __mmask16 all = lanes(16);
      const __m512 dy0 = load16(dy + c, all), h0 = load16(h + c, all);
      const __m512 dy1 = load16(dy + c + 16, all), h1 = load16(h + c + 16, all);
      acc0 = _mm512_fmadd_ps(_mm512_mul_ps(dy0, _mm512_loadu_ps(w + c)), h0, acc0);
      acc1 = _mm512_fmadd_ps(_mm512_mul_ps(dy1, _mm512_loadu_ps(w + c + 16)), h1, acc1);
      _mm512_storeu_ps(dw + c, _mm512_fmadd_ps(_mm512_mul_ps(dy0, h0), vinv, _mm512_loadu_ps(dw + c)));
      _mm512_storeu_ps(dw + c + 16, _mm512_fmadd_ps(_mm512_mul_ps(dy1, h1), vinv, _mm512_loadu_ps(dw + c + 16)));
    }
    for (; c < C; c += 16) {
      const __mmask16 m = lanes(C - c);
      const __m512 dyv = load16(dy + c, m), hv = load16(h + c, m);
      acc0 = _mm512_fmadd_ps(_mm512_mul_ps(dyv, _mm512_maskz_loadu_ps(m, w + c)), hv, acc0);
      _mm512_mask_storeu_ps(dw + c, m, _mm512_fmadd_ps(_mm512_mul_ps(dyv, hv), vinv, _mm512_maskz_loadu_ps(m, dw + c)));
    }
    const float dot = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    const __m512 vk = _mm512_set1_ps(inv * inv * inv * dot / static_cast<float>(C));
    for16<kStream>(dh, C, [&](int64_t i, __mmask16 m, auto store) ANYCHIP_AVX512 {
      const __m512 dyv = load16(dy + i, m), hv = load16(h + i, m);
      __m512 d = _mm512_fmsub_ps(_mm512_mul_ps(vinv, dyv), _mm512_maskz_loadu_ps(m, w + i), _mm512_mul_ps(vk, hv));
      if (extra != nullptr) d = _mm512_add_ps(d, load16(extra + i, m));
      store(dh + i, d);
    });
  }
}

// The streaming backward without dh_extra, for rows as forward_interleaved_avx512 takes them:
// while row r's dh is streamed out, row r + 1's dy and h are read, reduced and added to
// dweight, four interleaved quarters at a time. dweight gets the same additions in the same row
// order as backward_avx512, so the two paths agree on it bit for bit.
template <typename T>
ANYCHIP_AVX512 void backward_interleaved_avx512(const Backward<T>& a, int64_t r0, int64_t r1, float* dw) {
  using namespace avx512;
  const int64_t C = a.C, Q = C / 4;
  const __mmask16 all = lanes(16);
  const float* w = a.w;
  __m512 acc[4];
  // Row r's dot(dy * w, h) into acc, and its share of dweight.
  auto reduce_row = [&](int64_t r, int64_t off, int p) ANYCHIP_AVX512 {
    const int64_t c = p * Q + off;
    const __m512 dyv = load16(a.dy + r * C + c, all), hv = load16(a.h + r * C + c, all);
    acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(dyv, _mm512_loadu_ps(w + c)), hv, acc[p]);
    _mm512_storeu_ps(dw + c, _mm512_fmadd_ps(_mm512_mul_ps(dyv, hv), _mm512_set1_ps(a.inv_rms[r]),
                                             _mm512_loadu_ps(dw + c)));
  };
  if (r0 >= r1) return;
  for (int p = 0; p < 4; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t off = 0; off < Q; off += 16)
    for (int p = 0; p < 4; ++p) reduce_row(r0, off, p);
  for (int64_t r = r0; r < r1; ++r) {
    const T* dy = a.dy + r * C;
    const T* h = a.h + r * C;
    T* dh = a.dh + r * C;
    const float inv = a.inv_rms[r];
    const __m512 vinv = _mm512_set1_ps(inv);
    const float dot = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    const __m512 vk = _mm512_set1_ps(inv * inv * inv * dot / static_cast<float>(C));
    const bool next = r + 1 < r1;
    for (int p = 0; p < 4; ++p) acc[p] = _mm512_setzero_ps();
    for (int64_t off = 0; off < Q; off += 16) {
      for (int p = 0; p < 4; ++p) {
        if (next) reduce_row(r + 1, off, p);
        const int64_t c = p * Q + off;
        const __m512 dyv = load16(dy + c, all), hv = load16(h + c, all);
        stream16(dh + c, _mm512_fmsub_ps(_mm512_mul_ps(vinv, dyv), _mm512_loadu_ps(w + c), _mm512_mul_ps(vk, hv)));
      }
    }
  }
}

// ---- launch -----------------------------------------------------------------------------------

template <typename T>
AnychipStatus forward(const AnychipKernelCall* call) {
  const bool with_residual = call->num_inputs > 2;
  const AnychipTensor& x = in(call, 0);
  const int64_t R = rows(x), C = last_dim(x);
  std::vector<float> wbuf;
  Forward<T> a{data<const T>(x), with_residual ? data<const T>(in(call, 2)) : nullptr,
               weight_f32(data<const T>(in(call, 1)), C, wbuf), data<T>(out(call, 0)),
               data<float>(out(call, 1)), with_residual ? data<T>(out(call, 2)) : nullptr, C,
               static_cast<float>(attr(call, ANYCHIP_ATTR_RMS_NORM_EPS, 1e-6))};
  const bool vector = isa() >= Isa::kAvx512;
  const bool stream = R * C * static_cast<int64_t>(sizeof(T)) >= kStreamBytes;
#pragma omp parallel num_threads(threads(call)) if (R * C >= kParallelElements)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t r0 = part(R, nt, t), r1 = part(R, nt, t + 1);
    std::vector<float> hbuf(with_residual || !vector ? C + 8 : 0);  // + 8: AVX2 stores whole vectors
    if (!vector) {
      forward_below_avx512(a, r0, r1, hbuf.data(), stream);
    } else if (stream && !with_residual && interleavable(a.y, C)) {
      forward_interleaved_avx512(a, r0, r1);
      avx512::stream_fence();
    } else if (stream) {
      forward_avx512<T, true>(a, r0, r1, hbuf.data());
      avx512::stream_fence();
    } else {
      forward_avx512<T, false>(a, r0, r1, hbuf.data());
    }
  }
  return ANYCHIP_OK;
}

template <typename T>
AnychipStatus backward(const AnychipKernelCall* call) {
  const AnychipTensor& dy = in(call, 0);
  const int64_t R = rows(dy), C = last_dim(dy);
  std::vector<float> wbuf;
  Backward<T> a{data<const T>(dy), data<const T>(in(call, 1)), weight_f32(data<const T>(in(call, 2)), C, wbuf),
                data<const float>(in(call, 3)), call->num_inputs > 4 ? data<const T>(in(call, 4)) : nullptr,
                data<T>(out(call, 0)), C};
  T* dweight = data<T>(out(call, 1));
  const int64_t blocks = std::max<int64_t>(1, std::min(R, kGradBlocks));
  std::vector<float> partial(blocks * C);
  const bool vector = isa() >= Isa::kAvx512;
  const bool stream = R * C * static_cast<int64_t>(sizeof(T)) >= kStreamBytes;
#pragma omp parallel num_threads(threads(call)) if (R * C >= kParallelElements)
  {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = part(R, blocks, b), r1 = part(R, blocks, b + 1);
      float* dw = partial.data() + b * C;
      if (!vector) {
        backward_below_avx512(a, r0, r1, dw, stream);
      } else if (stream && a.dh_extra == nullptr && interleavable(a.dh, C)) {
        backward_interleaved_avx512(a, r0, r1, dw);
      } else if (stream) {
        backward_avx512<T, true>(a, r0, r1, dw);
      } else {
        backward_avx512<T, false>(a, r0, r1, dw);
      }
    }
    if (vector && stream) avx512::stream_fence();
    // Every column summed over the blocks in block order; a chunk of columns at a time, so
    // the additions run along rows (and vectorise).
#pragma omp for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, C - c0);
      float sums[kColumnChunk];
      std::copy_n(partial.data() + c0, n, sums);
      for (int64_t b = 1; b < blocks; ++b) {
        const float* row = partial.data() + b * C + c0;
        for (int64_t c = 0; c < n; ++c) sums[c] += row[c];
      }
      for (int64_t c = 0; c < n; ++c) dweight[c0 + c] = from_float<T>(sums[c]);
    }
  }
  return ANYCHIP_OK;
}

}  // namespace
}  // namespace anychip::cpu

using namespace anychip::cpu;

ANYCHIP_CPU_KERNEL(rms_norm) {
  if (AnychipStatus s = require_contiguous(call, "rms_norm"); s != ANYCHIP_OK) return s;
  return dispatch_float(call, in(call, 0).dtype, "rms_norm",
                        [&]<typename T>() { return forward<T>(call); });
}

ANYCHIP_CPU_KERNEL(rms_norm_grad) {
  if (AnychipStatus s = require_contiguous(call, "rms_norm_grad"); s != ANYCHIP_OK) return s;
  return dispatch_float(call, in(call, 0).dtype, "rms_norm_grad",
                        [&]<typename T>() { return backward<T>(call); });
}
