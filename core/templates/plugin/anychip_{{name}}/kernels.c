/*
 * The {{name}} kernels: plain C functions following anychip/kernel.h (in anychip's include
 * directory), registered in __init__.py's anychip_register_kernels. Ops without a kernel here
 * still run on {{name}}: anychip runs their Paddle reference, counted as a fallback.
 *
 * One op so far, swiglu for float32, forward and backward. From anychip/ops.h's op table:
 *   swiglu:      gate[...], up[...] -> y = silu(gate) * up
 *   swiglu_grad: dy, gate, up -> dgate, dup
 * with silu(g) = g * s, s = sigmoid(g), so dup = dy * silu(g) and
 * dgate = dy * up * s * (1 + g (1 - s)).
 *
 * How they run: they are registered with host_code=False, as a chip's own kernels are, so
 * anychip calls them directly with the stream to order the work on in call->stream. The
 * template's runtime keeps device memory in host memory and runs every stream synchronously,
 * so these bodies can compute right here from the tensors' data pointers: all earlier work on
 * the stream is already done.
 *
 * TODO(vendor): once rt_device_allocate (runtime.c) hands out chip memory, the CPU can no
 * longer read these pointers: replace each body with the launch of your SDK's kernel on
 * call->stream (aclnn* / a <<<grid, block, 0, stream>>> launch-like), returning once it is
 * enqueued. Keep the checks in front of it.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "anychip/kernel.h"

/* The library is built with -fvisibility=hidden: export only the kernels. */
#define KERNEL __attribute__((visibility("default"))) AnychipStatus

__attribute__((format(printf, 3, 4)))
static AnychipStatus fail(const AnychipKernelCall* call, AnychipStatus status, const char* fmt, ...) {
  if (call->error != NULL && call->error_size > 0) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(call->error, call->error_size, fmt, args);
    va_end(args);
  }
  return status;
}

static int64_t numel(const AnychipTensor* t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t->rank; ++d) n *= t->shape[d];
  return n;
}

static int is_dense(const AnychipTensor* t) {
  int64_t expected = 1;
  for (int32_t d = t->rank - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

/* anychip has already checked everything ops.h's op table states (same shapes, one float
 * dtype); what is left is what this kernel adds: float32 only, dense. */
static AnychipStatus check_float32_dense(const AnychipKernelCall* call, const char* kernel) {
  for (int32_t i = 0; i < call->num_inputs + call->num_outputs; ++i) {
    int is_input = i < call->num_inputs;
    const AnychipTensor* t = is_input ? &call->inputs[i] : &call->outputs[i - call->num_inputs];
    int index = is_input ? i : i - call->num_inputs;
    if (t->dtype != ANYCHIP_DTYPE_FLOAT32) {
      return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: %s %d has dtype %d; this kernel handles "
                  "float32 (%d) only", kernel, is_input ? "input" : "output", index, (int)t->dtype,
                  (int)ANYCHIP_DTYPE_FLOAT32);
    }
    if (!is_dense(t)) {
      return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: %s %d is not dense row-major", kernel,
                  is_input ? "input" : "output", index);
    }
  }
  return ANYCHIP_OK;
}

static float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

KERNEL anychip_{{name}}_swiglu(const AnychipKernelCall* call) {
  AnychipStatus st = check_float32_dense(call, "{{name}} swiglu");
  if (st != ANYCHIP_OK) return st;
  const float* gate = call->inputs[0].data;
  const float* up = call->inputs[1].data;
  float* y = call->outputs[0].data;
  const int64_t n = numel(&call->inputs[0]);
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
  return ANYCHIP_OK;
}

KERNEL anychip_{{name}}_swiglu_grad(const AnychipKernelCall* call) {
  AnychipStatus st = check_float32_dense(call, "{{name}} swiglu_grad");
  if (st != ANYCHIP_OK) return st;
  const float* dy = call->inputs[0].data;
  const float* gate = call->inputs[1].data;
  const float* up = call->inputs[2].data;
  float* dgate = call->outputs[0].data;
  float* dup = call->outputs[1].data;
  const int64_t n = numel(&call->inputs[1]);
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(gate[i]), silu = gate[i] * s;
    dgate[i] = dy[i] * up[i] * (s + silu * (1.0f - s));
    dup[i] = dy[i] * silu;
  }
  return ANYCHIP_OK;
}
