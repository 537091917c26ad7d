// Private to the decoder_step kernel (decoder_step*.cc): the model as the launch describes it and
// the per-row pieces the driver strings together. Each piece works on the share of the work it
// is given and gives every output element the same operations whatever that share is, so that
// results do not depend on the number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.h"
#include "quant.h"

namespace anychip::cpu::decoder {

// One linear layer W[N, K]: float32 (bits 0), weight_quantize's int8 / int4 layout, or bfloat16
// (bits 16).
struct Lin {
  int bits = 0;
  const float* w = nullptr;       // bits 0
  const uint16_t* w16 = nullptr;  // bits 16
  quant::QWeight q{};             // bits 4, 8
  int64_t n = 0, k = 0;
};

struct Layer {
  const float* attn_norm;
  Lin qkv;
  const float* qkv_bias;  // or null
  Lin o;
  const float* ffn_norm;
  Lin gate_up;
  Lin down;
};

struct Model {
  int64_t layers = 0, hq = 0, hk = 0, d = 0, f = 0, c = 0, v = 0;
  float eps = 0.0f, theta = 0.0f;
  bool x_int8 = false;  // the quantized LINs take x quantized to int8 (weight_only_linear's x_int8)
  std::vector<Layer> layer;
  const float* final_norm = nullptr;
  Lin head;
};

// Rows of bf16 x per AMX product: the width of a tile.
constexpr int64_t kBf16Rows = 16;

// One thread's buffers for the form of a product's input that its LIN takes: int8 (x_int8 and a
// quantized LIN) or bf16 (a bfloat16 LIN). Every thread makes its own (m rows of up to K are
// little work) rather than wait for one.
class Input {
 public:
  Input(const Model& model, int64_t m, int64_t max_k, Isa isa);
  ~Input();
  Input(const Input&) = delete;
  Input& operator=(const Input&) = delete;

  // Prepares x [m][K] for the products with w; then gemv reads it.
  void set(const Lin& w, const float* x);

  const Lin* w = nullptr;
  const float* x = nullptr;
  const quant::XInt8* int8 = nullptr;  // x's int8 form (x_int8, w quantized)
  const uint8_t* xt = nullptr;         // x^T's bf16 tiles, kBf16Rows rows per group (w bf16, AMX)
  const float* rounded = nullptr;      // x rounded to bf16 (w bf16, no AMX)
  int64_t m;
  Isa isa;
  int64_t tile_rows = 0;               // the rows the AMX tiles are configured for (0: none)
  std::vector<uint16_t> tail;          // the last rows of W, zero-padded to whole tiles (AMX)

 private:
  bool x_int8_;
  quant::XInt8 int8_buffer_;
  std::vector<uint8_t> xt_buffer_;
  std::vector<float> rounded_buffer_;
};

// y[i * ldy + n] = sum_k x[i * K + k] W[n][k] (+ the offsets' share) for i < m, n in [n0, n1),
// in the form `in` was prepared for.
void gemv(Input& in, int64_t n0, int64_t n1, float* y, int64_t ldy);

// y[i] = h[i] / sqrt(mean(h^2) + eps) * weight[i], i < c.
void rms_norm_row(const float* h, const float* weight, int64_t c, float eps, float* y, Isa isa);

// Rotates x[0, 2 half) in place: (a, b) = (x[i], x[i + half]) by the angle whose cos and sin
// are cs[i] and cs[half + i].
void rope_row(float* x, const float* cs, int64_t half);

// y[i] = silu(gate[i]) * up[i], i < n.
void swiglu_row(const float* gate, const float* up, int64_t n, float* y, Isa isa);

// The keys and values a query head attends to: cache slots [0, past) at k + at(j), v + at(j),
// then the new token's own at k_new, v_new (passed apart, so that the heads sharing them need
// not wait for the cache write), all in the cache's storage type T (float, bf16 or fp16): the
// new token's as the cache will hold them. Slot j is at j * stride in a row of its own, or, in a
// paged cache (table not null), at offset j % block of block table[j / block].
template <typename T>
struct Keys {
  const T *k, *v;
  int64_t stride, past;
  const T *k_new, *v_new;
  const int64_t* table = nullptr;
  int64_t block = 0;

  int64_t at(int64_t j) const { return (table ? table[j / block] * block + j % block : j) * stride; }
  const T* key(int64_t j) const { return j < past ? k + at(j) : k_new; }
  const T* value(int64_t j) const { return j < past ? v + at(j) : v_new; }
};

// Attention goes by blocks of consecutive cache slots, the unit of work that threads share out:
// about kBlocksPerSequence of them per sequence, of a multiple of 16 slots up to kMaxBlockKeys.
constexpr int64_t kBlocksPerSequence = 8;
constexpr int64_t kMaxBlockKeys = 256;
// A block pays its own maxima, exponentials, reductions and merge: below 64 slots they cost more
// than its products (SmolLM2, a decode step of 16 sequences of ~100 tokens: 31 ms in blocks of 16
// slots, 25 in blocks of 64).
constexpr int64_t kMinBlockKeys = 64;

// Slots per attention block of a sequence attending to `keys` slots.
inline int64_t block_keys(int64_t keys) {
  return std::min(kMaxBlockKeys,
                  std::max(kMinBlockKeys, quant::round_up((keys + kBlocksPerSequence - 1) / kBlocksPerSequence, 16)));
}

// One query against keys [j0, j1): with s_j = scale q . k_j, part[0, d) = sum_j e^(s_j - m) v_j,
// part[d] = m = max_j s_j, part[d + 1] = sum_j e^(s_j - m). scores holds j1 - j0 floats.
template <typename T>
void attend_block(const Keys<T>& kv, int64_t j0, int64_t j1, const float* q, int64_t d, float scale, float* scores,
                  float* part, Isa isa);

// o = softmax(scale q K^T) V from the parts of `count` consecutive blocks (d + 2 floats each).
void combine(const float* parts, int64_t count, int64_t d, float* o);

}  // namespace anychip::cpu::decoder
