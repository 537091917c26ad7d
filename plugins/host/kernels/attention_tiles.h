// How the attention kernels cut the work: row tiles of query rows (one kv head's group of query
// heads), key tiles of kKeyTile keys, and the mask policies that classify each (row tile, key
// tile) pair as skipped, unmasked or masked element-wise.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention_engine.h"

namespace anychip::cpu::attn {

struct Geometry {
  int64_t batch = 0, sq = 0, sk = 0, hq = 0, hk = 0, d = 0, group = 1;
  bool causal = false;
  int64_t offset = 0;   // causal: key j visible to query i iff j <= i + offset (Sk - Sq)
  float scale = 1.0f;
  float c = 1.0f;       // scale * log2(e): scores are kept in log2 units
  // Row tiles: `heads` query heads x `positions` consecutive queries (<= kRowTile rows). Long
  // queries get one head per tile; short ones (decode) pack the group's heads into one tile so
  // each key tile is loaded once for all of them.
  int positions = 1, heads = 1, head_chunks = 0;
  int64_t position_blocks = 0, key_tiles = 0;
};

inline Geometry make_geometry(const AnychipTensor& q, const AnychipTensor& k, double scale, bool causal) {
  Geometry g;
  g.batch = q.shape[0];
  g.sq = q.shape[1];
  g.hq = q.shape[2];
  g.d = q.shape[3];
  g.sk = k.shape[1];
  g.hk = k.shape[2];
  g.group = g.hk > 0 ? g.hq / g.hk : 1;
  g.causal = causal;
  g.offset = g.sk - g.sq;
  g.scale = static_cast<float>(scale);
  g.c = static_cast<float>(scale * 1.4426950408889634);
  g.positions = static_cast<int>(std::clamp<int64_t>(g.sq, 1, kRowTile));
  g.heads = static_cast<int>(std::clamp<int64_t>(kRowTile / g.positions, 1, std::max<int64_t>(g.group, 1)));
  g.head_chunks = static_cast<int>((g.group + g.heads - 1) / g.heads);
  g.position_blocks = (g.sq + g.positions - 1) / g.positions;
  g.key_tiles = (g.sk + kKeyTile - 1) / kKeyTile;
  return g;
}

struct RowTile {
  int64_t b = 0, h0 = 0, i0 = 0;
  int heads = 0, positions = 0;
  int rows() const { return heads * positions; }
  int64_t head(int r) const { return h0 + r / positions; }
  int64_t position(int r) const { return i0 + r % positions; }
};

// Row tile `chunk` of kv head hk's query heads, position block pb.
inline RowTile row_tile(const Geometry& g, int64_t b, int64_t hk, int64_t pb, int chunk) {
  RowTile rt;
  rt.b = b;
  rt.h0 = hk * g.group + static_cast<int64_t>(chunk) * g.heads;
  rt.heads = static_cast<int>(std::min<int64_t>(g.heads, hk * g.group + g.group - rt.h0));
  rt.i0 = pb * g.positions;
  rt.positions = static_cast<int>(std::min<int64_t>(g.positions, g.sq - rt.i0));
  return rt;
}

enum class TileKind { kSkip, kFull, kPartial };

inline TileKind causal_kind(const Geometry& g, const RowTile& rt, int64_t j0, int n) {
  if (!g.causal) return TileKind::kFull;
  if (j0 > rt.i0 + rt.positions - 1 + g.offset) return TileKind::kSkip;
  if (j0 + n - 1 <= rt.i0 + g.offset) return TileKind::kFull;
  return TileKind::kPartial;
}

// The element-wise description every policy starts from (causal rule only).
inline void base_mask(const Geometry& g, const RowTile& rt, int64_t j0, int n, TileMask* tm) {
  tm->heads = rt.heads;
  tm->positions = rt.positions;
  tm->i0 = rt.i0;
  tm->j0 = j0;
  tm->n = n;
  tm->causal = g.causal;
  tm->causal_offset = g.offset;
  tm->has_dense = false;
  tm->rule = kFlashNone;
}

// No mask input: only the causal rule (or nothing).
struct CausalPolicy {
  TileKind classify(const Geometry& g, const RowTile& rt, int64_t j0, int n) const {
    return causal_kind(g, rt, j0, n);
  }
  void describe(const Geometry&, const RowTile&, TileMask*) const {}
};

// A dense bool mask [B|1, Hq|1, Sq, Sk]. Its tiles are never known to be empty in advance:
// each is masked element-wise after QK^T, and skipped only if nothing survives.
struct DensePolicy {
  const uint8_t* mask = nullptr;
  int64_t batches = 1, heads = 1;  // the mask's dims 0 and 1 (1 = broadcast)

