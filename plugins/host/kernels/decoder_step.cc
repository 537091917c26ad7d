// decoder_step: the decode step of a Llama-family model in one launch (kernel.h states the math).
//
// A launch may also run one part of the step (kernel.h's `part`): one layer's attention half or
// MLP half, returning its product without the residual add, or the final norm and head. A
// tensor-parallel rank decodes so, summing the halves' partial products with its peers between
// the launches: the step has no place for a collective inside.
//
// One OpenMP region runs the whole step. Each thread takes one run of every product's output
// rows (one run each, rather than many blocks handed out as threads come free, measured 5 to
// 20% faster: each block's first rows wait on memory); attention goes by blocks of cache slots,
// first come, first served. Every output element is computed the same way whichever thread
// does it, so results do not depend on the number of threads. The threads meet after each
// phase that the next needs all of (decoder_step_team.h), five per layer: qkv, attention, o,
// gate_up, down. The RMSNorms are tiny, so every thread computes them into its own buffer
// instead of waiting for one thread; so is the merge of the attention blocks, and the int8 or
// bf16 form of each product's input where its LIN takes one (decoder::Input).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#include "decoder_step.h"
#include "decoder_step_team.h"

namespace anychip::cpu {
namespace {

using decoder::Layer;
using decoder::Lin;
using decoder::Model;

// The LIN kinds' formats (bits, group_size, has_offsets) follow each other in the attrs.
constexpr int kAttrsPerLin = ANYCHIP_ATTR_DECODER_STEP_O_BITS - ANYCHIP_ATTR_DECODER_STEP_QKV_BITS;
constexpr int kLinKinds = 5;
static_assert(ANYCHIP_ATTR_DECODER_STEP_HEAD_BITS == ANYCHIP_ATTR_DECODER_STEP_QKV_BITS + kAttrsPerLin * (kLinKinds - 1),
              "the LIN kinds' formats are qkv, o, gate_up, down, head in anychip/ops.h");
const char* const kLinNames[kLinKinds] = {"qkv", "o", "gate_up", "down", "head"};

struct Format {
  int bits;
  int64_t group_size;
  bool offsets;
};

// Walks the inputs in kernel.h's order, checking each; the first mismatch is kept as `error`.
class Inputs {
 public:
  Inputs(const AnychipKernelCall* call, bool x_int8, bool panels) : call_(call), x_int8_(x_int8), panels_(panels) {}

  // The next input if it is a contiguous `dtype` tensor of `shape`, else null. `layer` -1: none.
  const void* take(int layer, const char* name, const char* part, int32_t dtype, std::initializer_list<int64_t> shape) {
    if (!error.empty()) return nullptr;
    if (next_ >= call_->num_inputs) {
      error = "input " + std::to_string(next_) + " (" + label(layer, name, part) + ") is missing";
      return nullptr;
    }
    const AnychipTensor& t = in(call_, next_++);
    bool same = t.dtype == dtype && t.rank == static_cast<int32_t>(shape.size());
    int i = 0;
    for (int64_t want : shape) same = same && t.shape[i++] == want;
    if (!same) {
      std::string want = "[", got = "[";
      for (int64_t d : shape) want += (want.size() > 1 ? ", " : "") + std::to_string(d);
      for (int r = 0; r < t.rank; ++r) got += (r ? ", " : "") + std::to_string(t.shape[r]);
      error = label(layer, name, part) + " must be " + dtype_name(dtype) + " " + want + "], got " +
              dtype_name(t.dtype) + " " + got + "]";
      return nullptr;
    }
    if (!is_contiguous(t)) {
      error = label(layer, name, part) + " is not contiguous";
      return nullptr;
    }
    return t.data;
  }

  const float* floats(int layer, const char* name, const char* part, std::initializer_list<int64_t> shape) {
    return static_cast<const float*>(take(layer, name, part, ANYCHIP_DTYPE_FLOAT32, shape));
  }

