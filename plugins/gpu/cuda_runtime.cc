// anychip device plugin over the NVIDIA CUDA runtime (see anychip/device.h for the contract).
//
// libcudart is opened with dlopen at `initialize` and every entry point used is declared here, so
// the plugin builds without the CUDA toolkit and, on a machine without CUDA, loads fine and
// reports the device as unavailable with the reason.
#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>

#include "anychip/device.h"
#include "anychip/runtime_book.h"

namespace {

// The slice of the CUDA runtime ABI used here: cudaError_t and the enums are ints, streams and
// events are opaque pointers. Values are those of driver_types.h, stable across releases.
constexpr int kCudaErrorInvalidValue = 1;
constexpr int kCudaErrorMemoryAllocation = 2;
constexpr int kCudaErrorInvalidDevicePointer = 17;
constexpr int kCudaErrorInvalidDevice = 101;
constexpr int kCudaErrorInvalidResourceHandle = 400;
constexpr int kCudaErrorNotReady = 600;
constexpr int kCudaMemcpyHostToDevice = 1;
constexpr int kCudaMemcpyDeviceToHost = 2;
constexpr int kCudaMemcpyDeviceToDevice = 3;
constexpr int kCudaDevAttrComputeCapabilityMajor = 75;
constexpr int kCudaDevAttrComputeCapabilityMinor = 76;
constexpr unsigned kCudaStreamNonBlocking = 1;
constexpr unsigned kCudaEventWaitDefault = 0;

// cudaMalloc aligns to at least this, and memory_stats rounds allocations to it.
constexpr uint64_t kMinChunkSize = 256;

struct CudaApi {
  const char* (*GetErrorString)(int error);
  int (*GetLastError)();
  int (*GetDeviceCount)(int* count);
  int (*SetDevice)(int device);
  int (*GetDevice)(int* device);
  int (*DeviceGetAttribute)(int* value, int attr, int device);
  int (*MemGetInfo)(size_t* free_bytes, size_t* total_bytes);
  int (*RuntimeGetVersion)(int* version);
  int (*DriverGetVersion)(int* version);
  int (*Malloc)(void** ptr, size_t size);
  int (*Free)(void* ptr);
  int (*MallocHost)(void** ptr, size_t size);
  int (*FreeHost)(void* ptr);
  int (*Memset)(void* ptr, int value, size_t size);
  int (*Memcpy)(void* dst, const void* src, size_t size, int kind);
  int (*MemcpyAsync)(void* dst, const void* src, size_t size, int kind, void* stream);
  int (*DeviceSynchronize)();
  int (*StreamCreateWithFlags)(void** stream, unsigned flags);
  int (*StreamDestroy)(void* stream);
  int (*StreamQuery)(void* stream);
  int (*StreamSynchronize)(void* stream);
  int (*StreamWaitEvent)(void* stream, void* event, unsigned flags);
  int (*LaunchHostFunc)(void* stream, void (*fn)(void* user_data), void* user_data);
  int (*EventCreate)(void** event);
  int (*EventRecord)(void* event, void* stream);
  int (*EventQuery)(void* event);
  int (*EventSynchronize)(void* event);
  int (*EventDestroy)(void* event);
  int (*EventElapsedTime)(float* ms, void* start, void* end);
};

// cudart exposes device names only inside cudaDeviceProp, whose layout changes between releases,
// so names come from the driver API, whose cuDeviceGetName has kept its signature since CUDA 2.
// Optional: without it devices get a generic name.
struct DriverApi {
  int (*DeviceGet)(int* device, int ordinal);
  int (*DeviceGetName)(char* name, int len, int device);
};

}  // namespace

struct AnychipRuntime_st {
  std::atomic<bool> ready{false};
  CudaApi cuda{};
  DriverApi driver{};
  int device_count = 0;

  std::mutex mu;  // guards initialize and finalize
  // The contract's bookkeeping (anychip/runtime_book.h), from initialize to finalize: live
  // allocations, so that frees are checked and memory_stats counts them; live streams and
  // events with their device, so that stale or foreign handles fail with INVALID_ARGUMENT
  // instead of reaching CUDA, where they are undefined.
  AnychipBook* book = nullptr;
};

namespace {

AnychipStatus fail(AnychipStatus status, std::string message) {
  // The message lives in the runtime book (anychip/runtime_book.h): per thread, not per runtime
  // instance, so it also serves `last_error` before an instance exists.
  return anychip_book_fail(status, "%s", message.c_str());
}

// Names the device in messages; -1 stands for calls not tied to one device.
std::string gpu(int device) { return device < 0 ? "gpu" : "gpu:" + std::to_string(device); }

std::string hex(const void* ptr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", ptr);
  return buf;
}

std::string cuda_text(AnychipRuntime rt, int err) {
  const char* text = rt->cuda.GetErrorString(err);
  return text ? text : "error " + std::to_string(err);
}

AnychipStatus map_cuda_error(int err) {
  switch (err) {
    case kCudaErrorMemoryAllocation:
      return ANYCHIP_ERROR_OUT_OF_MEMORY;
    case kCudaErrorInvalidValue:
    case kCudaErrorInvalidDevicePointer:
    case kCudaErrorInvalidDevice:
    case kCudaErrorInvalidResourceHandle:
      return ANYCHIP_ERROR_INVALID_ARGUMENT;
    default:
      return ANYCHIP_ERROR_DEVICE;
  }
}

// Turns the result of CUDA call `api` made by `op` into a status. The message is built only on
// failure, to keep the success path free of string work.
AnychipStatus check(AnychipRuntime rt, int err, int device, const char* op, const char* api) {
  if (err == 0) return ANYCHIP_OK;
  // "Not ready" is a query answer, not a failure, and CUDA does not record it as one.
  if (err == kCudaErrorNotReady) return ANYCHIP_ERROR_NOT_READY;
  // CUDA also keeps the error as its "last error"; clear it so code in the same process that
  // checks cudaGetLastError after its own launches is not blamed for ours.
  rt->cuda.GetLastError();
  return fail(map_cuda_error(err),
              gpu(device) + " " + op + " failed (" + api + ": " + cuda_text(rt, err) + ")");
}

AnychipStatus require_ready(AnychipRuntime rt, const char* op) {
  if (rt && rt->ready.load(std::memory_order_acquire)) return ANYCHIP_OK;
  return fail(ANYCHIP_ERROR_UNAVAILABLE,
              std::string("gpu ") + op + ": the CUDA runtime is not initialized");
}

// Prologue of every per-device call: the runtime is up, `device` is in range and current.
AnychipStatus enter(AnychipRuntime rt, int device, const char* op) {
  if (AnychipStatus s = require_ready(rt, op)) return s;
  if (device < 0 || device >= rt->device_count) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                std::string("gpu ") + op + ": device " + std::to_string(device) +
                    " out of range (" + std::to_string(rt->device_count) + " devices)");
  }
  return check(rt, rt->cuda.SetDevice(device), device, op, "cudaSetDevice");
}

