/*
 * anychip/kernel.h -- the kernel contract: how anychip hands tensors to a plugin's kernel.
 *
 * A kernel is a plain C function over tensor descriptors (AnychipKernelFn). It never sees a
 * framework tensor or header: anychip.ops validates the arguments, allocates the outputs on the
 * device, builds the descriptors and launches the kernel on the current stream. A plugin
 * registers its kernels from Python (hook `anychip_register_kernels`, see anychip.hookspecs).
 *
 * Who checks what
 *   anychip.ops has already checked, before the launch, everything the op table (ops.h) states:
 *   ranks, shapes, dtypes, the device, attribute ranges. A kernel may therefore assume a valid
 *   call and only check what is specific to it (for example a shape it cannot handle), returning
 *   ANYCHIP_ERROR_UNSUPPORTED with a message in `call->error`.
 *
 * Conventions for every op
 *   - Tensors are dense and row-major (contiguous) unless the op says otherwise; `strides` are
 *     still filled in (in elements) so a kernel can assert it.
 *   - "float" means the op's compute dtype, one of float32, bfloat16, float16: all float
 *     inputs and outputs of one call share it unless a line names another dtype. Kernels
 *     accumulate in float32 whatever the storage dtype.
 *   - Optional inputs are trailing; `num_inputs` says whether they are present.
 *   - attrs are doubles at the places anychip/ops.h names; flags are 0.0 or 1.0.
 *   - Outputs are written completely (no output is assumed zero-filled), except where an op
 *     updates its outputs in place (adamw_step).
 *
 * The ops: anychip/ops.h, generated from the op definitions (anychip/ops/defs/<op>.py), is the
 * op table: per op, its tensors and math in words and each attribute's index by name
 * (ANYCHIP_ATTR_<OP>_<ATTR>). `anychip ops` lists which device has a kernel for which op.
 *
 * ---- Base ops (each defined in anychip/ops/defs: signature, dtypes, shape rule, reference) -----
 * The operator set that lets Paddle's own ops run on a chip (the Paddle kernel bridge routes them
 * here). "float" as above; int = int32 or int64; bool is 1 byte (0 or 1). Differences from the
 * conventions above:
 *   - ELEMENTWISE ops (unary, binary, compare, where, cast, fill, copy): the caller broadcasts.
 *     Every input has the OUTPUT's rank and shape, with stride 0 on broadcast dims and any
 *     strides otherwise (inputs may be strided views). Rank 0 and empty tensors are allowed.
 *     Outputs are dense, except copy's, which may be a strided view (write only what it addresses).
 *   - sum/mean/max read x with any strides; matmul/matmul_grad read x, y, dout with any strides.
 *     Every other input is dense.
 *   - The registered dtype is the input's (cast: the INPUT's; fill, arange: the output's;
 *     embedding: weight's; the *_grad ops: their float inputs').
 *   - Results must not depend on the number of threads.
 *   The base ops themselves are in anychip/ops.h, after the fused ops.
 *
 * Versioning: as in device.h, structs grow only at the end and carry their size.
 */
#ifndef ANYCHIP_KERNEL_H_
#define ANYCHIP_KERNEL_H_

#include <stddef.h>
#include <stdint.h>

#include "anychip/device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ANYCHIP_KERNEL_ABI_VERSION 1
#define ANYCHIP_MAX_RANK 8

/* One tensor as a kernel sees it. Filled by anychip; read-only to the kernel. */
typedef struct AnychipTensor {
  void* data;                        /* first element (a view's offset already applied) */
  int32_t dtype;                     /* AnychipDtype */
  int32_t rank;                      /* 0 .. ANYCHIP_MAX_RANK */
  int64_t shape[ANYCHIP_MAX_RANK];
  int64_t strides[ANYCHIP_MAX_RANK]; /* in elements, not bytes */
  int32_t device;                    /* device index on the op's device type */
  int32_t reserved;
} AnychipTensor;

/* One launch. Filled by anychip; the kernel writes only `error`. */
typedef struct AnychipKernelCall {
  size_t struct_size;                /* sizeof(AnychipKernelCall) of the caller */
  const AnychipTensor* inputs;
  int32_t num_inputs;
  int32_t num_outputs;
  const AnychipTensor* outputs;      /* the data they point to is the kernel's to write */
  const double* attrs;
  int32_t num_attrs;
  int32_t num_threads;               /* host threads the kernel may use; 0: its own default */
  AnychipStream stream;              /* the stream the launch is ordered on (NULL: host-synchronous) */
  char* error;                       /* on failure, a NUL-terminated message (may be NULL) */
  size_t error_size;
  void* reserved[8];
} AnychipKernelCall;

/* A kernel. Returns ANYCHIP_OK, or an error with a message in call->error. It must not keep
 * pointers from `call` after it returns. */
typedef AnychipStatus (*AnychipKernelFn)(const AnychipKernelCall* call);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ANYCHIP_KERNEL_H_ */
