/*
 * A stand-in for libcudart with the slice of its ABI plugins/gpu/cuda_runtime.cc loads, over host
 * memory: two "devices", everything synchronous (a stream's work is done when it is queued, so
 * queries are always ready and waits return at once). It lets the gpu plugin's runtime keep the
 * device.h contract under the conformance kit on machines without a GPU: what it checks is the
 * plugin's own bookkeeping and argument handling, not CUDA.
 *
 * Built by tests/test_gpu_runtime_fake_cuda.py into a folder named by LD_LIBRARY_PATH, as
 * libcudart.so; its errors use the values of CUDA's driver_types.h.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kSuccess = 0, kInvalidValue = 1, kMemoryAllocation = 2, kInvalidDevice = 101 };
enum { kDevices = 2 };
static const size_t kTotalBytes = (size_t)1 << 30; /* per device */

static __thread int current;
static size_t in_use[kDevices];
static int last = kSuccess;

static int fail(int error) {
  last = error;
  return error;
}

/* Each device allocation carries a header with its device and size, so frees give it back;
 * what the caller gets is 256-byte aligned, as from cudaMalloc. */
enum { kAlign = 256 };
typedef struct {
  int device;
  size_t size;
} Header;

const char* cudaGetErrorString(int error) {
  switch (error) {
    case kSuccess: return "no error";
    case kInvalidValue: return "invalid argument (fake cudart)";
    case kMemoryAllocation: return "out of memory (fake cudart)";
    case kInvalidDevice: return "invalid device ordinal (fake cudart)";
    default: return "unknown error (fake cudart)";
  }
}
int cudaGetLastError(void) {
  const int error = last;
  last = kSuccess;
  return error;
}
int cudaGetDeviceCount(int* count) {
  *count = kDevices;
  return kSuccess;
}
int cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return fail(kInvalidDevice);
  current = device;
  return kSuccess;
}
int cudaGetDevice(int* device) {
  *device = current;
  return kSuccess;
}
int cudaDeviceGetAttribute(int* value, int attr, int device) {
  if (device < 0 || device >= kDevices) return fail(kInvalidDevice);
  *value = attr == 75 ? 9 : 0; /* compute capability 9.0 */
  return kSuccess;
}
int cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = kTotalBytes;
  *free_bytes = kTotalBytes - in_use[current];
  return kSuccess;
}
int cudaRuntimeGetVersion(int* version) {
  *version = 13000;
  return kSuccess;
}
int cudaDriverGetVersion(int* version) {
  *version = 13000;
  return kSuccess;
}
int cudaMalloc(void** ptr, size_t size) {
  const size_t charged = (size + kAlign - 1) / kAlign * kAlign; /* as the device's free memory shows it */
  if (charged > kTotalBytes - in_use[current]) return fail(kMemoryAllocation);
  char* base = (char*)aligned_alloc(kAlign, kAlign + charged);
  if (!base) return fail(kMemoryAllocation);
  Header* h = (Header*)base;
  h->device = current;
  h->size = charged;
  in_use[current] += charged;
  *ptr = base + kAlign;
  return kSuccess;
}
int cudaFree(void* ptr) {
  if (!ptr) return kSuccess;
  Header* h = (Header*)((char*)ptr - kAlign);
  in_use[h->device] -= h->size;
  free(h);
  return kSuccess;
}
int cudaMallocHost(void** ptr, size_t size) {
  *ptr = malloc(size ? size : 1);
  return *ptr ? kSuccess : fail(kMemoryAllocation);
}
int cudaFreeHost(void* ptr) {
  free(ptr);
  return kSuccess;
}
int cudaMemset(void* ptr, int value, size_t size) {
  memset(ptr, value, size);
  return kSuccess;
}
int cudaMemcpy(void* dst, const void* src, size_t size, int kind) {
  (void)kind;
  memmove(dst, src, size);
  return kSuccess;
}
int cudaMemcpyAsync(void* dst, const void* src, size_t size, int kind, void* stream) {
  (void)stream;
  return cudaMemcpy(dst, src, size, kind);
}
int cudaDeviceSynchronize(void) { return kSuccess; }

/* Streams and events are heap objects, so that each handle is distinct and a leak shows. */
int cudaStreamCreateWithFlags(void** stream, unsigned flags) {
  (void)flags;
  *stream = malloc(1);
  return *stream ? kSuccess : fail(kMemoryAllocation);
}
int cudaStreamDestroy(void* stream) {
  free(stream);
  return kSuccess;
}
int cudaStreamQuery(void* stream) {
  (void)stream;
  return kSuccess;
}
int cudaStreamSynchronize(void* stream) {
  (void)stream;
  return kSuccess;
}
int cudaStreamWaitEvent(void* stream, void* event, unsigned flags) {
  (void)stream, (void)event, (void)flags;
  return kSuccess;
}
int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* user_data) {
  (void)stream;
  fn(user_data);
  return kSuccess;
}

typedef struct {
  double seconds; /* when it was last recorded */
} Event;

int cudaEventCreate(void** event) {
  Event* e = (Event*)calloc(1, sizeof(Event));
  *event = e;
  return e ? kSuccess : fail(kMemoryAllocation);
}
int cudaEventRecord(void* event, void* stream) {
  (void)stream;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  ((Event*)event)->seconds = (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
  return kSuccess;
}
int cudaEventQuery(void* event) {
  (void)event;
  return kSuccess;
}
int cudaEventSynchronize(void* event) {
  (void)event;
  return kSuccess;
}
int cudaEventDestroy(void* event) {
  free(event);
  return kSuccess;
}
int cudaEventElapsedTime(float* ms, void* start, void* end) {
  *ms = (float)((((Event*)end)->seconds - ((Event*)start)->seconds) * 1e3);
  return kSuccess;
}
