// AMX attention engine for bfloat16: QK^T and PV on tiles (bf16 in, fp32 accumulate); the
// softmax and everything else is the AVX-512 bf16 engine's. The probabilities enter the PV
// product rounded to bf16.
//
// Layouts (all tiles 16 rows x 64 bytes):
//   q pack  bf16 [rows][Dp]                      A operand of QK^T, 16 query rows per tile
//   k pack  bf16 pairs [Dp/2][kKeyTile][2]       B operand: k[j][2p], k[j][2p+1] at (p, j)
//   v pack  bf16 pairs [kKeyTile/2][Dp][2]       B operand: v[2q][c], v[2q+1][c] at (q, c)
//   p       bf16 [rows][kKeyTile]                A operand of PV
// The backward adds the pair layout of q / dO rows (B operand of dK, dV += dS^T Q, P^T dO) and
// of k (B operand of dQ += dS K); P and dS enter these products rounded to bf16.
#include "attention_simd.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,amx-tile,amx-bf16")

namespace anychip::cpu::attn {
namespace {

using simd::dpad;
using simd::first_lanes;

// Every tile is 16 rows x 64 bytes. A constant in memory: GCC does not see that
// _tile_loadconfig reads its operand and drops stores to a local one.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
constexpr TileConfig kTiles = {1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

// The first `count` of 32 16-bit lanes.
__mmask32 word_lanes(int count) {
  return _cvtu32_mask32(count >= 32 ? ~0u : count > 0 ? (1u << count) - 1 : 0u);
}

// GCC's _tile_loadd asm declares no memory read, so without this the compiler could move
// earlier stores into a packed buffer past the tile loads that read it.
inline void publish_stores() { asm volatile("" ::: "memory"); }

void begin_thread() { _tile_loadconfig(&kTiles); }

void end_thread() { _tile_release(); }

void pack_q(const void* const* rows, int m, int d, void* qp) {
  const int dp = dpad(d);
  const int mp = static_cast<int>(round_up(m, 32));
  auto* out = static_cast<uint16_t*>(qp);
  for (int r = 0; r < mp; ++r)
    for (int c = 0; c < dp; c += 32) {
      __m512i v = _mm512_setzero_si512();
      if (r < m) v = _mm512_maskz_loadu_epi16(word_lanes(d - c), static_cast<const uint16_t*>(rows[r]) + c);
      _mm512_storeu_si512(out + r * dp + c, v);
    }
}

// 32-bit transpose of the key tile: word (p, j) = the bf16 pair k[j][2p], k[j][2p + 1].
void pack_k(const void* k, int64_t ld, int n, int d, void* kp) {
  const auto* src = static_cast<const uint16_t*>(k);
  auto* out = static_cast<uint32_t*>(kp);
  const int dp = dpad(d);
  for (int k0 = 0; k0 < kKeyTile; k0 += 16)
    for (int c0 = 0; c0 < dp; c0 += 32) {
      const __mmask32 cols = word_lanes(d - c0);
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = _mm512_castsi512_ps(k0 + i < n ? _mm512_maskz_loadu_epi16(cols, src + (k0 + i) * ld + c0)
                                              : _mm512_setzero_si512());
      simd::transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + (c0 / 2 + i) * kKeyTile + k0, r[i]);
    }
}

// Pair layout of `rows` rows [rows][d] (row stride ld; rows n.. read as zero): word (q, c) of
// out [rows / 2][Dp] holds x[2q][c], x[2q + 1][c] -- a B operand whose K dimension is the rows.
void interleave_rows(const uint16_t* src, int64_t ld, int n, int rows, int d, uint16_t* out) {
  const int dp = dpad(d);
  alignas(64) static constexpr uint16_t kLo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                   8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                   24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_load_si512(kHi);
  for (int q = 0; q < rows / 2; ++q)
    for (int c = 0; c < dp; c += 32) {
      const __mmask32 cols = word_lanes(d - c);
      const __m512i a = _mm512_maskz_loadu_epi16(2 * q < n ? cols : 0, src + (2 * q) * ld + c);
      const __m512i b = _mm512_maskz_loadu_epi16(2 * q + 1 < n ? cols : 0, src + (2 * q + 1) * ld + c);
      _mm512_storeu_si512(out + 2 * (q * dp + c), _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(out + 2 * (q * dp + c + 16), _mm512_permutex2var_epi16(a, hi, b));
    }
}

const void* pack_v(const void* v, int64_t ld, int n, int d, void* vp, int64_t* ldv) {
  interleave_rows(static_cast<const uint16_t*>(v), ld, n, kKeyTile, d, static_cast<uint16_t*>(vp));
  *ldv = dpad(d);
  return vp;
}

void scores(const void* qp, const void* kp, int m, int d, int n, float c, float pad, float* t) {
  const int dp = dpad(d);
  const auto* q = static_cast<const uint16_t*>(qp);
  const auto* k = static_cast<const uint32_t*>(kp);
  const int rows = static_cast<int>(round_up(m, 16));
  publish_stores();
  for (int r0 = 0; r0 < rows; r0 += 32) {
    const bool two = r0 + 16 < rows;
    for (int j0 = 0; j0 < n; j0 += 32) {
      _tile_zero(0);
      _tile_zero(1);
      if (two) {
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int c0 = 0; c0 < dp; c0 += 32) {
        _tile_loadd(4, q + r0 * dp + c0, dp * 2);
        _tile_loadd(6, k + (c0 / 2) * kKeyTile + j0, kKeyTile * 4);
        _tile_loadd(7, k + (c0 / 2) * kKeyTile + j0 + 16, kKeyTile * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, q + (r0 + 16) * dp + c0, dp * 2);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, t + r0 * kKeyTile + j0, kKeyTile * 4);
      _tile_stored(1, t + r0 * kKeyTile + j0 + 16, kKeyTile * 4);
      if (two) {
        _tile_stored(2, t + (r0 + 16) * kKeyTile + j0, kKeyTile * 4);
        _tile_stored(3, t + (r0 + 16) * kKeyTile + j0 + 16, kKeyTile * 4);
      }
    }
  }
  const __m512 vc = _mm512_set1_ps(c);
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < kKeyTile; j += 16) {
      float* x = t + r * kKeyTile + j;
      const __m512 s = j < n ? _mm512_mul_ps(_mm512_loadu_ps(x), vc) : _mm512_setzero_ps();
      _mm512_storeu_ps(x, _mm512_mask_blend_ps(first_lanes(n - j), _mm512_set1_ps(pad), s));
    }
}

void softmax(const float* t, int m, float* mx, float* l, float* alpha, void* p) {
  simd::softmax<2>(t, m, mx, l, alpha, p);
  // The PV tiles read whole 16-row blocks: rows past m hold zeros, not stale probabilities.
  auto* pr = static_cast<uint16_t*>(p);
  for (int r = m; r < round_up(m, 16); ++r)
    for (int j = 0; j < kKeyTile; j += 32) _mm512_storeu_si512(pr + r * kKeyTile + j, _mm512_setzero_si512());
}

// acc[rows][Dp] += a[rows][kn] b[kn][Dp] on tiles: a bf16 (row stride lda), b in pair layout;
// rows a multiple of 16, kn of 32.
void tile_gemm(const uint16_t* a, int lda, int rows, const uint32_t* b, int kn, int dp, float* acc) {
  publish_stores();
  for (int r0 = 0; r0 < rows; r0 += 32) {
    const bool two = r0 + 16 < rows;
    for (int c0 = 0; c0 < dp; c0 += 32) {
      float* a0 = acc + r0 * dp + c0;
      _tile_loadd(0, a0, dp * 4);
      _tile_loadd(1, a0 + 16, dp * 4);
      if (two) {
        _tile_loadd(2, a0 + 16 * dp, dp * 4);
        _tile_loadd(3, a0 + 16 * dp + 16, dp * 4);
      }
      for (int k0 = 0; k0 < kn; k0 += 32) {
        _tile_loadd(4, a + r0 * lda + k0, lda * 2);
        _tile_loadd(6, b + (k0 / 2) * dp + c0, dp * 4);
        _tile_loadd(7, b + (k0 / 2) * dp + c0 + 16, dp * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, a + (r0 + 16) * lda + k0, lda * 2);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, a0, dp * 4);
      _tile_stored(1, a0 + 16, dp * 4);
      if (two) {
        _tile_stored(2, a0 + 16 * dp, dp * 4);
        _tile_stored(3, a0 + 16 * dp + 16, dp * 4);
      }
    }
  }
}

void pv(const void* pp, const void* vp, int64_t, int m, int n, int d, const float* alpha, float* acc) {
  const int dp = dpad(d);
  for (int r = 0; r < m; ++r) {
    if (alpha[r] == 1.0f) continue;  // the common case once a row's max settles
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < dp; c += 16) _mm512_storeu_ps(acc + r * dp + c, _mm512_mul_ps(_mm512_loadu_ps(acc + r * dp + c), a));
  }
  tile_gemm(static_cast<const uint16_t*>(pp), kKeyTile, static_cast<int>(round_up(m, 16)),
            static_cast<const uint32_t*>(vp), static_cast<int>(round_up(n, 32)), dp, acc);
}

// The q pack, then the pair layout of the same rows.
void pack_rows(const void* const* rows, int m, int d, void* xp) {
  pack_q(rows, m, d, xp);
  auto* a = static_cast<uint16_t*>(xp);
  const int mp = static_cast<int>(round_up(m, 32));
  interleave_rows(a, dpad(d), mp, mp, d, a + kRowTile * dpad(d));
}

// The k pack, then the pair layout of the keys.
void pack_keys(const void* x, int64_t ld, int n, int d, void* kp) {
  pack_k(x, ld, n, d, kp);
  interleave_rows(static_cast<const uint16_t*>(x), ld, n, kKeyTile, d,
                  reinterpret_cast<uint16_t*>(static_cast<float*>(kp) + kKeyTile * dpad(d)));
}

// acc[j] += sum_r a[r][j] x_r: a (P or dS) transposed to bf16 [kKeyTile][Mp], times the pair
// layout of the row pack.
void accum_keys(const float* a, const void* xp, int m, int d, float* acc) {
  const int mp = static_cast<int>(round_up(m, 32));
  alignas(64) uint16_t at[kKeyTile * kRowTile];
  for (int r0 = 0; r0 < mp; r0 += 16)
    for (int k0 = 0; k0 < kKeyTile; k0 += 16) {
      __m512 x[16];
      for (int i = 0; i < 16; ++i)
        x[i] = r0 + i < m ? _mm512_loadu_ps(a + (r0 + i) * kKeyTile + k0) : _mm512_setzero_ps();
      simd::transpose16(x);
      for (int i = 0; i < 16; ++i)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + (k0 + i) * mp + r0), (__m256i)_mm512_cvtneps_pbh(x[i]));
    }
  const auto* pairs = reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(xp) + kRowTile * dpad(d));
  tile_gemm(at, mp, kKeyTile, pairs, mp, dpad(d), acc);
}

