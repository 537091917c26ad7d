/*
 * The {{name}} device runtime: every function of AnychipDeviceInterface (anychip/device.h).
 *
 * As generated, the "chip" is host memory and everything is synchronous: async copies run at
 * once, streams are empty handles, events complete when recorded, callbacks run inline. It
 * already keeps the contract (capacity, OUT_OF_MEMORY, rejected double frees, range-checked
 * copies, thread safety, messages), so anychip and Paddle work on it unchanged. Port it to the
 * chip one function at a time: each says which SDK call replaces its body. Keep the checks
 * around the call, since most SDKs crash or corrupt memory where the contract wants an error.
 *
 * Options ("key=value;..." from the plugin's DeviceSpec; unknown keys are ignored):
 *   devices=N          number of devices (default 1)
 *   capacity=BYTES     memory per device (default 1 GiB)
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* posix_memalign, clock_gettime */
#endif

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "anychip/device.h"

#define DEVICE_NAME "{{name}}"
#define ALIGNMENT 256 /* device.h: allocations are aligned to at least 256 bytes */

/* ---- errors ---------------------------------------------------------------------------- */

/* Per thread, as device.h requires; shared by all runtimes of this library, as in CUDA. */
static __thread char last_message[512];

__attribute__((format(printf, 2, 3)))
static AnychipStatus fail(AnychipStatus status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(last_message, sizeof(last_message), fmt, args);
  va_end(args);
  return status;
}

/* ---- state ----------------------------------------------------------------------------- */

typedef struct Allocation {
  char* base;
  size_t size;        /* as requested: copies may not run past it */
  size_t charged;     /* rounded to ALIGNMENT: what counts against the capacity */
  struct Allocation* next;
} Allocation;

typedef struct Device {
  Allocation* allocations;
  uint64_t allocated, peak, total_allocations, num_allocations;
} Device;

/* Streams and events carry no work here; they are tracked so that stale or foreign handles are
 * rejected and finalize can free the ones the caller leaked. `h` must stay the first member. */
typedef struct Handle {
  int device;
  struct Handle* next;
} Handle;

struct AnychipStream_st {
  Handle h;
};

struct AnychipEvent_st {
  Handle h;
  int recorded;
  struct timespec at; /* when it was last recorded, for event_elapsed_ms */
};

struct AnychipRuntime_st {
  pthread_mutex_t mu; /* guards everything below */
  int initialized;
  size_t device_count;
  uint64_t capacity;
  Device* devices;
  Allocation* host_allocations;
  Handle* streams;
  Handle* events;
  pthread_key_t current_device; /* per thread and per runtime: stores device + 1 (0 = unset) */
};

typedef AnychipRuntime Rt;

/* Locks rt if it is usable; on failure nothing is held. */
static AnychipStatus lock_runtime(Rt rt) {
  if (rt == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": runtime is NULL");
  pthread_mutex_lock(&rt->mu);
  if (!rt->initialized) {
    pthread_mutex_unlock(&rt->mu);
    return fail(ANYCHIP_ERROR_UNAVAILABLE, DEVICE_NAME ": runtime is not initialized");
  }
  return ANYCHIP_OK;
}

/* Locks rt and checks the device index; on failure nothing is held. */
static AnychipStatus lock_device(Rt rt, int device, Device** dev) {
  AnychipStatus st = lock_runtime(rt);
  if (st != ANYCHIP_OK) return st;
  if (device < 0 || (size_t)device >= rt->device_count) {
    pthread_mutex_unlock(&rt->mu);
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": device index %d out of range "
                "(%zu device(s))", device, rt->device_count);
  }
  *dev = &rt->devices[device];
  return ANYCHIP_OK;
}

/* Every locked path ends in `return unlock(rt, status)`. */
static AnychipStatus unlock(Rt rt, AnychipStatus status) {
  pthread_mutex_unlock(&rt->mu);
  return status;
}