AnychipStatus require(bool ok, int device, const char* op, const char* what) {
  if (ok) return ANYCHIP_OK;
  return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, gpu(device) + " " + op + ": " + what);
}

// `record()` on the book, under its lock.
template <typename Record>
AnychipStatus with_book(AnychipRuntime rt, int device, Record record) {
  if (AnychipStatus s = anychip_book_lock_device(rt->book, device)) return s;
  return anychip_book_unlock(rt->book, record());
}

enum class HandleUse {
  kOwnDevice,  // the handle must belong to `device`
  kAnyDevice,  // CUDA orders across devices (stream_wait_event's event)
  kRemove,     // as kOwnDevice, and unregisters it
};

AnychipStatus check_handle(AnychipRuntime rt, AnychipHandleKind kind, void* handle, int device, HandleUse use) {
  return with_book(rt, device, [&] {
    switch (use) {
      case HandleUse::kAnyDevice: return anychip_book_check_handle_any(rt->book, kind, handle);
      // Removed under the lock: two racing destroys of one handle cannot both reach CUDA.
      case HandleUse::kRemove: return anychip_book_remove_handle(rt->book, kind, device, handle);
      default: return anychip_book_check_handle(rt->book, kind, device, handle);
    }
  });
}

template <typename Fn>
void load(void* lib, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!*fn) *missing += (missing->empty() ? "" : ", ") + std::string(name);
}

// ---- lifecycle ---------------------------------------------------------------------------------

AnychipStatus last_error(AnychipRuntime, char* buf, size_t len) { return anychip_book_last_error(buf, len); }

AnychipStatus initialize(AnychipRuntime rt) {
  if (!rt) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "gpu initialize: runtime is NULL");
  std::lock_guard<std::mutex> lock(rt->mu);
  if (rt->ready.load(std::memory_order_acquire)) return ANYCHIP_OK;

  // Libraries opened here are never closed: unloading libcudart while its threads and exit
  // handlers exist is unsafe, and a failed probe leaves nothing worth reclaiming.
  const char* lib_name = nullptr;
  void* lib = nullptr;
  std::string reasons;
  for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      lib_name = name;
      break;
    }
    const char* reason = dlerror();
    reasons += (reasons.empty() ? "" : "; ") + std::string(reason ? reason : name);
  }
  if (!lib) {
    return fail(ANYCHIP_ERROR_UNAVAILABLE, "gpu: cannot load the CUDA runtime: " + reasons);
  }

  CudaApi& c = rt->cuda;
  std::string missing;
  load(lib, "cudaGetErrorString", &c.GetErrorString, &missing);
  load(lib, "cudaGetLastError", &c.GetLastError, &missing);
  load(lib, "cudaGetDeviceCount", &c.GetDeviceCount, &missing);
  load(lib, "cudaSetDevice", &c.SetDevice, &missing);
  load(lib, "cudaGetDevice", &c.GetDevice, &missing);
  load(lib, "cudaDeviceGetAttribute", &c.DeviceGetAttribute, &missing);
  load(lib, "cudaMemGetInfo", &c.MemGetInfo, &missing);
  load(lib, "cudaRuntimeGetVersion", &c.RuntimeGetVersion, &missing);
  load(lib, "cudaDriverGetVersion", &c.DriverGetVersion, &missing);
  load(lib, "cudaMalloc", &c.Malloc, &missing);
  load(lib, "cudaFree", &c.Free, &missing);
  load(lib, "cudaMallocHost", &c.MallocHost, &missing);
  load(lib, "cudaFreeHost", &c.FreeHost, &missing);
  load(lib, "cudaMemset", &c.Memset, &missing);
  load(lib, "cudaMemcpy", &c.Memcpy, &missing);
  load(lib, "cudaMemcpyAsync", &c.MemcpyAsync, &missing);
  load(lib, "cudaDeviceSynchronize", &c.DeviceSynchronize, &missing);
  load(lib, "cudaStreamCreateWithFlags", &c.StreamCreateWithFlags, &missing);
  load(lib, "cudaStreamDestroy", &c.StreamDestroy, &missing);
  load(lib, "cudaStreamQuery", &c.StreamQuery, &missing);
  load(lib, "cudaStreamSynchronize", &c.StreamSynchronize, &missing);
  load(lib, "cudaStreamWaitEvent", &c.StreamWaitEvent, &missing);
  load(lib, "cudaLaunchHostFunc", &c.LaunchHostFunc, &missing);
  load(lib, "cudaEventCreate", &c.EventCreate, &missing);
  load(lib, "cudaEventRecord", &c.EventRecord, &missing);
  load(lib, "cudaEventQuery", &c.EventQuery, &missing);
  load(lib, "cudaEventSynchronize", &c.EventSynchronize, &missing);
  load(lib, "cudaEventDestroy", &c.EventDestroy, &missing);
  load(lib, "cudaEventElapsedTime", &c.EventElapsedTime, &missing);
  if (!missing.empty()) {
    return fail(ANYCHIP_ERROR_UNAVAILABLE, std::string("gpu: ") + lib_name + " lacks " + missing);
  }

  int count = 0;
  if (int err = c.GetDeviceCount(&count)) {
    c.GetLastError();
    // Without a driver cudart says "driver version is insufficient", which sends users hunting
    // for the wrong fix; say what is really missing.
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    std::string hint = driver ? "" : " -- no NVIDIA driver here (libcuda.so.1 not found)";
    if (driver) dlclose(driver);
    return fail(ANYCHIP_ERROR_UNAVAILABLE, "gpu: cudaGetDeviceCount failed: " +
                                               cuda_text(rt, err) + " (error " +
                                               std::to_string(err) + ")" + hint);
  }
  if (count <= 0) {
    return fail(ANYCHIP_ERROR_UNAVAILABLE, "gpu: no CUDA device (cudaGetDeviceCount returned 0)");
  }

  // cudart has loaded the driver by now, so this only takes another reference to it.
  if (void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(driver, "cuInit"));
    std::string unused;
    load(driver, "cuDeviceGet", &rt->driver.DeviceGet, &unused);
    load(driver, "cuDeviceGetName", &rt->driver.DeviceGetName, &unused);
    if (!init || init(0) != 0) rt->driver = DriverApi{};
  }

  // CUDA decides what fits (cudaMalloc, cudaMemGetInfo): the book only counts what is live.
  AnychipBook* book = anychip_book_new("gpu", static_cast<size_t>(count), UINT64_MAX, kMinChunkSize);
  if (!book) return ANYCHIP_ERROR_INTERNAL;  // the book said why
  anychip_book_set_initialized(book, 1);
  rt->book = book;
  rt->device_count = count;
  rt->ready.store(true, std::memory_order_release);
  return ANYCHIP_OK;
}

