/*
 * anychip/runtime_book.h -- the bookkeeping that device.h asks of every runtime, written once.
 *
 * device.h makes promises a vendor SDK rarely keeps by itself: a double free, a foreign or
 * interior pointer, a copy past an allocation's end, a stale stream or event handle are errors
 * with a message, never a crash; allocations count against a capacity (OUT_OF_MEMORY past it)
 * and are reported by memory_stats; the current device is per thread; every failure leaves a
 * per-thread message for last_error. An AnychipBook keeps all of that, so that a runtime
 * function is: lock the book (which checks the runtime and the device index), check or record
 * through it, make the SDK call, unlock. `anychip new-plugin`'s runtime.c is written this way,
 * and so is the gpu plugin's CUDA runtime (plugins/gpu/cuda_runtime.cc).
 *
 * Its source, runtime_book.c, ships beside this header: a plugin compiles it into its runtime
 * library (a file holding `#include "anychip/runtime_book.c"`, as new-plugin's template does);
 * nothing else is linked, and the book never calls the SDK.
 *
 * Threads: one mutex per book. anychip_book_lock / anychip_book_lock_device take it; every
 * other function except the error functions and anychip_book_new/free must be called with it
 * held, and the caller ends with `return anychip_book_unlock(book, status)`.
 */
#ifndef ANYCHIP_RUNTIME_BOOK_H_
#define ANYCHIP_RUNTIME_BOOK_H_

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "anychip/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct AnychipBook AnychipBook;

/* Kinds of handles a book tracks (anychip_book_add_handle). */
typedef enum AnychipHandleKind { ANYCHIP_HANDLE_STREAM = 0, ANYCHIP_HANDLE_EVENT = 1 } AnychipHandleKind;

/* ---- errors (no lock needed) ------------------------------------------------------------ */

/* Records a printf-style message for this thread and returns `status`:
 * `return anychip_book_fail(ANYCHIP_ERROR_INVALID_ARGUMENT, "npu:%d: ...", device);` */
AnychipStatus anychip_book_fail(AnychipStatus status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* anychip_book_fail with a va_list (for a runtime's own printf-style wrapper). */
AnychipStatus anychip_book_vfail(AnychipStatus status, const char* fmt, va_list args);

/* device.h's last_error: this thread's last message into buf (NUL-terminated, truncated). */
AnychipStatus anychip_book_last_error(char* buf, size_t len);

/* ---- options: "key=value;key=value" as anychip passes them to anychip_device_init -------- */

/* The unsigned integer under `key` into *value (left alone when the key is absent). Fails,
 * naming the key, on an entry without '=' or a value that is not an unsigned integer. */
AnychipStatus anychip_book_option_u64(const char* options, const char* key, uint64_t* value);

/* ---- the book ------------------------------------------------------------------------------ */

/* A book for `devices` devices of `capacity` bytes each; `name` ("npu") prefixes messages and
 * `alignment` (a power of two) rounds what each allocation is charged. NULL (with a message)
 * when out of host memory. The book starts uninitialized: see anychip_book_set_initialized. */
AnychipBook* anychip_book_new(const char* name, size_t devices, uint64_t capacity, uint64_t alignment);

/* Frees the book's records (not the memory they describe: see anychip_book_each_allocation). */
void anychip_book_free(AnychipBook* book);

/* Takes the lock if `book` is not NULL and initialized; else fails with nothing held. */
AnychipStatus anychip_book_lock(AnychipBook* book);
/* anychip_book_lock, then checks the device index (0 .. devices-1); nothing held on failure. */
AnychipStatus anychip_book_lock_device(AnychipBook* book, int device);
/* Releases the lock and returns `status`. */
AnychipStatus anychip_book_unlock(AnychipBook* book, AnychipStatus status);

/* Marks the book initialized (device.h's initialize) or not (finalize); locks itself. Fails
 * on a second initialize. */
AnychipStatus anychip_book_set_initialized(AnychipBook* book, int initialized);

size_t anychip_book_devices(const AnychipBook* book);
uint64_t anychip_book_capacity(const AnychipBook* book);
const char* anychip_book_name(const AnychipBook* book);

/* This thread's current device (device.h's set_device / get_device; 0 until set). */
void anychip_book_set_current(AnychipBook* book, int device);
int anychip_book_current(AnychipBook* book);

/* ---- memory (locked) ------------------------------------------------------------------- */

/* Before allocating `size` bytes on `device`: OUT_OF_MEMORY (with the free bytes in the message)
 * unless its charge (size rounded up to the alignment) fits; *charged receives the charge. */
AnychipStatus anychip_book_charge(AnychipBook* book, int device, size_t size, size_t* charged);

/* Records an allocation made: [base, base + size) charged `charged` bytes (0 for host memory,
 * host = 1, which only joins the list of live host allocations). Fails only without host memory. */
AnychipStatus anychip_book_add(AnychipBook* book, int device, int host, void* base, size_t size, size_t charged);

/* Unrecords the allocation that starts at `ptr`: INVALID_ARGUMENT naming `what` for a pointer
 * that is not one (a double free, a foreign or interior pointer). The caller then frees it. */
AnychipStatus anychip_book_remove(AnychipBook* book, int device, int host, void* ptr, const char* what);

/* OK if [ptr, ptr + size) lies inside one live device allocation of `device` (size 0: always);
 * else INVALID_ARGUMENT naming `what` ("memcpy_d2h: src"). */
AnychipStatus anychip_book_check_range(AnychipBook* book, int device, const void* ptr, size_t size, const char* what);

/* device.h's memory_stats from the book's counts (checks stats and its struct_size). */
AnychipStatus anychip_book_stats(AnychipBook* book, int device, AnychipMemoryStats* stats);

/* Calls release(base, device, host, ctx) for every live allocation (finalize frees the leaks). */
void anychip_book_each_allocation(AnychipBook* book, void (*release)(void* base, int device, int host, void* ctx),
                                  void* ctx);

/* ---- streams and events (locked) ------------------------------------------------------- */

/* Records `handle` as a live handle of `kind` on `device`. Fails only without host memory. */
AnychipStatus anychip_book_add_handle(AnychipBook* book, AnychipHandleKind kind, int device, const void* handle);
/* OK if `handle` is a live handle of `kind` on `device`; else INVALID_ARGUMENT. */
AnychipStatus anychip_book_check_handle(AnychipBook* book, AnychipHandleKind kind, int device, const void* handle);
/* OK if `handle` is a live handle of `kind` on any device (CUDA's stream_wait_event may wait on
 * another device's event); else INVALID_ARGUMENT. */
AnychipStatus anychip_book_check_handle_any(AnychipBook* book, AnychipHandleKind kind, const void* handle);
/* anychip_book_check_handle, then unrecords it. */
AnychipStatus anychip_book_remove_handle(AnychipBook* book, AnychipHandleKind kind, int device, const void* handle);
/* Calls release(handle, kind, ctx) for every live handle (finalize frees the leaks). */
void anychip_book_each_handle(AnychipBook* book, void (*release)(void* handle, AnychipHandleKind kind, void* ctx),
                              void* ctx);

/* ---- structs with a size field --------------------------------------------------------- */

/* OK if `p`, a device.h struct (its first member the caller's struct_size), is not NULL and
 * its struct_size is at least `needed`; else INVALID_ARGUMENT naming `what`. No lock needed. */
AnychipStatus anychip_book_check_struct(const AnychipBook* book, int device, const void* p, size_t needed,
                                        const char* what);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ANYCHIP_RUNTIME_BOOK_H_ */
