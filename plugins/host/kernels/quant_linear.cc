// weight_only_linear (y = x W^T + bias) and weight_only_linear_grad (dx = dy W), W dequantized
// from weight_quantize's 4- or 8-bit layout, with per-group offsets when the call has them.
//
// Decode sizes (M <= kGemvRows) stream W once, dequantizing in registers (quant_gemv.cc); with
// AMX, bf16 x of up to 16 rows goes through tiles instead (quant_gemv_amx.cc), one row too:
// the tile GEMV and GEMM give each row the same result, so bf16 rows do not depend on how many
// there are (serving prefills a prompt alone or in a batch and must get the same logits). Larger M
// dequantizes blocks of W into a scratch and runs a blocked product (quant_gemm.cc): AMX bf16
// when x is bf16 and the CPU has AMX, AVX-512 FMA in float32 otherwise.
//
// With x_int8 (attr 3), x is quantized to int8 per run (quant.h's x_run) and every M goes
// through the int8 GEMV (quant_gemv_int8x.cc, quant_gemv_avx2.cc), row blocks of kGemvRows in turn.
//
// Offsets: the float32 and int8-x GEMVs add their share, offsets times the group sums of (float)
// x, after the symmetric product (quant_offsets.cc); every other path dequantizes W with them.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "quant.h"
#include "unit_run.h"

namespace anychip::cpu::quant {
namespace {

// A 0/1 flag attr (absent: 0), or -1 if it is neither: has_offsets, x_int8, bf16_products
// (float32 x multiplied in bf16). The grad kernel's has_offsets is where the forward's is.
constexpr int kOffsetsAttr = ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_HAS_OFFSETS;
constexpr int kXInt8Attr = ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_X_INT8;
constexpr int kBf16ProductsAttr = ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_BF16_PRODUCTS;
static_assert(ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_GRAD_BITS == ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_BITS &&
                  ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_GRAD_GROUP_SIZE == ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_GROUP_SIZE &&
                  ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_GRAD_HAS_OFFSETS == kOffsetsAttr,
              "read_weight reads the forward's and the grad's formats alike");
int flag_attr(const AnychipKernelCall* call, int index) {
  const double v = attr(call, index, 0.0);
  return v == 0.0 ? 0 : v == 1.0 ? 1 : -1;
}

// x [m][k] float32 rounded to bf16 (to nearest even), as a tensor over `storage`.
AnychipTensor rounded_bf16(const AnychipTensor& x, int64_t m, int64_t k, std::vector<uint16_t>& storage, Isa isa,
                           int threads) {
  storage.resize(static_cast<size_t>(m * k));
  const auto* src = static_cast<const float*>(x.data);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < m; ++r) from_f32(src + r * k, k, ANYCHIP_DTYPE_BFLOAT16, storage.data() + r * k, isa);
  AnychipTensor t = x;
  t.data = storage.data();
  t.dtype = ANYCHIP_DTYPE_BFLOAT16;
  return t;
}

// The quantized weight of a call (inputs `qi`, `qi + 1` and, with offsets, `qi + 2`; attrs bits,
// group_size, has_offsets) for K inputs.
AnychipStatus read_weight(const AnychipKernelCall* call, int qi, int64_t k, QWeight* w, const char* what) {
  const AnychipTensor& q = in(call, qi);
  const AnychipTensor& s = in(call, qi + 1);
  const int bits = static_cast<int>(attr(call, ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_BITS));
  const int64_t group_size = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_GROUP_SIZE, -1));
  if (bits != 4 && bits != 8) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: bits %d is not 4 or 8", what, bits);
  if (q.rank != 2 || s.rank != 2 || s.dtype != ANYCHIP_DTYPE_FLOAT32 || !is_contiguous(q) || !is_contiguous(s))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: qweight and scales must be contiguous 2-D, scales float32", what);
  w->q = static_cast<const uint8_t*>(q.data);
  w->scales = static_cast<const float*>(s.data);
  w->bits = bits;
  w->n = q.shape[0];
  w->k = k;
  w->group = group_size <= 0 ? k : group_size;
  w->groups = s.shape[1];
  if (k <= 0 || k % w->group != 0 || k / w->group != w->groups || s.shape[0] != w->n)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: scales [%lld, %lld] do not fit K = %lld, group_size %lld", what,
                static_cast<long long>(s.shape[0]), static_cast<long long>(s.shape[1]), static_cast<long long>(k),
                static_cast<long long>(group_size));
  if (bits == 4 && k % 64 != 0)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: 4-bit weights need K %% 64 == 0 (K = %lld)", what,
                static_cast<long long>(k));
  if (q.shape[1] != w->row_bytes())
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: qweight has %lld bytes per row, expected %lld", what,
                static_cast<long long>(q.shape[1]), static_cast<long long>(w->row_bytes()));
  if (flag_attr(call, kOffsetsAttr) == 1) {
    const AnychipTensor& o = in(call, qi + 2);
    if (o.dtype != ANYCHIP_DTYPE_FLOAT32 || !is_contiguous(o) || o.rank != 2 || o.shape[0] != w->n ||
        o.shape[1] != w->groups)
      return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: offsets must be contiguous float32 [%lld, %lld] like scales",
                  what, static_cast<long long>(w->n), static_cast<long long>(w->groups));
    w->offsets = static_cast<const float*>(o.data);
  }
  return ANYCHIP_OK;
}