// What finalize frees: the handles and allocations still live (leaks, best effort).
void release_handle(void* handle, AnychipHandleKind kind, void* cuda) {
  const CudaApi& c = *static_cast<const CudaApi*>(cuda);
  kind == ANYCHIP_HANDLE_STREAM ? c.StreamDestroy(handle) : c.EventDestroy(handle);
}
void release_allocation(void* base, int, int host, void* cuda) {
  const CudaApi& c = *static_cast<const CudaApi*>(cuda);
  host ? c.FreeHost(base) : c.Free(base);
}

AnychipStatus finalize(AnychipRuntime rt) {
  if (AnychipStatus s = require_ready(rt, "finalize")) return s;
  std::lock_guard<std::mutex> lock(rt->mu);
  rt->ready.store(false, std::memory_order_release);
  // Best effort, errors ignored: at process exit the CUDA runtime may already be unloading, and
  // a failed context cannot be helped here. Drain first, since leftovers may still be in use.
  const CudaApi& c = rt->cuda;
  for (int device = 0; device < rt->device_count; ++device) {
    c.SetDevice(device);
    c.DeviceSynchronize();
  }
  if (anychip_book_lock(rt->book) == ANYCHIP_OK) {
    anychip_book_each_handle(rt->book, release_handle, &rt->cuda);
    anychip_book_each_allocation(rt->book, release_allocation, &rt->cuda);
    anychip_book_unlock(rt->book, ANYCHIP_OK);
  }
  anychip_book_free(rt->book);
  rt->book = nullptr;
  c.GetLastError();
  return ANYCHIP_OK;
}

AnychipStatus get_device_count(AnychipRuntime rt, size_t* count) {
  if (AnychipStatus s = require_ready(rt, "get_device_count")) return s;
  if (!count) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "gpu get_device_count: count is NULL");
  *count = static_cast<size_t>(rt->device_count);
  return ANYCHIP_OK;
}

AnychipStatus get_device_list(AnychipRuntime rt, size_t* ids, size_t count) {
  if (AnychipStatus s = require_ready(rt, "get_device_list")) return s;
  if (count > static_cast<size_t>(rt->device_count)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                "gpu get_device_list: count " + std::to_string(count) + " exceeds the " +
                    std::to_string(rt->device_count) + " devices");
  }
  if (!ids && count > 0) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "gpu get_device_list: ids is NULL");
  }
  for (size_t i = 0; i < count; ++i) ids[i] = i;
  return ANYCHIP_OK;
}

AnychipStatus init_device(AnychipRuntime rt, int device) {
  // cudaSetDevice creates the device's primary context, so first-use latency lands here.
  return enter(rt, device, "init_device");
}

AnychipStatus deinit_device(AnychipRuntime rt, int device) {
  if (AnychipStatus s = enter(rt, device, "deinit_device")) return s;
  // The primary context is shared with everything else in the process: drain it, never reset it.
  return check(rt, rt->cuda.DeviceSynchronize(), device, "deinit_device", "cudaDeviceSynchronize");
}

AnychipStatus set_device(AnychipRuntime rt, int device) {
  return enter(rt, device, "set_device");
}

AnychipStatus get_device(AnychipRuntime rt, int* device) {
  if (AnychipStatus s = require_ready(rt, "get_device")) return s;
  if (!device) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "gpu get_device: device is NULL");
  return check(rt, rt->cuda.GetDevice(device), -1, "get_device", "cudaGetDevice");
}

// ---- memory ------------------------------------------------------------------------------------

AnychipStatus device_allocate(AnychipRuntime rt, int device, void** ptr, size_t size) {
  const char* op = "device_allocate";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = require(ptr != nullptr, device, op, "ptr is NULL")) return s;
  *ptr = nullptr;
  if (AnychipStatus s = require(size != 0, device, op, "size is 0")) return s;

  void* allocation = nullptr;
  int err = rt->cuda.Malloc(&allocation, size);
  if (err == kCudaErrorMemoryAllocation) {
    rt->cuda.GetLastError();
    std::string message = gpu(device) + " out of memory: requested " + std::to_string(size) +
                          " bytes";
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (rt->cuda.MemGetInfo(&free_bytes, &total_bytes) == 0) {
      message += ", " + std::to_string(free_bytes) + " free of " + std::to_string(total_bytes);
    }
    return fail(ANYCHIP_ERROR_OUT_OF_MEMORY,
                message + " (cudaMalloc: " + cuda_text(rt, err) + ")");
  }
  if (AnychipStatus s = check(rt, err, device, op, "cudaMalloc")) return s;

  const uint64_t rounded = (size + kMinChunkSize - 1) / kMinChunkSize * kMinChunkSize;
  if (AnychipStatus s = with_book(rt, device, [&] {
        return anychip_book_add(rt->book, device, 0, allocation, size, rounded);
      })) {
    rt->cuda.Free(allocation);
    return s;
  }
  *ptr = allocation;
  return ANYCHIP_OK;
}

AnychipStatus device_free(AnychipRuntime rt, int device, void* ptr) {
  const char* op = "device_free";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  // Unrecorded before cudaFree so two racing frees of one pointer cannot both reach CUDA.
  if (AnychipStatus s = with_book(rt, device, [&] { return anychip_book_remove(rt->book, device, 0, ptr, op); })) {
    return s;
  }
  return check(rt, rt->cuda.Free(ptr), device, op, "cudaFree");
}

AnychipStatus host_allocate(AnychipRuntime rt, int device, void** ptr, size_t size) {
  const char* op = "host_allocate";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = require(ptr != nullptr, device, op, "ptr is NULL")) return s;
  *ptr = nullptr;
  if (AnychipStatus s = require(size != 0, device, op, "size is 0")) return s;

  void* allocation = nullptr;
  int err = rt->cuda.MallocHost(&allocation, size);
  if (err == kCudaErrorMemoryAllocation) {
    rt->cuda.GetLastError();
    return fail(ANYCHIP_ERROR_OUT_OF_MEMORY,
                gpu(device) + " out of pinned host memory: requested " + std::to_string(size) +
                    " bytes (cudaMallocHost: " + cuda_text(rt, err) + ")");
  }
  if (AnychipStatus s = check(rt, err, device, op, "cudaMallocHost")) return s;
  if (AnychipStatus s = with_book(rt, device, [&] {
        return anychip_book_add(rt->book, device, 1, allocation, size, 0);
      })) {
    rt->cuda.FreeHost(allocation);
    return s;
  }
  *ptr = allocation;
  return ANYCHIP_OK;
}

AnychipStatus host_free(AnychipRuntime rt, int device, void* ptr) {
  const char* op = "host_free";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = with_book(rt, device, [&] { return anychip_book_remove(rt->book, device, 1, ptr, op); })) {
    return s;
  }
  return check(rt, rt->cuda.FreeHost(ptr), device, op, "cudaFreeHost");
}

