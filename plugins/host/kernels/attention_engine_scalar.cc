// The scalar attention engine (attention_engine_portable.h compiled for the baseline ISA), the
// split-key merge all engines share, and the choice of engine per call.
#include "attention_engine_portable.h"

namespace anychip::cpu::attn {

template <typename T>
void combine_scalar(const float* const* acc, const float* const* mx, const float* const* l, int splits, int m,
                    int d, void* const* o_rows, float* const* lse) {
  const int dp = dpad(d);
  for (int r = 0; r < m; ++r) {
    float top = -kInf;
    for (int s = 0; s < splits; ++s) top = std::max(top, mx[s][r]);
    T* o = static_cast<T*>(o_rows[r]);
    if (top == -kInf) {
      for (int c = 0; c < d; ++c) o[c] = from_float<T>(0.0f);
      *lse[r] = -kInf;
      continue;
    }
    float w[kMaxSplits];
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      w[s] = std::exp2(mx[s][r] - top);
      sum += l[s][r] * w[s];
    }
    const float inv = 1.0f / sum;
    for (int c = 0; c < d; ++c) {
      float v = 0.0f;
      for (int s = 0; s < splits; ++s) v += acc[s][r * dp + c] * w[s];
      o[c] = from_float<T>(v * inv);
    }
    *lse[r] = (top + std::log2(sum)) * kLn2;
  }
}

template void combine_scalar<float>(const float* const*, const float* const*, const float* const*, int, int, int,
                                    void* const*, float* const*);
template void combine_scalar<bf16>(const float* const*, const float* const*, const float* const*, int, int, int,
                                   void* const*, float* const*);
template void combine_scalar<fp16>(const float* const*, const float* const*, const float* const*, int, int, int,
                                   void* const*, float* const*);

const Engine* scalar_engine(int32_t dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT32: return make<float>();
    case ANYCHIP_DTYPE_BFLOAT16: return make<bf16>();
    case ANYCHIP_DTYPE_FLOAT16: return make<fp16>();
    default: return nullptr;
  }
}

const Engine* engine_for(Isa isa, int32_t dtype) {
  if (isa == Isa::kAmx) {
    if (const Engine* e = amx_engine(dtype)) return e;
  }
  if (has_avx512(isa)) return avx512_engine(dtype);
  if (isa == Isa::kAvx2) return avx2_engine(dtype);
  return scalar_engine(dtype);
}

}  // namespace anychip::cpu::attn
