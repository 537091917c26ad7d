"""The C++ every source of the ``c`` backend starts with: storage types and their float32
conversions (round to nearest even on store), the ABI checks, and the loop geometry (collapsed
dims for elementwise kernels, rows for row kernels). Kept as text so a generated source is
self-contained and its hash covers everything that is compiled."""

PRELUDE = r"""
#ifndef ACG_HD  // __host__ __device__ under CUDA (the cuda backend defines it first)
#define ACG_HD
#endif
#ifndef __CUDACC__
#include <immintrin.h>
#include <omp.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#include "anychip/kernel.h"

namespace acg {

struct bf16 { uint16_t bits; };
struct fp16 { uint16_t bits; };
struct b8 { uint8_t v; };  // bool storage: any non-zero byte is true

template <class T> constexpr int32_t dtype_id();
template <> constexpr int32_t dtype_id<float>() { return ANYCHIP_DTYPE_FLOAT32; }
template <> constexpr int32_t dtype_id<fp16>() { return ANYCHIP_DTYPE_FLOAT16; }
template <> constexpr int32_t dtype_id<bf16>() { return ANYCHIP_DTYPE_BFLOAT16; }
template <> constexpr int32_t dtype_id<double>() { return ANYCHIP_DTYPE_FLOAT64; }
template <> constexpr int32_t dtype_id<int32_t>() { return ANYCHIP_DTYPE_INT32; }
template <> constexpr int32_t dtype_id<int64_t>() { return ANYCHIP_DTYPE_INT64; }
template <> constexpr int32_t dtype_id<int8_t>() { return ANYCHIP_DTYPE_INT8; }
template <> constexpr int32_t dtype_id<b8>() { return ANYCHIP_DTYPE_BOOL; }

ACG_HD inline float load(float v) { return v; }
ACG_HD inline double load(double v) { return v; }
ACG_HD inline int32_t load(int32_t v) { return v; }
ACG_HD inline int64_t load(int64_t v) { return v; }
ACG_HD inline int32_t load(int8_t v) { return v; }
ACG_HD inline bool load(b8 v) { return v.v != 0; }
ACG_HD inline float load(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
ACG_HD inline float load(fp16 h) {
  uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000) << 16;
  uint32_t e = (h.bits >> 10) & 0x1f, mant = h.bits & 0x3ff, bits;
  if (e == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      e = 127 - 15 + 1;
      while ((mant & 0x400) == 0) { mant <<= 1; --e; }
      bits = sign | (e << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (e == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((e + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// Storing converts the compute value: floats round to nearest even (NaN stays a quiet NaN),
// float -> int truncates toward zero, anything -> bool is "!= 0".
template <class S> struct Store;
template <> struct Store<float> { template <class V> ACG_HD static float of(V v) { return static_cast<float>(v); } };
template <> struct Store<double> { template <class V> ACG_HD static double of(V v) { return static_cast<double>(v); } };
template <> struct Store<int32_t> { template <class V> ACG_HD static int32_t of(V v) { return static_cast<int32_t>(v); } };
template <> struct Store<int64_t> { template <class V> ACG_HD static int64_t of(V v) { return static_cast<int64_t>(v); } };
template <> struct Store<int8_t> {  // from a float: toward zero, saturating, NaN -> 0; ints wrap
  template <class V> ACG_HD static int8_t of(V v) {
    if constexpr (std::is_floating_point<V>::value) {
      if (!(v == v)) return 0;
      return static_cast<int8_t>(v <= V(-128) ? V(-128) : v >= V(127) ? V(127) : v);
    } else {
      return static_cast<int8_t>(v);
    }
  }
};
template <> struct Store<b8> { template <class V> ACG_HD static b8 of(V v) { return b8{static_cast<uint8_t>(v != 0)}; } };
template <> struct Store<bf16> {
  template <class V> ACG_HD static bf16 of(V v) {
    float f = static_cast<float>(v);
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{static_cast<uint16_t>(u >> 16)};
  }
};
template <> struct Store<fp16> {
  template <class V> ACG_HD static fp16 of(V v) {
    float f = static_cast<float>(v);
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return fp16{static_cast<uint16_t>(sign | 0x7e00)};
    if (a >= 0x477ff000u) return fp16{static_cast<uint16_t>(sign | 0x7c00)};
    if (a < 0x38800000u) {  // subnormal or zero in fp16
      if (a < 0x33000000u) return fp16{sign};
      uint32_t mant = (a & 0x7fffff) | 0x800000;
      int shift = 126 - static_cast<int>(a >> 23);
      uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
      if (rem > mid || (rem == mid && (half & 1))) ++half;
      return fp16{static_cast<uint16_t>(sign | half)};
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return fp16{static_cast<uint16_t>(sign | (r >> 13))};
  }
};
template <class S, class V> ACG_HD inline S store(V v) { return Store<S>::of(v); }
// What storing as S and loading back gives (Cast in the description).
template <class S, class V> ACG_HD inline auto round_to(V v) { return load(store<S>(v)); }

// The math of the description, in the compute type.
#ifdef __CUDACC__
ACG_HD inline float exp(float x) { return expf(x); }
#else
// e^x in float32, branch-free so that loops over it vectorise (glibc's expf does not, short of
// -ffast-math, and bounded elementwise kernels at a sixth of memory bandwidth): x = n ln2 + r
// (Cody-Waite, two parts), Cephes' degree-6 polynomial for e^r on |r| <= ln2 / 2, and 2^n as two
// power-of-two factors so that subnormal results come out right. Within 1 ulp of the exact
// value on the test's 200k-point sweep of the whole range, 1.01 ulp at worst over 100M random
// points (the float32 polynomial's own rounding); +inf above ln(FLT_MAX), 0 below the smallest
// subnormal, NaN for NaN.
inline float exp(float x) {
  const float hi = 88.72283935546875f, lo = -103.97208404541015625f;
  const float xc = x > hi ? hi : (x < lo ? lo : x);  // selects, not fmaxf: those GCC will not vectorise
  const float n = __builtin_rintf(xc * 1.44269504088896341f);
  float r = fmaf(n, -0.693359375f, xc);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  const float e = fmaf(p, r * r, r) + 1.0f;
  const int32_t ni = static_cast<int32_t>(n), n1 = ni >> 1;
  const float s1 = __builtin_bit_cast(float, (n1 + 127) << 23);
  const float s2 = __builtin_bit_cast(float, (ni - n1 + 127) << 23);
  const float y = x > hi ? INFINITY : e * s1 * s2;
  return x != x ? x : y;
}
#endif
}  // namespace acg

#if !defined(__CUDACC__) && defined(__AVX512F__)
// The same e^x, 16 lanes at a time with vscalefps, which applies 2^n with one rounding (into the
// subnormals too) and overflows to inf by itself: about half the vector operations of the
// polynomial's branch-free scalar form, which kept exp compute-bound (over 64 MB on 2 threads:
// 24 GB/s against 15). Vectorised loops call it through the `declare simd` below (the vector
// ABI's name for a 16-lane AVX-512 variant of acg_exp_scalar); each library keeps its own copy.
extern "C" {
__attribute__((weak, visibility("hidden"))) float acg_exp_scalar(float x) { return acg::exp(x); }
// const: it reads no memory, so loops keep their pointers in registers around the call
#pragma omp declare simd simdlen(16) notinbranch
__attribute__((const)) float acg_exp_lanes(float) __asm__("acg_exp_scalar");
__attribute__((weak, visibility("hidden"))) __m512 _ZGVeN16v_acg_exp_scalar(__m512 x) {
  // min(hi, max(lo, x)): a NaN x comes through both (they return their second operand for NaN)
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.72283935546875f),
                                  _mm512_max_ps(_mm512_set1_ps(-103.97208404541015625f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), xc);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(e, n);
}
}
namespace acg {
inline float exp_lanes(float x) { return acg_exp_lanes(x); }
}  // namespace acg
#define ACG_EXP acg::exp_lanes
#else
#define ACG_EXP acg::exp
#endif

namespace acg {
ACG_HD inline float sigmoid(float x) { return 1.0f / (1.0f + ACG_EXP(-x)); }
ACG_HD inline float silu(float x) { return x / (1.0f + ACG_EXP(-x)); }
ACG_HD inline float rsqrt(float x) { return 1.0f / sqrtf(x); }
template <class V> ACG_HD inline V vmax(V a, V b) { return a != a ? a : (a > b ? a : b); }  // NaN propagates
template <class V> ACG_HD inline V vmin(V a, V b) { return a != a ? a : (a < b ? a : b); }

#ifndef __CUDACC__
inline int threads(const AnychipKernelCall* call) {
  return call->num_threads > 0 ? call->num_threads : omp_get_max_threads();
}
#endif

inline AnychipStatus fail(const AnychipKernelCall* call, const char* kernel, const char* what) {
  if (call->error != nullptr && call->error_size > 0) {
    std::snprintf(call->error, call->error_size, "%s (generated): %s", kernel, what);
  }
  return ANYCHIP_ERROR_UNSUPPORTED;
}

inline int64_t count(const AnychipTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.shape[d];
  return n;
}

inline bool dense(const AnychipTensor& t) {  // an empty tensor addresses nothing: dense
  if (count(t) == 0) return true;
  int64_t expect = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expect) return false;
    expect *= t.shape[d];
  }
  return true;
}

// Checks the call's tensor counts and dtypes: `ids` lists the expected dtype of every input,
// then every output (-1: any).
inline const char* check(const AnychipKernelCall* call, int nin, int nout, const int32_t* ids) {
  static thread_local char msg[160];
  if (call->num_inputs != nin || call->num_outputs != nout) {
    std::snprintf(msg, sizeof msg, "expected %d inputs and %d outputs, got %d and %d", nin, nout,
                  call->num_inputs, call->num_outputs);
    return msg;
  }
  for (int i = 0; i < nin + nout; ++i) {
    const AnychipTensor& t = i < nin ? call->inputs[i] : call->outputs[i - nin];
    if (ids[i] >= 0 && t.dtype != ids[i]) {
      std::snprintf(msg, sizeof msg, "%s %d has dtype %d, expected %d", i < nin ? "input" : "output",
                    i < nin ? i : i - nin, t.dtype, ids[i]);
      return msg;
    }
  }
  return nullptr;
}

#ifndef __CUDACC__
// Elementwise loops run in blocks of kBlock elements and, before each, prefetch every streamed
// tensor kAheadBytes ahead (outputs for writing). The hardware prefetcher alone leaves a kernel
// that computes much per element stalled on memory: e^x over 64 MB on 2 threads ran at 25 GB/s
// beside a 34 GB/s copy, with its arithmetic alone good for 85 GB/s; prefetched, 32-35 GB/s.
constexpr int64_t kBlock = 64;
constexpr int kAheadBytes = 2048;

template <bool Write, class T>
inline void prefetch_block(const T* p) {
  const char* ahead = reinterpret_cast<const char*>(p) + kAheadBytes;
  for (int b = 0; b < static_cast<int>(kBlock * sizeof(T)); b += 64) __builtin_prefetch(ahead + b, Write, 3);
}

inline int line_offset(const void* p) { return static_cast<int>(reinterpret_cast<uintptr_t>(p) % 64); }

// elements of *p before the first 64-byte boundary at or after p
template <class T>
inline int64_t lead_elements(const T* p) {
  return static_cast<int64_t>((64 - line_offset(p)) % 64 / sizeof(T));
}

// Outputs at least this large (all of a call's rows together, or a flat elementwise output) are
// written through an L1 buffer with non-temporal stores, so that the lines they overwrite are
// not first read from memory (a third of a row kernel's traffic); smaller ones stay in the cache
// for the next op.
constexpr int64_t kStreamMinBytes = int64_t{8} << 20;

// Whether a pipelined row kernel (c.py's _pipelined) walks a row's four quarters side by side,
// as four streams, or one after another, as one. Measured both ways: on an AVX-512 Xeon
// (Emerald Rapids) side by side made RMSNorm [4096, 4096] from DRAM 1.17-1.25x -> 1.10-1.12x
// the hand-written kernel's time; on an AVX2 EPYC (Zen 3) it took 27 ms side by side and ~4 ms
// one after another (hand-written: 4.3 ms), its non-temporal stores going to four places in
// each row. The sums are the same either way.
#ifdef __AVX512F__
constexpr bool kQuartersSideBySide = true;
#else
constexpr bool kQuartersSideBySide = false;
#endif

// bytes from src to dst, the 64-byte-aligned middle with non-temporal stores, then (`fence`) a
// fence so that they are ordered before this thread's later stores; a caller streaming many
// pieces fences once at the end.
inline void stream_bytes(void* dst, const void* src, int64_t bytes, bool fence = true) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  int64_t head = static_cast<int64_t>((64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  head = head < bytes ? head : bytes;
  memcpy(d, s, static_cast<size_t>(head));
  d += head, s += head, bytes -= head;
#ifdef __AVX512F__
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
#else
  for (; bytes >= 16; bytes -= 16, d += 16, s += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
#endif
  memcpy(d, s, static_cast<size_t>(bytes));
  if (fence) _mm_sfence();
}

// A block of 16 elements from src (64-byte aligned) to dst with non-temporal stores, or a plain
// copy where dst is not aligned for them (a row that starts mid-line). The caller fences once
// after its last block.
template <class T>
inline void stream_block(T* dst, const T* src) {
  constexpr int kBytes = 16 * static_cast<int>(sizeof(T));
#ifdef __AVX512F__
  constexpr int kStore = kBytes >= 64 ? 64 : 16;
#else
  constexpr int kStore = 16;
#endif
  auto* d = reinterpret_cast<char*>(dst);
  const auto* s = reinterpret_cast<const char*>(src);
  if (kBytes < kStore || reinterpret_cast<uintptr_t>(d) % kStore != 0) {
    memcpy(d, s, kBytes);
    return;
  }
#ifdef __AVX512F__
  if constexpr (kStore == 64) {
    for (int b = 0; b < kBytes; b += 64)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d + b), _mm512_load_si512(s + b));
    return;
  }
#endif
  for (int b = 0; b < kBytes; b += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + b), _mm_load_si128(reinterpret_cast<const __m128i*>(s + b)));
}
#endif

// ---- elementwise geometry: the output's index space, dims collapsed -----------------------

template <int N>
struct Loop {
  int rank = 0;
  int64_t shape[ANYCHIP_MAX_RANK];
  int64_t strides[N][ANYCHIP_MAX_RANK];
  int64_t n = 1;
  bool flat = false;  // one dim, every tensor with stride 1

  // The element offsets of outer index `o` (all dims but the last), per tensor.
  ACG_HD void offsets(int64_t o, int64_t* off) const {
    for (int t = 0; t < N; ++t) off[t] = 0;
    for (int d = rank - 2; d >= 0; --d) {
      const int64_t i = o % shape[d];
      o /= shape[d];
      for (int t = 0; t < N; ++t) off[t] += i * strides[t][d];
    }
  }
};

// Builds the loop over `out`'s shape for tensors ts[0..N) (inputs then outputs, each with the
// output's rank), dropping size-1 dims and merging dims that are contiguous in every tensor.
template <int N>
inline const char* make_loop(const AnychipTensor* const* ts, const AnychipTensor& out, Loop<N>* L) {
  static thread_local char msg[160];
  for (int t = 0; t < N; ++t) {
    if (ts[t]->rank != out.rank) {
      std::snprintf(msg, sizeof msg, "tensor %d has rank %d, expected the output's rank %d (broadcast "
                    "inputs are described with the output's shape and stride 0)", t, ts[t]->rank, out.rank);
      return msg;
    }
    for (int d = 0; d < out.rank; ++d) {
      if (ts[t]->shape[d] != out.shape[d]) {
        std::snprintf(msg, sizeof msg, "tensor %d has size %lld in dim %d, expected the output's %lld", t,
                      (long long)ts[t]->shape[d], d, (long long)out.shape[d]);
        return msg;
      }
    }
  }
  L->rank = 0;
  for (int d = 0; d < out.rank; ++d) {
    const int64_t size = out.shape[d];
    L->n *= size;
    if (size == 1) continue;
    bool merge = L->rank > 0;
    for (int t = 0; t < N && merge; ++t) {
      merge = L->strides[t][L->rank - 1] == ts[t]->strides[d] * size;
    }
    if (merge) {
      L->shape[L->rank - 1] *= size;
      for (int t = 0; t < N; ++t) L->strides[t][L->rank - 1] = ts[t]->strides[d];
    } else {
      L->shape[L->rank] = size;
      for (int t = 0; t < N; ++t) L->strides[t][L->rank] = ts[t]->strides[d];
      ++L->rank;
    }
  }
  if (L->rank == 0) {  // a scalar (or all dims 1): one element at offset 0
    L->rank = 1;
    L->shape[0] = 1;
    for (int t = 0; t < N; ++t) L->strides[t][0] = 1;
  }
  L->flat = L->rank == 1;
  for (int t = 0; t < N && L->flat; ++t) L->flat = L->strides[t][0] == 1;
  return nullptr;
}

// ---- row geometry -------------------------------------------------------------------------

// The rows of a row kernel: the dims of the first input split into row dims and the other
// ("kept") dims. Rows are numbered in row-major order of the kept dims; positions in a row in
// row-major order of the row dims.
struct Rows {
  int rank = 0;
  int64_t shape[ANYCHIP_MAX_RANK];
  bool in_row[ANYCHIP_MAX_RANK];
  int64_t rows = 1, len = 1;
  int row_rank = 0;               // number of row dims of size > 1
  int row_dim[ANYCHIP_MAX_RANK];  // those dims

  // Offset of row r's first element in a tensor of this shape with `strides`.
  ACG_HD int64_t row_offset(const int64_t* strides, int64_t r) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      if (in_row[d]) continue;
      off += (r % shape[d]) * strides[d];
      r /= shape[d];
    }
    return off;
  }
  // Offset of position c within a row (any number of row dims).
  ACG_HD int64_t position_offset(const int64_t* strides, int64_t c) const {
    int64_t off = 0;
    for (int k = row_rank - 1; k >= 0; --k) {
      const int d = row_dim[k];
      off += (c % shape[d]) * strides[d];
      c /= shape[d];
    }
    return off;
  }
  // The element stride along the row when it has at most one dim of size > 1.
  ACG_HD int64_t step(const int64_t* strides) const { return row_rank == 1 ? strides[row_dim[0]] : 1; }
};

inline const char* make_rows(const AnychipTensor& x, const bool* in_row, Rows* R) {
  R->rank = x.rank;
  for (int d = 0; d < x.rank; ++d) {
    R->shape[d] = x.shape[d];
    R->in_row[d] = in_row[d];
    if (in_row[d]) {
      R->len *= x.shape[d];
      if (x.shape[d] != 1) R->row_dim[R->row_rank++] = d;
    } else {
      R->rows *= x.shape[d];
    }
  }
  return nullptr;
}

inline bool same_shape(const AnychipTensor& a, const AnychipTensor& b) {
  if (a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d) if (a.shape[d] != b.shape[d]) return false;
  return true;
}

// Which dims of x make a row, from the call: the last, attrs[attr] (one axis, may be negative),
// or attrs[attr] = n axes at attrs[attr + 1 ..] (n = 0: all).
inline const char* row_dims_last(const AnychipTensor& x, bool* in_row) {
  for (int d = 0; d < x.rank; ++d) in_row[d] = d == x.rank - 1;
  return nullptr;
}
inline const char* row_dims_axis(const AnychipKernelCall* call, int attr, const AnychipTensor& x, bool* in_row) {
  int64_t axis = call->num_attrs > attr ? static_cast<int64_t>(call->attrs[attr]) : -1;
  if (axis < 0) axis += x.rank;
  if (x.rank > 0 && (axis < 0 || axis >= x.rank)) return "axis attr out of range";
  for (int d = 0; d < x.rank; ++d) in_row[d] = d == axis;
  return nullptr;
}
inline const char* row_dims_axes(const AnychipKernelCall* call, int attr, const AnychipTensor& x, bool* in_row) {
  const int64_t n = call->num_attrs > attr ? static_cast<int64_t>(call->attrs[attr]) : 0;
  if (call->num_attrs < attr + 1 + n) return "fewer axis attrs than the count says";
  for (int d = 0; d < x.rank; ++d) in_row[d] = n == 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t axis = static_cast<int64_t>(call->attrs[attr + 1 + k]);
    if (axis < 0 || axis >= x.rank) return "axis attr out of range";
    in_row[axis] = true;
  }
  return nullptr;
}

inline int64_t part(int64_t n, int64_t parts, int64_t i) { return n * i / parts; }

// ---- indexing (gather and scatter kernels) ------------------------------------------------

// A message naming the first of idx[0..n) outside [0, limit), or nullptr.
inline const char* bad_index(const int64_t* idx, int64_t n, int64_t limit) {
  static thread_local char msg[160];
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= limit) {
      std::snprintf(msg, sizeof msg, "index %lld at position %lld is outside [0, %lld)", (long long)idx[i],
                    (long long)i, (long long)limit);
      return msg;
    }
  }
  return nullptr;
}

// ---- matrices and batches (contraction kernels) -------------------------------------------

// The last two dims of a tensor as a matrix: element (r, c) at r * rs + c * cs; transposing
// swaps the strides.
struct Mat { int64_t rows, cols, rs, cs; };
inline Mat mat(const AnychipTensor& t, bool transposed) {
  const int r = t.rank;
  Mat m{t.shape[r - 2], t.shape[r - 1], t.strides[r - 2], t.strides[r - 1]};
  return transposed ? Mat{m.cols, m.rows, m.cs, m.rs} : m;
}

#ifndef __CUDACC__
// sum of a[l] * b[l] over l < len, in 16 partial sums combined in order (vectorised along l).
template <class T>
inline float dot(const float* a, const T* b, int64_t len) {
  float p[16] = {};
  int64_t l = 0;
  for (; l + 16 <= len; l += 16) {
#pragma omp simd
    for (int j = 0; j < 16; ++j) p[j] += a[l + j] * load(b[l + j]);
  }
  for (int j = 0; l + j < len; ++j) p[j] += a[l + j] * load(b[l + j]);
  float s = p[0];
  for (int j = 1; j < 16; ++j) s += p[j];
  return s;
}
#endif

// The batch: the leading dims of one tensor. Batch b of it lies in another tensor t whose own
// leading dims are right-aligned with them; a dim t lacks or has as 1 is broadcast (offset 0).
struct Batch {
  int rank = 0;
  int64_t shape[ANYCHIP_MAX_RANK] = {};
  int64_t count = 1;

  explicit Batch(const AnychipTensor& t) : rank(t.rank - 2) {
    for (int d = 0; d < rank; ++d) count *= (shape[d] = t.shape[d]);
  }
  int64_t offset(const AnychipTensor& t, int64_t b) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t i = b % shape[d];
      b /= shape[d];
      const int e = d - (rank - (t.rank - 2));
      if (e >= 0 && t.shape[e] != 1) off += i * t.strides[e];
    }
    return off;
  }
  // Why t's leading dims do not fit this batch, or nullptr.
  const char* misfit(const AnychipTensor& t) const {
    if (t.rank - 2 > rank) return "has more batch dims than the batch";
    for (int e = 0; e < t.rank - 2; ++e) {
      const int64_t size = t.shape[e], want = shape[e + rank - (t.rank - 2)];
      if (size != 1 && size != want) return "has a batch dim that is neither 1 nor the batch's";
    }
    return nullptr;
  }
  // The batches grouped by where they land in t, groups in order of first appearance.
  void groups(const AnychipTensor& t, std::vector<int64_t>* keys, std::vector<std::vector<int64_t>>* members) const {
    for (int64_t b = 0; b < count; ++b) {
      const int64_t key = offset(t, b);
      size_t g = 0;
      while (g < keys->size() && (*keys)[g] != key) ++g;
      if (g == keys->size()) {
        keys->push_back(key);
        members->emplace_back();
      }
      (*members)[g].push_back(b);
    }
  }
};

}  // namespace acg
"""
