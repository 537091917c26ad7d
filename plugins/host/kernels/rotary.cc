// rotary_embedding and rotary_embedding_grad, half-rotation (Llama/NeoX) layout: the pair
// (x[i], x[i + D/2]) of every head is rotated by the angle pos * theta^(-2i/D); the grad
// rotates by minus that angle.
//
// The angles are computed in float32 exactly as the reference does (1 / powf, a float32
// product, cosf/sinf), since at large positions one ulp of the angle is visible in the output.
// Those calls cost about as much as rotating the heads, so each position's cos/sin is computed
// once: in a shared table when the positions span no more values than there are rows (as in
// training, where every sequence holds 0 .. S-1), else per thread for the rows it handles.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"
#include "elementwise_avx512.h"
#include "elementwise_common.h"

namespace anychip::cpu {
namespace {

// cos and sign * sin of pos * inv_freq[i] for i < half, into cs[0, half) and cs[half, 2 half).
void angles(const float* inv_freq, int64_t half, int64_t pos, float sign, float* cs) {
  for (int64_t i = 0; i < half; ++i) {
    const float f = static_cast<float>(pos) * inv_freq[i];
    cs[i] = std::cos(f);
    cs[half + i] = sign * std::sin(f);
  }
}

template <typename T>
void rotate_scalar(const T* x, T* y, const float* cs, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = to_float(x[i]), b = to_float(x[i + half]), c = cs[i], s = cs[half + i];
    y[i] = from_float<T>(a * c - b * s);
    y[i + half] = from_float<T>(b * c + a * s);
  }
}

template <typename T, bool kStream>
ANYCHIP_AVX512 void rotate_avx512(const T* x, T* y, const float* cs, int64_t half) {
  using namespace avx512;
  // Both halves are read before either is written, so y may alias x.
  for16<kStream>(y, half, [&](int64_t i, __mmask16 m, auto store) ANYCHIP_AVX512 {
    const __m512 a = load16(x + i, m), b = load16(x + half + i, m);
    const __m512 c = _mm512_maskz_loadu_ps(m, cs + i), s = _mm512_maskz_loadu_ps(m, cs + half + i);
    store(y + i, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
    store(y + half + i, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
  });
}

template <typename T>
void rotate_head(bool vector, bool stream, const T* x, T* y, const float* cs, int64_t half) {
  if (!vector) {
    rotate_scalar(x, y, cs, half);
  } else if (stream) {
    rotate_avx512<T, true>(x, y, cs, half);
  } else {
    rotate_avx512<T, false>(x, y, cs, half);
  }
}

template <typename T>
AnychipStatus rotate(const AnychipKernelCall* call, float sin_sign) {
  const AnychipTensor& q = in(call, 0);
  const AnychipTensor& k = in(call, 1);
  const int64_t D = last_dim(q);
  if (D % 2 != 0 || last_dim(k) != D) {
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "rotary: head dims %lld and %lld must be equal and even",
                static_cast<long long>(D), static_cast<long long>(last_dim(k)));
  }
  const int64_t half = D / 2;
  static_assert(ANYCHIP_ATTR_ROTARY_EMBEDDING_THETA == ANYCHIP_ATTR_ROTARY_EMBEDDING_GRAD_THETA, "rotary's attrs");
  const float theta = static_cast<float>(attr(call, ANYCHIP_ATTR_ROTARY_EMBEDDING_THETA, 10000.0));
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
  }
  const int64_t* positions = data<const int64_t>(in(call, 2));
  const int64_t row_count = numel(in(call, 2));
  const int64_t heads[2] = {q.rank >= 2 ? q.shape[q.rank - 2] : 1, k.rank >= 2 ? k.shape[k.rank - 2] : 1};
  const T* xs[2] = {data<const T>(q), data<const T>(k)};
  T* ys[2] = {data<T>(out(call, 0)), data<T>(out(call, 1))};

  int64_t lowest = 0, highest = -1;
  if (row_count > 0) {
    const auto [lo, hi] = std::minmax_element(positions, positions + row_count);
    lowest = *lo;
    highest = *hi;
  }
  const bool tabled = row_count > 0 && static_cast<uint64_t>(highest) - static_cast<uint64_t>(lowest) <
                                           static_cast<uint64_t>(row_count);
  const int64_t table_rows = tabled ? highest - lowest + 1 : 0;
  std::vector<float> table(table_rows * D);  // cos, then sign * sin, of position lowest + row

  const int64_t per_row = heads[0] + heads[1], items = row_count * per_row;
  const bool vector = isa() >= Isa::kAvx512;
  // Streaming needs the second half of a head as aligned as the first.
  const bool stream = (numel(q) + numel(k)) * static_cast<int64_t>(sizeof(T)) >= kStreamBytes &&
                      half * static_cast<int64_t>(sizeof(T)) % 64 == 0;
#pragma omp parallel num_threads(threads(call)) if (items * D >= kParallelElements)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < table_rows; ++r) angles(inv_freq.data(), half, lowest + r, sin_sign, &table[r * D]);

    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    std::vector<float> own(tabled ? 0 : D);  // the last position's cos/sin when there is no table
    int64_t own_position = 0;
    bool own_valid = false;
    for (int64_t item = part(items, nt, t), end = part(items, nt, t + 1); item < end; ++item) {
      const int64_t row = item / per_row, head = item % per_row, pos = positions[row];
      const float* cs;
      if (tabled) {
        cs = &table[(pos - lowest) * D];
      } else {
        if (!own_valid || pos != own_position) angles(inv_freq.data(), half, pos, sin_sign, own.data());
        own_position = pos;
        own_valid = true;
        cs = own.data();
      }
      const int which = head < heads[0] ? 0 : 1;
      const int64_t offset = (row * heads[which] + (which == 0 ? head : head - heads[0])) * D;
      rotate_head(vector, stream, xs[which] + offset, ys[which] + offset, cs, half);
    }
    if (vector && stream) avx512::stream_fence();
  }
  return ANYCHIP_OK;
}

}  // namespace
}  // namespace anychip::cpu

using namespace anychip::cpu;

ANYCHIP_CPU_KERNEL(rotary_embedding) {
  if (AnychipStatus s = require_contiguous(call, "rotary_embedding"); s != ANYCHIP_OK) return s;
  return dispatch_float(call, in(call, 0).dtype, "rotary_embedding",
                        [&]<typename T>() { return rotate<T>(call, 1.0f); });
}

ANYCHIP_CPU_KERNEL(rotary_embedding_grad) {
  if (AnychipStatus s = require_contiguous(call, "rotary_embedding_grad"); s != ANYCHIP_OK) return s;
  return dispatch_float(call, in(call, 0).dtype, "rotary_embedding_grad",
                        [&]<typename T>() { return rotate<T>(call, -1.0f); });
}
