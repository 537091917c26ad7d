// The float32 FMA throughput this CPU sustains on the kernels' ISA: the compute roofline the
// benchmarks rate compute-bound cases against (bench/benchlib.py). Documented peaks fit one CPU
// model; this one is measured on whatever the kernels run on, with the vector width they use.
#include <omp.h>

#include <chrono>

#include "common.h"
#include "elementwise_avx512.h"
#include "simd_avx2.h"

namespace anychip::cpu {
namespace {

// Independent accumulator chains per thread: more than FMA pipes x FMA latency on every x86
// core (2 x 4-5), so the probe measures throughput, not latency. Each chain is c = c * a + b
// with a just below 1, so nothing overflows or goes subnormal; the empty asm keeps every chain
// in a register without a store, so the loop is FMAs alone.
constexpr int kChains = 12;
constexpr long kStepsPerCheck = 1 << 14;

#define ANYCHIP_FMA_CHAINS(V, FMA, A, B, C, LANES)                                              \
  V x0 = C, x1 = C, x2 = C, x3 = C, x4 = C, x5 = C, x6 = C, x7 = C, x8 = C, x9 = C, x10 = C, x11 = C; \
  const V a = A, b = B;                                                                          \
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);     \
  long steps = 0;                                                                                \
  do {                                                                                           \
    for (long s = 0; s < kStepsPerCheck; ++s) {                                                  \
      x0 = FMA(x0, a, b), x1 = FMA(x1, a, b), x2 = FMA(x2, a, b), x3 = FMA(x3, a, b);             \
      x4 = FMA(x4, a, b), x5 = FMA(x5, a, b), x6 = FMA(x6, a, b), x7 = FMA(x7, a, b);             \
      x8 = FMA(x8, a, b), x9 = FMA(x9, a, b), x10 = FMA(x10, a, b), x11 = FMA(x11, a, b);         \
      __asm__ volatile("" : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(x3), "+x"(x4), "+x"(x5), "+x"(x6), \
                       "+x"(x7), "+x"(x8), "+x"(x9), "+x"(x10), "+x"(x11));                      \
    }                                                                                            \
    steps += kStepsPerCheck;                                                                     \
  } while (std::chrono::steady_clock::now() < end);                                              \
  return steps * kChains * (LANES)

// FMA lane operations done in `seconds` on one thread.
ANYCHIP_AVX512 long chains_avx512(double seconds) {
  ANYCHIP_FMA_CHAINS(__m512, _mm512_fmadd_ps, _mm512_set1_ps(0.9999f), _mm512_set1_ps(1e-4f), _mm512_set1_ps(1.0f), 16);
}
ANYCHIP_AVX2 long chains_avx2(double seconds) {
  ANYCHIP_FMA_CHAINS(__m256, _mm256_fmadd_ps, _mm256_set1_ps(0.9999f), _mm256_set1_ps(1e-4f), _mm256_set1_ps(1.0f), 8);
}
inline float mul_add(float x, float a, float b) { return x * a + b; }
long chains_scalar(double seconds) { ANYCHIP_FMA_CHAINS(float, mul_add, 0.9999f, 1e-4f, 1.0f, 1); }

#undef ANYCHIP_FMA_CHAINS

}  // namespace
}  // namespace anychip::cpu

// FLOP/s (2 per FMA lane) of `threads` threads each running FMA chains for `seconds`, on the
// widest vectors isa() allows; the sum over threads. threads <= 0: OpenMP's default.
extern "C" __attribute__((visibility("default"))) double anychip_cpu_fma_peak(int threads, double seconds) {
  using namespace anychip::cpu;
  const int nt = threads > 0 ? threads : omp_get_max_threads();
  const Isa level = isa();
  long lanes = 0;
  double wall = 0.0;
#pragma omp parallel num_threads(nt) reduction(+ : lanes) reduction(max : wall)
  {
    const auto t0 = std::chrono::steady_clock::now();
    lanes = has_avx512(level) ? chains_avx512(seconds) : level == Isa::kAvx2 ? chains_avx2(seconds)
                                                                              : chains_scalar(seconds);
    wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return wall > 0.0 ? 2.0 * static_cast<double>(lanes) / wall : 0.0;
}