// The contract's synchronous operations. Our streams are non-blocking, so the legacy stream that
// cudaMemset/cudaMemcpy use is not ordered after them: wait for the whole device first. Then wait
// for the operation itself, since cudaMemset, device-to-device and pageable host-to-device
// cudaMemcpy may return before the data has landed.
template <typename Op>
AnychipStatus run_sync(AnychipRuntime rt, int device, const char* op, const char* api, Op run) {
  const CudaApi& c = rt->cuda;
  if (AnychipStatus s = check(rt, c.DeviceSynchronize(), device, op, "cudaDeviceSynchronize")) {
    return s;
  }
  if (AnychipStatus s = check(rt, run(), device, op, api)) return s;
  return check(rt, c.StreamSynchronize(nullptr), device, op, "cudaStreamSynchronize");
}

AnychipStatus device_memset(AnychipRuntime rt, int device, void* ptr, int value, size_t size) {
  const char* op = "memset";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (size == 0) return ANYCHIP_OK;
  if (AnychipStatus s = require(ptr != nullptr, device, op, "ptr is NULL")) return s;
  return run_sync(rt, device, op, "cudaMemset",
                  [&] { return rt->cuda.Memset(ptr, value, size); });
}

AnychipStatus copy_sync(AnychipRuntime rt, int device, void* dst, const void* src, size_t size,
                        int kind, const char* op) {
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (size == 0) return ANYCHIP_OK;
  if (AnychipStatus s = require(dst != nullptr, device, op, "dst is NULL")) return s;
  if (AnychipStatus s = require(src != nullptr, device, op, "src is NULL")) return s;
  return run_sync(rt, device, op, "cudaMemcpy",
                  [&] { return rt->cuda.Memcpy(dst, src, size, kind); });
}

AnychipStatus memcpy_h2d(AnychipRuntime rt, int device, void* dst, const void* src, size_t size) {
  return copy_sync(rt, device, dst, src, size, kCudaMemcpyHostToDevice, "memcpy_h2d");
}

AnychipStatus memcpy_d2h(AnychipRuntime rt, int device, void* dst, const void* src, size_t size) {
  return copy_sync(rt, device, dst, src, size, kCudaMemcpyDeviceToHost, "memcpy_d2h");
}

AnychipStatus memcpy_d2d(AnychipRuntime rt, int device, void* dst, const void* src, size_t size) {
  return copy_sync(rt, device, dst, src, size, kCudaMemcpyDeviceToDevice, "memcpy_d2d");
}

AnychipStatus copy_async(AnychipRuntime rt, int device, AnychipStream stream, void* dst,
                         const void* src, size_t size, int kind, const char* op) {
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_STREAM, stream, device, HandleUse::kOwnDevice)) {
    return s;
  }
  if (size == 0) return ANYCHIP_OK;
  if (AnychipStatus s = require(dst != nullptr, device, op, "dst is NULL")) return s;
  if (AnychipStatus s = require(src != nullptr, device, op, "src is NULL")) return s;
  return check(rt, rt->cuda.MemcpyAsync(dst, src, size, kind, stream), device, op,
               "cudaMemcpyAsync");
}

AnychipStatus memcpy_h2d_async(AnychipRuntime rt, int device, AnychipStream stream, void* dst,
                               const void* src, size_t size) {
  return copy_async(rt, device, stream, dst, src, size, kCudaMemcpyHostToDevice,
                    "memcpy_h2d_async");
}

AnychipStatus memcpy_d2h_async(AnychipRuntime rt, int device, AnychipStream stream, void* dst,
                               const void* src, size_t size) {
  return copy_async(rt, device, stream, dst, src, size, kCudaMemcpyDeviceToHost,
                    "memcpy_d2h_async");
}

AnychipStatus memcpy_d2d_async(AnychipRuntime rt, int device, AnychipStream stream, void* dst,
                               const void* src, size_t size) {
  return copy_async(rt, device, stream, dst, src, size, kCudaMemcpyDeviceToDevice,
                    "memcpy_d2d_async");
}

AnychipStatus memory_stats(AnychipRuntime rt, int device, AnychipMemoryStats* stats) {
  const char* op = "memory_stats";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  if (AnychipStatus s = with_book(rt, device, [&] { return anychip_book_stats(rt->book, device, stats); })) return s;
  // The counts are the book's; what is free is CUDA's (other users of the device included).
  if (AnychipStatus s = check(rt, rt->cuda.MemGetInfo(&free_bytes, &total_bytes), device, op,
                              "cudaMemGetInfo")) {
    return s;
  }
  stats->total_bytes = total_bytes;
  stats->free_bytes = free_bytes;
  return ANYCHIP_OK;
}

// ---- streams -----------------------------------------------------------------------------------

AnychipStatus stream_create(AnychipRuntime rt, int device, AnychipStream* stream) {
  const char* op = "stream_create";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = require(stream != nullptr, device, op, "stream is NULL")) return s;
  void* created = nullptr;
  if (AnychipStatus s = check(rt, rt->cuda.StreamCreateWithFlags(&created, kCudaStreamNonBlocking),
                              device, op, "cudaStreamCreateWithFlags")) {
    return s;
  }
  if (AnychipStatus s = with_book(rt, device, [&] {
        return anychip_book_add_handle(rt->book, ANYCHIP_HANDLE_STREAM, device, created);
      })) {
    rt->cuda.StreamDestroy(created);
    return s;
  }
  *stream = static_cast<AnychipStream>(created);
  return ANYCHIP_OK;
}

AnychipStatus stream_destroy(AnychipRuntime rt, int device, AnychipStream stream) {
  const char* op = "stream_destroy";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_STREAM, stream, device, HandleUse::kRemove)) {
    return s;
  }
  // Destroyed even when its work failed: the handle is already gone from the book.
  AnychipStatus drained =
      check(rt, rt->cuda.StreamSynchronize(stream), device, op, "cudaStreamSynchronize");
  AnychipStatus destroyed =
      check(rt, rt->cuda.StreamDestroy(stream), device, op, "cudaStreamDestroy");
  return drained ? drained : destroyed;
}

AnychipStatus stream_query(AnychipRuntime rt, int device, AnychipStream stream) {
  const char* op = "stream_query";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_STREAM, stream, device, HandleUse::kOwnDevice)) {
    return s;
  }
  return check(rt, rt->cuda.StreamQuery(stream), device, op, "cudaStreamQuery");
}

AnychipStatus stream_synchronize(AnychipRuntime rt, int device, AnychipStream stream) {
  const char* op = "stream_synchronize";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_STREAM, stream, device, HandleUse::kOwnDevice)) {
    return s;
  }
  return check(rt, rt->cuda.StreamSynchronize(stream), device, op, "cudaStreamSynchronize");
}

struct StreamCallback {
  AnychipStreamCallback callback;
  void* user_data;
};

void run_stream_callback(void* arg) {
  const StreamCallback* closure = static_cast<StreamCallback*>(arg);
  closure->callback(closure->user_data, ANYCHIP_OK);
  delete closure;
}

