// attention and attention_grad: flash attention with grouped-query heads, bottom-right causal
// masking and an optional dense bool mask [B|1, Hq|1, Sq, Sk] (anychip/kernel.h).
#include "attention_args.h"

namespace anychip::cpu::attn {
namespace {

// The optional dense mask at input `index`: bool [B|1, Hq|1, Sq, Sk], contiguous.
AnychipStatus dense_policy(const AnychipKernelCall* call, const char* op, int index, const Geometry& g,
                           DensePolicy* policy) {
  const AnychipTensor& m = in(call, index);
  if (m.rank != 4 || m.dtype != ANYCHIP_DTYPE_BOOL || (m.shape[0] != 1 && m.shape[0] != g.batch) ||
      (m.shape[1] != 1 && m.shape[1] != g.hq) || m.shape[2] != g.sq || m.shape[3] != g.sk)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: mask must be bool [B|1, Hq|1, Sq, Sk]", op);
  if (!dense_layout(m)) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: mask must be contiguous", op);
  policy->mask = data<const uint8_t>(m);
  policy->batches = m.shape[0];
  policy->heads = m.shape[1];
  return ANYCHIP_OK;
}

}  // namespace
}  // namespace anychip::cpu::attn

using namespace anychip::cpu;
using namespace anychip::cpu::attn;

ANYCHIP_CPU_KERNEL(attention) {
  constexpr const char* op = "attention";
  if (call->num_inputs < 3) return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects q, k, v[, mask]", op);
  const AnychipTensor &q = in(call, 0), &k = in(call, 1), &v = in(call, 2);
  const Engine* e = nullptr;
  if (AnychipStatus s = check_qkv(call, op, q, k, v, &e); s != ANYCHIP_OK) return s;
  if (AnychipStatus s = check_forward_outputs(call, op, q); s != ANYCHIP_OK) return s;
  const Geometry g = make_geometry(q, k, attr(call, ANYCHIP_ATTR_ATTENTION_SCALE, 1.0),
                                   attr(call, ANYCHIP_ATTR_ATTENTION_CAUSAL) != 0.0);
  if (call->num_inputs < 4) return forward(call, *e, g, CausalPolicy{}, forward_io(call));
  DensePolicy policy;
  if (AnychipStatus s = dense_policy(call, op, 3, g, &policy); s != ANYCHIP_OK) return s;
  return forward(call, *e, g, policy, forward_io(call));
}

ANYCHIP_CPU_KERNEL(attention_grad) {
  constexpr const char* op = "attention_grad";
  const Engine* e = nullptr;
  if (AnychipStatus s = check_backward(call, op, &e); s != ANYCHIP_OK) return s;
  const Geometry g = make_geometry(in(call, 1), in(call, 2), attr(call, ANYCHIP_ATTR_ATTENTION_GRAD_SCALE, 1.0),
                                   attr(call, ANYCHIP_ATTR_ATTENTION_GRAD_CAUSAL) != 0.0);
  if (call->num_inputs < 7) return backward(call, *e, g, CausalPolicy{}, backward_io(call));
  DensePolicy policy;
  if (AnychipStatus s = dense_policy(call, op, 6, g, &policy); s != ANYCHIP_OK) return s;
  return backward(call, *e, g, policy, backward_io(call));
}
