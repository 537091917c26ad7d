// w8a8_linear: each row of x quantized to int8 on the fly (scale absmax / 127, round half away
// from zero), int8 x int8 products summed exactly in int32, y = acc * xscale * wscale[n] + bias.
//
// AVX-512 VNNI has only u8 x s8 (vpdpbusd), so W is read offset by +128 (a sign-bit flip) and
// the rows of x carry the compensation: sum qx (qw + 128) = sum qx qw + 128 sum qx. Taking the
// offset on W's side keeps the correction per row of x, known from the quantization, instead of
// an extra pass over W. AMX (tdpbssd) multiplies s8 x s8 directly, for the larger M. AVX2's
// vpmaddubsw (u8 x s8 pairs summed into int16) would saturate on W + 128, so it takes |x| and W
// with x's sign instead: pairs of at most 2 x 127 x 127, exact.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "quant.h"
#include "quant_simd.h"
#include "simd_avx2.h"

namespace anychip::cpu::quant {
namespace {

// Rows of x (and output rows) beyond which AMX pays for packing W into tiles.
constexpr int64_t kAmxRows = 16;
constexpr int64_t kRowsPerTask = 64;

// x quantized: rows padded to 32 and columns to 64 with zeros, as AMX tiles read them.
struct QuantizedX {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  int64_t ld = 0;
};

QuantizedX quantize_x(const AnychipTensor& x, int64_t m, int64_t k, Isa isa, int threads) {
  QuantizedX qx;
  qx.ld = round_up(k, 64);
  qx.q.assign(static_cast<size_t>(round_up(m, 32) * qx.ld), 0);
  qx.scale.resize(static_cast<size_t>(m));
  qx.sum.resize(static_cast<size_t>(m));
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> row(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      to_f32(at(x, i * k), x.dtype, k, row.data(), isa);
      float amax = 0.0f;
      for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(row[c]));
      const float scale = amax / 127.0f;
      int8_t* q = qx.q.data() + i * qx.ld;
      int32_t sum = 0;
      if (scale > 0.0f) {
        for (int64_t c = 0; c < k; ++c) {
          const float v = std::min(std::max(row[c] / scale, -127.0f), 127.0f);
          q[c] = static_cast<int8_t>(round_half_away(v));
          sum += q[c];
        }
      }
      qx.scale[i] = scale;
      qx.sum[i] = sum;
    }
  }
  return qx;
}

// The int32 sums of rows i0 .. i0 + MR of x against rows n .. n + 3 of W (rows past N repeat
// the last one and are dropped by the caller).
template <int MR>
QUANT_AVX512 void vnni_tile(const QuantizedX& qx, int64_t i0, const uint8_t* const (&rows)[4], int64_t k,
                            int32_t (&dot)[4][4]) {
  __m512i acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int8_t* x = qx.q.data() + i0 * qx.ld;
  for (int64_t c = 0; c < k; c += 64) {
    // Bytes past K load as 0, flip to 128, and meet x's zero padding.
    const __mmask64 lane = lanes64(k - c);
    __m512i wv[4];
    for (int r = 0; r < 4; ++r) wv[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(lane, rows[r] + c), flip);
    for (int i = 0; i < MR; ++i) {
      const __m512i xv = _mm512_loadu_si512(x + i * qx.ld + c);
      for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_dpbusd_epi32(acc[i][r], wv[r], xv);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < 4; ++r) dot[i][r] = _mm512_reduce_add_epi32(acc[i][r]) - 128 * qx.sum[i0 + i];
}

// vnni_tile on AVX2 for rows n .. n + 3 of W, two at a time (8 accumulators), 32 k per step;
// a last partial step reads W through a zero-padded copy (x is padded already). No lambda holds
// the accumulators: GCC 12 then keeps them in memory.
template <int MR>
ANYCHIP_AVX2 void avx2_tile(const QuantizedX& qx, int64_t i0, const uint8_t* const (&rows)[4], int64_t k,
                            int32_t (&dot)[4][4]) {
  const int8_t* x = qx.q.data() + i0 * qx.ld;
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t whole = k / 32 * 32;
  for (int pair = 0; pair < 2; ++pair) {
    uint8_t tail[2][32] = {};
    for (int r = 0; r < 2; ++r) std::memcpy(tail[r], rows[2 * pair + r] + whole, static_cast<size_t>(k - whole));
    __m256i acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    for (int64_t c = 0; c < k; c += 32) {
      __m256i wv[2];
#pragma GCC unroll 2
      for (int r = 0; r < 2; ++r)
        wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c < whole ? rows[2 * pair + r] + c : tail[r]));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i * qx.ld + c));
        const __m256i xa = _mm256_abs_epi8(xv);