// `t` converted to float32 (itself when it is float32 already).
const float* as_f32(const AnychipTensor& t, int64_t n, std::vector<float>& buffer, Isa isa, int threads) {
  if (t.dtype == ANYCHIP_DTYPE_FLOAT32) return static_cast<const float*>(t.data);
  buffer.resize(static_cast<size_t>(n));
  const int64_t chunk = 1 << 14;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; i += chunk)
    to_f32(at(t, i), t.dtype, std::min(chunk, n - i), buffer.data() + i, isa);
  return buffer.data();
}

// A bf16 copy of rows x cols `t` padded with zeros to [rows_p][cols_p], for AMX tiles.
std::vector<uint16_t> padded_bf16(const AnychipTensor& t, int64_t rows, int64_t cols, int64_t rows_p, int64_t cols_p,
                                  int threads) {
  std::vector<uint16_t> out(static_cast<size_t>(rows_p * cols_p), 0);
  const auto* src = static_cast<const uint16_t*>(t.data);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data() + r * cols_p, src + r * cols, static_cast<size_t>(cols) * 2);
  return out;
}

// ---- forward ------------------------------------------------------------------------------------

// Blocks of rows of W for the AMX GEMV, handed out as threads come free.
constexpr int64_t kGemvBlock = 64;

// The VNNI and FMA GEMVs split W's rows between the threads in runs of kGemvUnit rows (a
// multiple of the tiles' 4; unit_run.h), a unit small enough that, with more rows of x than
// one pass takes (quant_gemv*.cc), it is still in L2 when the next rows of x come to it.
constexpr int64_t kGemvUnit = 64;

// acc [M][N] and y from `product(n0, n1, acc)`, which writes x times W^T (offsets included) for
// W's rows [n0, n1), a unit of kGemvUnit rows at a time: the store is the same for every product.
template <typename Product>
void forward_blocks(const QWeight& w, int64_t m, const AnychipTensor& y, const float* bias, Isa isa, int threads,
                    Product&& product) {
  std::vector<float> acc(static_cast<size_t>(m * w.n));
  std::vector<UnitRun> runs(static_cast<size_t>(threads));
  split_runs(runs.data(), threads, (w.n + kGemvUnit - 1) / kGemvUnit);
#pragma omp parallel num_threads(threads)
  walk_runs(runs.data(), threads, omp_get_thread_num(), [&](int64_t u) {
    const int64_t n0 = u * kGemvUnit, n1 = std::min(w.n, n0 + kGemvUnit);
    product(n0, n1, acc.data());
    store_rows(y, w.n, 0, m, n0, n1 - n0, acc.data() + n0, w.n, bias, isa);
  });
}

