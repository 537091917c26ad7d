// weight_quantize: w[K, N] -> qweight (int8 [N, K], or 4-bit [N, K/2] in 64-wide nibble
// blocks) and scales f32 [N, G], symmetric per group of K: scale = absmax / qmax,
// q = clamp(round(w / scale), -qmax, qmax) with round half away from zero.
//
// One-off preprocessing, so one portable version serves every ISA: 16 columns of w at a time
// (one cache line of float32 per row of w), with the loops over them left to the vectoriser.
#include <algorithm>
#include <cmath>
#include <vector>

#include "quant.h"

namespace anychip::cpu::quant {
namespace {

constexpr int64_t kCols = 16;

template <typename T>
void quantize(const T* w, int64_t k, int64_t n, int bits, int64_t group, uint8_t* qweight, float* scales,
              int threads) {
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  const int64_t groups = k / group, blocks = (n + kCols - 1) / kCols;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> vals(static_cast<size_t>(group * kCols));
    std::vector<int8_t> q(static_cast<size_t>(kCols * k));  // [column][k]
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kCols, nb = std::min(kCols, n - n0);
      for (int64_t g = 0; g < groups; ++g) {
        float amax[kCols] = {};
        for (int64_t r = 0; r < group; ++r) {
          const T* src = w + (g * group + r) * n + n0;
          float* v = vals.data() + r * kCols;
          for (int64_t j = 0; j < nb; ++j) {
            v[j] = to_float(src[j]);
            amax[j] = std::max(amax[j], std::fabs(v[j]));
          }
        }
        float scale[kCols];
        for (int64_t j = 0; j < nb; ++j) {
          scale[j] = amax[j] / qmax;
          scales[(n0 + j) * groups + g] = scale[j];
        }
        for (int64_t r = 0; r < group; ++r) {
          const float* v = vals.data() + r * kCols;
          for (int64_t j = 0; j < nb; ++j) {
            // Clamping before rounding equals clamping after (the bounds are integers).
            const float x = scale[j] > 0.0f ? std::min(std::max(v[j] / scale[j], -qmax), qmax) : 0.0f;
            q[j * k + g * group + r] = static_cast<int8_t>(round_half_away(x));
          }
        }
      }
      for (int64_t j = 0; j < nb; ++j) {
        const int8_t* src = q.data() + j * k;
        if (bits == 8) {
          std::memcpy(qweight + (n0 + j) * k, src, static_cast<size_t>(k));
          continue;
        }
        uint8_t* dst = qweight + (n0 + j) * (k / 2);
        for (int64_t blk = 0; blk < k / 64; ++blk)
          for (int64_t i = 0; i < 32; ++i)
            dst[blk * 32 + i] = static_cast<uint8_t>((src[64 * blk + i] + 8) | ((src[64 * blk + 32 + i] + 8) << 4));
      }
    }
  }
}

}  // namespace
}  // namespace anychip::cpu::quant

using namespace anychip::cpu;
using namespace anychip::cpu::quant;

ANYCHIP_CPU_KERNEL(weight_quantize) {
  const char* what = "weight_quantize";
  if (call->num_inputs < 1 || call->num_outputs < 2)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects w -> qweight, scales", what);
  const AnychipTensor& w = in(call, 0);
  const AnychipTensor& qw = out(call, 0);
  const AnychipTensor& sc = out(call, 1);
  if (!is_contiguous(w) || !is_contiguous(qw) || !is_contiguous(sc))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: tensors must be contiguous", what);
  const int bits = static_cast<int>(attr(call, ANYCHIP_ATTR_WEIGHT_QUANTIZE_BITS));
  const int64_t group_size = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_WEIGHT_QUANTIZE_GROUP_SIZE, -1));
  if (w.rank != 2) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: w must be [K, N]", what);
  const int64_t k = w.shape[0], n = w.shape[1];
  const int64_t group = group_size <= 0 ? k : group_size;
  if (bits != 4 && bits != 8) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: bits %d is not 4 or 8", what, bits);
  if (k <= 0 || k % group != 0 || (bits == 4 && k % 64 != 0))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: K = %lld does not fit group_size %lld and bits %d", what,
                static_cast<long long>(k), static_cast<long long>(group_size), bits);
  const int64_t row_bytes = bits == 8 ? k : k / 2;
  if (numel(qw) != n * row_bytes || numel(sc) != n * (k / group) || sc.dtype != ANYCHIP_DTYPE_FLOAT32 ||
      qw.dtype != (bits == 8 ? ANYCHIP_DTYPE_INT8 : ANYCHIP_DTYPE_UINT8))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: qweight or scales have the wrong shape or dtype", what);
  const int nt = threads(call);
  return dispatch_float(call, w.dtype, what, [&]<typename T>() {
    quantize(data<const T>(w), k, n, bits, group, data<uint8_t>(qw), data<float>(sc), nt);
    return ANYCHIP_OK;
  });
}