AnychipStatus stream_add_callback(AnychipRuntime rt, int device, AnychipStream stream,
                                  AnychipStreamCallback callback, void* user_data) {
  const char* op = "stream_add_callback";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_STREAM, stream, device, HandleUse::kOwnDevice)) {
    return s;
  }
  if (AnychipStatus s = require(callback != nullptr, device, op, "callback is NULL")) return s;
  auto* closure = new (std::nothrow) StreamCallback{callback, user_data};
  if (!closure) {
    return fail(ANYCHIP_ERROR_OUT_OF_MEMORY, gpu(device) + " " + op + ": no host memory");
  }
  AnychipStatus s = check(rt, rt->cuda.LaunchHostFunc(stream, run_stream_callback, closure),
                          device, op, "cudaLaunchHostFunc");
  if (s) delete closure;
  return s;
}

// ---- events ------------------------------------------------------------------------------------

AnychipStatus event_create(AnychipRuntime rt, int device, AnychipEvent* event) {
  const char* op = "event_create";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = require(event != nullptr, device, op, "event is NULL")) return s;
  void* created = nullptr;
  // Default flags: timing stays enabled, which event_elapsed_ms needs.
  if (AnychipStatus s = check(rt, rt->cuda.EventCreate(&created), device, op, "cudaEventCreate")) {
    return s;
  }
  if (AnychipStatus s = with_book(rt, device, [&] {
        return anychip_book_add_handle(rt->book, ANYCHIP_HANDLE_EVENT, device, created);
      })) {
    rt->cuda.EventDestroy(created);
    return s;
  }
  *event = static_cast<AnychipEvent>(created);
  return ANYCHIP_OK;
}

AnychipStatus event_record(AnychipRuntime rt, int device, AnychipStream stream,
                           AnychipEvent event) {
  const char* op = "event_record";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_STREAM, stream, device, HandleUse::kOwnDevice)) {
    return s;
  }
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_EVENT, event, device, HandleUse::kOwnDevice)) {
    return s;
  }
  return check(rt, rt->cuda.EventRecord(event, stream), device, op, "cudaEventRecord");
}

AnychipStatus event_query(AnychipRuntime rt, int device, AnychipEvent event) {
  const char* op = "event_query";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_EVENT, event, device, HandleUse::kOwnDevice)) {
    return s;
  }
  return check(rt, rt->cuda.EventQuery(event), device, op, "cudaEventQuery");
}

AnychipStatus event_synchronize(AnychipRuntime rt, int device, AnychipEvent event) {
  const char* op = "event_synchronize";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_EVENT, event, device, HandleUse::kOwnDevice)) {
    return s;
  }
  return check(rt, rt->cuda.EventSynchronize(event), device, op, "cudaEventSynchronize");
}

AnychipStatus event_destroy(AnychipRuntime rt, int device, AnychipEvent event) {
  const char* op = "event_destroy";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_EVENT, event, device, HandleUse::kRemove)) {
    return s;
  }
  return check(rt, rt->cuda.EventDestroy(event), device, op, "cudaEventDestroy");
}

AnychipStatus stream_wait_event(AnychipRuntime rt, int device, AnychipStream stream,
                                AnychipEvent event) {
  const char* op = "stream_wait_event";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_STREAM, stream, device, HandleUse::kOwnDevice)) {
    return s;
  }
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_EVENT, event, device, HandleUse::kAnyDevice)) {
    return s;
  }
  return check(rt, rt->cuda.StreamWaitEvent(stream, event, kCudaEventWaitDefault), device, op,
               "cudaStreamWaitEvent");
}

AnychipStatus event_elapsed_ms(AnychipRuntime rt, int device, AnychipEvent start,
                               AnychipEvent end, float* ms) {
  const char* op = "event_elapsed_ms";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = require(ms != nullptr, device, op, "ms is NULL")) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_EVENT, start, device, HandleUse::kOwnDevice)) {
    return s;
  }
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_EVENT, end, device, HandleUse::kOwnDevice)) {
    return s;
  }
  return check(rt, rt->cuda.EventElapsedTime(ms, start, end), device, op,
               "cudaEventElapsedTime");
}

// ---- device ------------------------------------------------------------------------------------

AnychipStatus synchronize_device(AnychipRuntime rt, int device) {
  const char* op = "synchronize_device";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  return check(rt, rt->cuda.DeviceSynchronize(), device, op, "cudaDeviceSynchronize");
}

AnychipStatus get_properties(AnychipRuntime rt, int device, AnychipDeviceProperties* props) {
  const char* op = "get_properties";
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = require(props != nullptr, device, op, "props is NULL")) return s;
  constexpr size_t kFilled = offsetof(AnychipDeviceProperties, max_alloc_size) +
                             sizeof(AnychipDeviceProperties::max_alloc_size);
  if (props->struct_size < kFilled) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                gpu(device) + " get_properties: props->struct_size " +
                    std::to_string(props->struct_size) + " is below " + std::to_string(kFilled));
  }
  const CudaApi& c = rt->cuda;
  int major = 0;
  int minor = 0;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  int runtime_version = 0;
  int driver_version = 0;
  AnychipStatus s = check(
      rt, c.DeviceGetAttribute(&major, kCudaDevAttrComputeCapabilityMajor, device), device, op,
      "cudaDeviceGetAttribute");
  if (!s) {
    s = check(rt, c.DeviceGetAttribute(&minor, kCudaDevAttrComputeCapabilityMinor, device),
              device, op, "cudaDeviceGetAttribute");
  }
  if (!s) s = check(rt, c.MemGetInfo(&free_bytes, &total_bytes), device, op, "cudaMemGetInfo");
  if (!s) s = check(rt, c.RuntimeGetVersion(&runtime_version), device, op, "cudaRuntimeGetVersion");
  if (!s) s = check(rt, c.DriverGetVersion(&driver_version), device, op, "cudaDriverGetVersion");
  if (s) return s;

  // Runtime and driver ordinals agree: both enumerate the same CUDA_VISIBLE_DEVICES list.
  const DriverApi& d = rt->driver;
  int handle = 0;
  if (!d.DeviceGet || !d.DeviceGetName || d.DeviceGet(&handle, device) != 0 ||
      d.DeviceGetName(props->name, sizeof props->name, handle) != 0) {
    std::snprintf(props->name, sizeof props->name, "NVIDIA GPU (sm_%d%d)", major, minor);
  }
  std::snprintf(props->vendor, sizeof props->vendor, "NVIDIA");
  props->total_memory = total_bytes;
  props->compute_capability = major * 10 + minor;
  props->simulated = 0;
  props->runtime_version = static_cast<uint64_t>(runtime_version);
  props->driver_version = static_cast<uint64_t>(driver_version);
  props->dtypes = 0;
  for (AnychipDtype dtype :
       {ANYCHIP_DTYPE_FLOAT32, ANYCHIP_DTYPE_FLOAT16, ANYCHIP_DTYPE_BFLOAT16,
        ANYCHIP_DTYPE_FLOAT64, ANYCHIP_DTYPE_INT8, ANYCHIP_DTYPE_UINT8, ANYCHIP_DTYPE_INT16,
        ANYCHIP_DTYPE_INT32, ANYCHIP_DTYPE_INT64, ANYCHIP_DTYPE_BOOL}) {
    props->dtypes |= ANYCHIP_DTYPE_BIT(dtype);
  }
  props->min_chunk_size = kMinChunkSize;
  props->max_alloc_size = total_bytes;
  return ANYCHIP_OK;
}


