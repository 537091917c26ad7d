"""A device of a loaded runtime, its memory (Buffer, HostBuffer) and its properties."""

from __future__ import annotations

import ctypes as C
from dataclasses import dataclass

import numpy as np

from ..dtypes import DTYPE_BITS
from . import abi
from .errors import InvalidArgumentError
from .library import Runtime
from .stream import Event, Stream, in_host_work


@dataclass(frozen=True)
class Properties:
    name: str
    vendor: str
    total_memory: int
    compute_capability: int
    simulated: bool
    runtime_version: int
    driver_version: int
    dtypes: tuple[str, ...]
    min_chunk_size: int
    max_alloc_size: int


@dataclass(frozen=True)
class MemoryStats:
    total_bytes: int
    free_bytes: int
    allocated_bytes: int
    peak_allocated_bytes: int
    num_allocations: int
    total_allocations: int


class Device:
    """Device ``index`` of ``runtime``; written ``name:index`` (e.g. ``npu:0``)."""

    def __init__(self, runtime: Runtime, index: int):
        if runtime.device_count == 0:
            raise InvalidArgumentError(f"{runtime.name} has no devices on this machine", "INVALID_ARGUMENT")
        if not 0 <= index < runtime.device_count:
            raise InvalidArgumentError(
                f"device index {index} out of range: {runtime.name} has {runtime.device_count} "
                f"device(s) (0..{runtime.device_count - 1})", "INVALID_ARGUMENT")
        self.runtime = runtime
        self.index = index

    def __repr__(self) -> str:
        return f"{self.runtime.name}:{self.index}"

    def call(self, function: str, *args, ok=(abi.OK,)) -> int:
        return self.runtime.call(function, self.index, *args, ok=ok)

    @property
    def properties(self) -> Properties:
        p = abi.DeviceProperties()
        p.struct_size = C.sizeof(p)
        self.call("get_properties", C.byref(p))
        return Properties(
            name=p.name.decode(), vendor=p.vendor.decode(), total_memory=p.total_memory,
            compute_capability=p.compute_capability, simulated=bool(p.simulated),
            runtime_version=p.runtime_version, driver_version=p.driver_version,
            dtypes=tuple(d for d, bit in DTYPE_BITS.items() if p.dtypes >> bit & 1),
            min_chunk_size=p.min_chunk_size, max_alloc_size=p.max_alloc_size)

    def memory_stats(self) -> MemoryStats:
        s = abi.MemoryStats()
        s.struct_size = C.sizeof(s)
        self.call("memory_stats", C.byref(s))
        return MemoryStats(s.total_bytes, s.free_bytes, s.allocated_bytes, s.peak_allocated_bytes,
                           s.num_allocations, s.total_allocations)

    def synchronize(self) -> None:
        self.call("synchronize_device")

    def allocate(self, nbytes: int) -> "Buffer":
        return Buffer(self, nbytes)

    def allocate_host(self, nbytes: int) -> "HostBuffer":
        return HostBuffer(self, nbytes)

    def upload(self, array: np.ndarray) -> "Buffer":
        """A new buffer holding a copy of ``array``'s bytes."""
        array = np.ascontiguousarray(array)
        buf = Buffer(self, max(array.nbytes, 1))
        buf.copy_from_host(array)
        return buf

    def stream(self) -> Stream:
        return Stream(self)

    def event(self) -> Event:
        return Event(self)


def _host_view(obj) -> tuple[int, int, object]:
    """(address, nbytes, owner) of a C-contiguous ndarray or a HostBuffer."""
    if isinstance(obj, HostBuffer):
        return obj.ptr, obj.nbytes, obj
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise InvalidArgumentError("host array must be C-contiguous (use np.ascontiguousarray)",
                                       "INVALID_ARGUMENT")
        return obj.ctypes.data, obj.nbytes, obj
    raise TypeError(f"expected a numpy array or HostBuffer, got {type(obj).__name__}")


def _free_deferred(runtime: Runtime) -> None:
    """Frees the buffers that were collected inside host work (Buffer.__del__)."""
    if in_host_work():
        return
    while True:
        try:
            index, ptr = runtime.deferred_frees.pop()
        except IndexError:  # empty, or another thread took the last one
            return
        runtime.call("device_free", index, C.c_void_p(ptr))