void forward_gemv(const QWeight& w, const float* x, int64_t m, const AnychipTensor& y, const float* bias, Isa isa,
                  int threads) {
  std::vector<float> sums(static_cast<size_t>(w.offsets != nullptr ? m * w.groups : 0));
  if (w.offsets != nullptr) group_sums(w, x, m, sums.data());
  forward_blocks(w, m, y, bias, isa, threads, [&](int64_t n0, int64_t n1, float* acc) {
    gemv(w, x, m, n0, n1, acc, w.n, isa);
    add_offsets_sums(w, sums.data(), m, n0, n1, acc, w.n);
  });
}

void forward_gemv_int8x(const QWeight& w, const float* x, int64_t m, const AnychipTensor& y, const float* bias,
                        Isa isa, int threads) {
  XInt8 xq;
  quantize_x(x, m, w, &xq, isa);
  forward_blocks(w, m, y, bias, isa, threads,
                 [&](int64_t n0, int64_t n1, float* acc) { gemv_int8x(w, xq, n0, n1, acc, w.n, isa); });
}

void forward_gemv_amx(const QWeight& w, const AnychipTensor& x, int64_t m, const AnychipTensor& y, const float* bias,
                      Isa isa, int threads) {
  const std::vector<uint8_t> xt = pack_xt(static_cast<const uint16_t*>(x.data), m, w.k);
  std::vector<float> acc(static_cast<size_t>(m * w.n));
  const int64_t blocks = (w.n + kGemvBlock - 1) / kGemvBlock;
#pragma omp parallel num_threads(threads)
  {
    amx_thread_begin(m);
    std::vector<uint16_t> scratch(static_cast<size_t>(kAmxGemvScratch));
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kGemvBlock, n1 = std::min(w.n, n0 + kGemvBlock);
      gemv_amx(w, xt.data(), m, n0, n1, acc.data(), w.n, scratch.data());
      store_rows(y, w.n, 0, m, n0, n1 - n0, acc.data() + n0, w.n, bias, isa);
    }
    amx_thread_end();
  }
}

void forward_f32(const QWeight& w, const float* x, int64_t m, const AnychipTensor& y, const float* bias, Isa isa,
                 int threads) {
  // B[k][n] = W[n][k]: dequantize 16 rows of W, transpose 16 x 16 blocks into the packed panel
  // (AVX2: element by element; each panel then serves all M rows).
  auto pack = [&w, isa](int64_t j0, int64_t l0, int64_t lb, float* bp, float* scratch) {
    const int64_t ld = round_up(lb, 16);
    for (int64_t r0 = 0; r0 < 64; r0 += 16) {
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t n = j0 + r0 + r;
        if (n < w.n) {
          dequant_row(w, n, l0, l0 + lb, scratch + r * ld, isa);
        } else {
          std::fill(scratch + r * ld, scratch + r * ld + lb, 0.0f);
        }
      }
      if (has_avx512(isa)) {
        for (int64_t l = 0; l < lb; l += 16)
          transpose16(reinterpret_cast<const uint32_t*>(scratch + l), ld,
                      reinterpret_cast<uint32_t*>(bp + l * 64 + r0), 64);
      } else {
        for (int64_t l = 0; l < lb; ++l)
          for (int64_t r = 0; r < 16; ++r) bp[l * 64 + r0 + r] = scratch[r * ld + l];
      }
    }
  };
  auto store = [&](int64_t m0, int64_t mb, int64_t j0, const float* c) {
    store_rows(y, w.n, m0, mb, j0, std::min<int64_t>(64, w.n - j0), c, 64, bias, isa);
  };
  gemm_f32(x, w.k, m, w.k, w.n, pack, store, threads, isa);
}

