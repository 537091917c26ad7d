// Argument checks and unpacking shared by the attention kernels (attention.cc,
// attention_flashmask.cc). anychip.ops validated the call; these catch what would crash.
#pragma once

#include "attention_driver.h"

namespace anychip::cpu::attn {

inline size_t element_size(int32_t dtype) { return dtype == ANYCHIP_DTYPE_FLOAT32 ? 4 : 2; }

// Contiguous, or empty (an empty tensor's strides say nothing).
inline bool dense_layout(const AnychipTensor& t) { return numel(t) == 0 || is_contiguous(t); }

inline bool same_shape(const AnychipTensor& a, const AnychipTensor& b) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

// q [B,Sq,Hq,D], k and v [B,Sk,Hk,D] of one float dtype, contiguous; sets *engine.
inline AnychipStatus check_qkv(const AnychipKernelCall* call, const char* op, const AnychipTensor& q,
                               const AnychipTensor& k, const AnychipTensor& v, const Engine** engine) {
  if (q.rank != 4 || k.rank != 4 || !same_shape(k, v))
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: q, k, v must be [B, S, H, D] with k and v alike", op);
  if (k.shape[0] != q.shape[0] || k.shape[3] != q.shape[3] || k.shape[2] <= 0 || q.shape[2] % k.shape[2] != 0)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT,
                "%s: k must be [B, Sk, Hk, D] with Hk dividing q's %lld heads", op, static_cast<long long>(q.shape[2]));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: q, k, v must share one dtype", op);
  if (!dense_layout(q) || !dense_layout(k) || !dense_layout(v))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: q, k, v must be contiguous", op);
  *engine = engine_for(isa(), q.dtype);
  if (*engine == nullptr)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: dtype %d is not float32, bfloat16 or float16", op, q.dtype);
  return ANYCHIP_OK;
}

// A forward's outputs o (like q) and lse float32 [B, Hq, Sq].
inline AnychipStatus check_forward_outputs(const AnychipKernelCall* call, const char* op, const AnychipTensor& q) {
  if (call->num_outputs != 2)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects outputs o and lse", op);
  const AnychipTensor& o = out(call, 0);
  const AnychipTensor& lse = out(call, 1);
  if (!same_shape(o, q) || o.dtype != q.dtype || !dense_layout(o))
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: o must be a contiguous tensor like q", op);
  if (lse.rank != 3 || lse.dtype != ANYCHIP_DTYPE_FLOAT32 || lse.shape[0] != q.shape[0] ||
      lse.shape[1] != q.shape[2] || lse.shape[2] != q.shape[1] || !dense_layout(lse))
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: lse must be contiguous float32 [B, Hq, Sq]", op);
  return ANYCHIP_OK;
}

// A backward's inputs do, q, k, v, o, lse (and nothing else checked here) and outputs dq, dk, dv.
inline AnychipStatus check_backward(const AnychipKernelCall* call, const char* op, const Engine** engine) {
  if (call->num_inputs < 6 || call->num_outputs != 3)
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: expects do, q, k, v, o, lse -> dq, dk, dv", op);
  const AnychipTensor &dout = in(call, 0), &q = in(call, 1), &k = in(call, 2), &v = in(call, 3);
  const AnychipTensor &o = in(call, 4), &lse = in(call, 5);
  if (AnychipStatus s = check_qkv(call, op, q, k, v, engine); s != ANYCHIP_OK) return s;
  for (const AnychipTensor* t : {&dout, &o, &out(call, 0)})
    if (!same_shape(*t, q) || t->dtype != q.dtype || !dense_layout(*t))
      return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: do, o and dq must be contiguous tensors like q", op);
  for (const AnychipTensor* t : {&out(call, 1), &out(call, 2)})
    if (!same_shape(*t, k) || t->dtype != q.dtype || !dense_layout(*t))
      return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: dk and dv must be contiguous tensors like k", op);
  if (lse.rank != 3 || lse.dtype != ANYCHIP_DTYPE_FLOAT32 || lse.shape[0] != q.shape[0] ||
      lse.shape[1] != q.shape[2] || lse.shape[2] != q.shape[1] || !dense_layout(lse))
    return fail(call, ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: lse must be contiguous float32 [B, Hq, Sq]", op);
  return ANYCHIP_OK;
}

inline ForwardIO forward_io(const AnychipKernelCall* call) {
  const AnychipTensor& q = in(call, 0);
  return {data<const char>(q), data<const char>(in(call, 1)), data<const char>(in(call, 2)), data<char>(out(call, 0)),
          data<float>(out(call, 1)), element_size(q.dtype)};
}

inline BackwardIO backward_io(const AnychipKernelCall* call) {
  return {data<const char>(in(call, 0)), data<const char>(in(call, 1)), data<const char>(in(call, 2)),
          data<const char>(in(call, 3)), data<const char>(in(call, 4)), data<const float>(in(call, 5)),
          data<char>(out(call, 0)),      data<char>(out(call, 1)),      data<char>(out(call, 2)),
          element_size(in(call, 1).dtype)};
}

}  // namespace anychip::cpu::attn
