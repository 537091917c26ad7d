/*
 * The {{name}} device runtime: every function of AnychipDeviceInterface (anychip/device.h).
 *
 * As generated, the "chip" is host memory and everything is synchronous: async copies run at
 * once, streams are empty handles, events complete when recorded, callbacks run inline. It
 * already keeps the contract (capacity, OUT_OF_MEMORY, rejected double frees, range-checked
 * copies, stale handles, thread safety, messages) through anychip's runtime book
 * (anychip/runtime_book.h, compiled in by setup.py), so anychip and Paddle work on it
 * unchanged. Port it to the chip one function at a time: each says which SDK call replaces its
 * body. Keep the book's calls around it (most SDKs crash where the contract wants an error);
 * `return fail(...)` leaves the message for last_error: append the SDK's own text to it.
 *
 * Options ("key=value;..." from the plugin's DeviceSpec; unknown keys are ignored):
 *   devices=N          number of devices (default 1)
 *   capacity=BYTES     memory per device (default 1 GiB)
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* posix_memalign, clock_gettime */
#endif

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "anychip/device.h"
#include "anychip/runtime_book.h"

#define DEVICE_NAME "{{name}}"
#define ALIGNMENT 256 /* device.h: allocations are aligned to at least 256 bytes */
#define fail anychip_book_fail

/* The runtime is its book; streams and events carry no work here. */
struct AnychipRuntime_st { AnychipBook* book; };
struct AnychipStream_st { int unused; }; /* TODO(vendor): the SDK's stream handle */
struct AnychipEvent_st {                  /* TODO(vendor): the SDK's event handle */
  int recorded;
  struct timespec at; /* when it was last recorded, for event_elapsed_ms */
};

typedef AnychipRuntime Rt;
#define BOOK (rt == NULL ? NULL : rt->book)
/* Return early with expr's error; LOCK / LOCK_RUNTIME lock the book or return (nothing held). */
#define TRY(expr) do { AnychipStatus try_ = (expr); if (try_ != ANYCHIP_OK) return try_; } while (0)
#define LOCK(device) TRY(anychip_book_lock_device(BOOK, (device)))
#define LOCK_RUNTIME() TRY(anychip_book_lock(BOOK))
#define UNLOCK(status) anychip_book_unlock(rt->book, (status))

/* ---- lifecycle ------------------------------------------------------------------------- */

static AnychipStatus rt_last_error(Rt rt, char* buf, size_t len) {
  (void)rt; /* TODO(vendor): keep; per thread, so it works before initialize and after finalize */
  return anychip_book_last_error(buf, len);
}

static AnychipStatus rt_initialize(Rt rt) {
  /* TODO(vendor): call the SDK's init first (aclInit / cuInit-like); return ANYCHIP_ERROR_UNAVAILABLE with the reason when the driver or chip is absent. */
  return anychip_book_set_initialized(BOOK, 1);
}

static void free_allocation(void* base, int device, int host, void* ctx) {
  (void)device, (void)host, (void)ctx;
  free(base); /* TODO(vendor): aclrtFree / aclrtFreeHost (cudaFree / cudaFreeHost)-like. */
}

static void free_handle(void* handle, AnychipHandleKind kind, void* ctx) {
  (void)kind, (void)ctx;
  free(handle); /* TODO(vendor): destroy the SDK stream or event first. */
}

static AnychipStatus rt_finalize(Rt rt) {
  /* TODO(vendor): then the SDK's teardown (aclFinalize / cudaDeviceReset-like). */
  LOCK_RUNTIME();
  anychip_book_each_allocation(rt->book, free_allocation, NULL);
  anychip_book_each_handle(rt->book, free_handle, NULL);
  anychip_book_unlock(rt->book, ANYCHIP_OK);
  anychip_book_free(rt->book);
  free(rt); /* device.h: only last_error follows, and it does not use rt */
  return ANYCHIP_OK;
}

static AnychipStatus rt_get_device_count(Rt rt, size_t* count) {
  /* TODO(vendor): aclrtGetDeviceCount / cudaGetDeviceCount-like, if it can differ from the option. */
  if (count == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": count is NULL");
  LOCK_RUNTIME();
  *count = anychip_book_devices(rt->book);
  return UNLOCK(ANYCHIP_OK);
}

static AnychipStatus rt_get_device_list(Rt rt, size_t* ids, size_t count) {
  /* TODO(vendor): the SDK's visible-device ids if they are not 0..N-1 (e.g. after a *_VISIBLE_DEVICES filter). */
  if (ids == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": ids is NULL");
  LOCK_RUNTIME();
  if (count > anychip_book_devices(rt->book)) {
    return UNLOCK(fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": count %zu exceeds the %zu device(s)", count,
                       anychip_book_devices(rt->book)));
  }
  for (size_t i = 0; i < count; ++i) ids[i] = i;
  return UNLOCK(ANYCHIP_OK);
}