void forward_amx(const QWeight& w, const AnychipTensor& x, int64_t m, const AnychipTensor& y, const float* bias,
                 Isa isa, int threads) {
  const int64_t kp = round_up(w.k, 32);
  const std::vector<uint16_t> a = padded_bf16(x, m, w.k, round_up(m, 32), kp, threads);
  // B[k][n] = W[n][k] in bf16 pairs: 16 rows of W dequantized, then 16 x 16 dword transposes.
  auto pack = [&w, kp](int64_t j0, int64_t nt, uint8_t* tiles, float* scratch) {
    auto* rows = reinterpret_cast<uint16_t*>(scratch);  // [16][kp] bf16
    float* row = scratch + 8 * kp;                       // one row in float32
    for (int64_t t = 0; t < nt; ++t) {
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t n = j0 + 16 * t + r;
        uint16_t* dst = rows + r * kp;
        if (n < w.n) {
          dequant_row(w, n, 0, w.k, row, Isa::kAvx512);
          from_f32(row, w.k, ANYCHIP_DTYPE_BFLOAT16, dst, Isa::kAvx512);
          std::fill(dst + w.k, dst + kp, uint16_t{0});
        } else {
          std::fill(dst, dst + kp, uint16_t{0});
        }
      }
      uint8_t* out = tiles + t * (kp / 32) * 1024;
      for (int64_t s = 0; s < kp / 32; ++s)
        transpose16(reinterpret_cast<const uint32_t*>(rows) + 16 * s, kp / 2,
                    reinterpret_cast<uint32_t*>(out + s * 1024), 16);
    }
  };
  auto store = [&](int64_t m0, int64_t j0, const void* c) {
    store_rows(y, w.n, m0, std::min<int64_t>(32, m - m0), j0, std::min<int64_t>(32, w.n - j0),
               static_cast<const float*>(c), 32, bias, isa);
  };
  gemm_amx(reinterpret_cast<const uint8_t*>(a.data()), kp * 2, false, m, kp, w.n, pack, store, threads);
}

// ---- grad ---------------------------------------------------------------------------------------

void grad_gemv(const QWeight& w, const float* dy, int64_t m, const AnychipTensor& dx, Isa isa, int threads) {
  std::vector<float> acc(static_cast<size_t>(m * w.k), 0.0f);
  // Columns of dx in chunks whose accumulators (m rows) stay within L1.
  const int64_t chunk = std::max<int64_t>(64, 8192 / m / 64 * 64);
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t share = round_up((w.k + nt - 1) / nt, 64);
    const int64_t k0 = std::min(w.k, t * share), k1 = std::min(w.k, k0 + share);
    std::vector<float> scratch(static_cast<size_t>(4 * std::min(chunk, share)));
    for (int64_t c = k0; c < k1; c += chunk) {
      const int64_t c1 = std::min(k1, c + chunk);
      gemv_grad(w, dy, m, c, c1, acc.data() + c, w.k, scratch.data(), isa);
    }
    if (k0 < k1) store_rows(dx, w.k, 0, m, k0, k1 - k0, acc.data() + k0, w.k, nullptr, isa);
  }
}

void grad_f32(const QWeight& w, const float* dy, int64_t m, const AnychipTensor& dx, Isa isa, int threads) {
  // B[n][k] = W[n][k]: rows of W dequantized straight into the packed panel.
  auto pack = [&w, isa](int64_t j0, int64_t l0, int64_t lb, float* bp, float*) {
    const int64_t cols = std::min<int64_t>(64, w.k - j0);
    for (int64_t l = 0; l < lb; ++l) {
      dequant_row(w, l0 + l, j0, j0 + cols, bp + l * 64, isa);
      std::fill(bp + l * 64 + cols, bp + l * 64 + 64, 0.0f);
    }
  };
  auto store = [&](int64_t m0, int64_t mb, int64_t j0, const float* c) {
    store_rows(dx, w.k, m0, mb, j0, std::min<int64_t>(64, w.k - j0), c, 64, nullptr, isa);
  };
  gemm_f32(dy, w.n, m, w.n, w.k, pack, store, threads, isa);
}

