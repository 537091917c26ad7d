// Loading the device (anychip_torch_open) and the C functions anychip.frontends.torch calls
// through ctypes: copies, memory statistics, the launch of host-code kernels, the fallback hook.
#include "device.h"

#include <dlfcn.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "stream.h"

namespace anychip::torch_bridge {

AnychipDeviceInterface g_iface;
std::string g_name;
int g_device_count = 0;

namespace {
thread_local c10::DeviceIndex t_device = 0;

std::string last_error() {
  char message[512] = "";
  if (g_iface.last_error != nullptr) g_iface.last_error(g_iface.runtime, message, sizeof(message));
  return message;
}

int fail(char* error, size_t size, const std::string& message) {
  std::snprintf(error, size, "%s", message.c_str());
  return 1;
}
}  // namespace

void check(AnychipStatus status, const char* what) {
  if (status == ANYCHIP_OK) return;
  std::string message = "anychip:" + g_name + " " + what + " failed: " + last_error();
  if (status == ANYCHIP_ERROR_OUT_OF_MEMORY) TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  TORCH_CHECK(false, message);
}

void check_device(c10::DeviceIndex index) {
  TORCH_CHECK(g_iface.runtime != nullptr,
              "the anychip device is not enabled: call anychip.torch.enable(\"<chip>\") (or set "
              "ANYCHIP_TORCH_CHIP) before using device 'anychip'");
  TORCH_CHECK_INDEX(index >= 0 && index < g_device_count, "anychip device index ", static_cast<int>(index),
                    " is out of range: ", g_name, " has ", g_device_count, " device(s)");
}

c10::DeviceIndex current_device() { return t_device; }

void set_current_device(c10::DeviceIndex index) {
  check_device(index);
  if (index != t_device) ANYCHIP_CALL(set_device, index);
  t_device = index;
}

}  // namespace anychip::torch_bridge

using namespace anychip::torch_bridge;

extern "C" {

// Loads `library`, calls its entry `symbol` with `options` and initialises it: the one device the
// PrivateUse1 backend stands for in this process. Returns 0, or 1 with the reason in `error`.
__attribute__((visibility("default"))) int anychip_torch_open(const char* name, const char* library,
                                                              const char* symbol, const char* options,
                                                              char* error, size_t error_size) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (g_iface.runtime != nullptr) {
    if (g_name == name) return 0;
    return fail(error, error_size, "PyTorch's anychip device is already " + g_name +
                " in this process; one chip per process (asked for " + name + ")");
  }
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return fail(error, error_size, std::string("cannot load ") + library + ": " + dlerror());
  auto entry = reinterpret_cast<AnychipStatus (*)(AnychipDeviceInterface*, const char*)>(dlsym(handle, symbol));
  if (entry == nullptr) return fail(error, error_size, std::string(library) + " does not export " + symbol);
  AnychipDeviceInterface iface{};
  iface.struct_size = sizeof(iface);
  AnychipStatus status = entry(&iface, options);
  char message[512] = "";
  if (status != ANYCHIP_OK) {
    if (iface.last_error != nullptr) iface.last_error(iface.runtime, message, sizeof(message));
    return fail(error, error_size, std::string(symbol) + " failed: " + message);
  }
  if ((iface.abi_version >> 16) != ANYCHIP_DEVICE_ABI_MAJOR) {
    return fail(error, error_size, std::string(library) + " implements device ABI " +
                std::to_string(iface.abi_version >> 16) + ".x, the bridge needs " +
                std::to_string(ANYCHIP_DEVICE_ABI_MAJOR) + ".x");
  }
  size_t count = 0;
  status = iface.initialize(iface.runtime);
  if (status == ANYCHIP_OK) status = iface.get_device_count(iface.runtime, &count);
  if (status != ANYCHIP_OK) {
    iface.last_error(iface.runtime, message, sizeof(message));
    return fail(error, error_size, std::string(name) + " does not initialise: " + message);
  }
  g_name = name;
  g_device_count = static_cast<int>(count);
  g_iface = iface;
  return 0;
}

