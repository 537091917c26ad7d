// Glue of anychip's Paddle kernel library (libanychip_paddle_kernels.so, see
// anychip/frontends/paddle/kernels.py and loader.cc).
//
// The library holds wrappers that turn Paddle's DenseTensors into AnychipTensor descriptors and
// launch a plugin's C-ABI kernel (anychip/kernel.h) the way anychip.ops does: on dev_ctx's
// stream, a host-code kernel through the device's Paddle bridge (`anychip_bridge_launch`, which
// opens exactly the tensors' memory and returns when the kernel ran), a device-code kernel
// called directly with the stream. One copy of the library serves one anychip device; which
// device, and which plugin kernel serves each (base op, dtype), loader.cc reads from the
// config beside the copy when Paddle loads it:
//   g_device_name  the anychip device name; its bridge is ../libanychip_<name>.so
//   g_kernels      (base op, dtype) -> library, symbol, host_code of the plugin's kernel
//   g_slot_ops     the op behind each slot wrapper (a plugin's op, see wrappers.h)
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "anychip/kernel.h"
#include "paddle/phi/backends/custom/custom_context.h"
#include "paddle/phi/common/int_array.h"
#include "paddle/phi/common/scalar.h"
#include "paddle/phi/core/dense_tensor.h"
#include "paddle/phi/core/enforce.h"
#include "paddle/phi/core/kernel_registry.h"

namespace anychip_pk {

struct KernelEntry {
  std::string op;
  phi::DataType dtype;
  std::string library;
  std::string symbol;
  bool host_code;
};

// Filled once by loader.cc while Paddle loads the library, read-only afterwards.
inline std::string g_device_name = "anychip";
inline std::vector<KernelEntry> g_kernels;
inline std::map<std::string, std::string> g_slot_ops;  // slot row (kernel_table.slot_row) -> op

using BridgeLaunch = int (*)(int device, void* stream, AnychipHostFunction fn, void* user_data,
                             const AnychipMemoryRange* ranges, int num_ranges, char* error,
                             size_t error_size);

[[noreturn]] inline void fail(const std::string& message) {
  PADDLE_THROW(common::errors::External("anychip[%s]: %s", g_device_name, message));
}

inline int32_t anychip_dtype(phi::DataType dtype) {
  switch (dtype) {
    case phi::DataType::FLOAT32: return ANYCHIP_DTYPE_FLOAT32;
    case phi::DataType::FLOAT16: return ANYCHIP_DTYPE_FLOAT16;
    case phi::DataType::BFLOAT16: return ANYCHIP_DTYPE_BFLOAT16;
    case phi::DataType::FLOAT64: return ANYCHIP_DTYPE_FLOAT64;
    case phi::DataType::INT8: return ANYCHIP_DTYPE_INT8;
    case phi::DataType::UINT8: return ANYCHIP_DTYPE_UINT8;
    case phi::DataType::INT16: return ANYCHIP_DTYPE_INT16;
    case phi::DataType::INT32: return ANYCHIP_DTYPE_INT32;
    case phi::DataType::INT64: return ANYCHIP_DTYPE_INT64;
    case phi::DataType::BOOL: return ANYCHIP_DTYPE_BOOL;
    default: fail("dtype " + phi::DataTypeToString(dtype) + " has no anychip dtype");
  }
}

struct Resolved {
  AnychipKernelFn fn = nullptr;
  bool host_code = true;
};

// The plugin's kernel for (op, dtype), resolved on first use (dlopen of the NativeKernel's
// library: the same file the Python side loaded, so the same instance).
inline Resolved find(const char* op, phi::DataType dtype) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, phi::DataType>, Resolved> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(std::string(op), dtype);
  auto hit = cache.find(key);
  if (hit != cache.end()) return hit->second;
  for (const KernelEntry& e : g_kernels) {
    if (key.first != e.op || e.dtype != dtype) continue;
    void* lib = dlopen(e.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) fail("cannot load kernel library " + e.library + ": " + dlerror());
    void* fn = dlsym(lib, e.symbol.c_str());
    if (fn == nullptr) fail(e.library + " exports no kernel " + e.symbol);
    Resolved r{reinterpret_cast<AnychipKernelFn>(fn), e.host_code};
    cache[key] = r;
    return r;
  }
  fail(std::string("no '") + op + "' kernel for " + phi::DataTypeToString(dtype));
}

// The device's bridge, which Paddle has already loaded (and which loaded this library).
inline BridgeLaunch bridge_launch() {
  static BridgeLaunch launch = [] {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&anychip_dtype), &info) == 0 || info.dli_fname == nullptr) {
      fail("cannot find the kernel library's own path");
    }
    std::string path = info.dli_fname;  // <folder>/kernels/libanychip_<name>_kernels.so
    path = path.substr(0, path.rfind('/'));
    path = path.substr(0, path.rfind('/') + 1) + "libanychip_" + g_device_name + ".so";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == nullptr) fail("the device's Paddle bridge " + path + " is not loaded");
    void* fn = dlsym(lib, "anychip_bridge_launch");
    if (fn == nullptr) fail(path + " exports no anychip_bridge_launch");
    return reinterpret_cast<BridgeLaunch>(fn);
  }();
  return launch;
}