class Buffer:
    """``nbytes`` of device memory. Copies are synchronous unless a stream is given."""

    def __init__(self, device: Device, nbytes: int):
        if not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise InvalidArgumentError(f"nbytes must be a positive int, got {nbytes!r}", "INVALID_ARGUMENT")
        self.device = device
        self.nbytes = int(nbytes)
        _free_deferred(device.runtime)
        ptr = C.c_void_p()
        device.call("device_allocate", C.byref(ptr), C.c_size_t(self.nbytes))
        self.ptr = ptr.value
        self.address = self.ptr  # kept after a free (ptr becomes None), to name the buffer in errors

    def __repr__(self) -> str:
        return f"Buffer({self.device}, {self.nbytes} bytes at {self.address:#x})"

    def _range(self, offset: int, nbytes: int, what: str) -> int:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise InvalidArgumentError(
                f"{what}: bytes [{offset}, {offset + nbytes}) are outside this {self.nbytes}-byte buffer",
                "INVALID_ARGUMENT")
        if self.ptr is None:
            raise InvalidArgumentError(f"{what}: buffer was freed", "INVALID_ARGUMENT")
        return self.ptr + offset

    def copy_from_host(self, src, offset: int = 0, stream: Stream | None = None) -> None:
        addr, n, owner = _host_view(src)
        dst = self._range(offset, n, "copy_from_host")
        if stream is None:
            self.device.call("memcpy_h2d", C.c_void_p(dst), C.c_void_p(addr), C.c_size_t(n))
        else:
            stream.keep(owner)
            self.device.call("memcpy_h2d_async", stream.handle, C.c_void_p(dst), C.c_void_p(addr), C.c_size_t(n))

    def copy_to_host(self, dst, offset: int = 0, stream: Stream | None = None) -> None:
        addr, n, owner = _host_view(dst)
        src = self._range(offset, n, "copy_to_host")
        if stream is None:
            self.device.call("memcpy_d2h", C.c_void_p(addr), C.c_void_p(src), C.c_size_t(n))
        else:
            stream.keep(owner)
            self.device.call("memcpy_d2h_async", stream.handle, C.c_void_p(addr), C.c_void_p(src), C.c_size_t(n))

    def copy_from(self, src: "Buffer", nbytes: int | None = None, dst_offset: int = 0,
                  src_offset: int = 0, stream: Stream | None = None) -> None:
        if src.device.runtime is not self.device.runtime or src.device.index != self.device.index:
            raise InvalidArgumentError(f"copy_from: source is on {src.device}, destination on {self.device}",
                                       "INVALID_ARGUMENT")
        n = src.nbytes - src_offset if nbytes is None else nbytes
        d = self._range(dst_offset, n, "copy_from (dst)")
        s = src._range(src_offset, n, "copy_from (src)")
        if stream is None:
            self.device.call("memcpy_d2d", C.c_void_p(d), C.c_void_p(s), C.c_size_t(n))
        else:
            self.device.call("memcpy_d2d_async", stream.handle, C.c_void_p(d), C.c_void_p(s), C.c_size_t(n))

    def to_numpy(self, dtype=np.uint8, shape=None) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = self.nbytes // dtype.itemsize if shape is None else int(np.prod(shape))
        out = np.empty(count, dtype=dtype)
        self.copy_to_host(out)
        return out if shape is None else out.reshape(shape)

    def fill(self, byte: int) -> None:
        self.device.call("memset", C.c_void_p(self._range(0, self.nbytes, "fill")), int(byte),
                         C.c_size_t(self.nbytes))

    def free(self) -> None:
        """Returns the memory to the device. Freeing twice raises InvalidArgumentError."""
        if self.ptr is None:  # the device would only see a NULL pointer
            raise InvalidArgumentError(f"{self.device}: free of {self.address:#x} ({self.nbytes} bytes): "
                                       "this buffer was already freed", "INVALID_ARGUMENT")
        ptr = self.ptr
        self.ptr = None
        self.device.call("device_free", C.c_void_p(ptr))
        _free_deferred(self.device.runtime)

    def __del__(self):
        if getattr(self, "ptr", None) is None or self.device.runtime._closed:
            return
        if in_host_work():
            # The garbage collector can run anywhere, a stream's host function included; there
            # device_free would wait for that stream, i.e. for itself.
            self.device.runtime.deferred_frees.append((self.device.index, self.ptr))
            self.ptr = None
            return
        try:
            self.free()
        except Exception:  # interpreter shutdown: nothing useful to report to
            pass


class HostBuffer:
    """Page-locked host memory from the device's runtime, for asynchronous copies."""

    def __init__(self, device: Device, nbytes: int):
        if nbytes <= 0:
            raise InvalidArgumentError(f"nbytes must be positive, got {nbytes}", "INVALID_ARGUMENT")
        self.device = device
        self.nbytes = int(nbytes)
        if device.runtime.has("host_allocate"):
            ptr = C.c_void_p()
            device.call("host_allocate", C.byref(ptr), C.c_size_t(self.nbytes))
            self.ptr = ptr.value
            self._owned = None
        else:  # device.h default: plain (pageable) host memory
            self._owned = np.empty(self.nbytes, np.uint8)
            self.ptr = self._owned.ctypes.data

    def numpy(self, dtype=np.uint8, shape=None) -> np.ndarray:
        """A numpy view of the memory (valid while this HostBuffer lives)."""
        dtype = np.dtype(dtype)
        raw = (C.c_char * self.nbytes).from_address(self.ptr)
        arr = np.frombuffer(raw, dtype=np.uint8).view(dtype)
        return arr if shape is None else arr.reshape(shape)

    def free(self) -> None:
        if self.ptr is not None and self._owned is None:
            self.device.call("host_free", C.c_void_p(self.ptr))
        self.ptr = None

    def __del__(self):
        if getattr(self, "ptr", None) is not None and not self.device.runtime._closed:
            try:
                self.free()
            except Exception:
                pass
