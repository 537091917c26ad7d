// The arithmetic of flash attention on one (query rows x key tile) block, per ISA and dtype.
//
// The driver (attention_driver.h) owns the loops, the tiling and the masks; every
// floating-point operation happens in an engine function reached through this table. Each
// function is compiled exactly once, so `attention` with a dense mask and `flashmask_attention`
// run bit-identical arithmetic on every tile they both compute: they differ only in which tiles
// they skip and which scores they set to -inf, and a skipped tile is always one whose every
// score would have been -inf.
//
// Buffers, all allocated as floats (Dp = roundup(D, 32); a row tile has M <= kRowTile rows):
//   q / row pack   kRowTile * Dp       engine layout of the tile's q (or dO) rows
//   k pack         kKeyTile * Dp       engine layout of a key tile (key pack: twice that)
//   v pack         kKeyTile * Dp       engine layout of a value tile (fp32 inputs: v in place)
//   t, dp          [kRowTile][kKeyTile] fp32 scores in log2 units, then probabilities / dS
//   p              [kRowTile][kKeyTile] probabilities in the PV operand dtype
//   acc            [kRowTile][Dp]       fp32 running output (rows past M are scratch)
#pragma once

#include <cstdint>

#include "common.h"

namespace anychip::cpu::attn {

constexpr int kKeyTile = 64;  // keys per tile
constexpr int kRowTile = 64;  // query rows per row tile at most
constexpr int kMaxSplits = 64;  // key chunks of one row tile, merged by `combine`

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Which scores of a row tile x key tile block are hidden. Rows are `heads` runs of `positions`
// consecutive query positions starting at i0 (row r: head r / positions, position
// i0 + r % positions). Pure selection: applying it only writes -inf.
struct TileMask {
  int heads = 1, positions = 0;
  int64_t i0 = 0, j0 = 0;
  int n = 0;                        // valid keys in the tile
  bool causal = false;
  int64_t causal_offset = 0;        // key j visible to query i iff j <= i + causal_offset
  // Dense bool mask (if has_dense): per head of the tile, its [Sq, Sk] plane, row stride dense_ld.
  bool has_dense = false;
  const uint8_t* dense[kRowTile];
  int64_t dense_ld = 0;
  // FlashMask (if rule != kFlashNone): per head of the tile, its bound columns [E][Sk]:
  // column e starts at bounds[h] + e * bounds_ld.
  int rule = 0;
  const int32_t* bounds[kRowTile];
  int64_t bounds_ld = 0;
};

// How FlashMask's bound columns hide query row i from key j (anychip/kernel.h).
enum FlashRule {
  kFlashNone = 0,
  kFlashLower = 1,       // E=1:         i >= LTS
  kFlashLowerBand = 2,   // E=2 causal:  LTS <= i < LTE
  kFlashLowerUpper = 3,  // E=2:         i >= LTS or i < UTE
  kFlashTwoBands = 4,    // E=4:         LTS <= i < LTE or UTS <= i < UTE
};

struct Engine {
  // Per-thread set-up and tear-down around the tile loops (AMX tile configuration); may be null.
  void (*begin_thread)();
  void (*end_thread)();

  // ---- forward
  // Gathers M query rows (row pointers into q) into the q pack; rows M..roundup(M, 32)-1 are 0.
  void (*pack_q)(const void* const* rows, int m, int d, void* qp);
  // Packs keys [n][d] (row stride ld elements) for `scores`; keys n..kKeyTile-1 read as zero.
  void (*pack_k)(const void* k, int64_t ld, int n, int d, void* kp);
  // Packs values for `pv`; returns what to pass to pv with its row stride in *ldv.
  const void* (*pack_v)(const void* v, int64_t ld, int n, int d, void* vp, int64_t* ldv);
  // t[r][j] = c * x_r . k_j for rows < M, keys < n; keys n.. get `pad`. x is a q pack (or a
  // row pack), k a key pack (or the first part of a pack_keys pack).
  void (*scores)(const void* x, const void* k, int m, int d, int n, float c, float pad, float* t);
  // Sets hidden scores of rows < M to -inf; returns whether any score of those rows is visible.
  bool (*apply_mask)(const TileMask& mask, float* t);
  // Online softmax step over rows < M: updates the row max mx and sum l, returns the factor
  // alpha each row's acc must be scaled by, and writes the probabilities into p.
  void (*softmax)(const float* t, int m, float* mx, float* l, float* alpha, void* p);
  // acc[r] = acc[r] * alpha[r] + sum_{j < n} p[r][j] v[j] for rows < M.
  void (*pv)(const void* p, const void* v, int64_t ldv, int m, int n, int d, const float* alpha, float* acc);
  // o_r = acc_r / l_r (0 where l_r = 0), lse_r = ln(sum exp) (-inf where l_r = 0).
  void (*finalize)(const float* acc, const float* mx, const float* l, int m, int d, void* const* o_rows,
                   float* const* lse);
  // Merges `splits` partial results of the same rows (each: acc [kRowTile][Dp], mx, l), as finalize.
  void (*combine)(const float* const* acc, const float* const* mx, const float* const* l, int splits, int m,
                  int d, void* const* o_rows, float* const* lse);

  // ---- backward (fp32 accumulation; P and dS enter the products in the engine's operand dtype)
  // Gathers M rows (q or dO) into a row pack (<= kRowTile * Dp floats): a q pack for `scores`
  // and the right operand of `accum_keys`; rows M..roundup(M, 32)-1 are 0.
  void (*pack_rows)(const void* const* rows, int m, int d, void* xp);
  // Packs keys [n][d] (k or v) into a key pack (<= 2 * kKeyTile * Dp floats): a `pack_k` pack
  // for `scores`, then the right operand of `accum_rows`; keys n.. read as zero.
  void (*pack_keys)(const void* x, int64_t ld, int n, int d, void* kp);
  // sum_d a[d] * b[d] of two storage-dtype rows.
  float (*row_dot)(const void* a, const void* b, int d);
  // p = exp(t - lse) (t in log2 units, lse natural), ds = p * (dp - delta); rows < M, all keys.
  // Writes p over t and ds over dp.
  void (*grad_scores)(float* t, float* dp, int m, const float* lse, const float* delta);
  // acc[j] += sum_{r < M} a[r][j] x_r for all kKeyTile keys j (acc [kKeyTile][Dp], x a row pack).
  void (*accum_keys)(const float* a, const void* xp, int m, int d, float* acc);
  // acc[r] += sum_{j < n} a[r][j] k_j for rows < M (k a pack_keys pack).
  void (*accum_rows)(const float* a, const void* kp, int m, int n, int d, float* acc);
  // out row r (stride ld elements) = s * acc[r] in the storage dtype, for r < n.
  void (*store_rows)(const float* acc, int n, int d, float s, void* out, int64_t ld);
};

// The engine for a dtype (ANYCHIP_DTYPE_*) on an ISA; null if the dtype is not a float type.
const Engine* engine_for(Isa isa, int32_t dtype);

// Per-ISA tables (attention_engine_{scalar,avx2,avx512,amx}.cc).
const Engine* scalar_engine(int32_t dtype);
const Engine* avx2_engine(int32_t dtype);
const Engine* avx512_engine(int32_t dtype);
const Engine* amx_engine(int32_t dtype);  // bfloat16 only; null otherwise

// Scalar merge of split-key partial results, shared by every engine (attention_engine_scalar.cc).
template <typename T>
void combine_scalar(const float* const* acc, const float* const* mx, const float* const* l, int splits, int m,
                    int d, void* const* o_rows, float* const* lse);

}  // namespace anychip::cpu::attn