  TileKind classify(const Geometry& g, const RowTile& rt, int64_t j0, int n) const {
    return causal_kind(g, rt, j0, n) == TileKind::kSkip ? TileKind::kSkip : TileKind::kPartial;
  }
  void describe(const Geometry& g, const RowTile& rt, TileMask* tm) const {
    tm->has_dense = true;
    tm->dense_ld = g.sk;
    for (int h = 0; h < rt.heads; ++h) {
      const int64_t plane = (batches > 1 ? rt.b : 0) * heads + (heads > 1 ? rt.h0 + h : 0);
      tm->dense[h] = mask + plane * g.sq * g.sk;
    }
  }
};

// FlashMask startend_row_indices, re-laid out once per call (attention_flashmask.cc):
//   columns [B][Hm][E][Sk]               bound column e of key j at ((b Hm + hm) E + e) Sk + j
//   ranges  [B][Hm][key tiles][E][2]     min and max of each column over a key tile
struct FlashPolicy {
  const int32_t* columns = nullptr;
  const int32_t* ranges = nullptr;
  int64_t mask_heads = 1;
  int e = 1;
  int rule = kFlashNone;

  int64_t mask_head(const Geometry& g, int64_t h) const { return h * mask_heads / g.hq; }

  TileKind classify(const Geometry& g, const RowTile& rt, int64_t j0, int n) const {
    const TileKind causal = causal_kind(g, rt, j0, n);
    if (causal == TileKind::kSkip) return TileKind::kSkip;
    const int64_t lo = rt.i0, hi = rt.i0 + rt.positions - 1;  // the tile's query rows
    bool all_hidden = true, all_visible = true;
    int64_t last = -1;
    for (int h = 0; h < rt.heads; ++h) {
      const int64_t hm = mask_head(g, rt.h0 + h);
      if (hm == last) continue;
      last = hm;
      const int32_t* mm = ranges + ((rt.b * mask_heads + hm) * g.key_tiles + j0 / kKeyTile) * e * 2;
      auto mn = [&](int c) { return static_cast<int64_t>(mm[2 * c]); };
      auto mx = [&](int c) { return static_cast<int64_t>(mm[2 * c + 1]); };
      // hidden: every row of the tile is hidden from every key; visible: none is.
      bool hidden = false, visible = false;
      switch (rule) {
        case kFlashLower:
          hidden = lo >= mx(0);
          visible = hi < mn(0);
          break;
        case kFlashLowerBand:
          hidden = mx(0) <= lo && hi < mn(1);
          visible = hi < mn(0) || lo >= mx(1);
          break;
        case kFlashLowerUpper:
          hidden = lo >= mx(0) || hi < mn(1);
          visible = hi < mn(0) && lo >= mx(1);
          break;
        case kFlashTwoBands:
          hidden = (mx(0) <= lo && hi < mn(1)) || (mx(2) <= lo && hi < mn(3));
          visible = (hi < mn(0) || lo >= mx(1)) && (hi < mn(2) || lo >= mx(3));
          break;
        default: visible = true;
      }
      all_hidden = all_hidden && hidden;
      all_visible = all_visible && visible;
    }
    if (all_hidden) return TileKind::kSkip;
    return all_visible && causal == TileKind::kFull ? TileKind::kFull : TileKind::kPartial;
  }

  void describe(const Geometry& g, const RowTile& rt, TileMask* tm) const {
    tm->rule = rule;
    tm->bounds_ld = g.sk;
    for (int h = 0; h < rt.heads; ++h)
      tm->bounds[h] = columns + (rt.b * mask_heads + mask_head(g, rt.h0 + h)) * e * g.sk;
  }
};

}  // namespace anychip::cpu::attn