// The device's name ("" until opened) and device count.
__attribute__((visibility("default"))) const char* anychip_torch_device_name() { return g_name.c_str(); }
__attribute__((visibility("default"))) int anychip_torch_device_count() { return g_device_count; }

// The calling thread's current device; setting it checks the index.
__attribute__((visibility("default"))) int anychip_torch_get_device() { return current_device(); }

__attribute__((visibility("default"))) int anychip_torch_set_device(int device, char* error, size_t error_size) {
  try {
    set_current_device(static_cast<c10::DeviceIndex>(device));
    return 0;
  } catch (const c10::Error& e) {
    return fail(error, error_size, e.what_without_backtrace());
  }
}

// Waits for all work on every stream of `device`.
__attribute__((visibility("default"))) int anychip_torch_synchronize(int device, char* error, size_t error_size) {
  if (device < 0 || device >= g_device_count) {
    return fail(error, error_size, "anychip device index " + std::to_string(device) + " is out of range: " + g_name +
                " has " + std::to_string(g_device_count) + " device(s)");
  }
  AnychipStatus status = g_iface.synchronize_device(g_iface.runtime, device);
  return status == ANYCHIP_OK ? 0 : fail(error, error_size, last_error());
}

// Synchronous copies of `size` bytes (kind 0: host to device, 1: device to host, 2: device to
// device). Returns 0, or 1 with the plugin's message in `error`.
__attribute__((visibility("default"))) int anychip_torch_copy(int kind, int device, void* dst, const void* src,
                                                              size_t size, char* error, size_t error_size) {
  if (size == 0) return 0;
  AnychipStatus status = kind == 0   ? g_iface.memcpy_h2d(g_iface.runtime, device, dst, src, size)
                         : kind == 1 ? g_iface.memcpy_d2h(g_iface.runtime, device, dst, src, size)
                                     : g_iface.memcpy_d2d(g_iface.runtime, device, dst, src, size);
  return status == ANYCHIP_OK ? 0 : fail(error, error_size, last_error());
}

// The stream kernels of `device` are ordered on: the calling thread's current PyTorch stream.
__attribute__((visibility("default"))) void* anychip_torch_current_stream(int device) {
  return current_stream_handle(static_cast<c10::DeviceIndex>(device));
}

// anychip._launcher's bridge: runs a host-code kernel as work of `stream`, with exactly `ranges`
// open to the host, and returns when it is done (same contract as the Paddle bridge's).
__attribute__((visibility("default"))) int anychip_torch_launch(int device, void* stream, AnychipHostFunction fn,
                                                                void* user_data, const AnychipMemoryRange* ranges,
                                                                int num_ranges, char* error, size_t error_size) {
  if (g_iface.launch_host_function == nullptr) {
    std::snprintf(error, error_size, "%s runs no host-code kernels (launch_host_function is NULL)", g_name.c_str());
    return ANYCHIP_ERROR_UNSUPPORTED;
  }
  auto s = static_cast<AnychipStream>(stream);
  AnychipStatus status = g_iface.launch_host_function(g_iface.runtime, device, s, fn, user_data, ranges, num_ranges);
  if (status == ANYCHIP_OK) status = g_iface.stream_synchronize(g_iface.runtime, device, s);
  if (status != ANYCHIP_OK && g_iface.last_error != nullptr) g_iface.last_error(g_iface.runtime, error, error_size);
  return status;
}

// Fills `stats` (struct_size set by the caller). Returns 0, or 1 with the message in `error`.
__attribute__((visibility("default"))) int anychip_torch_memory_stats(int device, AnychipMemoryStats* stats,
                                                                      char* error, size_t error_size) {
  AnychipStatus status = g_iface.memory_stats(g_iface.runtime, device, stats);
  return status == ANYCHIP_OK ? 0 : fail(error, error_size, last_error());
}

__attribute__((visibility("default"))) int anychip_torch_properties(int device, AnychipDeviceProperties* props,
                                                                    char* error, size_t error_size) {
  AnychipStatus status = g_iface.get_properties(g_iface.runtime, device, props);
  return status == ANYCHIP_OK ? 0 : fail(error, error_size, last_error());
}

}  // extern "C"