  // A LIN W[n, k] in format `f`.
  bool lin(int layer, const char* name, const Format& f, int64_t n, int64_t k, Lin* w) {
    w->bits = f.bits;
    w->n = n;
    w->k = k;
    if (f.bits == 0) {
      w->w = floats(layer, name, "weight", {n, k});
      return w->w != nullptr;
    }
    if (f.bits == 16) {
      if (k % 32 != 0) {
        error = label(layer, name, "") + ": bfloat16 weights need K = " + std::to_string(k) + " to be a multiple of 32";
        return false;
      }
      w->w16 = static_cast<const uint16_t*>(take(layer, name, "weight", ANYCHIP_DTYPE_BFLOAT16, {n, k}));
      return w->w16 != nullptr;
    }
    quant::QWeight& q = w->q;
    q.bits = f.bits;
    q.n = n;
    q.k = k;
    q.group = f.group_size == -1 ? k : f.group_size;
    if (q.group <= 0 || k % q.group != 0 || (f.bits == 4 && k % 64 != 0)) {
      error = label(layer, name, "") + ": K = " + std::to_string(k) + " does not take " + std::to_string(f.bits) +
              "-bit weights in groups of " + std::to_string(f.group_size);
      return false;
    }
    if (x_int8_ && (k % quant::XInt8::kMinRun != 0 || q.group % quant::XInt8::kMinRun != 0)) {
      error = label(layer, name, "") + ": x_int8 needs K = " + std::to_string(k) + " and the group size " +
              std::to_string(q.group) + " to be multiples of 32";
      return false;
    }
    q.groups = k / q.group;
    q.q = static_cast<const uint8_t*>(take(layer, name, "qweight", f.bits == 8 ? ANYCHIP_DTYPE_INT8 : ANYCHIP_DTYPE_UINT8,
                                           {n, f.bits == 8 ? k : k / 2}));
    q.scales = floats(layer, name, "scales", {n, q.groups});
    if (f.offsets) q.offsets = floats(layer, name, "offsets", {n, q.groups});
    if (panels_)
      q.panels = static_cast<const uint8_t*>(
          take(layer, name, "panels", ANYCHIP_DTYPE_UINT8, {(n + 15) / 16, q.panel_bytes()}));
    return error.empty();
  }

  // Dim i of the next input, 0 if there is none.
  int64_t next_dim(int i) const {
    return next_ < call_->num_inputs && in(call_, next_).rank > i ? in(call_, next_).shape[i] : 0;
  }

  bool all_taken() {
    if (error.empty() && next_ != call_->num_inputs)
      error = std::to_string(call_->num_inputs) + " inputs given, the attrs describe " + std::to_string(next_);
    return error.empty();
  }

  std::string error;

 private:
  static const char* dtype_name(int32_t dtype) {
    switch (dtype) {
      case ANYCHIP_DTYPE_FLOAT32: return "float32";
      case ANYCHIP_DTYPE_BFLOAT16: return "bfloat16";
      case ANYCHIP_DTYPE_INT64: return "int64";
      case ANYCHIP_DTYPE_INT8: return "int8";
      case ANYCHIP_DTYPE_UINT8: return "uint8";
      default: return "another dtype";
    }
  }

  static std::string label(int layer, const char* name, const char* part) {
    std::string s = layer >= 0 ? "layers[" + std::to_string(layer) + "]." + name : name;
    return *part ? s + "." + part : s;
  }

