// One plain read of a buffer by the kernels' threads: the read roofline a streaming kernel (the
// decode GEMV) is rated against, timed by the benchmarks between that kernel's own calls on
// buffers of the same size, so that both meet the same memory system at the same moment
// (bench/benchlib.py, PairedRead). Plain loads, the hardware prefetchers alone, no software
// prefetch: the rate any loop over the bytes gets, not one tuned to beat the kernel.
#include <omp.h>

#include <immintrin.h>

#include "common.h"
#include "elementwise_avx512.h"
#include "simd_avx2.h"

namespace anychip::cpu {
namespace {

// Four accumulators, each a vector or-ed with every fourth load: the loads are independent, and
// the result depends on each of them, so none is dropped.
ANYCHIP_AVX512 uint64_t read_avx512(const uint8_t* p, int64_t bytes) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    a = _mm512_or_si512(a, _mm512_loadu_si512(p + i));
    b = _mm512_or_si512(b, _mm512_loadu_si512(p + i + 64));
    c = _mm512_or_si512(c, _mm512_loadu_si512(p + i + 128));
    d = _mm512_or_si512(d, _mm512_loadu_si512(p + i + 192));
  }
  uint64_t tail = 0;
  for (; i < bytes; ++i) tail |= p[i];
  uint64_t lanes[8];
  _mm512_storeu_si512(lanes, _mm512_or_si512(_mm512_or_si512(a, b), _mm512_or_si512(c, d)));
  for (const uint64_t lane : lanes) tail |= lane;
  return tail;
}

ANYCHIP_AVX2 uint64_t read_avx2(const uint8_t* p, int64_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    a = _mm256_or_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_or_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_or_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_or_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  uint64_t tail = 0;
  for (; i < bytes; ++i) tail |= p[i];
  uint64_t lanes[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d)));
  for (const uint64_t lane : lanes) tail |= lane;
  return tail;
}

uint64_t read_scalar(const uint8_t* p, int64_t bytes) {
  uint64_t a = 0, b = 0;
  int64_t i = 0;
  for (; i + 16 <= bytes; i += 16) {
    uint64_t x, y;
    std::memcpy(&x, p + i, 8);
    std::memcpy(&y, p + i + 8, 8);
    a |= x, b |= y;
  }
  for (; i < bytes; ++i) a |= p[i];
  return a | b;
}

}  // namespace
}  // namespace anychip::cpu

// Reads the `bytes` bytes at `data` once, `threads` threads each a contiguous share (as the
// GEMV's threads take W's rows), on the widest vectors isa() allows; returns the or of all its
// 8-byte words and tail bytes: nonzero exactly when some byte is. threads <= 0: OpenMP's default.
extern "C" __attribute__((visibility("default"))) uint64_t anychip_cpu_read_pass(const void* data, int64_t bytes,
                                                                                  int threads) {
  using namespace anychip::cpu;
  const auto* p = static_cast<const uint8_t*>(data);
  const int nt = threads > 0 ? threads : omp_get_max_threads();
  const Isa level = isa();
  uint64_t bits = 0;
#pragma omp parallel num_threads(nt) reduction(| : bits)
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    const int64_t begin = bytes * t / n / 64 * 64, end = t + 1 == n ? bytes : bytes * (t + 1) / n / 64 * 64;
    bits = has_avx512(level) ? read_avx512(p + begin, end - begin)
           : level == Isa::kAvx2 ? read_avx2(p + begin, end - begin)
                                 : read_scalar(p + begin, end - begin);
  }
  return bits;
}