/* The live allocation holding [ptr, ptr + size), or NULL. */
static Allocation* find_range(Allocation* list, const void* ptr, size_t size) {
  uintptr_t p = (uintptr_t)ptr;
  for (Allocation* a = list; a != NULL; a = a->next) {
    uintptr_t base = (uintptr_t)a->base;
    if (p >= base && p - base <= a->size && size <= a->size - (p - base)) return a;
  }
  return NULL;
}

/* Unlinks the allocation starting exactly at ptr; NULL if there is none. */
static Allocation* unlink_allocation(Allocation** list, const void* ptr) {
  for (Allocation** link = list; *link != NULL; link = &(*link)->next) {
    if ((*link)->base == ptr) {
      Allocation* found = *link;
      *link = found->next;
      return found;
    }
  }
  return NULL;
}

static void free_allocations(Allocation* list) {
  while (list != NULL) {
    Allocation* next = list->next;
    free(list->base);
    free(list);
    list = next;
  }
}

static Handle* find_handle(Handle* list, const void* handle) {
  for (Handle* h = list; h != NULL; h = h->next) {
    if (h == handle) return h;
  }
  return NULL;
}

static void unlink_handle(Handle** list, Handle* handle) {
  for (Handle** link = list; *link != NULL; link = &(*link)->next) {
    if (*link == handle) {
      *link = handle->next;
      return;
    }
  }
}

static void free_handles(Handle* list) {
  while (list != NULL) {
    Handle* next = list->next;
    free(list);
    list = next;
  }
}

static AnychipStatus check_stream(Rt rt, int device, AnychipStream stream) {
  Handle* h = find_handle(rt->streams, stream);
  if (h == NULL || h->device != device) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: stream %p is not a live stream "
                "of this device", device, (void*)stream);
  }
  return ANYCHIP_OK;
}

static AnychipStatus check_event(Rt rt, int device, AnychipEvent event) {
  Handle* h = find_handle(rt->events, event);
  if (h == NULL || h->device != device) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: event %p is not a live event "
                "of this device", device, (void*)event);
  }
  return ANYCHIP_OK;
}

/* ---- lifecycle ------------------------------------------------------------------------- */

static AnychipStatus rt_last_error(Rt rt, char* buf, size_t len) {
  /* TODO(vendor): keep; append the SDK's own text (aclGetRecentErrMsg / cudaGetErrorString-like) where you call fail(). */
  (void)rt; /* the message is per thread, so this works before initialize and after finalize */
  if (buf == NULL || len == 0) return ANYCHIP_ERROR_INVALID_ARGUMENT;
  snprintf(buf, len, "%s", last_message);
  return ANYCHIP_OK;
}

static AnychipStatus rt_initialize(Rt rt) {
  /* TODO(vendor): replace with the SDK's init (aclInit / cuInit-like); return ANYCHIP_ERROR_UNAVAILABLE with the reason when the driver or chip is absent. */
  if (rt == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": runtime is NULL");
  pthread_mutex_lock(&rt->mu);
  if (rt->initialized) {
    return unlock(rt, fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": initialize called twice"));
  }
  if (rt->device_count > 0) {
    rt->devices = calloc(rt->device_count, sizeof(Device));
    if (rt->devices == NULL) {
      return unlock(rt, fail(ANYCHIP_ERROR_INTERNAL, DEVICE_NAME ": out of host memory"));
    }
  }
  if (pthread_key_create(&rt->current_device, NULL) != 0) {
    free(rt->devices);
    rt->devices = NULL;
    return unlock(rt, fail(ANYCHIP_ERROR_INTERNAL, DEVICE_NAME ": pthread_key_create failed"));
  }
  rt->initialized = 1;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_finalize(Rt rt) {
  /* TODO(vendor): replace with the SDK's teardown (aclFinalize / cudaDeviceReset-like) after freeing what is left. */
  AnychipStatus st = lock_runtime(rt);
  if (st != ANYCHIP_OK) return st;
  for (size_t i = 0; i < rt->device_count; ++i) free_allocations(rt->devices[i].allocations);
  free(rt->devices);
  free_allocations(rt->host_allocations);
  free_handles(rt->streams);
  free_handles(rt->events);
  pthread_key_delete(rt->current_device);
  pthread_mutex_unlock(&rt->mu);
  pthread_mutex_destroy(&rt->mu);
  free(rt); /* device.h: only last_error follows, and it does not use rt */
  return ANYCHIP_OK;
}

