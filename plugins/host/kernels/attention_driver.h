// The flash-attention loops, shared by `attention` and `flashmask_attention` and templated on
// the mask policy (attention_tiles.h). They only index, classify and call the engine, so the
// floating-point work of a tile is the same whichever policy found it visible.
//
// Forward (FlashAttention-2 order): one work item per (batch, kv head, block of query
// positions[, key chunk]); within it the key tiles are the outer loop and the group's row tiles
// the inner one, so each key tile is packed once for all query heads that read it. When there
// are few items (decode), the keys are split into chunks merged afterwards (split-K); the split
// depends only on the shapes, so results do not depend on the thread count.
//
// Backward: delta = rowsum(dO * O); then dk/dv with one item per (batch, kv head, key tile)
// summing over the group's row tiles in a fixed order, and dq in a second pass with one item per
// (batch, kv head, block of query positions) summing over key tiles in order. No item writes
// another's outputs, so the result is deterministic.
#pragma once

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "attention_tiles.h"

namespace anychip::cpu::attn {

constexpr int64_t kSplitTarget = 64;   // split keys when there are fewer work items than this
constexpr int64_t kMinSplitTiles = 4;  // key tiles per chunk at least

// Work buffers: one zeroed, cache-line aligned region per thread. The memory is a per calling
// thread cache (two slots, for two buffers live at once) that the thread's next call reuses,
// so that a call does not fault in fresh pages; it grows to the largest call and is freed when
// the thread exits.
class Scratch {
 public:
  explicit Scratch(int slot) : slot_(slot) {}

  bool allocate(size_t per_thread, int threads) {
    stride_ = static_cast<size_t>(round_up(static_cast<int64_t>(per_thread), 16));
    data_ = cached(slot_, stride_ * static_cast<size_t>(threads));
    return data_ != nullptr;
  }
  // Thread `thread`'s region, zeroed (by the caller, so its pages are local to it).
  float* region(int thread) const {
    float* p = data_ + stride_ * static_cast<size_t>(thread);
    std::memset(p, 0, stride_ * sizeof(float));
    return p;
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  static float* cached(int slot, size_t floats) {
    thread_local std::unique_ptr<float, Free> buffers[2];
    thread_local size_t sizes[2] = {0, 0};
    if (sizes[slot] < floats) {
      buffers[slot].reset();
      sizes[slot] = 0;
      buffers[slot].reset(static_cast<float*>(std::aligned_alloc(64, std::max<size_t>(floats, 16) * sizeof(float))));
      if (buffers[slot] != nullptr) sizes[slot] = floats;
    }
    return buffers[slot].get();
  }

  int slot_;
  float* data_ = nullptr;
  size_t stride_ = 0;
};

struct ForwardIO {
  const char *q, *k, *v;
  char* o;
  float* lse;
  size_t esize;
};

struct BackwardIO {
  const char *dout, *q, *k, *v, *o;
  const float* lse;
  char *dq, *dk, *dv;
  size_t esize;
};

namespace detail {

inline const char* q_row(const char* base, const Geometry& g, int64_t b, int64_t i, int64_t h, size_t es) {
  return base + (((b * g.sq + i) * g.hq + h) * g.d) * static_cast<int64_t>(es);
}
inline const char* kv_row(const char* base, const Geometry& g, int64_t b, int64_t j, int64_t hk, size_t es) {
  return base + (((b * g.sk + j) * g.hk + hk) * g.d) * static_cast<int64_t>(es);
}
inline int64_t lse_index(const Geometry& g, int64_t b, int64_t h, int64_t i) { return (b * g.hq + h) * g.sq + i; }

inline int thread_count(const AnychipKernelCall* call, int64_t items) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads(call), items)));
}

// Runs `body(item, scratch, mask)` over items on up to `nt` threads, each with its own zeroed
// scratch region and mask description, inside the engine's per-thread set-up.
template <typename Body>
void parallel_items(const Engine& e, int nt, int64_t items, const Scratch& scratch, Body&& body) {
#pragma omp parallel num_threads(nt)
  {
    if (e.begin_thread != nullptr) e.begin_thread();
    float* s = scratch.region(omp_get_thread_num());
    TileMask tm;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) body(item, s, tm);
    if (e.end_thread != nullptr) e.end_thread();
  }
}

}  // namespace detail

