// Shared by the host kernels: element conversion, argument access, errors, ISA dispatch.
//
// Kernels pick an instruction set per call (isa()): AMX (tile matmul, bf16/int8), AVX-512 (with
// BF16/VNNI extensions), AVX2 (with FMA and F16C: the hot decode and prefill kernels, for CPUs
// without AVX-512 such as AMD's before Zen 4) and scalar C++. A kernel without code for the
// chosen tier runs the best tier below it that it has. ANYCHIP_CPU_ISA=scalar|avx2|avx512|amx
// caps the choice, so tests run every path the CPU has on one machine.
#pragma once

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "anychip/kernel.h"
#include "anychip/ops.h"

namespace anychip::cpu {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

// The best instruction set this CPU and process allow, capped by ANYCHIP_CPU_ISA. AMX counts
// only after the kernel granted this process the tile state (arch_prctl), requested once here.
Isa isa();
const char* isa_name(Isa isa);
inline bool has_avx512(Isa isa) { return isa >= Isa::kAvx512; }

// Threads a kernel may use for this call (call->num_threads, else OpenMP's default).
int threads(const AnychipKernelCall* call);

// Writes a message into call->error and returns `status`.
AnychipStatus fail(const AnychipKernelCall* call, AnychipStatus status, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

inline const AnychipTensor& in(const AnychipKernelCall* c, int i) { return c->inputs[i]; }
inline const AnychipTensor& out(const AnychipKernelCall* c, int i) { return c->outputs[i]; }
inline double attr(const AnychipKernelCall* c, int i, double fallback = 0.0) {
  return i < c->num_attrs ? c->attrs[i] : fallback;
}

inline int64_t numel(const AnychipTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.rank; ++i) n *= t.shape[i];
  return n;
}
// Product of all dims but the last: the "rows" of a [..., C] tensor.
inline int64_t rows(const AnychipTensor& t) {
  int64_t n = 1;
  for (int i = 0; i + 1 < t.rank; ++i) n *= t.shape[i];
  return n;
}
inline int64_t last_dim(const AnychipTensor& t) { return t.rank == 0 ? 1 : t.shape[t.rank - 1]; }
bool is_contiguous(const AnychipTensor& t);

template <typename T>
inline T* data(const AnychipTensor& t) {
  return static_cast<T*>(t.data);
}

// ---- storage types and their conversion to/from float -------------------------------------

struct bf16 {
  uint16_t bits;
};
struct fp16 {
  uint16_t bits;
};

inline float to_float(float v) { return v; }
inline float to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float f);
inline float to_float(fp16 v) { return fp16_to_float(v.bits); }

template <typename T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) {
  return f;
}
// Round to nearest even, NaN kept quiet: the same rounding as Paddle's and the hardware's.
template <>
inline bf16 from_float<bf16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}
template <>
inline fp16 from_float<fp16>(float f) {
  return fp16{float_to_fp16(f)};
}

// Calls `body.template operator()<T>()` with T the storage type of a float dtype.
template <typename Body>
AnychipStatus dispatch_float(const AnychipKernelCall* call, int32_t dtype, const char* what, Body&& body) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT32: return body.template operator()<float>();
    case ANYCHIP_DTYPE_BFLOAT16: return body.template operator()<bf16>();
    case ANYCHIP_DTYPE_FLOAT16: return body.template operator()<fp16>();
    default: return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: dtype %d is not float32, bfloat16 or float16", what, dtype);
  }
}

}  // namespace anychip::cpu

// Kernels are exported as `anychip_cpu_<name>` with the AnychipKernelFn signature.
#define ANYCHIP_CPU_KERNEL(name) \
  extern "C" __attribute__((visibility("default"))) AnychipStatus anychip_cpu_##name(const AnychipKernelCall* call)
