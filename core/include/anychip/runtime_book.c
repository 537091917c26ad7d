/* anychip/runtime_book.h: the runtime contract's bookkeeping, written once (C99 + pthreads). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "anychip/runtime_book.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors -------------------------------------------------------------------------------- */

/* Per thread, as device.h requires; shared by every book of this library, as in CUDA. */
static __thread char last_message[512];

AnychipStatus anychip_book_vfail(AnychipStatus status, const char* fmt, va_list args) {
  vsnprintf(last_message, sizeof(last_message), fmt, args);
  return status;
}

AnychipStatus anychip_book_fail(AnychipStatus status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  anychip_book_vfail(status, fmt, args);
  va_end(args);
  return status;
}

AnychipStatus anychip_book_last_error(char* buf, size_t len) {
  if (buf == NULL || len == 0) return ANYCHIP_ERROR_INVALID_ARGUMENT;
  snprintf(buf, len, "%s", last_message);
  return ANYCHIP_OK;
}

/* ---- options ------------------------------------------------------------------------------- */

/* The decimal digits in [s, end) into *out; 0 on anything else or overflow. */
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

AnychipStatus anychip_book_option_u64(const char* options, const char* key, uint64_t* value) {
  size_t key_len = strlen(key);
  for (const char* item = options; item != NULL && *item != '\0';) {
    const char* end = strchr(item, ';');
    if (end == NULL) end = item + strlen(item);
    const char* eq = memchr(item, '=', (size_t)(end - item));
    if (end > item && (eq == NULL || eq == item)) {
      return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "options: expected key=value, got '%.*s'",
                               (int)(end - item), item);
    }
    if (eq != NULL && (size_t)(eq - item) == key_len && strncmp(item, key, key_len) == 0 &&
        !parse_u64(eq + 1, end, value)) {
      return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "options: %s must be an unsigned integer, got '%.*s'",
                               key, (int)(end - eq - 1), eq + 1);
    }
    item = *end == ';' ? end + 1 : end;
  }
  return ANYCHIP_OK;
}

/* ---- the book ------------------------------------------------------------------------------ */

typedef struct Allocation {
  char* base;
  size_t size;     /* as requested: ranges may not run past it */
  size_t charged;  /* what counts against the capacity */
  int device, host;
  struct Allocation* next;
} Allocation;

typedef struct Handle {
  const void* handle;
  int device;
  AnychipHandleKind kind;
  struct Handle* next;
} Handle;

typedef struct Counts {
  uint64_t allocated, peak, total_allocations, num_allocations;
} Counts;

struct AnychipBook {
  pthread_mutex_t mu; /* guards everything below */
  char name[64];
  int initialized;
  size_t devices;
  uint64_t capacity, alignment;
  Counts* counts; /* per device */
  Allocation* allocations;
  Handle* handles;
  pthread_key_t current; /* per thread: device + 1 (0: unset) */
};

AnychipBook* anychip_book_new(const char* name, size_t devices, uint64_t capacity, uint64_t alignment) {
  AnychipBook* book = calloc(1, sizeof(*book));
  if (book != NULL && devices > 0) book->counts = calloc(devices, sizeof(Counts));
  if (book == NULL || (devices > 0 && book->counts == NULL) || pthread_mutex_init(&book->mu, NULL) != 0) {
    if (book != NULL) free(book->counts);
    free(book);
    anychip_book_fail(ANYCHIP_ERROR_INTERNAL, "%s: out of host memory", name);
    return NULL;
  }
  if (pthread_key_create(&book->current, NULL) != 0) {
    pthread_mutex_destroy(&book->mu);
    free(book->counts);
    free(book);
    anychip_book_fail(ANYCHIP_ERROR_INTERNAL, "%s: pthread_key_create failed", name);
    return NULL;
  }
  snprintf(book->name, sizeof(book->name), "%s", name);
  book->devices = devices;
  book->capacity = capacity;
  book->alignment = alignment ? alignment : 1;
  return book;
}

void anychip_book_free(AnychipBook* book) {
  if (book == NULL) return;
  while (book->allocations != NULL) {
    Allocation* next = book->allocations->next;
    free(book->allocations);
    book->allocations = next;
  }
  while (book->handles != NULL) {
    Handle* next = book->handles->next;
    free(book->handles);
    book->handles = next;
  }
  pthread_key_delete(book->current);
  pthread_mutex_destroy(&book->mu);
  free(book->counts);
  free(book);
}

