/*
 * anychip/device.h -- the device runtime contract between anychip and a chip plugin.
 *
 * This header is the whole contract: a vendor implements a device from it alone, with no
 * Paddle (or any framework) header. anychip's Python runtime (`anychip.runtime`) and its
 * Paddle bridge both drive a device only through the table below.
 *
 * How a plugin is loaded
 *   1. anychip dlopen()s the plugin's shared library and looks up its entry symbol
 *      (by default `anychip_device_init`, type `AnychipDeviceInitFn`).
 *   2. The caller zero-fills an AnychipDeviceInterface, sets `struct_size`, and calls the entry
 *      with an options string ("key=value;key=value", possibly empty) taken from the plugin's
 *      Python registration. One library may be initialised several times (the simulator backs
 *      four chips this way); each call returns an independent `runtime` instance.
 *   3. The plugin fills `abi_version`, `runtime` and every function pointer it implements.
 *      Pointers marked OPTIONAL may stay NULL; the caller then uses the stated default.
 *   4. The caller calls `initialize` once before anything else and `finalize` once at the end.
 *
 * Conventions (they hold for every function unless its comment says otherwise)
 *   - Every function returns an AnychipStatus. On failure it must also leave a short, exact,
 *     human-readable message for `last_error` (e.g. "npu:0 out of memory: requested 4096 bytes,
 *     1024 free of 65536"). Messages name the argument that was wrong.
 *   - Every function is thread-safe: callers may use one runtime from many threads at once.
 *   - `device` arguments are 0-based indices < device count. An index out of range returns
 *     ANYCHIP_ERROR_INVALID_ARGUMENT; it never crashes.
 *   - Device pointers are opaque to the host. Callers never dereference them; the only way data
 *     moves between host and device is through the copy functions. A device pointer may point
 *     inside an allocation (a view), and a copy range must lie within one live allocation.
 *   - Work enqueued on one stream runs in enqueue order. Work on different streams may run
 *     concurrently; ordering between streams is expressed only with events.
 *   - memset and the copies without `_async` first wait for all work previously enqueued on any
 *     stream of that device, then perform their operation and return when it is complete.
 *   - Asynchronous functions only enqueue; errors found while running enqueued work are reported
 *     by the next synchronize/query of that stream (and of the device), as with CUDA. They also
 *     travel with events: an event recorded after the failed work fails its synchronize/query,
 *     and a stream that waits on it fails as if the work had been its own (frameworks order
 *     their compute stream after a collective stream only so; an error must not stop there).
 *
 * Versioning
 *   The struct grows only at its end (the `reserved` slots are consumed first). A caller built
 *   against a newer header sets a larger `struct_size`; a plugin must fill only what it knows
 *   and never write past `struct_size`. ANYCHIP_DEVICE_ABI_VERSION changes its major part only
 *   when an existing field changes meaning; the caller rejects a plugin with another major.
 */
#ifndef ANYCHIP_DEVICE_H_
#define ANYCHIP_DEVICE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ANYCHIP_DEVICE_ABI_MAJOR 1
#define ANYCHIP_DEVICE_ABI_MINOR 2
#define ANYCHIP_DEVICE_ABI_VERSION ((ANYCHIP_DEVICE_ABI_MAJOR << 16) | ANYCHIP_DEVICE_ABI_MINOR)
#define ANYCHIP_DEVICE_INIT_SYMBOL "anychip_device_init"

typedef enum AnychipStatus {
  ANYCHIP_OK = 0,
  ANYCHIP_ERROR_INVALID_ARGUMENT = 1, /* bad index, pointer, size or handle */
  ANYCHIP_ERROR_OUT_OF_MEMORY = 2,    /* allocation larger than what is free */
  ANYCHIP_ERROR_NOT_READY = 3,        /* query: the work is still running (not a failure) */
  ANYCHIP_ERROR_UNSUPPORTED = 4,      /* the plugin does not implement this on this device */
  ANYCHIP_ERROR_UNAVAILABLE = 5,      /* the hardware or vendor runtime is absent */
  ANYCHIP_ERROR_DEVICE = 6,           /* the device (or enqueued work) failed */
  ANYCHIP_ERROR_INTERNAL = 7          /* a bug in the plugin */
} AnychipStatus;