  const AnychipKernelCall* call_;
  bool x_int8_, panels_;
  int next_ = 0;
};

// What a launch runs (kernel.h: decoder_step's `part`).
enum class Part { kAll = 0, kAttention = 1, kMlp = 2, kHead = 3 };

struct Step {
  const Model& m;
  Part part;
  int64_t layer;         // the layer of kAttention and kMlp
  int64_t b, s;          // s: the cache's dim 2, slots per row (per block when paged)
  int64_t r;             // the cache's dim 1: rows (blocks when paged)
  int64_t capacity;      // slots a sequence may hold: s, or the table's width * s when paged
  const int64_t* pos;
  const int64_t* rows;   // the cache row of each sequence (not paged)
  const int64_t* tables; // paged: [b, width] the blocks of each sequence, else null
  int64_t width;
  const float* x;
  float* logits;         // [B, V], or [B, C] for kAttention and kMlp
  void *k_cache, *v_cache;  // float, bf16 or fp16: run's T
  Isa isa;
  int threads;
};

// Attention blocks per sequence at most, for caches of s slots.
int64_t max_blocks(int64_t s) {
  return std::max(decoder::kBlocksPerSequence, (s + decoder::kMaxBlockKeys - 1) / decoder::kMaxBlockKeys);
}

// Floats of the buffers the threads share, and of each thread's own.
int64_t shared_floats(const Model& m, int64_t b, int64_t s) {
  return b * (2 * m.c + (m.hq + 2 * m.hk) * m.d + m.hq * max_blocks(s) * (m.d + 2) + 3 * m.f + m.d);
}
int64_t own_floats(const Model& m, int64_t b) {
  return b * (m.c + m.hq * m.d) + decoder::kMaxBlockKeys + (m.hq + 3 * m.hk) * m.d;
}

// One unit of attention work: slots [j0, j1) of sequence b, for every head. A unit reads whole
// slots (all kv heads): one kv head's share of a slot alone is a strided read, and the
// hardware prefetcher then fetches the other heads' lines too, tripling the memory traffic.
struct AttentionUnit {
  int64_t b, c, j0, j1;
};

// The whole step, the caches holding T; the caller has checked every shape.
template <typename T>
void run(const Step& st, float* scratch) {
  const Model& m = st.m;
  const int64_t B = st.b, C = m.c, D = m.d, half = D / 2, Hq = m.hq, Hk = m.hk, F = m.f;
  const int64_t nqkv = (Hq + 2 * Hk) * D, group = Hq / Hk, slot = Hk * D, part = D + 2;
  const int64_t blocks = max_blocks(st.capacity);
  float* h = scratch;                       // [B, C] the residual stream
  float* qkv = h + B * C;                   // [B, nqkv]
  float* parts = qkv + B * nqkv;            // [B, Hq, blocks, D + 2] attention by block of slots
  float* tmp = parts + B * Hq * blocks * part;  // [B, C] a product before it joins h
  float* gu = tmp + B * C;                  // [B, 2F]
  float* act = gu + B * 2 * F;              // [B, F]
  float* cs = act + B * F;                  // [B, D]: cos, sin of each sequence's angles
  float* own = cs + B * D;                  // per thread: own_floats()
  const Isa isa = st.isa;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  std::copy(st.x, st.x + B * C, h);
  for (int64_t i = 0; i < half; ++i) {
    // As rotary_embedding: float32 frequencies and angles.
    const float inv_freq = 1.0f / std::pow(m.theta, static_cast<float>(2 * i) / static_cast<float>(D));
    for (int64_t b = 0; b < B; ++b) {
      const float f = static_cast<float>(st.pos[b]) * inv_freq;
      cs[b * D + i] = std::cos(f);
      cs[b * D + half + i] = std::sin(f);
    }
  }
  std::vector<AttentionUnit> units;
  std::vector<int64_t> counts(static_cast<size_t>(B));  // blocks of each sequence
  for (int64_t b = 0; b < B; ++b) {
    const int64_t keys = st.pos[b] + 1, width = decoder::block_keys(keys);
    for (int64_t j0 = 0; j0 < keys; j0 += width) units.push_back({b, j0 / width, j0, std::min(keys, j0 + width)});
    counts[b] = (keys + width - 1) / width;
  }

  decoder::Team team(m.layers);
#pragma omp parallel num_threads(st.threads)
  {
    team.join();
    float* a = own + omp_get_thread_num() * own_floats(m, B);  // [B, C] normed rows
    float* att = a + B * C;                                     // [B, Hq D] attention output
    float* scores = att + B * Hq * D;                           // [kMaxBlockKeys]
    float* q = scores + decoder::kMaxBlockKeys;                 // [Hq, D] rotated
    float* k = q + Hq * D;                                      // [Hk, D] rotated
    T* kv_new = reinterpret_cast<T*>(k + Hk * D);               // [2, Hk, D]: k, v as the cache holds them
    const decoder::Rows qkv_rows = team.rows(nqkv), c_rows = team.rows(C), f_rows = team.rows(F);
    const decoder::Rows v_rows = team.rows(m.v);
    decoder::Input input(m, B, std::max({C, Hq * D, F}), isa);
    // h += x W^T over this thread's rows.
    auto add_product = [&](const Lin& w, const float* x) {
      input.set(w, x);
      decoder::gemv(input, c_rows.begin, c_rows.end, tmp, C);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t n = c_rows.begin; n < c_rows.end; ++n) h[b * C + n] += tmp[b * C + n];
    };

    // A half layer's product goes out as it is: a tensor-parallel rank's partial sum.
    auto put_product = [&](const Lin& w, const float* x) {
      input.set(w, x);
      decoder::gemv(input, c_rows.begin, c_rows.end, st.logits, C);
    };
    const bool attention = st.part == Part::kAll || st.part == Part::kAttention;
    const bool mlp = st.part == Part::kAll || st.part == Part::kMlp;
    const int64_t l0 = st.part == Part::kAll ? 0 : st.layer;
    const int64_t l1 = st.part == Part::kAll ? m.layers : st.part == Part::kHead ? 0 : st.layer + 1;

    for (int64_t l = l0; l < l1; ++l) {
      const Layer& layer = m.layer[l];
      T* kc = static_cast<T*>(st.k_cache) + l * st.r * st.s * slot;
      T* vc = static_cast<T*>(st.v_cache) + l * st.r * st.s * slot;
      if (attention) {
        for (int64_t b = 0; b < B; ++b) decoder::rms_norm_row(h + b * C, layer.attn_norm, C, m.eps, a + b * C, isa);

        input.set(layer.qkv, a);
        decoder::gemv(input, qkv_rows.begin, qkv_rows.end, qkv, nqkv);
        if (layer.qkv_bias != nullptr)
          for (int64_t b = 0; b < B; ++b)
            for (int64_t n = qkv_rows.begin; n < qkv_rows.end; ++n) qkv[b * nqkv + n] += layer.qkv_bias[n];
        team.barrier();

        // Every unit rotates the q heads, and the last block of a sequence its new k, which it
        // also writes to the cache: no thread waits for another's RoPE.
        team.claim(l, static_cast<int64_t>(units.size()), [&](int64_t i) {
          const AttentionUnit& u = units[i];
          const int64_t past = st.pos[u.b];
          const int64_t* table = st.tables ? st.tables + u.b * st.width : nullptr;
          // slot 0 of the sequence's row; paged, of the pool (Keys looks its blocks up)
          const int64_t first = table ? 0 : st.rows[u.b] * st.s;
          const int64_t written = table ? table[past / st.s] * st.s + past % st.s : first + past;
          const float* row = qkv + u.b * nqkv;
          std::copy(row, row + (Hq + Hk) * D, q);
          for (int64_t hh = 0; hh < Hq + Hk; ++hh) decoder::rope_row(q + hh * D, cs + u.b * D, half);
          for (int64_t i = 0; i < slot; ++i) {
            kv_new[i] = from_float<T>(k[i]);
            kv_new[slot + i] = from_float<T>(row[(Hq + Hk) * D + i]);
          }
          if (u.j1 == past + 1) {
            std::copy(kv_new, kv_new + slot, kc + written * slot);
            std::copy(kv_new + slot, kv_new + 2 * slot, vc + written * slot);
          }
          for (int64_t hh = 0; hh < Hq; ++hh) {
            const int64_t kh = hh / group, base = first * slot + kh * D;
            const decoder::Keys<T> keys{kc + base, vc + base, slot, past, kv_new + kh * D, kv_new + slot + kh * D,
                                        table, st.s};
            decoder::attend_block(keys, u.j0, u.j1, q + hh * D, D, scale, scores,
                                  parts + ((u.b * Hq + hh) * blocks + u.c) * part, isa);
          }
        });
        team.barrier();

        for (int64_t b = 0; b < B; ++b)
          for (int64_t hh = 0; hh < Hq; ++hh)
            decoder::combine(parts + (b * Hq + hh) * blocks * part, counts[b], D, att + (b * Hq + hh) * D);
        if (!mlp) {
          put_product(layer.o, att);
          break;
        }
        add_product(layer.o, att);
        team.barrier();
      }

      for (int64_t b = 0; b < B; ++b) decoder::rms_norm_row(h + b * C, layer.ffn_norm, C, m.eps, a + b * C, isa);
      input.set(layer.gate_up, a);
      decoder::gemv(input, f_rows.begin, f_rows.end, gu, 2 * F);
      decoder::gemv(input, F + f_rows.begin, F + f_rows.end, gu, 2 * F);
      for (int64_t b = 0; b < B; ++b)
        decoder::swiglu_row(gu + b * 2 * F + f_rows.begin, gu + b * 2 * F + F + f_rows.begin,
                            f_rows.end - f_rows.begin, act + b * F + f_rows.begin, isa);
      team.barrier();

      if (!attention) {
        put_product(layer.down, act);
        break;
      }
      add_product(layer.down, act);
      team.barrier();
    }

    if (st.part == Part::kAll || st.part == Part::kHead) {
      for (int64_t b = 0; b < B; ++b) decoder::rms_norm_row(h + b * C, m.final_norm, C, m.eps, a + b * C, isa);
      input.set(m.head, a);
      decoder::gemv(input, v_rows.begin, v_rows.end, st.logits, m.v);
    }
  }
}

}  // namespace