static AnychipStatus rt_get_device_count(Rt rt, size_t* count) {
  /* TODO(vendor): replace with aclrtGetDeviceCount / cudaGetDeviceCount-like. */
  if (count == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": count is NULL");
  AnychipStatus st = lock_runtime(rt);
  if (st != ANYCHIP_OK) return st;
  *count = rt->device_count;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_get_device_list(Rt rt, size_t* ids, size_t count) {
  /* TODO(vendor): replace with the SDK's visible-device ids if they are not 0..N-1 (e.g. after a *_VISIBLE_DEVICES filter). */
  if (ids == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": ids is NULL");
  AnychipStatus st = lock_runtime(rt);
  if (st != ANYCHIP_OK) return st;
  if (count > rt->device_count) {
    return unlock(rt, fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": count %zu exceeds the "
                           "%zu device(s)", count, rt->device_count));
  }
  for (size_t i = 0; i < count; ++i) ids[i] = i;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_init_device(Rt rt, int device) {
  /* TODO(vendor): replace with per-device setup (aclrtSetDevice + context creation / cudaSetDevice-like). */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_deinit_device(Rt rt, int device) {
  /* TODO(vendor): replace with per-device teardown (aclrtResetDevice / cudaDeviceReset-like). */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_set_device(Rt rt, int device) {
  /* TODO(vendor): replace with aclrtSetDevice / cudaSetDevice-like. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  pthread_setspecific(rt->current_device, (void*)(intptr_t)(device + 1));
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_get_device(Rt rt, int* device) {
  /* TODO(vendor): replace with aclrtGetDevice / cudaGetDevice-like. */
  if (device == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": device is NULL");
  AnychipStatus st = lock_runtime(rt);
  if (st != ANYCHIP_OK) return st;
  intptr_t stored = (intptr_t)pthread_getspecific(rt->current_device);
  *device = stored == 0 ? 0 : (int)(stored - 1);
  return unlock(rt, ANYCHIP_OK);
}

/* ---- memory ---------------------------------------------------------------------------- */

static AnychipStatus rt_device_allocate(Rt rt, int device, void** ptr, size_t size) {
  /* TODO(vendor): replace posix_memalign with aclrtMalloc / cudaMalloc-like; keep the capacity check and the list. */
  if (ptr == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: ptr is NULL", device);
  *ptr = NULL;
  if (size == 0) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: size is 0", device);
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  uint64_t free_bytes = rt->capacity - dev->allocated;
  size_t charged = (size + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
  if (charged < size || charged > free_bytes) { /* charged < size: the rounding overflowed */
    return unlock(rt, fail(ANYCHIP_ERROR_OUT_OF_MEMORY, DEVICE_NAME ":%d out of memory: requested "
                           "%zu bytes, %llu free of %llu", device, size,
                           (unsigned long long)free_bytes, (unsigned long long)rt->capacity));
  }
  Allocation* a = malloc(sizeof(*a));
  void* base = NULL;
  if (a == NULL || posix_memalign(&base, ALIGNMENT, charged) != 0) {
    free(a);
    return unlock(rt, fail(ANYCHIP_ERROR_OUT_OF_MEMORY, DEVICE_NAME ":%d out of memory: the host "
                           "could not back %zu bytes", device, size));
  }
  a->base = base;
  a->size = size;
  a->charged = charged;
  a->next = dev->allocations;
  dev->allocations = a;
  dev->allocated += charged;
  if (dev->allocated > dev->peak) dev->peak = dev->allocated;
  dev->num_allocations += 1;
  dev->total_allocations += 1;
  *ptr = base;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_device_free(Rt rt, int device, void* ptr) {
  /* TODO(vendor): replace free with aclrtFree / cudaFree-like, after the list lookup. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  Allocation* a = unlink_allocation(&dev->allocations, ptr);
  if (a == NULL) {
    return unlock(rt, fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d device_free: ptr %p is "
                           "not a live allocation (double free, foreign or interior pointer)",
                           device, ptr));
  }
  dev->allocated -= a->charged;
  dev->num_allocations -= 1;
  free(a->base);
  free(a);
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_host_allocate(Rt rt, int device, void** ptr, size_t size) {
  /* TODO(vendor): replace posix_memalign with aclrtMallocHost / cudaHostAlloc-like (page-locked memory). */
  if (ptr == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: ptr is NULL", device);
  *ptr = NULL;
  if (size == 0) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: size is 0", device);
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  Allocation* a = malloc(sizeof(*a));
  void* base = NULL;
  if (a == NULL || posix_memalign(&base, ALIGNMENT, size) != 0) {
    free(a);
    return unlock(rt, fail(ANYCHIP_ERROR_OUT_OF_MEMORY, DEVICE_NAME ":%d host_allocate: out of "
                           "host memory for %zu bytes", device, size));
  }
  a->base = base;
  a->size = a->charged = size;
  a->next = rt->host_allocations;
  rt->host_allocations = a;
  *ptr = base;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_host_free(Rt rt, int device, void* ptr) {
  /* TODO(vendor): replace free with aclrtFreeHost / cudaFreeHost-like, after the list lookup. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  Allocation* a = unlink_allocation(&rt->host_allocations, ptr);
  if (a == NULL) {
    return unlock(rt, fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d host_free: ptr %p is "
                           "not a live host allocation", device, ptr));
  }
  free(a->base);
  free(a);
  return unlock(rt, ANYCHIP_OK);
}

typedef enum CopyKind { H2D, D2H, D2D } CopyKind;

/* Checks a copy against the live allocations and runs it; rt is locked by the caller. */
static AnychipStatus copy_locked(Device* dev, int device, CopyKind kind, void* dst,
                                 const void* src, size_t size) {
  static const char* const names[] = {"memcpy_h2d", "memcpy_d2h", "memcpy_d2d"};
  if (size == 0) return ANYCHIP_OK;
  if (kind != H2D && find_range(dev->allocations, src, size) == NULL) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d %s: src %p + %zu bytes is not "
                "inside one live allocation", device, names[kind], src, size);
  }
  if (kind != D2H && find_range(dev->allocations, dst, size) == NULL) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d %s: dst %p + %zu bytes is not "
                "inside one live allocation", device, names[kind], dst, size);
  }
  if (dst == NULL || src == NULL) { /* only a host side can still be NULL here */
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d %s: host pointer is NULL", device,
                names[kind]);
  }
  memmove(dst, src, size); /* memmove: a d2d copy within one allocation may overlap */
  return ANYCHIP_OK;
}

static AnychipStatus copy(Rt rt, int device, CopyKind kind, void* dst, const void* src,
                          size_t size) {
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  return unlock(rt, copy_locked(dev, device, kind, dst, src, size));
}

/* Async copies run at once: nothing is ever queued, so the stream is only validated. */
static AnychipStatus copy_async(Rt rt, int device, AnychipStream stream, CopyKind kind,
                                void* dst, const void* src, size_t size) {
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  st = check_stream(rt, device, stream);
  if (st != ANYCHIP_OK) return unlock(rt, st);
  return unlock(rt, copy_locked(dev, device, kind, dst, src, size));
}

static AnychipStatus rt_memset(Rt rt, int device, void* ptr, int value, size_t size) {
  /* TODO(vendor): replace memset with aclrtMemset / cudaMemset-like, after the range check. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  if (size > 0 && find_range(dev->allocations, ptr, size) == NULL) {
    return unlock(rt, fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d memset: ptr %p + %zu "
                           "bytes is not inside one live allocation", device, ptr, size));
  }
  if (size > 0) memset(ptr, value, size);
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_memcpy_h2d(Rt rt, int device, void* dst, const void* src, size_t size) {
  /* TODO(vendor): replace with aclrtMemcpy(ACL_MEMCPY_HOST_TO_DEVICE) / cudaMemcpy(HostToDevice)-like. */
  return copy(rt, device, H2D, dst, src, size);
}

static AnychipStatus rt_memcpy_d2h(Rt rt, int device, void* dst, const void* src, size_t size) {
  /* TODO(vendor): replace with aclrtMemcpy(ACL_MEMCPY_DEVICE_TO_HOST) / cudaMemcpy(DeviceToHost)-like. */
  return copy(rt, device, D2H, dst, src, size);
}

static AnychipStatus rt_memcpy_d2d(Rt rt, int device, void* dst, const void* src, size_t size) {
  /* TODO(vendor): replace with aclrtMemcpy(ACL_MEMCPY_DEVICE_TO_DEVICE) / cudaMemcpy(DeviceToDevice)-like. */
  return copy(rt, device, D2D, dst, src, size);
}

static AnychipStatus rt_memcpy_h2d_async(Rt rt, int device, AnychipStream stream, void* dst,
                                         const void* src, size_t size) {
  /* TODO(vendor): replace with aclrtMemcpyAsync(HOST_TO_DEVICE) / cudaMemcpyAsync(HostToDevice)-like. */
  return copy_async(rt, device, stream, H2D, dst, src, size);
}

static AnychipStatus rt_memcpy_d2h_async(Rt rt, int device, AnychipStream stream, void* dst,
                                         const void* src, size_t size) {
  /* TODO(vendor): replace with aclrtMemcpyAsync(DEVICE_TO_HOST) / cudaMemcpyAsync(DeviceToHost)-like. */
  return copy_async(rt, device, stream, D2H, dst, src, size);
}

static AnychipStatus rt_memcpy_d2d_async(Rt rt, int device, AnychipStream stream, void* dst,
                                         const void* src, size_t size) {
  /* TODO(vendor): replace with aclrtMemcpyAsync(DEVICE_TO_DEVICE) / cudaMemcpyAsync(DeviceToDevice)-like. */
  return copy_async(rt, device, stream, D2D, dst, src, size);
}

static AnychipStatus rt_memory_stats(Rt rt, int device, AnychipMemoryStats* stats) {
  /* TODO(vendor): keep this bookkeeping; take total/free from aclrtGetMemInfo / cudaMemGetInfo-like if the chip is shared. */
  if (stats == NULL || stats->struct_size < sizeof(AnychipMemoryStats)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: stats is NULL or its "
                "struct_size is too small", device);
  }
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  stats->total_bytes = rt->capacity;
  stats->free_bytes = rt->capacity - dev->allocated;
  stats->allocated_bytes = dev->allocated;
  stats->peak_allocated_bytes = dev->peak;
  stats->num_allocations = dev->num_allocations;
  stats->total_allocations = dev->total_allocations;
  return unlock(rt, ANYCHIP_OK);
}

/* ---- streams --------------------------------------------------------------------------- */

static AnychipStatus rt_stream_create(Rt rt, int device, AnychipStream* stream) {
  /* TODO(vendor): replace with aclrtCreateStream / cudaStreamCreate-like, keeping the SDK handle in the struct. */
  if (stream == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: stream is NULL", device);
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  AnychipStream s = calloc(1, sizeof(*s));
  if (s == NULL) return unlock(rt, fail(ANYCHIP_ERROR_INTERNAL, DEVICE_NAME ": out of host memory"));
  s->h.device = device;
  s->h.next = rt->streams;
  rt->streams = &s->h;
  *stream = s;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_stream_destroy(Rt rt, int device, AnychipStream stream) {
  /* TODO(vendor): replace with aclrtSynchronizeStream + aclrtDestroyStream / cudaStreamDestroy-like. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  st = check_stream(rt, device, stream);
  if (st != ANYCHIP_OK) return unlock(rt, st);
  unlink_handle(&rt->streams, &stream->h);
  free(stream);
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_stream_query(Rt rt, int device, AnychipStream stream) {
  /* TODO(vendor): replace with aclrtStreamQuery / cudaStreamQuery-like (its "busy" maps to ANYCHIP_ERROR_NOT_READY). */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  return unlock(rt, check_stream(rt, device, stream));
}

static AnychipStatus rt_stream_synchronize(Rt rt, int device, AnychipStream stream) {
  /* TODO(vendor): replace with aclrtSynchronizeStream / cudaStreamSynchronize-like, outside the lock. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  return unlock(rt, check_stream(rt, device, stream));
}

static AnychipStatus rt_stream_add_callback(Rt rt, int device, AnychipStream stream,
                                            AnychipStreamCallback callback, void* user_data) {
  /* TODO(vendor): replace with aclrtLaunchCallback / cudaLaunchHostFunc-like. */
  if (callback == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: callback is NULL", device);
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  st = unlock(rt, check_stream(rt, device, stream));
  /* All earlier work is done, so it runs now, outside the lock (device.h: it may not call the runtime). */
  if (st == ANYCHIP_OK) callback(user_data, ANYCHIP_OK);
  return st;
}

/* ---- events ---------------------------------------------------------------------------- */

static AnychipStatus rt_event_create(Rt rt, int device, AnychipEvent* event) {
  /* TODO(vendor): replace with aclrtCreateEvent / cudaEventCreate-like, keeping the SDK handle in the struct. */
  if (event == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: event is NULL", device);
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  AnychipEvent e = calloc(1, sizeof(*e));
  if (e == NULL) return unlock(rt, fail(ANYCHIP_ERROR_INTERNAL, DEVICE_NAME ": out of host memory"));
  e->h.device = device;
  e->h.next = rt->events;
  rt->events = &e->h;
  *event = e;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_event_record(Rt rt, int device, AnychipStream stream, AnychipEvent event) {
  /* TODO(vendor): replace with aclrtRecordEvent / cudaEventRecord-like. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  st = check_stream(rt, device, stream);
  if (st == ANYCHIP_OK) st = check_event(rt, device, event);
  if (st != ANYCHIP_OK) return unlock(rt, st);
  clock_gettime(CLOCK_MONOTONIC, &event->at); /* the stream is always drained: done now */
  event->recorded = 1;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_event_query(Rt rt, int device, AnychipEvent event) {
  /* TODO(vendor): replace with aclrtQueryEventStatus / cudaEventQuery-like (not yet complete maps to ANYCHIP_ERROR_NOT_READY). */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  return unlock(rt, check_event(rt, device, event));
}

static AnychipStatus rt_event_synchronize(Rt rt, int device, AnychipEvent event) {
  /* TODO(vendor): replace with aclrtSynchronizeEvent / cudaEventSynchronize-like, outside the lock. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  return unlock(rt, check_event(rt, device, event));
}

static AnychipStatus rt_event_destroy(Rt rt, int device, AnychipEvent event) {
  /* TODO(vendor): replace with aclrtDestroyEvent / cudaEventDestroy-like. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  st = check_event(rt, device, event);
  if (st != ANYCHIP_OK) return unlock(rt, st);
  unlink_handle(&rt->events, &event->h);
  free(event);
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_stream_wait_event(Rt rt, int device, AnychipStream stream,
                                          AnychipEvent event) {
  /* TODO(vendor): replace with aclrtStreamWaitEvent / cudaStreamWaitEvent-like. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  st = check_stream(rt, device, stream);
  if (st == ANYCHIP_OK) st = check_event(rt, device, event);
  return unlock(rt, st); /* every record is already complete: nothing to wait for */
}

static AnychipStatus rt_event_elapsed_ms(Rt rt, int device, AnychipEvent start, AnychipEvent end,
                                         float* ms) {
  /* TODO(vendor): replace with aclrtEventElapsedTime / cudaEventElapsedTime-like. */
  if (ms == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: ms is NULL", device);
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  st = check_event(rt, device, start);
  if (st == ANYCHIP_OK) st = check_event(rt, device, end);
  if (st != ANYCHIP_OK) return unlock(rt, st);
  if (!start->recorded || !end->recorded) {
    return unlock(rt, fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d event_elapsed_ms: "
                           "%s was never recorded", device, start->recorded ? "end" : "start"));
  }
  *ms = (float)((double)(end->at.tv_sec - start->at.tv_sec) * 1e3 +
                (double)(end->at.tv_nsec - start->at.tv_nsec) / 1e6);
  return unlock(rt, ANYCHIP_OK);
}

/* ---- device ---------------------------------------------------------------------------- */

static AnychipStatus rt_synchronize_device(Rt rt, int device) {
  /* TODO(vendor): replace with aclrtSynchronizeDevice / cudaDeviceSynchronize-like, outside the lock. */
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  return unlock(rt, ANYCHIP_OK);
}

static AnychipStatus rt_get_properties(Rt rt, int device, AnychipDeviceProperties* props) {
  /* TODO(vendor): replace with aclrtGetSocName + aclrtGetMemInfo / cudaGetDeviceProperties-like; set simulated=0 on real hardware. */
  if (props == NULL || props->struct_size < sizeof(AnychipDeviceProperties)) {
    return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ":%d: props is NULL or its "
                "struct_size is too small", device);
  }
  Device* dev;
  AnychipStatus st = lock_device(rt, device, &dev);
  if (st != ANYCHIP_OK) return st;
  snprintf(props->name, sizeof(props->name), "%s", DEVICE_NAME " template device (simulated)");
  snprintf(props->vendor, sizeof(props->vendor), "%s", "unknown");
  props->total_memory = rt->capacity;
  props->compute_capability = 0;
  props->simulated = 1; /* host memory posing as a chip: ANYCHIP_REQUIRE_HARDWARE=1 refuses it */
  props->runtime_version = 0;
  props->driver_version = 0;
  props->dtypes = ANYCHIP_DTYPE_BIT(ANYCHIP_DTYPE_FLOAT32) | ANYCHIP_DTYPE_BIT(ANYCHIP_DTYPE_FLOAT16) |
                  ANYCHIP_DTYPE_BIT(ANYCHIP_DTYPE_BFLOAT16);
  props->min_chunk_size = ALIGNMENT;
  props->max_alloc_size = rt->capacity;
  return unlock(rt, ANYCHIP_OK);
}

/* ---- entry point ----------------------------------------------------------------------- */

/* Parses the decimal digits in [s, end); 0 on anything else or overflow. */
static int parse_u64(const char* s, const char* end, uint64_t* out) {
  uint64_t value = 0;
  if (s == end) return 0;
  for (; s < end; ++s) {
    if (*s < '0' || *s > '9') return 0;
    unsigned digit = (unsigned)(*s - '0');
    if (value > (UINT64_MAX - digit) / 10) return 0;
    value = value * 10 + digit;
  }
  *out = value;
  return 1;
}

static AnychipStatus parse_options(const char* options, uint64_t* devices, uint64_t* capacity) {
  const char* item = options;
  while (item != NULL && *item != '\0') {
    const char* end = strchr(item, ';');
    if (end == NULL) end = item + strlen(item);
    const char* eq = memchr(item, '=', (size_t)(end - item));
    if (end > item && (eq == NULL || eq == item)) {
      return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": options: expected key=value, "
                  "got '%.*s'", (int)(end - item), item);
    }
    if (eq != NULL) {
      size_t key_len = (size_t)(eq - item);
      uint64_t* target = NULL;
      if (key_len == 7 && strncmp(item, "devices", 7) == 0) target = devices;
      if (key_len == 8 && strncmp(item, "capacity", 8) == 0) target = capacity;
      if (target != NULL && !parse_u64(eq + 1, end, target)) {
        return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": options: %.*s must be an "
                    "unsigned integer, got '%.*s'", (int)key_len, item, (int)(end - eq - 1), eq + 1);
      }
    }
    item = *end == ';' ? end + 1 : end;
  }
  if (*capacity == 0) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": options: capacity must be positive");
  return ANYCHIP_OK;
}

__attribute__((visibility("default")))
AnychipStatus anychip_device_init(AnychipDeviceInterface* iface, const char* options) {
  /* TODO(vendor): keep; load the vendor SDK here (dlopen) if it is optional, and report its absence from initialize. */
  if (iface == NULL) return fail(ANYCHIP_ERROR_INVALID_ARGUMENT, DEVICE_NAME ": iface is NULL");
  /* Set last_error first, as far as the caller's struct reaches, so even a refusal explains itself. */
  if (iface->struct_size >= offsetof(AnychipDeviceInterface, last_error) + sizeof(iface->last_error)) {
    iface->last_error = rt_last_error;
  }
  if (iface->struct_size < offsetof(AnychipDeviceInterface, reserved)) {
    return fail(ANYCHIP_ERROR_UNSUPPORTED, DEVICE_NAME ": iface->struct_size %zu is smaller than "
                "the %zu bytes this plugin fills", iface->struct_size,
                offsetof(AnychipDeviceInterface, reserved));
  }
  uint64_t devices = 1, capacity = 1ull << 30;
  AnychipStatus st = parse_options(options, &devices, &capacity);
  if (st != ANYCHIP_OK) return st;

  Rt rt = calloc(1, sizeof(*rt));
  if (rt == NULL) return fail(ANYCHIP_ERROR_INTERNAL, DEVICE_NAME ": out of host memory");
  if (pthread_mutex_init(&rt->mu, NULL) != 0) {
    free(rt);
    return fail(ANYCHIP_ERROR_INTERNAL, DEVICE_NAME ": pthread_mutex_init failed");
  }
  rt->device_count = (size_t)devices;
  rt->capacity = capacity;

  /* Only fields before `reserved`: all inside struct_size, checked above. */
  iface->abi_version = ANYCHIP_DEVICE_ABI_VERSION;
  iface->runtime = rt;
  iface->initialize = rt_initialize;
  iface->finalize = rt_finalize;
  iface->get_device_count = rt_get_device_count;
  iface->get_device_list = rt_get_device_list;
  iface->init_device = rt_init_device;
  iface->deinit_device = rt_deinit_device;
  iface->set_device = rt_set_device;
  iface->get_device = rt_get_device;
  iface->device_allocate = rt_device_allocate;
  iface->device_free = rt_device_free;
  iface->host_allocate = rt_host_allocate;
  iface->host_free = rt_host_free;
  iface->memset = rt_memset;
  iface->memcpy_h2d = rt_memcpy_h2d;
  iface->memcpy_d2h = rt_memcpy_d2h;
  iface->memcpy_d2d = rt_memcpy_d2d;
  iface->memcpy_h2d_async = rt_memcpy_h2d_async;
  iface->memcpy_d2h_async = rt_memcpy_d2h_async;
  iface->memcpy_d2d_async = rt_memcpy_d2d_async;
  iface->memory_stats = rt_memory_stats;
  iface->stream_create = rt_stream_create;
  iface->stream_destroy = rt_stream_destroy;
  iface->stream_query = rt_stream_query;
  iface->stream_synchronize = rt_stream_synchronize;
  iface->stream_add_callback = rt_stream_add_callback;
  iface->event_create = rt_event_create;
  iface->event_record = rt_event_record;
  iface->event_query = rt_event_query;
  iface->event_synchronize = rt_event_synchronize;
  iface->event_destroy = rt_event_destroy;
  iface->stream_wait_event = rt_stream_wait_event;
  iface->event_elapsed_ms = rt_event_elapsed_ms;
  iface->synchronize_device = rt_synchronize_device;
  iface->get_properties = rt_get_properties;
  /* Collectives (device.h, ABI 1.2: comm_get_unique_id_size .. group_end) stay NULL: anychip
   * then reports that this chip has no collectives. A vendor with a collective library (NCCL,
   * HCCL, ...) fills all fourteen here, mapping each to its call on the given stream (see
   * plugins/gpu/cuda_runtime.cc for NCCL). */
  return ANYCHIP_OK;
}