AnychipStatus anychip_book_lock(AnychipBook* book) {
  if (book == NULL) return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "runtime is NULL");
  pthread_mutex_lock(&book->mu);
  if (!book->initialized) {
    pthread_mutex_unlock(&book->mu);
    return anychip_book_fail(ANYCHIP_ERROR_UNAVAILABLE, "%s: runtime is not initialized", book->name);
  }
  return ANYCHIP_OK;
}

AnychipStatus anychip_book_lock_device(AnychipBook* book, int device) {
  AnychipStatus st = anychip_book_lock(book);
  if (st != ANYCHIP_OK) return st;
  if (device < 0 || (size_t)device >= book->devices) {
    pthread_mutex_unlock(&book->mu);
    return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: device index %d out of range (%zu device(s))",
                             book->name, device, book->devices);
  }
  return ANYCHIP_OK;
}

AnychipStatus anychip_book_unlock(AnychipBook* book, AnychipStatus status) {
  pthread_mutex_unlock(&book->mu);
  return status;
}

AnychipStatus anychip_book_set_initialized(AnychipBook* book, int initialized) {
  if (book == NULL) return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "runtime is NULL");
  pthread_mutex_lock(&book->mu);
  AnychipStatus st = ANYCHIP_OK;
  if (initialized && book->initialized) {
    st = anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: initialize called twice", book->name);
  } else {
    book->initialized = initialized;
  }
  pthread_mutex_unlock(&book->mu);
  return st;
}

size_t anychip_book_devices(const AnychipBook* book) { return book->devices; }
uint64_t anychip_book_capacity(const AnychipBook* book) { return book->capacity; }
const char* anychip_book_name(const AnychipBook* book) { return book->name; }

void anychip_book_set_current(AnychipBook* book, int device) {
  pthread_setspecific(book->current, (void*)(intptr_t)(device + 1));
}

int anychip_book_current(AnychipBook* book) {
  intptr_t stored = (intptr_t)pthread_getspecific(book->current);
  return stored == 0 ? 0 : (int)(stored - 1);
}

/* ---- memory -------------------------------------------------------------------------------- */

AnychipStatus anychip_book_charge(AnychipBook* book, int device, size_t size, size_t* charged) {
  uint64_t free_bytes = book->capacity - book->counts[device].allocated;
  size_t rounded = (size + book->alignment - 1) / book->alignment * book->alignment;
  if (rounded < size || rounded > free_bytes) { /* rounded < size: the rounding overflowed */
    return anychip_book_fail(ANYCHIP_ERROR_OUT_OF_MEMORY, "%s:%d out of memory: requested %zu bytes, %llu free of %llu",
                             book->name, device, size, (unsigned long long)free_bytes,
                             (unsigned long long)book->capacity);
  }
  *charged = rounded;
  return ANYCHIP_OK;
}

AnychipStatus anychip_book_add(AnychipBook* book, int device, int host, void* base, size_t size, size_t charged) {
  Allocation* a = malloc(sizeof(*a));
  if (a == NULL) return anychip_book_fail(ANYCHIP_ERROR_OUT_OF_MEMORY, "%s:%d: out of host memory", book->name, device);
  *a = (Allocation){(char*)base, size, host ? 0 : charged, device, host, book->allocations};
  book->allocations = a;
  if (!host) {
    Counts* c = &book->counts[device];
    c->allocated += charged;
    if (c->allocated > c->peak) c->peak = c->allocated;
    c->num_allocations += 1;
    c->total_allocations += 1;
  }
  return ANYCHIP_OK;
}

AnychipStatus anychip_book_remove(AnychipBook* book, int device, int host, void* ptr, const char* what) {
  for (Allocation** link = &book->allocations; *link != NULL; link = &(*link)->next) {
    Allocation* a = *link;
    if (a->base == ptr && a->device == device && a->host == !!host) {
      *link = a->next;
      if (!host) {
        book->counts[device].allocated -= a->charged;
        book->counts[device].num_allocations -= 1;
      }
      free(a);
      return ANYCHIP_OK;
    }
  }
  return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s:%d %s: ptr %p is not a live %sallocation (double free, "
                           "foreign or interior pointer)", book->name, device, what, ptr, host ? "host " : "");
}