// ---- collectives over NCCL (device.h ABI 1.2) --------------------------------------------------
//
// libnccl.so.2 (the nvidia-nccl-cu12 wheel ships one) is opened with dlopen at the first
// collective call, like libcudart; without it every collective returns ANYCHIP_ERROR_UNAVAILABLE
// with the reason. Each function maps one to one to its NCCL call; all_to_all is a group of
// sends and recvs, as NCCL's documentation does it. The enum values are those of nccl.h.

struct NcclUniqueId {
  char internal[ANYCHIP_COMM_UNIQUE_ID_BYTES];  // NCCL_UNIQUE_ID_BYTES
};

struct NcclApi {
  const char* (*GetErrorString)(int result);
  int (*GetUniqueId)(NcclUniqueId* id);
  int (*CommInitRank)(void** comm, int nranks, NcclUniqueId id, int rank);
  int (*CommDestroy)(void* comm);
  int (*AllReduce)(const void* send, void* recv, size_t count, int dtype, int op, void* comm,
                   void* stream);
  int (*Broadcast)(const void* send, void* recv, size_t count, int dtype, int root, void* comm,
                   void* stream);
  int (*Reduce)(const void* send, void* recv, size_t count, int dtype, int op, int root,
                void* comm, void* stream);
  int (*AllGather)(const void* send, void* recv, size_t count, int dtype, void* comm,
                   void* stream);
  int (*ReduceScatter)(const void* send, void* recv, size_t count, int dtype, int op, void* comm,
                       void* stream);
  int (*Send)(const void* buf, size_t count, int dtype, int peer, void* comm, void* stream);
  int (*Recv)(void* buf, size_t count, int dtype, int peer, void* comm, void* stream);
  int (*GroupStart)();
  int (*GroupEnd)();
};

std::mutex g_nccl_mu;
NcclApi g_nccl{};
bool g_nccl_loaded = false;
std::string g_nccl_error;  // why loading failed, once tried

AnychipStatus load_nccl() {
  std::lock_guard<std::mutex> lock(g_nccl_mu);
  if (g_nccl_loaded) return ANYCHIP_OK;
  if (g_nccl_error.empty()) {
    void* lib = nullptr;
    std::string reasons;
    for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      const char* why = dlerror();
      reasons += std::string(reasons.empty() ? "" : "; ") + (why ? why : name);
    }
    if (!lib) {
      g_nccl_error = "NCCL is not available (" + reasons +
                     "); install the nvidia-nccl-cu12 wheel or put libnccl.so.2 on LD_LIBRARY_PATH";
    } else {
      std::string missing;
      NcclApi api{};
      load(lib, "ncclGetErrorString", &api.GetErrorString, &missing);
      load(lib, "ncclGetUniqueId", &api.GetUniqueId, &missing);
      load(lib, "ncclCommInitRank", &api.CommInitRank, &missing);
      load(lib, "ncclCommDestroy", &api.CommDestroy, &missing);
      load(lib, "ncclAllReduce", &api.AllReduce, &missing);
      load(lib, "ncclBroadcast", &api.Broadcast, &missing);
      load(lib, "ncclReduce", &api.Reduce, &missing);
      load(lib, "ncclAllGather", &api.AllGather, &missing);
      load(lib, "ncclReduceScatter", &api.ReduceScatter, &missing);
      load(lib, "ncclSend", &api.Send, &missing);
      load(lib, "ncclRecv", &api.Recv, &missing);
      load(lib, "ncclGroupStart", &api.GroupStart, &missing);
      load(lib, "ncclGroupEnd", &api.GroupEnd, &missing);
      if (!missing.empty()) {
        g_nccl_error = "NCCL is too old: libnccl.so.2 lacks " + missing + " (send/recv need 2.7)";
      } else {
        g_nccl = api;
        g_nccl_loaded = true;
        return ANYCHIP_OK;
      }
    }
  }
  return fail(ANYCHIP_ERROR_UNAVAILABLE, "gpu: " + g_nccl_error);
}

AnychipStatus check_nccl(int result, int device, const char* op, const char* api) {
  if (result == 0) return ANYCHIP_OK;
  // ncclInvalidArgument = 4, ncclInvalidUsage = 5; the rest are failures of the system or peers.
  AnychipStatus status = (result == 4 || result == 5) ? ANYCHIP_ERROR_INVALID_ARGUMENT
                                                      : ANYCHIP_ERROR_DEVICE;
  return fail(status, gpu(device) + " " + op + " failed (" + api + ": " +
                          (g_nccl.GetErrorString ? g_nccl.GetErrorString(result) : "?") + ")");
}

}  // namespace

struct AnychipComm_st {
  void* nccl;
  int device, rank, nranks;
};

namespace {

std::mutex g_comm_mu;
std::unordered_set<AnychipComm> g_comms;

// AnychipDtype -> ncclDataType_t; bool travels as uint8 (see nccl_op). -1: NCCL has no int16.
int nccl_dtype(AnychipDtype dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_INT8: return 0;
    case ANYCHIP_DTYPE_UINT8: case ANYCHIP_DTYPE_BOOL: return 1;
    case ANYCHIP_DTYPE_INT32: return 2;
    case ANYCHIP_DTYPE_INT64: return 4;
    case ANYCHIP_DTYPE_FLOAT16: return 6;
    case ANYCHIP_DTYPE_FLOAT32: return 7;
    case ANYCHIP_DTYPE_FLOAT64: return 8;
    case ANYCHIP_DTYPE_BFLOAT16: return 9;
    default: return -1;
  }
}

// AnychipReduceOp -> ncclRedOp_t (the same numbering). On bool (as uint8 0/1), sum is max
// (logical or) and prod is min (logical and); avg is invalid.
int nccl_op(AnychipDtype dtype, AnychipReduceOp op) {
  if (op < ANYCHIP_REDUCE_SUM || op > ANYCHIP_REDUCE_AVG) return -1;
  if (dtype == ANYCHIP_DTYPE_BOOL) {
    if (op == ANYCHIP_REDUCE_AVG) return -1;
    if (op == ANYCHIP_REDUCE_SUM) return ANYCHIP_REDUCE_MAX;
    if (op == ANYCHIP_REDUCE_PROD) return ANYCHIP_REDUCE_MIN;
  }
  return static_cast<int>(op);
}

