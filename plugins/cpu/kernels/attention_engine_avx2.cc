// The AVX2 attention engine: attention_engine_portable.h compiled for AVX2 + FMA.
#pragma GCC target("avx2,fma")

#include "attention_engine_portable.h"

namespace anychip::cpu::attn {

const Engine* avx2_engine(int32_t dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT32: return make<float>();
    case ANYCHIP_DTYPE_BFLOAT16: return make<bf16>();
    case ANYCHIP_DTYPE_FLOAT16: return make<fp16>();
    default: return nullptr;
  }
}

}  // namespace anychip::cpu::attn