void grad_amx(const QWeight& w, const AnychipTensor& dy, int64_t m, const AnychipTensor& dx, Isa isa, int threads) {
  const int64_t np = round_up(w.n, 32);
  const std::vector<uint16_t> a = padded_bf16(dy, m, w.n, round_up(m, 32), np, threads);
  // B[n][k] = W[n][k] in bf16 pairs of rows n = 2p, 2p + 1, interleaved per column.
  auto pack = [&w, np](int64_t j0, int64_t nt, uint8_t* tiles, float* scratch) {
    const int64_t cols = std::min(16 * nt, w.k - j0), steps = np / 32;
    float* even = scratch;
    float* odd = scratch + 16 * nt;
    for (int64_t p = 0; p < np / 2; ++p) {
      for (int64_t h = 0; h < 2; ++h) {
        float* dst = h == 0 ? even : odd;
        const int64_t n = 2 * p + h;
        if (n < w.n) {
          dequant_row(w, n, j0, j0 + cols, dst, Isa::kAvx512);
          std::fill(dst + cols, dst + 16 * nt, 0.0f);
        } else {
          std::fill(dst, dst + 16 * nt, 0.0f);
        }
      }
      for (int64_t c = 0; c < 16 * nt; ++c) {
        const uint32_t pair = from_float<bf16>(even[c]).bits | (uint32_t{from_float<bf16>(odd[c]).bits} << 16);
        uint8_t* tile = tiles + ((c / 16) * steps + p / 16) * 1024;
        std::memcpy(tile + (p % 16) * 64 + (c % 16) * 4, &pair, 4);
      }
    }
  };
  auto store = [&](int64_t m0, int64_t j0, const void* c) {
    store_rows(dx, w.k, m0, std::min<int64_t>(32, m - m0), j0, std::min<int64_t>(32, w.k - j0),
               static_cast<const float*>(c), 32, nullptr, isa);
  };
  gemm_amx(reinterpret_cast<const uint8_t*>(a.data()), np * 2, false, m, np, w.k, pack, store, threads);
}

}  // namespace
}  // namespace anychip::cpu::quant

using namespace anychip::cpu;
using namespace anychip::cpu::quant;

