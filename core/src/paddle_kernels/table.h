// The rows of libanychip_paddle_kernels.so's registration table, as the generated table_*.cc
// files (from core/paddle_kernel_table.py) declare them: per Paddle kernel, its name, the body
// of its registration (e.g. an output dtype) and one instance of its wrapper per dtype.
// loader.cc registers the rows (and dtypes) that its device's config names.
#pragma once

#include <functional>

#include "wrappers.h"

namespace anychip_pk {

// One dtype's instance of a wrapper, as PD_REGISTER_PLUGIN_KERNEL would register it.
struct Instance {
  phi::DataType dtype;
  phi::KernelArgsParseFn parse;
  void (*compute)(phi::KernelContext*);
  void* variadic;
};

constexpr int kNumDtypes = 10;

struct Row {
  const char* name;
  phi::KernelArgsDefFn define;
  Instance instances[kNumDtypes];
};

using RowSink = std::function<void(const Row&)>;

inline void define_nothing(const phi::KernelKey&, phi::Kernel*) {}

#define ANYCHIP_PK_INSTANCE(fn, T)                                                  \
  Instance {                                                                        \
    ::phi::CppTypeToDataType<T>::Type(), ARG_PARSE_FUNCTOR(fn, T, ::phi::CustomContext), \
        PHI_KERNEL(fn<T, ::phi::CustomContext>), PHI_VARIADIC_KERNEL(fn<T, ::phi::CustomContext>) \
  }

// Every dtype anychip has (anychip.paddle_kernel_table.CPP_TYPES): kNumDtypes of them.
#define ANYCHIP_PK_ALL_DTYPES(fn)                                                          \
  ANYCHIP_PK_INSTANCE(fn, float), ANYCHIP_PK_INSTANCE(fn, phi::dtype::float16),            \
      ANYCHIP_PK_INSTANCE(fn, phi::dtype::bfloat16), ANYCHIP_PK_INSTANCE(fn, double),      \
      ANYCHIP_PK_INSTANCE(fn, int8_t), ANYCHIP_PK_INSTANCE(fn, uint8_t),                   \
      ANYCHIP_PK_INSTANCE(fn, int16_t), ANYCHIP_PK_INSTANCE(fn, int32_t),                  \
      ANYCHIP_PK_INSTANCE(fn, int64_t), ANYCHIP_PK_INSTANCE(fn, bool)

// Calls `sink` with every row of the table (table.cc, generated).
void for_each_row(const RowSink& sink);

}  // namespace anychip_pk