// A descriptor of `t` as it is (Paddle's strides; dense unless a strided view).
inline AnychipTensor describe(const phi::DenseTensor& t) {
  AnychipTensor d{};
  d.data = const_cast<void*>(t.data());
  d.dtype = anychip_dtype(t.dtype());
  d.rank = t.dims().size();
  if (d.rank > ANYCHIP_MAX_RANK) fail("tensor rank " + std::to_string(d.rank) + " exceeds ANYCHIP_MAX_RANK");
  auto strides = t.strides();
  bool has_strides = strides.size() == d.rank;
  int64_t dense = 1;
  for (int i = d.rank - 1; i >= 0; --i) {
    d.shape[i] = t.dims()[i];
    d.strides[i] = has_strides ? strides[i] : dense;
    dense *= d.shape[i];
  }
  return d;
}

// `t` seen with shape `out` (numpy broadcasting, aligned on the right): stride 0 on the
// dimensions `t` lacks or has as 1, which is how the base-op ABI takes elementwise inputs.
inline AnychipTensor broadcast(const phi::DenseTensor& t, const phi::DDim& out) {
  AnychipTensor own = describe(t);
  AnychipTensor d = own;
  d.rank = out.size();
  if (d.rank > ANYCHIP_MAX_RANK || own.rank > d.rank) {
    fail("cannot broadcast shape " + t.dims().to_str() + " to " + out.to_str());
  }
  int lead = d.rank - own.rank;
  for (int i = 0; i < d.rank; ++i) {
    d.shape[i] = out[i];
    if (i < lead) {
      d.strides[i] = 0;
    } else if (own.shape[i - lead] == out[i]) {
      d.strides[i] = own.strides[i - lead];
    } else if (own.shape[i - lead] == 1) {
      d.strides[i] = 0;
    } else {
      fail("cannot broadcast shape " + t.dims().to_str() + " to " + out.to_str());
    }
  }
  return d;
}

inline size_t element_size(int32_t dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT64: case ANYCHIP_DTYPE_INT64: return 8;
    case ANYCHIP_DTYPE_FLOAT32: case ANYCHIP_DTYPE_INT32: return 4;
    case ANYCHIP_DTYPE_FLOAT16: case ANYCHIP_DTYPE_BFLOAT16: case ANYCHIP_DTYPE_INT16: return 2;
    default: return 1;
  }
}

// The bytes a descriptor addresses (what the simulator must open for the kernel).
inline AnychipMemoryRange range_of(const AnychipTensor& d) {
  int64_t last = 0;
  for (int i = 0; i < d.rank; ++i) {
    if (d.shape[i] == 0) return AnychipMemoryRange{d.data, 0};
    last += (d.shape[i] - 1) * d.strides[i];
  }
  return AnychipMemoryRange{d.data, static_cast<size_t>(last + 1) * element_size(d.dtype)};
}

struct Launch {
  AnychipKernelFn fn;
  AnychipKernelCall call;
};

inline AnychipStatus run_launch(void* user_data) {
  auto* l = static_cast<Launch*>(user_data);
  return l->fn(&l->call);
}

// Runs base op `op`'s kernel registered for `dtype` on dev_ctx's stream. Returns when done for
// a host-code kernel (the bridge synchronizes), as anychip.ops' launches do.
inline void launch(const phi::CustomContext& ctx, const char* op, phi::DataType dtype,
                   const std::vector<AnychipTensor>& ins, const std::vector<AnychipTensor>& outs,
                   const std::vector<double>& attrs = {}) {
  for (const auto& o : outs) {
    if (range_of(o).size == 0) return;  // nothing to write: Paddle allows empty tensors
  }
  Resolved kernel = find(op, dtype);
  int device = ctx.GetPlace().GetDeviceId();
  void* stream = ctx.stream();
  char error[1024] = "";
  Launch l{kernel.fn, AnychipKernelCall{}};
  l.call.struct_size = sizeof(AnychipKernelCall);
  l.call.inputs = ins.data();
  l.call.num_inputs = static_cast<int32_t>(ins.size());
  l.call.outputs = outs.data();
  l.call.num_outputs = static_cast<int32_t>(outs.size());
  l.call.attrs = attrs.data();
  l.call.num_attrs = static_cast<int32_t>(attrs.size());
  l.call.stream = static_cast<AnychipStream>(stream);
  l.call.error = error;
  l.call.error_size = sizeof(error);
  int status;
  char bridge_error[1024] = "";
  if (kernel.host_code) {
    std::vector<AnychipMemoryRange> ranges;
    for (auto* list : {&ins, &outs}) {
      for (const auto& d : *list) ranges.push_back(range_of(d));
    }
    status = bridge_launch()(device, stream, run_launch, &l, ranges.data(), static_cast<int>(ranges.size()),
                             bridge_error, sizeof(bridge_error));
  } else {
    status = run_launch(&l);
  }
  if (status != ANYCHIP_OK) {
    std::string message = error[0] != '\0' ? error : bridge_error;
    if (message.empty()) message = "status " + std::to_string(status);
    fail(std::string("kernel '") + op + "' (" + phi::DataTypeToString(dtype) + ") on device " +
         std::to_string(device) + " failed: " + message);
  }
}

}  // namespace anychip_pk