/* Element types, as bits of AnychipDeviceProperties.dtypes. */
typedef enum AnychipDtype {
  ANYCHIP_DTYPE_FLOAT32 = 0,
  ANYCHIP_DTYPE_FLOAT16 = 1,
  ANYCHIP_DTYPE_BFLOAT16 = 2,
  ANYCHIP_DTYPE_FLOAT64 = 3,
  ANYCHIP_DTYPE_INT8 = 4,
  ANYCHIP_DTYPE_UINT8 = 5,
  ANYCHIP_DTYPE_INT16 = 6,
  ANYCHIP_DTYPE_INT32 = 7,
  ANYCHIP_DTYPE_INT64 = 8,
  ANYCHIP_DTYPE_BOOL = 9
} AnychipDtype;
#define ANYCHIP_DTYPE_BIT(dtype) (1ull << (dtype))

/* Opaque handles, defined by the plugin. */
typedef struct AnychipRuntime_st* AnychipRuntime;
typedef struct AnychipStream_st* AnychipStream;
typedef struct AnychipEvent_st* AnychipEvent;
/* A communicator (ABI 1.2): one rank's membership in a group of `nranks` devices. */
typedef struct AnychipComm_st* AnychipComm;

/* Reduction operators of the collectives (ABI 1.2), as NCCL's ncclRedOp_t (avg: sum / nranks,
 * NCCL >= 2.10). On bool, sum and max are logical or, prod and min logical and; avg is invalid. */
typedef enum AnychipReduceOp {
  ANYCHIP_REDUCE_SUM = 0,
  ANYCHIP_REDUCE_PROD = 1,
  ANYCHIP_REDUCE_MAX = 2,
  ANYCHIP_REDUCE_MIN = 3,
  ANYCHIP_REDUCE_AVG = 4
} AnychipReduceOp;

/* Bytes of a communicator's unique id (NCCL's NCCL_UNIQUE_ID_BYTES). */
#define ANYCHIP_COMM_UNIQUE_ID_BYTES 128

/* Called on a plugin thread when a stream reaches it; `status` is ANYCHIP_OK unless earlier work
 * on the stream failed. It must not call any function of the runtime (CUDA forbids it, and a
 * synchronising call would deadlock the stream that runs it). */
typedef void (*AnychipStreamCallback)(void* user_data, AnychipStatus status);

/* Host code run as device work by `launch_host_function`; its status is the work's status. */
typedef AnychipStatus (*AnychipHostFunction)(void* user_data);

/* A byte range of device memory that a host function reads or writes. */
typedef struct AnychipMemoryRange {
  const void* ptr;
  size_t size;
} AnychipMemoryRange;

typedef struct AnychipDeviceProperties {
  size_t struct_size;          /* caller fills: sizeof(AnychipDeviceProperties) */
  char name[64];               /* e.g. "Ascend 910B (simulated)" */
  char vendor[64];             /* e.g. "Huawei" */
  uint64_t total_memory;       /* bytes the device can hand out */
  int32_t compute_capability;  /* vendor-defined, major*10+minor (CUDA: 90 for sm_90) */
  int32_t simulated;           /* 1 when the device is anychip's simulator, not hardware */
  uint64_t runtime_version;    /* vendor runtime version, major*1000+minor*10 (CUDA style) */
  uint64_t driver_version;     /* likewise; 0 when there is no driver */
  uint64_t dtypes;             /* OR of ANYCHIP_DTYPE_BIT() for element types kernels accept */
  uint64_t min_chunk_size;     /* allocation granularity in bytes (a power of two) */
  uint64_t max_alloc_size;     /* largest single allocation in bytes */
  uint64_t reserved[8];
} AnychipDeviceProperties;

typedef struct AnychipMemoryStats {
  size_t struct_size;          /* caller fills: sizeof(AnychipMemoryStats) */
  uint64_t total_bytes;        /* capacity */
  uint64_t free_bytes;         /* simulator: capacity minus allocated; hardware: what the
                                  device reports free (other processes deducted) */
  uint64_t allocated_bytes;    /* live allocations, rounded to min_chunk_size */
  uint64_t peak_allocated_bytes;
  uint64_t num_allocations;    /* live allocations */
  uint64_t total_allocations;  /* allocations since initialize */
  uint64_t reserved[4];
} AnychipMemoryStats;