// acc[r] += sum_j a[r][j] k_j: a (dS) in bf16 times the pair layout of the keys.
void accum_rows(const float* a, const void* kp, int m, int n, int d, float* acc) {
  const int rows = static_cast<int>(round_up(m, 16));
  alignas(64) uint16_t ab[kRowTile * kKeyTile];
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < kKeyTile; j += 32) {
      __m512i v = _mm512_setzero_si512();
      if (r < m)
        v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(a + r * kKeyTile + j + 16), _mm512_loadu_ps(a + r * kKeyTile + j));
      _mm512_storeu_si512(ab + r * kKeyTile + j, v);
    }
  const auto* keys = reinterpret_cast<const uint32_t*>(static_cast<const float*>(kp) + kKeyTile * dpad(d));
  tile_gemm(ab, kKeyTile, rows, keys, static_cast<int>(round_up(n, 32)), dpad(d), acc);
}

}  // namespace

const Engine* amx_engine(int32_t dtype) {
  if (dtype != ANYCHIP_DTYPE_BFLOAT16) return nullptr;
  static const Engine e = [] {
    Engine x = *avx512_engine(ANYCHIP_DTYPE_BFLOAT16);
    x.begin_thread = begin_thread;
    x.end_thread = end_thread;
    x.pack_q = pack_q;
    x.pack_k = pack_k;
    x.pack_v = pack_v;
    x.scores = scores;
    x.softmax = softmax;
    x.pv = pv;
    x.pack_rows = pack_rows;
    x.pack_keys = pack_keys;
    x.accum_keys = accum_keys;
    x.accum_rows = accum_rows;
    return x;
  }();
  return &e;
}

}  // namespace anychip::cpu::attn

#pragma GCC pop_options