static AnychipStatus rt_init_device(Rt rt, int device) {
  /* TODO(vendor): per-device setup (aclrtSetDevice + context creation / cudaSetDevice-like). */
  LOCK(device);
  return UNLOCK(ANYCHIP_OK);
}

static AnychipStatus rt_deinit_device(Rt rt, int device) {
  /* TODO(vendor): per-device teardown (aclrtResetDevice / cudaDeviceReset-like). */
  LOCK(device);
  return UNLOCK(ANYCHIP_OK);
}

static AnychipStatus rt_set_device(Rt rt, int device) {
  /* TODO(vendor): aclrtSetDevice / cudaSetDevice-like, besides the book's per-thread record. */
  LOCK(device);
  anychip_book_set_current(rt->book, device);
  return UNLOCK(ANYCHIP_OK);
}

static AnychipStatus rt_get_device(Rt rt, int* device) {
  /* TODO(vendor): keep (the book remembers the current device per thread). */
  if (device == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": device is NULL");
  LOCK_RUNTIME();
  *device = anychip_book_current(rt->book);
  return UNLOCK(ANYCHIP_OK);
}

/* ---- memory ---------------------------------------------------------------------------- */

static AnychipStatus allocate(Rt rt, int device, int host, void** ptr, size_t size) {
  if (ptr == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: ptr is NULL", device);
  *ptr = NULL;
  if (size == 0) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: size is 0", device);
  LOCK(device);
  size_t charged = size;
  AnychipStatus st = host ? ANYCHIP_OK : anychip_book_charge(rt->book, device, size, &charged);
  if (st != ANYCHIP_OK) return UNLOCK(st);
  void* base = NULL;
  /* TODO(vendor): aclrtMalloc / aclrtMallocHost (cudaMalloc / cudaHostAlloc)-like in place of posix_memalign. */
  if (posix_memalign(&base, ALIGNMENT, charged) != 0) {
    return UNLOCK(fail(ANYCHIP_ERROR_OUT_OF_MEMORY, DEVICE_NAME ":%d out of memory: %zu bytes", device, size));
  }
  st = anychip_book_add(rt->book, device, host, base, size, charged);
  if (st != ANYCHIP_OK) free(base);
  *ptr = st == ANYCHIP_OK ? base : NULL;
  return UNLOCK(st);
}

static AnychipStatus release(Rt rt, int device, int host, void* ptr) {
  LOCK(device);
  AnychipStatus st = anychip_book_remove(rt->book, device, host, ptr, host ? "host_free" : "device_free");
  if (st == ANYCHIP_OK) free(ptr); /* TODO(vendor): aclrtFree / aclrtFreeHost (cudaFree / cudaFreeHost)-like. */
  return UNLOCK(st);
}

static AnychipStatus rt_device_allocate(Rt rt, int device, void** ptr, size_t size) {
  return allocate(rt, device, 0, ptr, size);
}
static AnychipStatus rt_device_free(Rt rt, int device, void* ptr) { return release(rt, device, 0, ptr); }
static AnychipStatus rt_host_allocate(Rt rt, int device, void** ptr, size_t size) {
  return allocate(rt, device, 1, ptr, size);
}
static AnychipStatus rt_host_free(Rt rt, int device, void* ptr) { return release(rt, device, 1, ptr); }

typedef enum CopyKind { H2D, D2H, D2D } CopyKind;

enum { STREAM = 1, EVENT = 2 }; /* which handles to check */

/* OK if the handles named in `which` are live ones of `device`; the book is locked. */
static AnychipStatus handles(Rt rt, int device, int which, const void* stream, const void* event) {
  AnychipStatus st = ANYCHIP_OK;
  if (which & STREAM) st = anychip_book_check_handle(rt->book, ANYCHIP_HANDLE_STREAM, device, stream);
  if (st == ANYCHIP_OK && (which & EVENT)) st = anychip_book_check_handle(rt->book, ANYCHIP_HANDLE_EVENT, device, event);
  return st;
}

/* Checks a copy against the live allocations (and its stream, when async) and runs it. */
static AnychipStatus copy(Rt rt, int device, int async, AnychipStream stream, CopyKind kind, void* dst,
                          const void* src, size_t size) {
  static const char* const srcs[] = {"memcpy_h2d: src", "memcpy_d2h: src", "memcpy_d2d: src"};
  static const char* const dsts[] = {"memcpy_h2d: dst", "memcpy_d2h: dst", "memcpy_d2d: dst"};
  LOCK(device);
  AnychipStatus st = handles(rt, device, async ? STREAM : 0, stream, NULL);
  if (st == ANYCHIP_OK && kind != H2D) st = anychip_book_check_range(rt->book, device, src, size, srcs[kind]);
  if (st == ANYCHIP_OK && kind != D2H) st = anychip_book_check_range(rt->book, device, dst, size, dsts[kind]);
  if (st == ANYCHIP_OK && size > 0 && (dst == NULL || src == NULL)) { /* only a host side can still be NULL */
    st = fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d %s: host pointer is NULL", device, srcs[kind]);
  }
  /* TODO(vendor): aclrtMemcpy(Async) / cudaMemcpy(Async)-like, of the kind, on the stream when given. */
  if (st == ANYCHIP_OK && size > 0) memmove(dst, src, size); /* a d2d copy within one allocation may overlap */
  return UNLOCK(st);
}

static AnychipStatus rt_memcpy_h2d(Rt rt, int device, void* dst, const void* src, size_t size) {
  return copy(rt, device, 0, NULL, H2D, dst, src, size);
}
static AnychipStatus rt_memcpy_d2h(Rt rt, int device, void* dst, const void* src, size_t size) {
  return copy(rt, device, 0, NULL, D2H, dst, src, size);
}
static AnychipStatus rt_memcpy_d2d(Rt rt, int device, void* dst, const void* src, size_t size) {
  return copy(rt, device, 0, NULL, D2D, dst, src, size);
}
static AnychipStatus rt_memcpy_h2d_async(Rt rt, int device, AnychipStream s, void* dst, const void* src, size_t size) {
  return copy(rt, device, 1, s, H2D, dst, src, size);
}
static AnychipStatus rt_memcpy_d2h_async(Rt rt, int device, AnychipStream s, void* dst, const void* src, size_t size) {
  return copy(rt, device, 1, s, D2H, dst, src, size);
}
static AnychipStatus rt_memcpy_d2d_async(Rt rt, int device, AnychipStream s, void* dst, const void* src, size_t size) {
  return copy(rt, device, 1, s, D2D, dst, src, size);
}

static AnychipStatus rt_memset(Rt rt, int device, void* ptr, int value, size_t size) {
  LOCK(device);
  AnychipStatus st = anychip_book_check_range(rt->book, device, ptr, size, "memset: ptr");
  if (st == ANYCHIP_OK && size > 0) memset(ptr, value, size); /* TODO(vendor): aclrtMemset / cudaMemset-like. */
  return UNLOCK(st);
}

static AnychipStatus rt_memory_stats(Rt rt, int device, AnychipMemoryStats* stats) {
  /* TODO(vendor): keep; take total/free from aclrtGetMemInfo / cudaMemGetInfo-like if the chip is shared. */
  LOCK(device);
  return UNLOCK(anychip_book_stats(rt->book, device, stats));
}

/* ---- streams and events ---------------------------------------------------------------- */

/* A new stream or event handle of `bytes`, recorded in the book. */
static AnychipStatus create(Rt rt, int device, AnychipHandleKind kind, size_t bytes, void** out) {
  if (out == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: the handle pointer is NULL", device);
  LOCK(device);
  /* TODO(vendor): aclrtCreateStream / aclrtCreateEvent (cudaStreamCreate / cudaEventCreate)-like; keep its handle in the struct. */
  void* handle = calloc(1, bytes);
  if (handle == NULL) return UNLOCK(fail(ANYCHIP_ERROR_INTERNAL, DEVICE_NAME ": out of host memory"));
  AnychipStatus st = anychip_book_add_handle(rt->book, kind, device, handle);
  if (st != ANYCHIP_OK) free(handle);
  *out = st == ANYCHIP_OK ? handle : NULL;
  return UNLOCK(st);
}

static AnychipStatus destroy(Rt rt, int device, AnychipHandleKind kind, void* handle) {
  LOCK(device);
  AnychipStatus st = anychip_book_remove_handle(rt->book, kind, device, handle);
  if (st == ANYCHIP_OK) free_handle(handle, kind, NULL);
  return UNLOCK(st);
}

/* Checks the handles named in `which`; the work they stand for is always done here. */
static AnychipStatus check(Rt rt, int device, int which, AnychipStream stream, AnychipEvent event) {
  LOCK(device);
  return UNLOCK(handles(rt, device, which, stream, event));
}

static AnychipStatus rt_stream_create(Rt rt, int device, AnychipStream* stream) {
  return create(rt, device, ANYCHIP_HANDLE_STREAM, sizeof(**stream), (void**)stream);
}
static AnychipStatus rt_stream_destroy(Rt rt, int device, AnychipStream stream) {
  /* TODO(vendor): aclrtSynchronizeStream + aclrtDestroyStream / cudaStreamDestroy-like (in free_handle). */
  return destroy(rt, device, ANYCHIP_HANDLE_STREAM, stream);
}
static AnychipStatus rt_stream_query(Rt rt, int device, AnychipStream stream) {
  /* TODO(vendor): aclrtStreamQuery / cudaStreamQuery-like (busy maps to ANYCHIP_ERROR_NOT_READY). */
  return check(rt, device, STREAM, stream, NULL);
}
static AnychipStatus rt_stream_synchronize(Rt rt, int device, AnychipStream stream) {
  /* TODO(vendor): aclrtSynchronizeStream / cudaStreamSynchronize-like, after the check (outside the lock). */
  return check(rt, device, STREAM, stream, NULL);
}

static AnychipStatus rt_stream_add_callback(Rt rt, int device, AnychipStream stream, AnychipStreamCallback callback,
                                            void* user_data) {
  /* TODO(vendor): aclrtLaunchCallback / cudaLaunchHostFunc-like. */
  if (callback == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: callback is NULL", device);
  AnychipStatus st = check(rt, device, STREAM, stream, NULL);
  if (st == ANYCHIP_OK) callback(user_data, ANYCHIP_OK); /* earlier work is done; outside the lock (device.h) */
  return st;
}

static AnychipStatus rt_event_create(Rt rt, int device, AnychipEvent* event) {
  return create(rt, device, ANYCHIP_HANDLE_EVENT, sizeof(**event), (void**)event);
}
static AnychipStatus rt_event_destroy(Rt rt, int device, AnychipEvent event) {
  /* TODO(vendor): aclrtDestroyEvent / cudaEventDestroy-like (in free_handle). */
  return destroy(rt, device, ANYCHIP_HANDLE_EVENT, event);
}

static AnychipStatus rt_event_record(Rt rt, int device, AnychipStream stream, AnychipEvent event) {
  /* TODO(vendor): aclrtRecordEvent / cudaEventRecord-like. */
  LOCK(device);
  AnychipStatus st = handles(rt, device, STREAM | EVENT, stream, event);
  if (st == ANYCHIP_OK) {
    clock_gettime(CLOCK_MONOTONIC, &event->at); /* the stream is always drained: done now */
    event->recorded = 1;
  }
  return UNLOCK(st);
}

static AnychipStatus rt_event_query(Rt rt, int device, AnychipEvent event) {
  /* TODO(vendor): aclrtQueryEventStatus / cudaEventQuery-like (not yet complete maps to ANYCHIP_ERROR_NOT_READY). */
  return check(rt, device, EVENT, NULL, event);
}
static AnychipStatus rt_event_synchronize(Rt rt, int device, AnychipEvent event) {
  /* TODO(vendor): aclrtSynchronizeEvent / cudaEventSynchronize-like, after the check (outside the lock). */
  return check(rt, device, EVENT, NULL, event);
}
static AnychipStatus rt_stream_wait_event(Rt rt, int device, AnychipStream stream, AnychipEvent event) {
  /* TODO(vendor): aclrtStreamWaitEvent / cudaStreamWaitEvent-like; here every record is already complete. */
  return check(rt, device, STREAM | EVENT, stream, event);
}

static AnychipStatus rt_event_elapsed_ms(Rt rt, int device, AnychipEvent start, AnychipEvent end, float* ms) {
  /* TODO(vendor): aclrtEventElapsedTime / cudaEventElapsedTime-like. */
  if (ms == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: ms is NULL", device);
  LOCK(device);
  AnychipStatus st = handles(rt, device, EVENT, NULL, start);
  if (st == ANYCHIP_OK) st = handles(rt, device, EVENT, NULL, end);
  if (st != ANYCHIP_OK) return UNLOCK(st);
  if (!start->recorded || !end->recorded) {
    return UNLOCK(fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d event_elapsed_ms: %s was never recorded",
                       device, start->recorded ? "end" : "start"));
  }
  *ms = (float)((double)(end->at.tv_sec - start->at.tv_sec) * 1e3 + (double)(end->at.tv_nsec - start->at.tv_nsec) / 1e6);
  return UNLOCK(ANYCHIP_OK);
}

/* ---- device ---------------------------------------------------------------------------- */

static AnychipStatus rt_synchronize_device(Rt rt, int device) {
  /* TODO(vendor): aclrtSynchronizeDevice / cudaDeviceSynchronize-like, after the check (outside the lock). */
  LOCK(device);
  return UNLOCK(ANYCHIP_OK);
}

static AnychipStatus rt_get_properties(Rt rt, int device, AnychipDeviceProperties* props) {
  /* TODO(vendor): aclrtGetSocName + aclrtGetMemInfo / cudaGetDeviceProperties-like; set simulated=0 on real hardware. */
  LOCK(device);
  AnychipStatus st = anychip_book_check_struct(rt->book, device, props, sizeof(AnychipDeviceProperties), "props");
  if (st != ANYCHIP_OK) return UNLOCK(st);
  memset((char*)props + sizeof(props->struct_size), 0, sizeof(*props) - sizeof(props->struct_size));
  strcpy(props->name, DEVICE_NAME " template device (simulated)");
  strcpy(props->vendor, "unknown");
  props->total_memory = props->max_alloc_size = anychip_book_capacity(rt->book);
  props->simulated = 1; /* host memory posing as a chip: ANYCHIP_REQUIRE_HARDWARE=1 refuses it */
  props->dtypes = ANYCHIP_DTYPE_BIT(ANYCHIP_DTYPE_FLOAT32) | ANYCHIP_DTYPE_BIT(ANYCHIP_DTYPE_FLOAT16) |
                  ANYCHIP_DTYPE_BIT(ANYCHIP_DTYPE_BFLOAT16);
  props->min_chunk_size = ALIGNMENT;
  return UNLOCK(ANYCHIP_OK);
}

/* ---- entry point ----------------------------------------------------------------------- */

__attribute__((visibility("default")))
AnychipStatus anychip_device_init(AnychipDeviceInterface* iface, const char* options) {
  /* TODO(vendor): keep; load the vendor SDK here (dlopen) if it is optional, and report its absence from initialize. */
  if (iface == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": iface is NULL");
  /* Set last_error first, as far as the caller's struct reaches, so even a refusal explains itself. */
  if (iface->struct_size >= offsetof(AnychipDeviceInterface, last_error) + sizeof(iface->last_error)) {
    iface->last_error = rt_last_error;
  }
  if (iface->struct_size < offsetof(AnychipDeviceInterface, reserved)) {
    return fail(ANYCHIP_ERROR_UNSUPPORTED, DEVICE_NAME ": iface->struct_size %zu is smaller than the %zu bytes this "
                "plugin fills", iface->struct_size, offsetof(AnychipDeviceInterface, reserved));
  }
  uint64_t devices = 1, capacity = 1ull << 30;
  TRY(anychip_book_option_u64(options, "devices", &devices));
  TRY(anychip_book_option_u64(options, "capacity", &capacity));
  if (capacity == 0) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": options: capacity must be positive");
  Rt rt = calloc(1, sizeof(*rt));
  if (rt == NULL || (rt->book = anychip_book_new(DEVICE_NAME, (size_t)devices, capacity, ALIGNMENT)) == NULL) {
    free(rt);
    return fail(ANYCHIP_ERROR_INTERNAL, DEVICE_NAME ": out of host memory");
  }
  /* Only fields before `reserved`: all inside struct_size, checked above. */
  iface->abi_version = ANYCHIP_DEVICE_ABI_VERSION;
  iface->runtime = rt;
#define SET(field) iface->field = rt_##field
  SET(initialize); SET(finalize); SET(get_device_count); SET(get_device_list);
  SET(init_device); SET(deinit_device); SET(set_device); SET(get_device);
  SET(device_allocate); SET(device_free); SET(host_allocate); SET(host_free); SET(memset);
  SET(memcpy_h2d); SET(memcpy_d2h); SET(memcpy_d2d);
  SET(memcpy_h2d_async); SET(memcpy_d2h_async); SET(memcpy_d2d_async); SET(memory_stats);
  SET(stream_create); SET(stream_destroy); SET(stream_query); SET(stream_synchronize); SET(stream_add_callback);
  SET(event_create); SET(event_record); SET(event_query); SET(event_synchronize); SET(event_destroy);
  SET(stream_wait_event); SET(event_elapsed_ms); SET(synchronize_device); SET(get_properties);
#undef SET
  /* Collectives (device.h, ABI 1.2: comm_get_unique_id_size .. group_end) stay NULL: anychip
   * then reports that this chip has no collectives. A vendor with a collective library (NCCL,
   * HCCL, ...) fills all fourteen here, mapping each to its call on the given stream (see
   * plugins/gpu/cuda_runtime.cc for NCCL). */
  return ANYCHIP_OK;
}