template <class Policy>
AnychipStatus forward(const AnychipKernelCall* call, const Engine& e, const Geometry& g, const Policy& policy,
                      const ForwardIO& io) {
  using detail::q_row;
  if (g.batch == 0 || g.sq == 0 || g.hq == 0) return ANYCHIP_OK;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int d = static_cast<int>(g.d);
  const int64_t dp = round_up(g.d, 32);
  const int chunks = g.head_chunks;
  const int64_t bases = g.batch * g.hk * g.position_blocks;
  int64_t splits = 1, span = g.key_tiles;  // key tiles per split
  if (bases < kSplitTarget && g.key_tiles >= 2 * kMinSplitTiles) {
    splits = std::min<int64_t>({(kSplitTarget + bases - 1) / bases, g.key_tiles / kMinSplitTiles, kMaxSplits});
    span = (g.key_tiles + splits - 1) / splits;
    splits = (g.key_tiles + span - 1) / span;
  }
  const int64_t items = bases * splits;

  // Per thread: q packs, accumulators, row max and sum of every row tile, then one key tile.
  const int64_t tile = kRowTile * dp;
  const int64_t acc_off = chunks * tile, mx_off = 2 * chunks * tile, l_off = mx_off + chunks * kRowTile;
  const int64_t kp_off = l_off + chunks * kRowTile, vp_off = kp_off + kKeyTile * dp;
  const int64_t t_off = vp_off + kKeyTile * dp, p_off = t_off + kRowTile * kKeyTile;
  const int64_t alpha_off = p_off + kRowTile * kKeyTile, per_thread = alpha_off + kRowTile;
  const int64_t part = tile + 2 * kRowTile;  // a split's partial result of one row tile

  const int nt = detail::thread_count(call, items);
  Scratch scratch(0), partial(1);
  if (!scratch.allocate(per_thread, nt) || (splits > 1 && !partial.allocate(items * chunks * part, 1)))
    return fail(call, ANYCHIP_ERROR_OUT_OF_MEMORY, "attention: no memory for the work buffers");
  float* parts = splits > 1 ? partial.region(0) : nullptr;

  detail::parallel_items(e, nt, items, scratch, [&](int64_t item, float* s, TileMask& tm) {
    const int64_t split = item % splits, base = item / splits;
    const int64_t bh = base % (g.batch * g.hk);
    const int64_t pb = g.position_blocks - 1 - base / (g.batch * g.hk);  // longest (causal) first
    const int64_t b = bh / g.hk, hk = bh % g.hk;
    const void* rows[kRowTile];
    for (int c = 0; c < chunks; ++c) {
      const RowTile rt = row_tile(g, b, hk, pb, c);
      for (int r = 0; r < rt.rows(); ++r) rows[r] = q_row(io.q, g, b, rt.position(r), rt.head(r), io.esize);
      e.pack_q(rows, rt.rows(), d, s + c * tile);
      std::fill_n(s + mx_off + c * kRowTile, kRowTile, -kInf);
      std::fill_n(s + l_off + c * kRowTile, kRowTile, 0.0f);
      std::fill_n(s + acc_off + c * tile, round_up(rt.rows(), 32) * dp, 0.0f);
    }
    const int64_t kt_end = std::min(g.key_tiles, (split + 1) * span);
    for (int64_t kt = split * span; kt < kt_end; ++kt) {
      const int64_t j0 = kt * kKeyTile;
      const int n = static_cast<int>(std::min<int64_t>(kKeyTile, g.sk - j0));
      bool have_k = false;
      const void* v = nullptr;
      int64_t ldv = 0;
      for (int c = 0; c < chunks; ++c) {
        const RowTile rt = row_tile(g, b, hk, pb, c);
        const TileKind kind = policy.classify(g, rt, j0, n);
        if (kind == TileKind::kSkip) continue;
        if (!have_k) {
          e.pack_k(detail::kv_row(io.k, g, b, j0, hk, io.esize), g.hk * g.d, n, d, s + kp_off);
          have_k = true;
        }
        const int m = rt.rows();
        e.scores(s + c * tile, s + kp_off, m, d, n, g.c, -kInf, s + t_off);
        if (kind == TileKind::kPartial) {
          base_mask(g, rt, j0, n, &tm);
          policy.describe(g, rt, &tm);
          if (!e.apply_mask(tm, s + t_off)) continue;
        }
        e.softmax(s + t_off, m, s + mx_off + c * kRowTile, s + l_off + c * kRowTile, s + alpha_off, s + p_off);
        if (v == nullptr) v = e.pack_v(detail::kv_row(io.v, g, b, j0, hk, io.esize), g.hk * g.d, n, d, s + vp_off, &ldv);
        e.pv(s + p_off, v, ldv, m, n, d, s + alpha_off, s + acc_off + c * tile);
      }
    }
    for (int c = 0; c < chunks; ++c) {
      const RowTile rt = row_tile(g, b, hk, pb, c);
      const float* acc = s + acc_off + c * tile;
      const float* mx = s + mx_off + c * kRowTile;
      const float* l = s + l_off + c * kRowTile;
      if (splits == 1) {
        void* o_rows[kRowTile];
        float* lse[kRowTile];
        for (int r = 0; r < rt.rows(); ++r) {
          o_rows[r] = const_cast<char*>(q_row(io.o, g, b, rt.position(r), rt.head(r), io.esize));
          lse[r] = io.lse + detail::lse_index(g, b, rt.head(r), rt.position(r));
        }
        e.finalize(acc, mx, l, rt.rows(), d, o_rows, lse);
      } else {
        float* dst = parts + (item * chunks + c) * part;
        std::copy_n(acc, rt.rows() * dp, dst);
        std::copy_n(mx, rt.rows(), dst + tile);
        std::copy_n(l, rt.rows(), dst + tile + kRowTile);
      }
    }
  });
  if (splits == 1) return ANYCHIP_OK;

  const int ntc = detail::thread_count(call, bases);
#pragma omp parallel for num_threads(ntc) schedule(dynamic, 1)
  for (int64_t base = 0; base < bases; ++base) {
    const int64_t bh = base % (g.batch * g.hk);
    const int64_t pb = g.position_blocks - 1 - base / (g.batch * g.hk);
    const int64_t b = bh / g.hk, hk = bh % g.hk;
    for (int c = 0; c < chunks; ++c) {
      const RowTile rt = row_tile(g, b, hk, pb, c);
      const float* acc[kMaxSplits];
      const float* mx[kMaxSplits];
      const float* l[kMaxSplits];
      for (int64_t sp = 0; sp < splits; ++sp) {
        const float* src = parts + ((base * splits + sp) * chunks + c) * part;
        acc[sp] = src;
        mx[sp] = src + tile;
        l[sp] = src + tile + kRowTile;
      }
      void* o_rows[kRowTile];
      float* lse[kRowTile];
      for (int r = 0; r < rt.rows(); ++r) {
        o_rows[r] = const_cast<char*>(q_row(io.o, g, b, rt.position(r), rt.head(r), io.esize));
        lse[r] = io.lse + detail::lse_index(g, b, rt.head(r), rt.position(r));
      }
      e.combine(acc, mx, l, static_cast<int>(splits), rt.rows(), d, o_rows, lse);
    }
  }
  return ANYCHIP_OK;
}

