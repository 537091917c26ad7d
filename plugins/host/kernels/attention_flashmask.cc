// flashmask_attention and its grad: attention under a FlashMask column-sparse mask
// (startend_row_indices, arXiv 2410.01359; rules in anychip/kernel.h). Each key tile's bound
// columns are reduced to their min and max once per call, so a (row tile, key tile) pair is
// skipped without touching K/V when every row is hidden from every key, run without per-element
// masking when none is, and masked element-wise otherwise. Same driver and engine as
// `attention`, so it equals `attention` with the equivalent dense mask bit for bit.
#include <vector>

#include "attention_args.h"

namespace anychip::cpu::attn {
namespace {

// The re-laid-out bounds a FlashPolicy points into.
struct FlashBounds {
  std::vector<int32_t> columns, ranges;
};

AnychipStatus flash_policy(const AnychipKernelCall* call, const char* op, int index, const Geometry& g,
                           FlashBounds* storage, FlashPolicy* policy) {
  const AnychipTensor& se = in(call, index);
  if (se.rank != 4 || se.dtype != ANYCHIP_DTYPE_INT32 || se.shape[0] != g.batch || se.shape[2] != g.sk ||
      (se.shape[1] != 1 && se.shape[1] != g.hk && se.shape[1] != g.hq) ||
      (se.shape[3] != 1 && se.shape[3] != 2 && se.shape[3] != 4))
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT,
                "%s: startend_row_indices must be int32 [B, 1|Hk|Hq, Sk, 1|2|4]", op);
  if (!dense_layout(se)) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: startend_row_indices must be contiguous", op);
  const int64_t hm = se.shape[1];
  const int e = static_cast<int>(se.shape[3]);
  policy->mask_heads = hm;
  policy->e = e;
  policy->rule = e == 1 ? kFlashLower : e == 4 ? kFlashTwoBands : g.causal ? kFlashLowerBand : kFlashLowerUpper;
  try {
    storage->columns.resize(static_cast<size_t>(g.batch * hm * e * g.sk));
    storage->ranges.resize(static_cast<size_t>(g.batch * hm * g.key_tiles * e * 2));
  } catch (const std::bad_alloc&) {
    return fail(call, ANYCHIP_ERROR_OUT_OF_MEMORY, "%s: no memory for the mask bounds", op);
  }
  const int32_t* src = data<const int32_t>(se);
  int32_t* columns = storage->columns.data();
  int32_t* ranges = storage->ranges.data();
  const int64_t planes = g.batch * hm;
#pragma omp parallel for num_threads(static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads(call), planes))))
  for (int64_t plane = 0; plane < planes; ++plane) {
    for (int64_t j = 0; j < g.sk; ++j)
      for (int c = 0; c < e; ++c) columns[(plane * e + c) * g.sk + j] = src[(plane * g.sk + j) * e + c];
    for (int64_t kt = 0; kt < g.key_tiles; ++kt)
      for (int c = 0; c < e; ++c) {
        const int32_t* col = columns + (plane * e + c) * g.sk;
        const int64_t j0 = kt * kKeyTile, j1 = std::min(g.sk, j0 + kKeyTile);
        int32_t lo = col[j0], hi = col[j0];
        for (int64_t j = j0 + 1; j < j1; ++j) {
          lo = std::min(lo, col[j]);
          hi = std::max(hi, col[j]);
        }
        ranges[((plane * g.key_tiles + kt) * e + c) * 2] = lo;
        ranges[((plane * g.key_tiles + kt) * e + c) * 2 + 1] = hi;
      }
  }
  policy->columns = columns;
  policy->ranges = ranges;
  return ANYCHIP_OK;
}

}  // namespace
}  // namespace anychip::cpu::attn

using namespace anychip::cpu;
using namespace anychip::cpu::attn;

ANYCHIP_CPU_KERNEL(flashmask_attention) {
  constexpr const char* op = "flashmask_attention";
  if (call->num_inputs < 4)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects q, k, v, startend_row_indices", op);
  const AnychipTensor &q = in(call, 0), &k = in(call, 1), &v = in(call, 2);
  const Engine* e = nullptr;
  if (AnychipStatus s = check_qkv(call, op, q, k, v, &e); s != ANYCHIP_OK) return s;
  if (AnychipStatus s = check_forward_outputs(call, op, q); s != ANYCHIP_OK) return s;
  const Geometry g = make_geometry(q, k, attr(call, ANYCHIP_ATTR_FLASHMASK_ATTENTION_SCALE, 1.0),
                                   attr(call, ANYCHIP_ATTR_FLASHMASK_ATTENTION_CAUSAL) != 0.0);
  FlashBounds bounds;
  FlashPolicy policy;
  if (AnychipStatus s = flash_policy(call, op, 3, g, &bounds, &policy); s != ANYCHIP_OK) return s;
  return forward(call, *e, g, policy, forward_io(call));
}

ANYCHIP_CPU_KERNEL(flashmask_attention_grad) {
  constexpr const char* op = "flashmask_attention_grad";
  const Engine* e = nullptr;
  if (AnychipStatus s = check_backward(call, op, &e); s != ANYCHIP_OK) return s;
  if (call->num_inputs < 7)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects do, q, k, v, o, lse, startend_row_indices", op);
  const Geometry g = make_geometry(in(call, 1), in(call, 2), attr(call, ANYCHIP_ATTR_FLASHMASK_ATTENTION_GRAD_SCALE, 1.0),
                                   attr(call, ANYCHIP_ATTR_FLASHMASK_ATTENTION_GRAD_CAUSAL) != 0.0);
  FlashBounds bounds;
  FlashPolicy policy;
  if (AnychipStatus s = flash_policy(call, op, 6, g, &bounds, &policy); s != ANYCHIP_OK) return s;
  return backward(call, *e, g, policy, backward_io(call));
}