#pragma GCC unroll 2
        for (int r = 0; r < 2; ++r) {
          const __m256i pairs = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(wv[r], xv));
          acc[i][r] = _mm256_add_epi32(acc[i][r], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int r = 0; r < 2; ++r) {
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc[i][r]), _mm256_extracti128_si256(acc[i][r], 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        dot[i][2 * pair + r] = _mm_cvtsi128_si32(h);
      }
  }
}

void tile_rows(int64_t mr, const QuantizedX& qx, int64_t i0, const uint8_t* const (&rows)[4], int64_t k,
               int32_t (&dot)[4][4], Isa isa) {
  if (!has_avx512(isa)) {
    switch (mr) {
      case 1: return avx2_tile<1>(qx, i0, rows, k, dot);
      case 2: return avx2_tile<2>(qx, i0, rows, k, dot);
      case 3: return avx2_tile<3>(qx, i0, rows, k, dot);
      default: return avx2_tile<4>(qx, i0, rows, k, dot);
    }
  }
  switch (mr) {
    case 1: return vnni_tile<1>(qx, i0, rows, k, dot);
    case 2: return vnni_tile<2>(qx, i0, rows, k, dot);
    case 3: return vnni_tile<3>(qx, i0, rows, k, dot);
    default: return vnni_tile<4>(qx, i0, rows, k, dot);
  }
}

struct Problem {
  const int8_t* w;   // [N, K]
  const float* ws;   // [N]
  const float* bias; // [N] or null
  int64_t m, n, k;
  const AnychipTensor* y;
};

float dequant(const QuantizedX& qx, const Problem& p, int64_t i, int64_t n, int32_t dot) {
  return static_cast<float>(dot) * qx.scale[i] * p.ws[n];
}

void run_tiles(const QuantizedX& qx, const Problem& p, Isa isa, int threads) {
  const int64_t tasks = (p.n + kRowsPerTask - 1) / kRowsPerTask;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> out(static_cast<size_t>(std::min<int64_t>(p.m, 4) * kRowsPerTask));
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t n0 = task * kRowsPerTask, nb = std::min(kRowsPerTask, p.n - n0);
      // Rows of x in fours against this block of W, which stays in L2 after the first four.
      for (int64_t i0 = 0; i0 < p.m; i0 += 4) {
        const int64_t mr = std::min<int64_t>(4, p.m - i0);
        for (int64_t n = n0; n < n0 + nb; n += 4) {
          const uint8_t* rows[4];
          for (int64_t r = 0; r < 4; ++r)
            rows[r] = reinterpret_cast<const uint8_t*>(p.w) + std::min(n + r, p.n - 1) * p.k;
          int32_t dot[4][4];
          tile_rows(mr, qx, i0, rows, p.k, dot, isa);
          for (int64_t i = 0; i < mr; ++i)
            for (int64_t r = 0; r < 4 && n + r < n0 + nb; ++r)
              out[i * kRowsPerTask + (n - n0) + r] = dequant(qx, p, i0 + i, n + r, dot[i][r]);
        }
        store_rows(*p.y, p.n, i0, mr, n0, nb, out.data(), kRowsPerTask, p.bias, isa);
      }
    }
  }
}

