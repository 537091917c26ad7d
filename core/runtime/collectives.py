"""Collectives over the ABI 1.2 functions of ``anychip/device.h`` (NCCL-style communicators).

    >>> uid = unique_id(dev)                 # on rank 0, then passed to the others out of band
    >>> comm = Communicator.init(dev, uid, rank, nranks)
    >>> comm.all_reduce(buf.ptr, buf.ptr, count, "float32", "sum", stream)   # enqueued on stream
    >>> stream.synchronize(); comm.destroy()

Pointers are device pointers (ints), counts are in elements of ``dtype`` (an anychip dtype name
or an AnychipDtype number), ``op`` is one of sum, prod, max, min, avg. Every call only enqueues
on ``stream``; a peer's failure or a timeout is raised by the stream's next synchronize.
"""

from __future__ import annotations

import ctypes as C

from . import abi
from .errors import AnychipError, InvalidArgumentError

DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int8": 4, "uint8": 5,
          "int16": 6, "int32": 7, "int64": 8, "bool": 9}

_FUNCTIONS = [name for name, _t in abi.COLLECTIVE_FUNCTIONS]


def _null(fn) -> bool:
    return C.cast(fn, C.c_void_p).value is None


def _abi_name(runtime) -> str:
    version = runtime._iface.abi_version
    return f"{version >> 16}.{version & 0xFFFF}"


def has_collectives(runtime) -> bool:
    """True when ``runtime``'s plugin fills every collective function (ABI >= 1.2)."""
    return all(not _null(getattr(runtime._iface, name)) for name in _FUNCTIONS)


def require_collectives(runtime) -> None:
    missing = [name for name in _FUNCTIONS if _null(getattr(runtime._iface, name))]
    if len(missing) == len(_FUNCTIONS):
        raise AnychipError(f"{runtime.name} has no collectives (its plugin implements device ABI "
                           f"{_abi_name(runtime)} and leaves the collective functions NULL)", "UNSUPPORTED")
    if missing:
        raise AnychipError(f"{runtime.name}: its plugin fills only some collective functions; NULL: "
                           f"{', '.join(missing)} (they come as one block)", "INTERNAL")


def _runtime_of(device):
    runtime = getattr(device, "runtime", None)
    if runtime is None:
        raise InvalidArgumentError(f"device must be an anychip.runtime.Device, got {type(device).__name__}")
    return runtime


def _dtype(dtype) -> int:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        return DTYPES[dtype]
    if isinstance(dtype, int) and 0 <= dtype < len(DTYPES):
        return dtype
    raise InvalidArgumentError(f"dtype must be a dtype name or an AnychipDtype 0..{len(DTYPES) - 1}, got {dtype!r}")


def _op(op) -> int:
    if op not in abi.REDUCE_OPS:
        raise InvalidArgumentError(f"op must be one of {', '.join(abi.REDUCE_OPS)}, got {op!r}")
    return abi.REDUCE_OPS[op]


def _count(count) -> int:
    if not isinstance(count, int) or count < 0:
        raise InvalidArgumentError(f"count must be a number of elements >= 0, got {count!r}")
    return count


def unique_id(device) -> bytes:
    """A fresh communicator id of the device's plugin (call on rank 0; pass it to the others)."""
    runtime = _runtime_of(device)
    require_collectives(runtime)
    size = C.c_size_t()
    runtime.call("comm_get_unique_id_size", C.byref(size))
    if not 0 < size.value <= abi.COMM_UNIQUE_ID_BYTES:
        raise AnychipError(f"{runtime.name}: comm_get_unique_id_size returned {size.value}, expected "
                           f"1..{abi.COMM_UNIQUE_ID_BYTES}", "INTERNAL")
    buf = C.create_string_buffer(size.value)
    runtime.call("comm_get_unique_id", buf, size.value)
    return buf.raw


class Communicator:
    """One rank of a communicator on one device."""

    def __init__(self, device, handle: int, rank: int, nranks: int):
        self.device, self.handle, self.rank, self.nranks = device, handle, rank, nranks
        self._runtime = device.runtime

    def __repr__(self) -> str:
        return f"Communicator({self.device!r}, rank {self.rank} of {self.nranks})"

    @classmethod
    def init(cls, device, uid: bytes, rank: int, nranks: int) -> "Communicator":
        runtime = _runtime_of(device)
        require_collectives(runtime)
        if not isinstance(uid, (bytes, bytearray)) or not 0 < len(uid) <= abi.COMM_UNIQUE_ID_BYTES:
            raise InvalidArgumentError(f"unique_id must be the bytes unique_id() returned (1.."
                                       f"{abi.COMM_UNIQUE_ID_BYTES} bytes), got {type(uid).__name__} "
                                       f"of length {len(uid) if hasattr(uid, '__len__') else '?'}")
        if not isinstance(nranks, int) or nranks < 1:
            raise InvalidArgumentError(f"nranks must be an int >= 1, got {nranks!r}")
        if not isinstance(rank, int) or not 0 <= rank < nranks:
            raise InvalidArgumentError(f"rank must be an int in 0..{nranks - 1}, got {rank!r}")
        handle = abi.Comm()
        buf = C.create_string_buffer(bytes(uid), len(uid))
        device.call("comm_init_rank", buf, len(uid), rank, nranks, C.byref(handle))
        return cls(device, handle.value, rank, nranks)

    def _check(self) -> None:
        if self.handle is None:
            raise AnychipError(f"{self!r} is destroyed", "INVALID_ARGUMENT")

    def _root(self, root) -> int:
        if not isinstance(root, int) or not 0 <= root < self.nranks:
            raise InvalidArgumentError(f"root must be a rank in 0..{self.nranks - 1}, got {root!r}")
        return root

    def _call(self, function: str, *args, stream) -> None:
        self._check()
        self._runtime.call(function, *args, self.handle, stream.handle)

    def all_reduce(self, send: int, recv: int, count: int, dtype, op, stream) -> None:
        self._call("all_reduce", send, recv, _count(count), _dtype(dtype), _op(op), stream=stream)

    def broadcast(self, send: int, recv: int, count: int, dtype, root: int, stream) -> None:
        self._call("broadcast", send, recv, _count(count), _dtype(dtype), self._root(root), stream=stream)

    def reduce(self, send: int, recv: int, count: int, dtype, op, root: int, stream) -> None:
        self._call("reduce", send, recv, _count(count), _dtype(dtype), _op(op), self._root(root), stream=stream)

    def all_gather(self, send: int, recv: int, count: int, dtype, stream) -> None:
        self._call("all_gather", send, recv, _count(count), _dtype(dtype), stream=stream)

    def reduce_scatter(self, send: int, recv: int, count: int, dtype, op, stream) -> None:
        self._call("reduce_scatter", send, recv, _count(count), _dtype(dtype), _op(op), stream=stream)

    def all_to_all(self, send: int, recv: int, count: int, dtype, stream) -> None:
        self._call("all_to_all", send, recv, _count(count), _dtype(dtype), stream=stream)

    def send(self, buf: int, count: int, dtype, peer: int, stream) -> None:
        self._call("send", buf, _count(count), _dtype(dtype), self._root(peer), stream=stream)

    def recv(self, buf: int, count: int, dtype, peer: int, stream) -> None:
        self._call("recv", buf, _count(count), _dtype(dtype), self._root(peer), stream=stream)

    def group_start(self) -> None:
        self._runtime.call("group_start")

    def group_end(self) -> None:
        self._runtime.call("group_end")

    def destroy(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            self._runtime.call("comm_destroy", handle)