template <class Policy>
AnychipStatus backward(const AnychipKernelCall* call, const Engine& e, const Geometry& g, const Policy& policy,
                       const BackwardIO& io) {
  using detail::kv_row;
  using detail::q_row;
  const int d = static_cast<int>(g.d);
  const int64_t dp = round_up(g.d, 32);
  const int chunks = g.head_chunks;
  const int64_t tile = kRowTile * dp, key_block = kKeyTile * dp, scores = kRowTile * kKeyTile;
  const int64_t ldkv = g.hk * g.d;
  const size_t es = io.esize;
  constexpr float kInf = std::numeric_limits<float>::infinity();

  // delta = rowsum(dO * O), laid out like lse.
  Scratch delta_buffer(1);
  if (!delta_buffer.allocate(static_cast<size_t>(g.batch * g.hq * g.sq), 1))
    return fail(call, ANYCHIP_ERROR_OUT_OF_MEMORY, "attention_grad: no memory for the work buffers");
  float* delta = delta_buffer.region(0);
  const int64_t rows_total = g.batch * g.sq * g.hq;
#pragma omp parallel for num_threads(detail::thread_count(call, rows_total / 256 + 1)) schedule(static)
  for (int64_t row = 0; row < rows_total; ++row) {
    const int64_t h = row % g.hq, i = (row / g.hq) % g.sq, b = row / (g.hq * g.sq);
    delta[detail::lse_index(g, b, h, i)] = e.row_dot(q_row(io.dout, g, b, i, h, es), q_row(io.o, g, b, i, h, es), d);
  }

  // Packs row tile rt's q and dO rows, and gathers its lse and delta.
  auto load_rows = [&](const RowTile& rt, float* xq, float* xdo, float* lse, float* dl) {
    const void* rows[kRowTile];
    for (int r = 0; r < rt.rows(); ++r) rows[r] = q_row(io.q, g, rt.b, rt.position(r), rt.head(r), es);
    e.pack_rows(rows, rt.rows(), d, xq);
    for (int r = 0; r < rt.rows(); ++r) rows[r] = q_row(io.dout, g, rt.b, rt.position(r), rt.head(r), es);
    e.pack_rows(rows, rt.rows(), d, xdo);
    for (int r = 0; r < rt.rows(); ++r) {
      const int64_t at = detail::lse_index(g, rt.b, rt.head(r), rt.position(r));
      lse[r] = io.lse[at];
      dl[r] = delta[at];
    }
  };
  // Recomputes P (into t) and dS (into dpv) of row tile rt against the packed key tile; false
  // if the tile is fully masked.
  auto grad_tile = [&](const RowTile& rt, TileKind kind, int64_t j0, int n, const float* xq, const float* xdo,
                       const float* kp, const float* vp, const float* lse, const float* dl, float* t, float* dpv,
                       TileMask& tm) {
    const int m = rt.rows();
    e.scores(xq, kp, m, d, n, g.c, -kInf, t);
    if (kind == TileKind::kPartial) {
      base_mask(g, rt, j0, n, &tm);
      policy.describe(g, rt, &tm);
      if (!e.apply_mask(tm, t)) return false;
    }
    e.scores(xdo, vp, m, d, n, 1.0f, 0.0f, dpv);
    e.grad_scores(t, dpv, m, lse, dl);
    return true;
  };

  // dk, dv: one item per (batch, kv head, key tile).
  if (g.sk > 0) {
    const int64_t items = g.batch * g.hk * g.key_tiles;
    const int64_t kp_off = 0, vp_off = key_block, dk_off = 2 * key_block, dv_off = 3 * key_block;
    const int64_t xq_off = 4 * key_block, xdo_off = xq_off + tile, t_off = xdo_off + tile;
    const int64_t dp_off = t_off + scores, lse_off = dp_off + scores, dl_off = lse_off + kRowTile;
    const int nt = detail::thread_count(call, items);
    Scratch scratch(0);
    if (!scratch.allocate(dl_off + kRowTile, nt))
      return fail(call, ANYCHIP_ERROR_OUT_OF_MEMORY, "attention_grad: no memory for the work buffers");
    detail::parallel_items(e, nt, items, scratch, [&](int64_t item, float* s, TileMask& tm) {
      const int64_t kt = item % g.key_tiles, bh = item / g.key_tiles;
      const int64_t b = bh / g.hk, hk = bh % g.hk;
      const int64_t j0 = kt * kKeyTile;
      const int n = static_cast<int>(std::min<int64_t>(kKeyTile, g.sk - j0));
      e.pack_k(kv_row(io.k, g, b, j0, hk, es), ldkv, n, d, s + kp_off);
      e.pack_k(kv_row(io.v, g, b, j0, hk, es), ldkv, n, d, s + vp_off);
      std::fill_n(s + dk_off, 2 * key_block, 0.0f);
      for (int c = 0; c < chunks; ++c)
        for (int64_t pb = 0; pb < g.position_blocks; ++pb) {
          const RowTile rt = row_tile(g, b, hk, pb, c);
          const TileKind kind = policy.classify(g, rt, j0, n);
          if (kind == TileKind::kSkip) continue;
          load_rows(rt, s + xq_off, s + xdo_off, s + lse_off, s + dl_off);
          if (!grad_tile(rt, kind, j0, n, s + xq_off, s + xdo_off, s + kp_off, s + vp_off, s + lse_off, s + dl_off,
                         s + t_off, s + dp_off, tm))
            continue;
          e.accum_keys(s + t_off, s + xdo_off, rt.rows(), d, s + dv_off);
          e.accum_keys(s + dp_off, s + xq_off, rt.rows(), d, s + dk_off);
        }
      e.store_rows(s + dk_off, n, d, g.scale, const_cast<char*>(kv_row(io.dk, g, b, j0, hk, es)), ldkv);
      e.store_rows(s + dv_off, n, d, 1.0f, const_cast<char*>(kv_row(io.dv, g, b, j0, hk, es)), ldkv);
    });
  }

  // dq: one item per (batch, kv head, block of query positions).
  if (g.sq > 0) {
    const int64_t items = g.batch * g.hk * g.position_blocks;
    const int64_t xq_off = 0, xdo_off = chunks * tile, dq_off = 2 * chunks * tile, lse_off = 3 * chunks * tile;
    const int64_t dl_off = lse_off + chunks * kRowTile, kp_off = dl_off + chunks * kRowTile;
    const int64_t vp_off = kp_off + 2 * key_block, t_off = vp_off + key_block, dp_off = t_off + scores;
    const int nt = detail::thread_count(call, items);
    Scratch scratch(0);
    if (!scratch.allocate(dp_off + scores, nt))
      return fail(call, ANYCHIP_ERROR_OUT_OF_MEMORY, "attention_grad: no memory for the work buffers");
    detail::parallel_items(e, nt, items, scratch, [&](int64_t item, float* s, TileMask& tm) {
      const int64_t bh = item % (g.batch * g.hk);
      const int64_t pb = g.position_blocks - 1 - item / (g.batch * g.hk);
      const int64_t b = bh / g.hk, hk = bh % g.hk;
      for (int c = 0; c < chunks; ++c) {
        load_rows(row_tile(g, b, hk, pb, c), s + xq_off + c * tile, s + xdo_off + c * tile,
                  s + lse_off + c * kRowTile, s + dl_off + c * kRowTile);
        std::fill_n(s + dq_off + c * tile, tile, 0.0f);
      }
      for (int64_t kt = 0; kt < g.key_tiles; ++kt) {
        const int64_t j0 = kt * kKeyTile;
        const int n = static_cast<int>(std::min<int64_t>(kKeyTile, g.sk - j0));
        bool packed = false;
        for (int c = 0; c < chunks; ++c) {
          const RowTile rt = row_tile(g, b, hk, pb, c);
          const TileKind kind = policy.classify(g, rt, j0, n);
          if (kind == TileKind::kSkip) continue;
          if (!packed) {
            e.pack_keys(kv_row(io.k, g, b, j0, hk, es), ldkv, n, d, s + kp_off);
            e.pack_k(kv_row(io.v, g, b, j0, hk, es), ldkv, n, d, s + vp_off);
            packed = true;
          }
          if (!grad_tile(rt, kind, j0, n, s + xq_off + c * tile, s + xdo_off + c * tile, s + kp_off, s + vp_off,
                         s + lse_off + c * kRowTile, s + dl_off + c * kRowTile, s + t_off, s + dp_off, tm))
            continue;
          e.accum_rows(s + dp_off, s + kp_off, rt.rows(), n, d, s + dq_off + c * tile);
        }
      }
      for (int c = 0; c < chunks; ++c) {
        const RowTile rt = row_tile(g, b, hk, pb, c);
        for (int r = 0; r < rt.rows(); ++r)
          e.store_rows(s + dq_off + c * tile + r * dp, 1, d, g.scale,
                       const_cast<char*>(q_row(io.dq, g, b, rt.position(r), rt.head(r), es)), 0);
      }
    });
  }
  return ANYCHIP_OK;
}

}  // namespace anychip::cpu::attn