// Prologue of every collective: NCCL is loaded, `comm` is live and its device current, `stream`
// belongs to that device, and `dtype` (and `op`, when given) map to NCCL.
AnychipStatus enter_comm(AnychipRuntime rt, AnychipComm comm, AnychipStream stream,
                         AnychipDtype dtype, const AnychipReduceOp* op, const char* name,
                         int* nccl_type, int* nccl_red) {
  if (AnychipStatus s = load_nccl()) return s;
  {
    std::lock_guard<std::mutex> lock(g_comm_mu);
    if (!comm || !g_comms.count(comm)) {
      return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                  std::string("gpu ") + name + ": comm " + hex(comm) + " is not a live communicator");
    }
  }
  if (AnychipStatus s = enter(rt, comm->device, name)) return s;
  if (AnychipStatus s = check_handle(rt, ANYCHIP_HANDLE_STREAM, stream, comm->device, HandleUse::kOwnDevice)) {
    return s;
  }
  *nccl_type = nccl_dtype(dtype);
  if (*nccl_type < 0) {
    return fail(ANYCHIP_ERROR_UNSUPPORTED, gpu(comm->device) + " " + name + ": NCCL has no dtype " +
                                               std::to_string(static_cast<int>(dtype)));
  }
  if (op) {
    *nccl_red = nccl_op(dtype, *op);
    if (*nccl_red < 0) {
      return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                  gpu(comm->device) + " " + name + ": op " + std::to_string(static_cast<int>(*op)) +
                      " is not a reduction on dtype " + std::to_string(static_cast<int>(dtype)));
    }
  }
  return ANYCHIP_OK;
}

AnychipStatus comm_get_unique_id_size(AnychipRuntime, size_t* size) {
  if (!size) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "gpu comm_get_unique_id_size: size is NULL");
  *size = sizeof(NcclUniqueId);
  return ANYCHIP_OK;
}

AnychipStatus comm_get_unique_id(AnychipRuntime, void* id, size_t size) {
  if (AnychipStatus s = load_nccl()) return s;
  if (!id || size < sizeof(NcclUniqueId)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "gpu comm_get_unique_id: id is NULL or size " +
                                                    std::to_string(size) + " < 128");
  }
  NcclUniqueId uid{};
  if (AnychipStatus s = check_nccl(g_nccl.GetUniqueId(&uid), -1, "comm_get_unique_id",
                                   "ncclGetUniqueId")) {
    return s;
  }
  std::memcpy(id, &uid, sizeof(uid));
  return ANYCHIP_OK;
}

AnychipStatus comm_init_rank(AnychipRuntime rt, int device, const void* id, size_t id_size,
                             int rank, int nranks, AnychipComm* comm) {
  const char* op = "comm_init_rank";
  if (AnychipStatus s = load_nccl()) return s;
  if (AnychipStatus s = enter(rt, device, op)) return s;
  if (AnychipStatus s = require(id && id_size == sizeof(NcclUniqueId), device, op,
                                "id must be the 128 bytes comm_get_unique_id wrote")) {
    return s;
  }
  if (AnychipStatus s = require(nranks >= 1 && rank >= 0 && rank < nranks && comm, device, op,
                                "rank must be in 0..nranks-1 and comm non-NULL")) {
    return s;
  }
  NcclUniqueId uid;
  std::memcpy(&uid, id, sizeof(uid));
  void* handle = nullptr;
  if (AnychipStatus s = check_nccl(g_nccl.CommInitRank(&handle, nranks, uid, rank), device, op,
                                   "ncclCommInitRank")) {
    return s;
  }
  auto* c = new AnychipComm_st{handle, device, rank, nranks};
  std::lock_guard<std::mutex> lock(g_comm_mu);
  g_comms.insert(c);
  *comm = c;
  return ANYCHIP_OK;
}

AnychipStatus comm_destroy(AnychipRuntime rt, AnychipComm comm) {
  const char* op = "comm_destroy";
  if (AnychipStatus s = load_nccl()) return s;
  {
    std::lock_guard<std::mutex> lock(g_comm_mu);
    if (!comm || !g_comms.erase(comm)) {
      return fail(ANYCHIP_ERROR_INVALID_ARGUMENT,
                  std::string("gpu comm_destroy: comm ") + hex(comm) + " is not a live communicator");
    }
  }
  int device = comm->device;
  void* handle = comm->nccl;
  delete comm;
  if (AnychipStatus s = enter(rt, device, op)) return s;
  return check_nccl(g_nccl.CommDestroy(handle), device, op, "ncclCommDestroy");
}

AnychipStatus all_reduce(AnychipRuntime rt, const void* send, void* recv, size_t count,
                         AnychipDtype dtype, AnychipReduceOp op, AnychipComm comm,
                         AnychipStream stream) {
  int t = 0, r = 0;
  if (AnychipStatus s = enter_comm(rt, comm, stream, dtype, &op, "all_reduce", &t, &r)) return s;
  return check_nccl(g_nccl.AllReduce(send, recv, count, t, r, comm->nccl, stream), comm->device,
                    "all_reduce", "ncclAllReduce");
}

AnychipStatus broadcast(AnychipRuntime rt, const void* send, void* recv, size_t count,
                        AnychipDtype dtype, int root, AnychipComm comm, AnychipStream stream) {
  int t = 0, r = 0;
  if (AnychipStatus s = enter_comm(rt, comm, stream, dtype, nullptr, "broadcast", &t, &r)) return s;
  return check_nccl(g_nccl.Broadcast(send, recv, count, t, root, comm->nccl, stream), comm->device,
                    "broadcast", "ncclBroadcast");
}

AnychipStatus reduce(AnychipRuntime rt, const void* send, void* recv, size_t count,
                     AnychipDtype dtype, AnychipReduceOp op, int root, AnychipComm comm,
                     AnychipStream stream) {
  int t = 0, r = 0;
  if (AnychipStatus s = enter_comm(rt, comm, stream, dtype, &op, "reduce", &t, &r)) return s;
  return check_nccl(g_nccl.Reduce(send, recv, count, t, r, root, comm->nccl, stream), comm->device,
                    "reduce", "ncclReduce");
}

AnychipStatus all_gather(AnychipRuntime rt, const void* send, void* recv, size_t count,
                         AnychipDtype dtype, AnychipComm comm, AnychipStream stream) {
  int t = 0, r = 0;
  if (AnychipStatus s = enter_comm(rt, comm, stream, dtype, nullptr, "all_gather", &t, &r)) return s;
  return check_nccl(g_nccl.AllGather(send, recv, count, t, comm->nccl, stream), comm->device,
                    "all_gather", "ncclAllGather");
}

AnychipStatus reduce_scatter(AnychipRuntime rt, const void* send, void* recv, size_t count,
                             AnychipDtype dtype, AnychipReduceOp op, AnychipComm comm,
                             AnychipStream stream) {
  int t = 0, r = 0;
  if (AnychipStatus s = enter_comm(rt, comm, stream, dtype, &op, "reduce_scatter", &t, &r)) return s;
  return check_nccl(g_nccl.ReduceScatter(send, recv, count, t, r, comm->nccl, stream),
                    comm->device, "reduce_scatter", "ncclReduceScatter");
}