ANYCHIP_CPU_KERNEL(weight_only_linear) {
  const char* what = "weight_only_linear";
  const int has_offsets = flag_attr(call, kOffsetsAttr);
  if (has_offsets < 0) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: has_offsets must be 0 or 1", what);
  const int x_int8 = flag_attr(call, kXInt8Attr);
  if (x_int8 < 0) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: x_int8 must be 0 or 1", what);
  const int bf16_products = flag_attr(call, kBf16ProductsAttr);
  if (bf16_products < 0) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: bf16_products must be 0 or 1", what);
  if (bf16_products == 1 && x_int8 == 1)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: x_int8 and bf16_products exclude each other", what);
  const int bias_at = 3 + has_offsets;
  if (call->num_inputs < bias_at || call->num_outputs < 1)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects x, qweight, scales, offsets?, bias? -> y", what);
  const AnychipTensor& x = in(call, 0);
  const AnychipTensor* bias = call->num_inputs > bias_at ? &in(call, bias_at) : nullptr;
  const AnychipTensor& y = out(call, 0);
  if (!is_float(x.dtype) || y.dtype != x.dtype || (bias != nullptr && bias->dtype != x.dtype))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: x, bias and y must share a float dtype", what);
  if (!is_contiguous(x) || !is_contiguous(y) || (bias != nullptr && !is_contiguous(*bias)))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: tensors must be contiguous", what);
  if (bf16_products == 1 && x.dtype != ANYCHIP_DTYPE_FLOAT32)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: bf16_products takes float32 x", what);
  QWeight w;
  if (AnychipStatus st = read_weight(call, 1, last_dim(x), &w, what); st != ANYCHIP_OK) return st;
  if (x_int8 == 1 && (w.k % XInt8::kMinRun != 0 || w.group % XInt8::kMinRun != 0))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED,
                "%s: x_int8 needs K and the group size to be multiples of 32 (K = %lld, group %lld)", what,
                static_cast<long long>(w.k), static_cast<long long>(w.group));
  const int64_t m = rows(x);
  if (m == 0 || w.n == 0) return ANYCHIP_OK;
  const Isa isa = anychip::cpu::isa();
  const int nt = threads(call);
  std::vector<float> bias_f;
  if (bias != nullptr) {
    bias_f.resize(static_cast<size_t>(w.n));
    to_f32(bias->data, bias->dtype, w.n, bias_f.data(), isa);
  }
  const float* b = bias != nullptr ? bias_f.data() : nullptr;
  if (x_int8 == 1) {
    std::vector<float> buffer;
    forward_gemv_int8x(w, as_f32(x, m * w.k, buffer, isa, nt), m, y, b, isa, nt);
    return ANYCHIP_OK;
  }
  std::vector<uint16_t> x_bf16;  // bf16_products: x rounded, the products as for bf16 x, y float32
  const AnychipTensor& xp = bf16_products == 1 ? rounded_bf16(x, m, w.k, x_bf16, isa, nt) : x;
  if (isa == Isa::kAmx && xp.dtype == ANYCHIP_DTYPE_BFLOAT16) {
    if (gemv_amx_fits(w, m)) {
      forward_gemv_amx(w, xp, m, y, b, isa, nt);
      return ANYCHIP_OK;
    }
    if (m > kGemvRows) {
      forward_amx(w, xp, m, y, b, isa, nt);
      return ANYCHIP_OK;
    }
  }
  std::vector<float> buffer;
  const float* xf = as_f32(xp, m * w.k, buffer, isa, nt);
  // Without AMX, bf16_products rows all take the blocked product, so that they too do not
  // depend on M.
  if (isa == Isa::kScalar || (m <= kGemvRows && bf16_products == 0)) {
    forward_gemv(w, xf, m, y, b, isa, nt);
  } else {
    forward_f32(w, xf, m, y, b, isa, nt);
  }
  return ANYCHIP_OK;
}

ANYCHIP_CPU_KERNEL(weight_only_linear_grad) {
  const char* what = "weight_only_linear_grad";
  const int has_offsets = flag_attr(call, kOffsetsAttr);
  if (has_offsets < 0) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: has_offsets must be 0 or 1", what);
  if (call->num_inputs < 3 + has_offsets || call->num_outputs < 1)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects dy, qweight, scales, offsets? -> dx", what);
  const AnychipTensor& dy = in(call, 0);
  const AnychipTensor& dx = out(call, 0);
  if (!is_float(dy.dtype) || dx.dtype != dy.dtype)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: dy and dx must share a float dtype", what);
  if (!is_contiguous(dy) || !is_contiguous(dx))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: tensors must be contiguous", what);
  QWeight w;
  if (AnychipStatus st = read_weight(call, 1, last_dim(dx), &w, what); st != ANYCHIP_OK) return st;
  if (last_dim(dy) != w.n)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: dy has %lld features, qweight %lld", what,
                static_cast<long long>(last_dim(dy)), static_cast<long long>(w.n));
  const int64_t m = rows(dy);
  if (m == 0) return ANYCHIP_OK;
  const Isa isa = anychip::cpu::isa();
  const int nt = threads(call);
  const bool small = m <= kGemvRows || w.n == 0;  // N = 0: dx = 0, from the zeroed accumulators
  if (isa == Isa::kAmx && dy.dtype == ANYCHIP_DTYPE_BFLOAT16 && !small) {
    grad_amx(w, dy, m, dx, isa, nt);
    return ANYCHIP_OK;
  }
  std::vector<float> buffer;
  const float* dyf = as_f32(dy, m * w.n, buffer, isa, nt);
  if (isa == Isa::kScalar || small) {
    grad_gemv(w, dyf, m, dx, isa, nt);
  } else {
    grad_f32(w, dyf, m, dx, isa, nt);
  }
  return ANYCHIP_OK;
}