void run_amx(const QuantizedX& qx, const Problem& p, Isa isa, int threads) {
  const int64_t kp = qx.ld;
  // B[k][n] = W[n][k] in quads of k: 16 rows of W copied with zero padding to kp, then 16 x 16
  // dword transposes.
  auto pack = [&p, kp](int64_t j0, int64_t nt, uint8_t* tiles, float* scratch) {
    auto* rows = reinterpret_cast<uint8_t*>(scratch);  // [16][kp]
    for (int64_t t = 0; t < nt; ++t) {
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t n = j0 + 16 * t + r;
        uint8_t* dst = rows + r * kp;
        if (n < p.n) {
          std::memcpy(dst, p.w + n * p.k, static_cast<size_t>(p.k));
          std::fill(dst + p.k, dst + kp, uint8_t{0});
        } else {
          std::fill(dst, dst + kp, uint8_t{0});
        }
      }
      uint8_t* out = tiles + t * (kp / 64) * 1024;
      for (int64_t s = 0; s < kp / 64; ++s)
        transpose16(reinterpret_cast<const uint32_t*>(rows) + 16 * s, kp / 4,
                    reinterpret_cast<uint32_t*>(out + s * 1024), 16);
    }
  };
  auto store = [&](int64_t m0, int64_t j0, const void* c) {
    const auto* dot = static_cast<const int32_t*>(c);
    const int64_t rows = std::min<int64_t>(32, p.m - m0), cols = std::min<int64_t>(32, p.n - j0);
    float out[32 * 32];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) out[i * 32 + j] = dequant(qx, p, m0 + i, j0 + j, dot[i * 32 + j]);
    store_rows(*p.y, p.n, m0, rows, j0, cols, out, 32, p.bias, isa);
  };
  gemm_amx(reinterpret_cast<const uint8_t*>(qx.q.data()), kp, true, p.m, kp, p.n, pack, store, threads);
}

void run_scalar(const QuantizedX& qx, const Problem& p, int threads) {
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> out(static_cast<size_t>(p.n));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < p.m; ++i) {
      const int8_t* x = qx.q.data() + i * qx.ld;
      for (int64_t n = 0; n < p.n; ++n) {
        const int8_t* w = p.w + n * p.k;
        int32_t dot = 0;
        for (int64_t c = 0; c < p.k; ++c) dot += int32_t{x[c]} * int32_t{w[c]};
        out[n] = dequant(qx, p, i, n, dot);
      }
      store_rows(*p.y, p.n, i, 1, 0, p.n, out.data(), p.n, p.bias, Isa::kScalar);
    }
  }
}

}  // namespace
}  // namespace anychip::cpu::quant

using namespace anychip::cpu;
using namespace anychip::cpu::quant;

ANYCHIP_CPU_KERNEL(w8a8_linear) {
  const char* what = "w8a8_linear";
  if (call->num_inputs < 3 || call->num_outputs < 1)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects x, qweight, scales, bias? -> y", what);
  const AnychipTensor& x = in(call, 0);
  const AnychipTensor& qw = in(call, 1);
  const AnychipTensor& ws = in(call, 2);
  const AnychipTensor* bias = call->num_inputs > 3 ? &in(call, 3) : nullptr;
  const AnychipTensor& y = out(call, 0);
  if (!is_float(x.dtype) || y.dtype != x.dtype || (bias != nullptr && bias->dtype != x.dtype))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: x, bias and y must share a float dtype", what);
  if (!is_contiguous(x) || !is_contiguous(y) || !is_contiguous(qw) || !is_contiguous(ws) ||
      (bias != nullptr && !is_contiguous(*bias)))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: tensors must be contiguous", what);
  const int64_t k = last_dim(x), m = rows(x);
  if (qw.rank != 2 || qw.dtype != ANYCHIP_DTYPE_INT8 || qw.shape[1] != k || ws.dtype != ANYCHIP_DTYPE_FLOAT32 || numel(ws) != qw.shape[0])
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: qweight must be int8 [N, K] and scales float32 [N, 1]", what);
  const int64_t n = qw.shape[0];
  if (m == 0 || n == 0) return ANYCHIP_OK;
  const Isa isa = anychip::cpu::isa();
  const int nt = threads(call);
  std::vector<float> bias_f;
  if (bias != nullptr) {
    bias_f.resize(static_cast<size_t>(n));
    to_f32(bias->data, bias->dtype, n, bias_f.data(), isa);
  }
  const Problem p{static_cast<const int8_t*>(qw.data), static_cast<const float*>(ws.data),
                  bias != nullptr ? bias_f.data() : nullptr, m, n, k, &y};
  const QuantizedX qx = quantize_x(x, m, k, isa, nt);
  if (isa == Isa::kScalar || k == 0) {
    run_scalar(qx, p, nt);
  } else if (isa == Isa::kAmx && m > kAmxRows) {
    run_amx(qx, p, isa, nt);
  } else {
    run_tiles(qx, p, isa, nt);
  }
  return ANYCHIP_OK;
}