size_t dtype_bytes(AnychipDtype dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT16: case ANYCHIP_DTYPE_BFLOAT16: case ANYCHIP_DTYPE_INT16: return 2;
    case ANYCHIP_DTYPE_FLOAT32: case ANYCHIP_DTYPE_INT32: return 4;
    case ANYCHIP_DTYPE_FLOAT64: case ANYCHIP_DTYPE_INT64: return 8;
    default: return 1;
  }
}

AnychipStatus all_to_all(AnychipRuntime rt, const void* send, void* recv, size_t count,
                         AnychipDtype dtype, AnychipComm comm, AnychipStream stream) {
  const char* op = "all_to_all";
  int t = 0, r = 0;
  if (AnychipStatus s = enter_comm(rt, comm, stream, dtype, nullptr, op, &t, &r)) return s;
  size_t slice = count * dtype_bytes(dtype);
  if (AnychipStatus s = check_nccl(g_nccl.GroupStart(), comm->device, op, "ncclGroupStart")) return s;
  AnychipStatus first = ANYCHIP_OK;
  for (int peer = 0; peer < comm->nranks && first == ANYCHIP_OK; ++peer) {
    first = check_nccl(g_nccl.Send(static_cast<const char*>(send) + peer * slice, count, t, peer,
                                   comm->nccl, stream), comm->device, op, "ncclSend");
    if (first == ANYCHIP_OK) {
      first = check_nccl(g_nccl.Recv(static_cast<char*>(recv) + peer * slice, count, t, peer,
                                     comm->nccl, stream), comm->device, op, "ncclRecv");
    }
  }
  AnychipStatus ended = check_nccl(g_nccl.GroupEnd(), comm->device, op, "ncclGroupEnd");
  return first != ANYCHIP_OK ? first : ended;
}

AnychipStatus send(AnychipRuntime rt, const void* buf, size_t count, AnychipDtype dtype, int peer,
                   AnychipComm comm, AnychipStream stream) {
  int t = 0, r = 0;
  if (AnychipStatus s = enter_comm(rt, comm, stream, dtype, nullptr, "send", &t, &r)) return s;
  return check_nccl(g_nccl.Send(buf, count, t, peer, comm->nccl, stream), comm->device, "send",
                    "ncclSend");
}

AnychipStatus recv(AnychipRuntime rt, void* buf, size_t count, AnychipDtype dtype, int peer,
                   AnychipComm comm, AnychipStream stream) {
  int t = 0, r = 0;
  if (AnychipStatus s = enter_comm(rt, comm, stream, dtype, nullptr, "recv", &t, &r)) return s;
  return check_nccl(g_nccl.Recv(buf, count, t, peer, comm->nccl, stream), comm->device, "recv",
                    "ncclRecv");
}

AnychipStatus group_start(AnychipRuntime) {
  if (AnychipStatus s = load_nccl()) return s;
  return check_nccl(g_nccl.GroupStart(), -1, "group_start", "ncclGroupStart");
}

AnychipStatus group_end(AnychipRuntime) {
  if (AnychipStatus s = load_nccl()) return s;
  return check_nccl(g_nccl.GroupEnd(), -1, "group_end", "ncclGroupEnd");
}

}  // namespace

// No options are recognised; the contract lets a plugin ignore keys it does not know.
extern "C" __attribute__((visibility("default"))) AnychipStatus anychip_device_init(
    AnychipDeviceInterface* iface, const char* /*options*/) {
  if (!iface) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "gpu: anychip_device_init: iface is NULL");
  }
  // last_error goes in first so that even a rejected table can report why.
  constexpr size_t kLastErrorEnd =
      offsetof(AnychipDeviceInterface, last_error) + sizeof(AnychipDeviceInterface::last_error);
  constexpr size_t kFilled = offsetof(AnychipDeviceInterface, get_properties) +
                             sizeof(AnychipDeviceInterface::get_properties);
  if (iface->struct_size >= kLastErrorEnd) iface->last_error = last_error;
  if (iface->struct_size < kFilled) {
    return fail(ANYCHIP_ERROR_UNSUPPORTED,
                "gpu: anychip_device_init: iface->struct_size " +
                    std::to_string(iface->struct_size) + " is below the " +
                    std::to_string(kFilled) + " bytes this plugin fills");
  }
  // The instance is never freed: the contract has no destroy call, and `last_error` may follow
  // `finalize`.
  AnychipRuntime rt = new (std::nothrow) AnychipRuntime_st;
  if (!rt) {
    return fail(ANYCHIP_ERROR_OUT_OF_MEMORY, "gpu: anychip_device_init: no host memory");
  }

  iface->abi_version = ANYCHIP_DEVICE_ABI_VERSION;
  iface->runtime = rt;
  iface->initialize = initialize;
  iface->finalize = finalize;
  iface->get_device_count = get_device_count;
  iface->get_device_list = get_device_list;
  iface->init_device = init_device;
  iface->deinit_device = deinit_device;
  iface->set_device = set_device;
  iface->get_device = get_device;
  iface->device_allocate = device_allocate;
  iface->device_free = device_free;
  iface->host_allocate = host_allocate;
  iface->host_free = host_free;
  iface->memset = device_memset;
  iface->memcpy_h2d = memcpy_h2d;
  iface->memcpy_d2h = memcpy_d2h;
  iface->memcpy_d2d = memcpy_d2d;
  iface->memcpy_h2d_async = memcpy_h2d_async;
  iface->memcpy_d2h_async = memcpy_d2h_async;
  iface->memcpy_d2d_async = memcpy_d2d_async;
  iface->memory_stats = memory_stats;
  iface->stream_create = stream_create;
  iface->stream_destroy = stream_destroy;
  iface->stream_query = stream_query;
  iface->stream_synchronize = stream_synchronize;
  iface->stream_add_callback = stream_add_callback;
  iface->event_create = event_create;
  iface->event_record = event_record;
  iface->event_query = event_query;
  iface->event_synchronize = event_synchronize;
  iface->event_destroy = event_destroy;
  iface->stream_wait_event = stream_wait_event;
  iface->event_elapsed_ms = event_elapsed_ms;
  iface->synchronize_device = synchronize_device;
  iface->get_properties = get_properties;
  // The collectives only when the caller's table has room for them (a caller built against
  // ABI 1.1 has `reserved` there, which a plugin never writes).
  constexpr size_t kCollectivesEnd =
      offsetof(AnychipDeviceInterface, group_end) + sizeof(AnychipDeviceInterface::group_end);
  if (iface->struct_size >= kCollectivesEnd) {
    iface->comm_get_unique_id_size = comm_get_unique_id_size;
    iface->comm_get_unique_id = comm_get_unique_id;
    iface->comm_init_rank = comm_init_rank;
    iface->comm_destroy = comm_destroy;
    iface->all_reduce = all_reduce;
    iface->broadcast = broadcast;
    iface->reduce = reduce;
    iface->all_gather = all_gather;
    iface->reduce_scatter = reduce_scatter;
    iface->all_to_all = all_to_all;
    iface->send = send;
    iface->recv = recv;
    iface->group_start = group_start;
    iface->group_end = group_end;
  }
  return ANYCHIP_OK;
}
