#include "common.h"

#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace anychip::cpu {
namespace {

constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

Isa detect() {
  __builtin_cpu_init();
  Isa best = Isa::kScalar;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    best = Isa::kAvx2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
      __builtin_cpu_supports("avx512vnni")) {
    best = Isa::kAvx512;
    if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
        __builtin_cpu_supports("amx-int8") &&
        syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) {
      best = Isa::kAmx;
    }
  }
  const char* cap = std::getenv("ANYCHIP_CPU_ISA");
  if (cap != nullptr && *cap != '\0') {
    Isa limit = std::strcmp(cap, "scalar") == 0   ? Isa::kScalar
                : std::strcmp(cap, "avx2") == 0   ? Isa::kAvx2
                : std::strcmp(cap, "avx512") == 0 ? Isa::kAvx512
                                                  : Isa::kAmx;
    if (static_cast<int>(limit) < static_cast<int>(best)) best = limit;
  }
  return best;
}

}  // namespace

Isa isa() {
  static const Isa chosen = detect();
  return chosen;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAmx: return "amx";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

int threads(const AnychipKernelCall* call) {
  return call->num_threads > 0 ? call->num_threads : omp_get_max_threads();
}

AnychipStatus fail(const AnychipKernelCall* call, AnychipStatus status, const char* fmt, ...) {
  if (call->error != nullptr && call->error_size > 0) {
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(call->error, call->error_size, fmt, args);
    va_end(args);
  }
  return status;
}

bool is_contiguous(const AnychipTensor& t) {
  if (numel(t) == 0) return true;  // nothing to address (numpy gives such arrays stride 0)
  int64_t expected = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;            // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;           // overflow to inf
  if (a < 0x38800000u) {                                // subnormal or zero in fp16
    if (a < 0x33000000u) return sign;                   // below half the smallest subnormal
    uint32_t mant = (a & 0x7fffff) | 0x800000;
    int shift = 126 - static_cast<int>(a >> 23);        // 14 .. 24
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);  // rebias, round to nearest even
  return sign | static_cast<uint16_t>(r >> 13);
}

}  // namespace anychip::cpu

// The instruction set the kernels use in this process (isa()), for listings and tests.
extern "C" __attribute__((visibility("default"))) const char* anychip_cpu_isa() {
  return anychip::cpu::isa_name(anychip::cpu::isa());
}