typedef struct AnychipDeviceInterface {
  /* Caller fills with sizeof(AnychipDeviceInterface) as it was compiled. */
  size_t struct_size;
  /* Plugin fills with ANYCHIP_DEVICE_ABI_VERSION. */
  uint32_t abi_version;
  uint32_t padding0;
  /* Plugin fills with its instance; passed back as the first argument of every function. */
  AnychipRuntime runtime;

  /* Plugin fills (REQUIRED). Copies the message of this thread's last failure (of any instance
   * of the library) into `buf`
   * (NUL-terminated, truncated to `len`). Must work before `initialize` and after a failed
   * entry call, so loading errors can be reported. */
  AnychipStatus (*last_error)(AnychipRuntime rt, char* buf, size_t len);

  /* ---- lifecycle ------------------------------------------------------------------------- */

  /* REQUIRED. Bring up the vendor runtime. Returns ANYCHIP_ERROR_UNAVAILABLE, with the reason,
   * when the hardware or driver is absent; the caller then lists the device as unavailable. */
  AnychipStatus (*initialize)(AnychipRuntime rt);
  /* REQUIRED. Release everything; no call but `last_error` follows. */
  AnychipStatus (*finalize)(AnychipRuntime rt);
  /* REQUIRED. Number of usable devices (may be 0). */
  AnychipStatus (*get_device_count)(AnychipRuntime rt, size_t* count);
  /* OPTIONAL (default: 0..count-1). Fills `ids` with `count` device ids. */
  AnychipStatus (*get_device_list)(AnychipRuntime rt, size_t* ids, size_t count);
  /* OPTIONAL (default: no-op). Per-device setup before first use / teardown after last use. */
  AnychipStatus (*init_device)(AnychipRuntime rt, int device);
  AnychipStatus (*deinit_device)(AnychipRuntime rt, int device);
  /* REQUIRED. The calling thread's current device (initially 0), as in CUDA. */
  AnychipStatus (*set_device)(AnychipRuntime rt, int device);
  AnychipStatus (*get_device)(AnychipRuntime rt, int* device);

  /* ---- memory ---------------------------------------------------------------------------- */

  /* REQUIRED. Allocates `size` bytes aligned to at least 256 bytes. Past the capacity it returns
   * ANYCHIP_ERROR_OUT_OF_MEMORY (never aborts) and leaves *ptr NULL. size 0 is invalid. */
  AnychipStatus (*device_allocate)(AnychipRuntime rt, int device, void** ptr, size_t size);
  /* REQUIRED. Frees a pointer returned by device_allocate on this device. A pointer that is not
   * a live allocation (double free, foreign pointer, interior pointer) returns
   * ANYCHIP_ERROR_INVALID_ARGUMENT when the plugin can tell (the simulator always can). The
   * caller synchronises the work that uses the memory before freeing it. */
  AnychipStatus (*device_free)(AnychipRuntime rt, int device, void* ptr);
  /* OPTIONAL (default: malloc/free, not pinned). Page-locked host memory for async copies. */
  AnychipStatus (*host_allocate)(AnychipRuntime rt, int device, void** ptr, size_t size);
  AnychipStatus (*host_free)(AnychipRuntime rt, int device, void* ptr);
  /* REQUIRED. Sets `size` bytes at device pointer `ptr` to `value`. Synchronous. */
  AnychipStatus (*memset)(AnychipRuntime rt, int device, void* ptr, int value, size_t size);
  /* REQUIRED. Synchronous copies: host->device, device->host, device->device (same device). */
  AnychipStatus (*memcpy_h2d)(AnychipRuntime rt, int device, void* dst, const void* src,
                              size_t size);
  AnychipStatus (*memcpy_d2h)(AnychipRuntime rt, int device, void* dst, const void* src,
                              size_t size);
  AnychipStatus (*memcpy_d2d)(AnychipRuntime rt, int device, void* dst, const void* src,
                              size_t size);
  /* REQUIRED. Enqueue the same copies on `stream`. Host memory must stay valid, and unchanged
   * (h2d) or unread (d2h), until the stream passes the copy. */
  AnychipStatus (*memcpy_h2d_async)(AnychipRuntime rt, int device, AnychipStream stream,
                                    void* dst, const void* src, size_t size);
  AnychipStatus (*memcpy_d2h_async)(AnychipRuntime rt, int device, AnychipStream stream,
                                    void* dst, const void* src, size_t size);
  AnychipStatus (*memcpy_d2d_async)(AnychipRuntime rt, int device, AnychipStream stream,
                                    void* dst, const void* src, size_t size);
  /* REQUIRED. Fills `stats` (the caller sets stats->struct_size). */
  AnychipStatus (*memory_stats)(AnychipRuntime rt, int device, AnychipMemoryStats* stats);

  /* ---- streams --------------------------------------------------------------------------- */

  /* REQUIRED. Creates an in-order work queue. Handles are never NULL (Paddle relies on it). */
  AnychipStatus (*stream_create)(AnychipRuntime rt, int device, AnychipStream* stream);
  /* REQUIRED. Waits for the stream's work, then destroys it. */
  AnychipStatus (*stream_destroy)(AnychipRuntime rt, int device, AnychipStream stream);
  /* REQUIRED. ANYCHIP_OK when all enqueued work is done, ANYCHIP_ERROR_NOT_READY while some
   * runs, the work's error status if it failed. */
  AnychipStatus (*stream_query)(AnychipRuntime rt, int device, AnychipStream stream);
  /* REQUIRED. Blocks until all enqueued work is done; returns its first error, if any. */
  AnychipStatus (*stream_synchronize)(AnychipRuntime rt, int device, AnychipStream stream);
  /* REQUIRED. Enqueues `callback(user_data, status)`; it runs after all earlier work. */
  AnychipStatus (*stream_add_callback)(AnychipRuntime rt, int device, AnychipStream stream,
                                       AnychipStreamCallback callback, void* user_data);

  /* ---- events ---------------------------------------------------------------------------- */

  /* REQUIRED. An event starts out complete (querying a never-recorded event returns OK). */
  AnychipStatus (*event_create)(AnychipRuntime rt, int device, AnychipEvent* event);
  /* REQUIRED. Captures the stream's current position: the event completes when all work
   * enqueued on `stream` before this call is done. Re-recording moves the capture. */
  AnychipStatus (*event_record)(AnychipRuntime rt, int device, AnychipStream stream,
                                AnychipEvent event);
  /* REQUIRED. ANYCHIP_OK when the last record completed, ANYCHIP_ERROR_NOT_READY otherwise. */
  AnychipStatus (*event_query)(AnychipRuntime rt, int device, AnychipEvent event);
  /* REQUIRED. Blocks until the last record completed. */
  AnychipStatus (*event_synchronize)(AnychipRuntime rt, int device, AnychipEvent event);
  /* REQUIRED. Destroys the event; a pending record may still complete harmlessly. */
  AnychipStatus (*event_destroy)(AnychipRuntime rt, int device, AnychipEvent event);
  /* REQUIRED. Work enqueued on `stream` after this call waits until `event`'s record at the
   * time of this call completes. The host does not block. */
  AnychipStatus (*stream_wait_event)(AnychipRuntime rt, int device, AnychipStream stream,
                                     AnychipEvent event);
  /* OPTIONAL (default: timing unsupported). Milliseconds between two completed records. */
  AnychipStatus (*event_elapsed_ms)(AnychipRuntime rt, int device, AnychipEvent start,
                                    AnychipEvent end, float* ms);

  /* ---- device ---------------------------------------------------------------------------- */

  /* REQUIRED. Blocks until all work on every stream of the device is done; returns the first
   * error any of it reported since the last synchronisation. */
  AnychipStatus (*synchronize_device)(AnychipRuntime rt, int device);
  /* REQUIRED. Fills `props` (the caller sets props->struct_size). */
  AnychipStatus (*get_properties)(AnychipRuntime rt, int device, AnychipDeviceProperties* props);

  /* ---- host-code kernels (ABI 1.1) ------------------------------------------------------- */

  /* OPTIONAL (NULL: the device runs no host-code kernels; anychip then runs ops for it on the
   * CPU through Paddle, counted as fallbacks). For devices whose memory the host CPU can address
   * (anychip's simulator, the host itself): enqueues `fn(user_data)` on `stream` after all
   * earlier work. While `fn` runs, the host may read and write exactly the `num_ranges` ranges
   * listed, and each range must lie inside one live allocation (checked at the call:
   * ANYCHIP_ERROR_INVALID_ARGUMENT names the range). The caller keeps `user_data` and `ranges`
   * alive until the work completes (it synchronizes the stream). A non-OK status from `fn` is
   * the work's error, reported by the next synchronize/query; `fn` leaves its own message
   * wherever its caller asked (anychip/kernel.h: AnychipKernelCall.error). `fn` runs on a
   * thread of the plugin's: a call it makes that waits for `stream` (stream_synchronize, a
   * device_free or synchronous copy that orders after the stream) would wait for itself. The
   * caller never makes one (anychip defers a buffer collected there); a plugin that can tell
   * refuses stream_synchronize/stream_destroy of `stream` with ANYCHIP_ERROR_INVALID_ARGUMENT
   * and lets the synchronous calls skip `stream`, whose earlier work is done (the simulator). */
  AnychipStatus (*launch_host_function)(AnychipRuntime rt, int device, AnychipStream stream,
                                        AnychipHostFunction fn, void* user_data,
                                        const AnychipMemoryRange* ranges, int num_ranges);

  /* ---- collectives (ABI 1.2) ------------------------------------------------------------ */
  /* All OPTIONAL, as one block: a plugin fills all of them or none. NULL (every plugin built
   * against ABI <= 1.1, whose struct has `reserved` here) means "this chip has no collectives";
   * the caller reports that, naming the chip and the plugin's ABI. They mirror NCCL and Paddle's
   * device_ext.h xccl_* functions one to one:
   *   - A unique id is an opaque blob of `comm_get_unique_id_size` bytes (at most
   *     ANYCHIP_COMM_UNIQUE_ID_BYTES), made once by rank 0 and passed to the other ranks out of
   *     band (a file, a TCP store). Every rank then calls `comm_init_rank` with it.
   *   - `count` is in elements of `dtype` (an AnychipDtype the device declares in
   *     AnychipDeviceProperties.dtypes), never bytes. Buffers are device memory of the device the
   *     communicator was initialised on, and `stream` is a stream of that device.
   *   - Every collective only enqueues on `stream`: it runs after all earlier work on the stream,
   *     and later work sees its result. Errors (a peer that never arrives, a dead peer) are the
   *     work's errors, reported by the next synchronize/query of the stream; a plugin never
   *     waits forever for a peer (the simulator: ANYCHIP_COLLECTIVE_TIMEOUT seconds).
   *   - Every rank of a communicator calls the same collectives in the same order with the same
   *     count, dtype, op and root.
   *   - In place (send == recv) is allowed for all_reduce, broadcast and reduce; for all_gather
   *     when send == recv + rank * count, for reduce_scatter when recv == send + rank * count
   *     (each rank's slice), as NCCL allows. all_to_all and send/recv are never in place. */

  /* Plugin fills. Bytes of this plugin's unique id (<= ANYCHIP_COMM_UNIQUE_ID_BYTES). */
  AnychipStatus (*comm_get_unique_id_size)(AnychipRuntime rt, size_t* size);
  /* Plugin fills. Writes a fresh unique id (random: a stale one from a crashed run never
   * collides) into `id`, whose `size` must be at least comm_get_unique_id_size's. */
  AnychipStatus (*comm_get_unique_id)(AnychipRuntime rt, void* id, size_t size);
  /* Plugin fills. Joins `device` as rank `rank` (0 <= rank < nranks) of the communicator named
   * by `id`. Blocking like ncclCommInitRank: it may wait for the other ranks. *comm is never NULL
   * on success. */
  AnychipStatus (*comm_init_rank)(AnychipRuntime rt, int device, const void* id, size_t id_size,
                                  int rank, int nranks, AnychipComm* comm);
  /* Plugin fills. Waits for the communicator's enqueued work, then releases it. */
  AnychipStatus (*comm_destroy)(AnychipRuntime rt, AnychipComm comm);
  /* recv[i] = op over ranks of send[i], i < count, on every rank. */
  AnychipStatus (*all_reduce)(AnychipRuntime rt, const void* send, void* recv, size_t count,
                              AnychipDtype dtype, AnychipReduceOp op, AnychipComm comm,
                              AnychipStream stream);
  /* recv = root's send (send is read on `root` only; may equal recv). */
  AnychipStatus (*broadcast)(AnychipRuntime rt, const void* send, void* recv, size_t count,
                             AnychipDtype dtype, int root, AnychipComm comm, AnychipStream stream);
  /* As all_reduce, but only `root`'s recv is written (recv is ignored on the others). */
  AnychipStatus (*reduce)(AnychipRuntime rt, const void* send, void* recv, size_t count,
                          AnychipDtype dtype, AnychipReduceOp op, int root, AnychipComm comm,
                          AnychipStream stream);
  /* recv (nranks * count elements) = the ranks' send (count elements each), in rank order. */
  AnychipStatus (*all_gather)(AnychipRuntime rt, const void* send, void* recv, size_t count,
                              AnychipDtype dtype, AnychipComm comm, AnychipStream stream);
  /* recv (count elements) = slice `rank` of op over ranks of send (nranks * count elements). */
  AnychipStatus (*reduce_scatter)(AnychipRuntime rt, const void* send, void* recv, size_t count,
                                  AnychipDtype dtype, AnychipReduceOp op, AnychipComm comm,
                                  AnychipStream stream);
  /* send and recv hold nranks * count elements: slice j of send goes to rank j, where it lands
   * as slice `rank` of recv. */
  AnychipStatus (*all_to_all)(AnychipRuntime rt, const void* send, void* recv, size_t count,
                              AnychipDtype dtype, AnychipComm comm, AnychipStream stream);
  /* Point to point: `send` to rank `peer`, which posts the matching `recv` (same count and
   * dtype). Outside a group, a send blocks its stream until the peer's recv runs. */
  AnychipStatus (*send)(AnychipRuntime rt, const void* buf, size_t count, AnychipDtype dtype,
                        int peer, AnychipComm comm, AnychipStream stream);
  AnychipStatus (*recv)(AnychipRuntime rt, void* buf, size_t count, AnychipDtype dtype, int peer,
                        AnychipComm comm, AnychipStream stream);
  /* Calls between group_start and group_end (of the calling thread; groups nest) are enqueued
   * together at group_end, as ncclGroupStart/End: sends and recvs of a group cannot deadlock
   * each other, whatever their order. */
  AnychipStatus (*group_start)(AnychipRuntime rt);
  AnychipStatus (*group_end)(AnychipRuntime rt);

  /* Room to grow without breaking plugins built against this version: new functions take
   * these slots in order. Plugins leave them NULL. */
  void* reserved[17];
} AnychipDeviceInterface;

/* The entry point every plugin library exports. Fills `iface` (see "How a plugin is loaded").
 * On failure returns an error and, if it set `iface->last_error`, a message for it. */
typedef AnychipStatus (*AnychipDeviceInitFn)(AnychipDeviceInterface* iface, const char* options);

/* The struct keeps the size it had at ABI 1.0/1.1 (3 pointer-sized header words, 36 functions,
 * 31 reserved slots): growing it would break plugins built against an older header. */
#if defined(__cplusplus) && __cplusplus >= 201103L
static_assert(sizeof(AnychipDeviceInterface) == (3 + 36 + 31) * sizeof(void*) ||
                  sizeof(void*) != 8,
              "AnychipDeviceInterface must not change size");
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(AnychipDeviceInterface) == (3 + 36 + 31) * sizeof(void*) ||
                   sizeof(void*) != 8,
               "AnychipDeviceInterface must not change size");
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ANYCHIP_DEVICE_H_ */