AnychipStatus anychip_book_check_range(AnychipBook* book, int device, const void* ptr, size_t size, const char* what) {
  if (size == 0) return ANYCHIP_OK;
  uintptr_t p = (uintptr_t)ptr;
  for (const Allocation* a = book->allocations; a != NULL; a = a->next) {
    uintptr_t base = (uintptr_t)a->base;
    if (!a->host && a->device == device && p >= base && p - base <= a->size && size <= a->size - (p - base)) {
      return ANYCHIP_OK;
    }
  }
  return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s:%d %s %p + %zu bytes is not inside one live allocation",
                           book->name, device, what, ptr, size);
}

AnychipStatus anychip_book_stats(AnychipBook* book, int device, AnychipMemoryStats* stats) {
  AnychipStatus st = anychip_book_check_struct(book, device, stats, sizeof(AnychipMemoryStats), "stats");
  if (st != ANYCHIP_OK) return st;
  const Counts* c = &book->counts[device];
  stats->total_bytes = book->capacity;
  stats->free_bytes = book->capacity - c->allocated;
  stats->allocated_bytes = c->allocated;
  stats->peak_allocated_bytes = c->peak;
  stats->num_allocations = c->num_allocations;
  stats->total_allocations = c->total_allocations;
  return ANYCHIP_OK;
}

void anychip_book_each_allocation(AnychipBook* book, void (*release)(void* base, int device, int host, void* ctx),
                                  void* ctx) {
  for (const Allocation* a = book->allocations; a != NULL; a = a->next) release(a->base, a->device, a->host, ctx);
}

/* ---- streams and events -------------------------------------------------------------------- */

static const char* const kind_names[] = {"stream", "event"};

AnychipStatus anychip_book_add_handle(AnychipBook* book, AnychipHandleKind kind, int device, const void* handle) {
  Handle* h = malloc(sizeof(*h));
  if (h == NULL) return anychip_book_fail(ANYCHIP_ERROR_INTERNAL, "%s:%d: out of host memory", book->name, device);
  *h = (Handle){handle, device, kind, book->handles};
  book->handles = h;
  return ANYCHIP_OK;
}

static Handle** find_handle(AnychipBook* book, AnychipHandleKind kind, int device, const void* handle) {
  for (Handle** link = &book->handles; *link != NULL; link = &(*link)->next) {
    const Handle* h = *link;
    if (h->handle == handle && h->kind == kind && h->device == device) return link;
  }
  return NULL;
}

AnychipStatus anychip_book_check_handle(AnychipBook* book, AnychipHandleKind kind, int device, const void* handle) {
  if (find_handle(book, kind, device, handle) != NULL) return ANYCHIP_OK;
  return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s:%d: %s %p is not a live %s of this device", book->name,
                           device, kind_names[kind], handle, kind_names[kind]);
}

AnychipStatus anychip_book_check_handle_any(AnychipBook* book, AnychipHandleKind kind, const void* handle) {
  for (const Handle* h = book->handles; h != NULL; h = h->next)
    if (h->handle == handle && h->kind == kind) return ANYCHIP_OK;
  return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s: %s %p is not a live %s", book->name, kind_names[kind],
                           handle, kind_names[kind]);
}

AnychipStatus anychip_book_remove_handle(AnychipBook* book, AnychipHandleKind kind, int device, const void* handle) {
  Handle** link = find_handle(book, kind, device, handle);
  if (link == NULL) return anychip_book_check_handle(book, kind, device, handle);
  Handle* h = *link;
  *link = h->next;
  free(h);
  return ANYCHIP_OK;
}

void anychip_book_each_handle(AnychipBook* book, void (*release)(void* handle, AnychipHandleKind kind, void* ctx),
                              void* ctx) {
  for (const Handle* h = book->handles; h != NULL; h = h->next) release((void*)h->handle, h->kind, ctx);
}

/* ---- structs with a size field ------------------------------------------------------------- */

AnychipStatus anychip_book_check_struct(const AnychipBook* book, int device, const void* p, size_t needed,
                                        const char* what) {
  size_t given = 0;
  if (p != NULL) memcpy(&given, p, sizeof(given));
  if (p == NULL || given < needed) {
    return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "%s:%d: %s is NULL or its struct_size %zu is below %zu",
                             book->name, device, what, given, needed);
  }
  return ANYCHIP_OK;
}
