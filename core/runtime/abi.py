"""ctypes mirror of ``anychip/device.h``. Keep in the header's field order; tests compare sizes."""

from __future__ import annotations

import ctypes as C

ABI_MAJOR = 1
ABI_MINOR = 2

OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_OUT_OF_MEMORY = 2
ERROR_NOT_READY = 3
ERROR_UNSUPPORTED = 4
ERROR_UNAVAILABLE = 5
ERROR_DEVICE = 6
ERROR_INTERNAL = 7

STATUS_NAMES = {
    OK: "OK", ERROR_INVALID_ARGUMENT: "INVALID_ARGUMENT", ERROR_OUT_OF_MEMORY: "OUT_OF_MEMORY",
    ERROR_NOT_READY: "NOT_READY", ERROR_UNSUPPORTED: "UNSUPPORTED", ERROR_UNAVAILABLE: "UNAVAILABLE",
    ERROR_DEVICE: "DEVICE", ERROR_INTERNAL: "INTERNAL",
}

Status = C.c_int
Rt = C.c_void_p
Handle = C.c_void_p
Callback = C.CFUNCTYPE(None, C.c_void_p, C.c_int)
HostFunction = C.CFUNCTYPE(Status, C.c_void_p)


class MemoryRange(C.Structure):
    _fields_ = [("ptr", C.c_void_p), ("size", C.c_size_t)]


class DeviceProperties(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("name", C.c_char * 64),
        ("vendor", C.c_char * 64),
        ("total_memory", C.c_uint64),
        ("compute_capability", C.c_int32),
        ("simulated", C.c_int32),
        ("runtime_version", C.c_uint64),
        ("driver_version", C.c_uint64),
        ("dtypes", C.c_uint64),
        ("min_chunk_size", C.c_uint64),
        ("max_alloc_size", C.c_uint64),
        ("reserved", C.c_uint64 * 8),
    ]


class MemoryStats(C.Structure):
    _fields_ = [
        ("struct_size", C.c_size_t),
        ("total_bytes", C.c_uint64),
        ("free_bytes", C.c_uint64),
        ("allocated_bytes", C.c_uint64),
        ("peak_allocated_bytes", C.c_uint64),
        ("num_allocations", C.c_uint64),
        ("total_allocations", C.c_uint64),
        ("reserved", C.c_uint64 * 4),
    ]


def _fn(*args):
    return C.CFUNCTYPE(Status, Rt, *args)


I, SZ, P = C.c_int, C.c_size_t, C.c_void_p

# (field, ctypes function type, required) in header order.
FUNCTIONS = [
    ("last_error", _fn(C.c_char_p, SZ), True),
    ("initialize", _fn(), True),
    ("finalize", _fn(), True),
    ("get_device_count", _fn(C.POINTER(SZ)), True),
    ("get_device_list", _fn(C.POINTER(SZ), SZ), False),
    ("init_device", _fn(I), False),
    ("deinit_device", _fn(I), False),
    ("set_device", _fn(I), True),
    ("get_device", _fn(C.POINTER(I)), True),
    ("device_allocate", _fn(I, C.POINTER(P), SZ), True),
    ("device_free", _fn(I, P), True),
    ("host_allocate", _fn(I, C.POINTER(P), SZ), False),
    ("host_free", _fn(I, P), False),
    ("memset", _fn(I, P, I, SZ), True),
    ("memcpy_h2d", _fn(I, P, P, SZ), True),
    ("memcpy_d2h", _fn(I, P, P, SZ), True),
    ("memcpy_d2d", _fn(I, P, P, SZ), True),
    ("memcpy_h2d_async", _fn(I, Handle, P, P, SZ), True),
    ("memcpy_d2h_async", _fn(I, Handle, P, P, SZ), True),
    ("memcpy_d2d_async", _fn(I, Handle, P, P, SZ), True),
    ("memory_stats", _fn(I, C.POINTER(MemoryStats)), True),
    ("stream_create", _fn(I, C.POINTER(Handle)), True),
    ("stream_destroy", _fn(I, Handle), True),
    ("stream_query", _fn(I, Handle), True),
    ("stream_synchronize", _fn(I, Handle), True),
    ("stream_add_callback", _fn(I, Handle, Callback, P), True),
    ("event_create", _fn(I, C.POINTER(Handle)), True),
    ("event_record", _fn(I, Handle, Handle), True),
    ("event_query", _fn(I, Handle), True),
    ("event_synchronize", _fn(I, Handle), True),
    ("event_destroy", _fn(I, Handle), True),
    ("stream_wait_event", _fn(I, Handle, Handle), True),
    ("event_elapsed_ms", _fn(I, Handle, Handle, C.POINTER(C.c_float)), False),
    ("synchronize_device", _fn(I), True),
    ("get_properties", _fn(I, C.POINTER(DeviceProperties)), True),
    ("launch_host_function", _fn(I, Handle, HostFunction, P, C.POINTER(MemoryRange), C.c_int), False),
]


# Collectives (ABI 1.2): all OPTIONAL, as one block (NULL in plugins built against ABI <= 1.1).
REDUCE_SUM, REDUCE_PROD, REDUCE_MAX, REDUCE_MIN, REDUCE_AVG = range(5)
REDUCE_OPS = {"sum": REDUCE_SUM, "prod": REDUCE_PROD, "max": REDUCE_MAX, "min": REDUCE_MIN, "avg": REDUCE_AVG}
COMM_UNIQUE_ID_BYTES = 128
Comm = C.c_void_p
COLLECTIVE_FUNCTIONS = [
    ("comm_get_unique_id_size", _fn(C.POINTER(SZ))),
    ("comm_get_unique_id", _fn(P, SZ)),
    ("comm_init_rank", _fn(I, P, SZ, I, I, C.POINTER(Comm))),
    ("comm_destroy", _fn(Comm)),
    ("all_reduce", _fn(P, P, SZ, I, I, Comm, Handle)),
    ("broadcast", _fn(P, P, SZ, I, I, Comm, Handle)),
    ("reduce", _fn(P, P, SZ, I, I, I, Comm, Handle)),
    ("all_gather", _fn(P, P, SZ, I, Comm, Handle)),
    ("reduce_scatter", _fn(P, P, SZ, I, I, Comm, Handle)),
    ("all_to_all", _fn(P, P, SZ, I, Comm, Handle)),
    ("send", _fn(P, SZ, I, I, Comm, Handle)),
    ("recv", _fn(P, SZ, I, I, Comm, Handle)),
    ("group_start", _fn()),
    ("group_end", _fn()),
]
RESERVED_SLOTS = 31 - len(COLLECTIVE_FUNCTIONS)


class DeviceInterface(C.Structure):
    _fields_ = (
        [("struct_size", C.c_size_t), ("abi_version", C.c_uint32), ("padding0", C.c_uint32),
         ("runtime", Rt)]
        + [(name, ftype) for name, ftype, _ in FUNCTIONS]
        + [(name, ftype) for name, ftype in COLLECTIVE_FUNCTIONS]
        + [("reserved", C.c_void_p * RESERVED_SLOTS)]
    )


InitFn = C.CFUNCTYPE(Status, C.POINTER(DeviceInterface), C.c_char_p)