ANYCHIP_CPU_KERNEL(decoder_step) {
  constexpr const char* kOp = "decoder_step";
  constexpr int kFormatAttrs = ANYCHIP_ATTR_DECODER_STEP_X_INT8;  // the attrs every call passes
  if (call->num_attrs < kFormatAttrs || call->num_attrs > ANYCHIP_NUM_ATTRS_DECODER_STEP)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED,
                "%s: expected %d attrs (then optionally x_int8, has_cache_rows, part, layer, panels), got %d", kOp,
                kFormatAttrs, call->num_attrs);
  if (call->num_inputs < 2 || call->num_outputs != 3)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: expected x, positions, the weights -> logits, k_cache, v_cache", kOp);
  Model m;
  m.layers = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_DECODER_STEP_L));
  m.hq = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_DECODER_STEP_HQ));
  m.hk = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_DECODER_STEP_HK));
  m.d = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_DECODER_STEP_D));
  m.f = static_cast<int64_t>(attr(call, ANYCHIP_ATTR_DECODER_STEP_F));
  m.eps = static_cast<float>(attr(call, ANYCHIP_ATTR_DECODER_STEP_EPS));
  m.theta = static_cast<float>(attr(call, ANYCHIP_ATTR_DECODER_STEP_THETA));
  const bool has_bias = attr(call, ANYCHIP_ATTR_DECODER_STEP_HAS_QKV_BIAS) != 0.0;
  const double x_int8 = attr(call, ANYCHIP_ATTR_DECODER_STEP_X_INT8, 0.0);
  if (x_int8 != 0.0 && x_int8 != 1.0)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: x_int8 must be 0 or 1, got %g", kOp, x_int8);
  m.x_int8 = x_int8 == 1.0;
  const double has_rows = attr(call, ANYCHIP_ATTR_DECODER_STEP_HAS_CACHE_ROWS, 0.0);
  if (has_rows != 0.0 && has_rows != 1.0 && has_rows != 2.0)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: has_cache_rows must be 0, 1 or 2 (block tables), got %g", kOp,
                has_rows);
  const bool paged = has_rows == 2.0;
  const double panels_attr = attr(call, ANYCHIP_ATTR_DECODER_STEP_PANELS, 0.0);
  if ((panels_attr != 0.0 && panels_attr != 1.0) || (panels_attr == 1.0 && !m.x_int8))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: panels must be 0 or 1, and 1 only with x_int8 = 1, got %g", kOp,
                panels_attr);
  const bool panels = panels_attr == 1.0;
  const double part = attr(call, ANYCHIP_ATTR_DECODER_STEP_PART, 0.0);
  const double part_layer = attr(call, ANYCHIP_ATTR_DECODER_STEP_LAYER, 0.0);
  if (part != 0.0 && part != 1.0 && part != 2.0 && part != 3.0)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: part must be 0 (all), 1 (attention), 2 (mlp) or 3 (head), got %g",
                kOp, part);
  if (part_layer != std::floor(part_layer) || part_layer < 0.0 || part_layer >= static_cast<double>(m.layers))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: layer must be one of the %lld layers, got %g", kOp,
                static_cast<long long>(m.layers), part_layer);
  if (m.layers < 1 || m.layers > call->num_inputs || m.hq < 1 || m.hk < 1 || m.hq % m.hk != 0 || m.d < 2 || m.d % 2 != 0 || m.f < 1 ||
      !(m.eps > 0.0f) || !(m.theta > 0.0f))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED,
                "%s: unsupported config L=%lld Hq=%lld Hk=%lld D=%lld F=%lld eps=%g theta=%g (need Hq %% Hk == 0, "
                "D even, eps and theta > 0, inputs for every layer)",
                kOp, static_cast<long long>(m.layers), static_cast<long long>(m.hq), static_cast<long long>(m.hk),
                static_cast<long long>(m.d), static_cast<long long>(m.f), m.eps, m.theta);
  Format fmt[kLinKinds];
  for (int i = 0; i < kLinKinds; ++i) {
    const double* a = call->attrs + ANYCHIP_ATTR_DECODER_STEP_QKV_BITS + kAttrsPerLin * i;
    fmt[i] = {static_cast<int>(a[0]), static_cast<int64_t>(a[1]), a[2] != 0.0};
    if (fmt[i].bits != 0 && fmt[i].bits != 4 && fmt[i].bits != 8 && fmt[i].bits != 16)
      return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: %s has bits %d, expected 0 (float32), 4, 8 or 16 (bfloat16)", kOp,
                  kLinNames[i], fmt[i].bits);
  }

  const AnychipTensor& xt = in(call, 0);
  const AnychipTensor& logits = out(call, 0);
  const AnychipTensor& kt = out(call, 1);
  const AnychipTensor& vt = out(call, 2);
  if (xt.rank != 2 || logits.rank != 2 || kt.rank != 5)
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: x must be [B, C], logits [B, V], k_cache [L, B, S, Hk, D]", kOp);
  const int64_t B = xt.shape[0], R = kt.shape[1], S = kt.shape[2];
  const bool half_layer = part == 1.0 || part == 2.0;  // the output is then [B, C], V the head's rows
  m.c = xt.shape[1];
  m.v = logits.shape[1];
  const int64_t nqkv = (m.hq + 2 * m.hk) * m.d;

  Inputs ins(call, m.x_int8, panels);
  const float* x = ins.floats(-1, "x", "", {B, m.c});
  const auto* pos = static_cast<const int64_t*>(ins.take(-1, "positions", "", ANYCHIP_DTYPE_INT64, {B}));
  const auto* given_rows =
      has_rows == 1.0 ? static_cast<const int64_t*>(ins.take(-1, "cache_rows", "", ANYCHIP_DTYPE_INT64, {B})) : nullptr;
  const int64_t width = paged ? ins.next_dim(1) : 0;
  const auto* tables =
      paged ? static_cast<const int64_t*>(ins.take(-1, "block_tables", "", ANYCHIP_DTYPE_INT64, {B, width})) : nullptr;
  m.layer.resize(static_cast<size_t>(m.layers));
  for (int l = 0; l < m.layers && ins.error.empty(); ++l) {
    Layer& y = m.layer[l];
    y.attn_norm = ins.floats(l, "attn_norm", "", {m.c});
    ins.lin(l, "qkv", fmt[0], nqkv, m.c, &y.qkv);
    y.qkv_bias = has_bias ? ins.floats(l, "qkv_bias", "", {nqkv}) : nullptr;
    ins.lin(l, "o", fmt[1], m.c, m.hq * m.d, &y.o);
    y.ffn_norm = ins.floats(l, "ffn_norm", "", {m.c});
    ins.lin(l, "gate_up", fmt[2], 2 * m.f, m.c, &y.gate_up);
    ins.lin(l, "down", fmt[3], m.c, m.f, &y.down);
  }
  m.final_norm = ins.floats(-1, "final_norm", "", {m.c});
  if (half_layer) m.v = ins.next_dim(0);
  ins.lin(-1, "head", fmt[4], m.v, m.c, &m.head);
  if (!ins.all_taken()) return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: %s", kOp, ins.error.c_str());

  const std::vector<int64_t> cache{m.layers, given_rows || paged ? R : B, S, m.hk, m.d};
  for (const AnychipTensor* t : {&kt, &vt}) {
    bool fits = t->dtype == kt.dtype && t->rank == 5 && is_contiguous(*t);
    for (int i = 0; fits && i < 5; ++i) fits = t->shape[i] == cache[i];
    if (!fits)
      return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: %s must be contiguous [%lld, %lld, %lld, %lld, %lld]%s", kOp,
                  t == &kt ? "k_cache" : "v_cache", static_cast<long long>(m.layers), static_cast<long long>(cache[1]),
                  static_cast<long long>(S), static_cast<long long>(m.hk), static_cast<long long>(m.d),
                  t == &kt ? "" : " of k_cache's dtype");
  }
  if (logits.dtype != ANYCHIP_DTYPE_FLOAT32 || logits.shape[0] != B || logits.shape[1] != (half_layer ? m.c : m.v) ||
      !is_contiguous(logits))
    return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: the output must be contiguous float32 [%lld, %lld]", kOp,
                static_cast<long long>(B), static_cast<long long>(half_layer ? m.c : m.v));
  const int64_t capacity = paged ? width * S : S;
  for (int64_t b = 0; b < B; ++b)
    if (pos[b] < 0 || pos[b] >= capacity)
      return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: positions[%lld] = %lld is outside the cache's [0, %lld)", kOp,
                  static_cast<long long>(b), static_cast<long long>(pos[b]), static_cast<long long>(capacity));
  std::vector<int64_t> rows(static_cast<size_t>(B));
  if (paged) {
    // The blocks a sequence reads must exist; the slots written must differ (two writers of one
    // slot would race), which is what a sequence's own last block guarantees.
    std::vector<int64_t> written(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j <= pos[b] / S; ++j) {
        const int64_t block = tables[b * width + j];
        if (block < 0 || block >= R)
          return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: block_tables[%lld, %lld] = %lld is outside the cache's %lld "
                      "blocks", kOp, static_cast<long long>(b), static_cast<long long>(j), static_cast<long long>(block),
                      static_cast<long long>(R));
      }
      written[b] = tables[b * width + pos[b] / S] * S + pos[b] % S;
    }
    std::vector<int64_t> sorted = written;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: two sequences write the same slot of one block", kOp);
  } else {
    // Each sequence its own cache row: two sharing one would race on its slots.
    std::vector<char> taken(static_cast<size_t>(cache[1]), 0);
    for (int64_t b = 0; b < B; ++b) {
      rows[b] = given_rows ? given_rows[b] : b;
      if (rows[b] < 0 || rows[b] >= cache[1] || taken[rows[b]]++)
        return fail(call, ANYCHIP_ERROR_UNSUPPORTED, "%s: cache_rows[%lld] = %lld is outside [0, %lld) or repeated",
                    kOp, static_cast<long long>(b), static_cast<long long>(rows[b]), static_cast<long long>(cache[1]));
    }
  }
  if (B == 0 || logits.shape[1] == 0) return ANYCHIP_OK;

  const Step step{m,        static_cast<Part>(static_cast<int>(part)), static_cast<int64_t>(part_layer),
                  B,        S,
                  cache[1], capacity,
                  pos,      rows.data(),
                  tables,   width,
                  x,        data<float>(logits),
                  kt.data,  vt.data,
                  isa(),    threads(call)};
  return dispatch_float(call, kt.dtype, "decoder_step: k_cache", [&]<typename T>() {
    try {
      std::vector<float> scratch(
          static_cast<size_t>(shared_floats(m, B, capacity) + step.threads * own_floats(m, B)));
      run<T>(step, scratch.data());
    } catch (const std::bad_alloc&) {
      return fail(call, ANYCHIP_ERROR_OUT_OF_MEMORY, "%s: no memory for the step's buffers", kOp);
    }
    return ANYCHIP_OK;
  });
}

}  // namespace anychip::cpu
