// Shared by the row-wise and elementwise kernels (rms_norm, rotary, swiglu, adamw): how they
// split work and when they stream their outputs.
#pragma once

#include <cstdint>

#include "common.h"

namespace anychip::cpu {

// Below this many elements a call runs on the calling thread (waking a team costs more).
constexpr int64_t kParallelElements = int64_t{1} << 14;

// Outputs at least this large are streamed past the caches (non-temporal stores): they could
// not stay cached for a consumer anyway, and skipping the read-for-ownership of the lines they
// overwrite saves a third of a read-once, write-once kernel's memory traffic.
constexpr int64_t kStreamBytes = int64_t{8} << 20;

// Start of part `i` of `n` near-equal parts of [0, total) (part i is [part(i), part(i + 1))).
inline int64_t part(int64_t total, int64_t n, int64_t i) { return total * i / n; }

// ANYCHIP_OK when every input and output of the call is contiguous, else UNSUPPORTED.
inline AnychipStatus require_contiguous(const AnychipKernelCall* call, const char* op) {
  for (int i = 0; i < call->num_inputs; ++i) {
    if (!is_contiguous(in(call, i))) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: input %d is not contiguous", op, i);
  }
  for (int i = 0; i < call->num_outputs; ++i) {
    if (!is_contiguous(out(call, i))) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: output %d is not contiguous", op, i);
  }
  return ANYCHIP_OK;
}

}  // namespace anychip::cpu
