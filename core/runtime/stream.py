"""Streams (in-order work queues) and events (markers in them) of a device."""

from __future__ import annotations

import ctypes as C
import threading

from . import abi
from .errors import AnychipError


# Set while Python code runs as a stream's work (launch_host): the thread is the device's own,
# where a call that waits for that stream (device_free, a synchronous copy) never returns.
_host_work = threading.local()


def in_host_work() -> bool:
    """True inside a host function that a stream is running."""
    return getattr(_host_work, "active", False)


class Stream:
    def __init__(self, device):
        self.device = device
        handle = abi.Handle()
        device.call("stream_create", C.byref(handle))
        self.handle = handle
        # Host objects that enqueued work still reads or writes (async copies, callbacks):
        # kept alive until the stream is known to have passed them.
        self._keepalive: list = []
        self._lock = threading.Lock()

    def keep(self, obj) -> None:
        with self._lock:
            self._keepalive.append(obj)

    def query(self) -> bool:
        """True when all enqueued work is done."""
        return self.device.call("stream_query", self.handle, ok=(abi.OK, abi.ERROR_NOT_READY)) == abi.OK

    def synchronize(self) -> None:
        try:
            self.device.call("stream_synchronize", self.handle)
        finally:
            with self._lock:
                self._keepalive.clear()

    def wait_event(self, event: "Event") -> None:
        self.device.call("stream_wait_event", self.handle, event.handle)

    def add_callback(self, fn) -> None:
        """Runs ``fn(status_name)`` on a runtime thread once earlier work is done."""

        def trampoline(_user_data, status):
            fn(abi.STATUS_NAMES.get(status, str(status)))

        cb = abi.Callback(trampoline)
        self.keep(cb)
        self.device.call("stream_add_callback", self.handle, cb, None)

    def launch_host(self, fn, buffers=()) -> None:
        """Enqueues ``fn()`` as device work (``launch_host_function``): it runs after earlier
        work with the memory of ``buffers`` (each a Buffer, or ``(buffer, offset, nbytes)``)
        open to the host. An exception from ``fn`` becomes the stream's error."""
        if not self.device.runtime.has("launch_host_function"):
            raise AnychipError(f"{self.device} runs no host-code kernels (launch_host_function is NULL)",
                               "UNSUPPORTED")
        ranges = (abi.MemoryRange * max(len(buffers), 1))()
        for i, item in enumerate(buffers):
            buf, offset, nbytes = item if isinstance(item, tuple) else (item, 0, item.nbytes)
            ranges[i].ptr, ranges[i].size = buf._range(offset, nbytes, f"buffers[{i}]"), nbytes

        def trampoline(_user_data):
            _host_work.active = True
            try:
                fn()
            except Exception:  # noqa: BLE001 - reported as the stream's error, like a kernel's
                return abi.ERROR_DEVICE
            finally:
                _host_work.active = False
            return abi.OK

        cb = abi.HostFunction(trampoline)
        self.keep((cb, ranges))
        self.device.call("launch_host_function", self.handle, cb, None, ranges, len(buffers))

    def destroy(self) -> None:
        if self.handle is not None:
            self.device.call("stream_destroy", self.handle)
            self.handle = None
            self._keepalive.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()


class Event:
    def __init__(self, device):
        self.device = device
        handle = abi.Handle()
        device.call("event_create", C.byref(handle))
        self.handle = handle

    def record(self, stream: Stream) -> "Event":
        self.device.call("event_record", stream.handle, self.handle)
        return self

    def query(self) -> bool:
        return self.device.call("event_query", self.handle, ok=(abi.OK, abi.ERROR_NOT_READY)) == abi.OK

    def synchronize(self) -> None:
        self.device.call("event_synchronize", self.handle)

    def elapsed_ms(self, end: "Event") -> float:
        if not self.device.runtime.has("event_elapsed_ms"):
            raise NotImplementedError(f"{self.device}: the plugin does not time events")
        ms = C.c_float()
        self.device.call("event_elapsed_ms", self.handle, end.handle, C.byref(ms))
        return ms.value

    def destroy(self) -> None:
        if self.handle is not None:
            self.device.call("event_destroy", self.handle)
            self.handle = None
