// The rows of libanychip_paddle_kernels.so's registration table, as the generated table_*.cc
// files (from core/frontends/paddle/kernel_table.py) declare them: per Paddle kernel, its name, the body
// of its registration (e.g. an output dtype) and one instance of its wrapper per dtype.
// loader.cc registers the rows (and dtypes) that its device's config names.
#pragma once

#include <functional>
#include <vector>

#include "wrappers.h"

namespace anychip_pk {

// One dtype's instance of a wrapper, as PD_REGISTER_PLUGIN_KERNEL would register it.
struct Instance {
  phi::DataType dtype;
  phi::KernelArgsParseFn parse;
  void (*compute)(phi::KernelContext*);
  void* variadic;
};

struct Row {
  const char* name;
  phi::KernelArgsDefFn define;
  std::vector<Instance> instances;  // one per dtype of kernel_table.CPP_TYPES
};

using RowSink = std::function<void(const Row&)>;

inline void define_nothing(const phi::KernelKey&, phi::Kernel*) {}

#define ANYCHIP_PK_INSTANCE(fn, T)                                                  \
  Instance {                                                                        \
    ::phi::CppTypeToDataType<T>::Type(), ARG_PARSE_FUNCTOR(fn, T, ::phi::CustomContext), \
        PHI_KERNEL(fn<T, ::phi::CustomContext>), PHI_VARIADIC_KERNEL(fn<T, ::phi::CustomContext>) \
  }

// Calls `sink` with every row of the table (table.cc, generated).
void for_each_row(const RowSink& sink);

}  // namespace anychip_pk
