"""Loading a plugin's runtime library and calling through its AnychipDeviceInterface."""

from __future__ import annotations

import ctypes as C
import os
import threading

from . import abi
from .errors import AnychipError, DeviceUnavailableError, error_for


def _is_null(fn) -> bool:
    return C.cast(fn, C.c_void_p).value is None


class Runtime:
    """One initialised instance of a plugin library (one ``AnychipRuntime``)."""

    def __init__(self, name: str, library: str, symbol: str = "anychip_device_init", options: str = ""):
        self.name = name
        self._closed = False
        # (device, pointer) of buffers collected inside a stream's host work, where freeing
        # would wait for that stream: freed by the next allocation or free outside it.
        self.deferred_frees: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        if not os.path.exists(library):
            raise DeviceUnavailableError(f"{name}: runtime library {library} does not exist "
                                         "(was its package built and installed?)", "UNAVAILABLE")
        try:
            self._lib = C.CDLL(library, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as exc:
            raise DeviceUnavailableError(f"{name}: cannot load {library}: {exc}", "UNAVAILABLE") from None
        try:
            entry = abi.InitFn((symbol, self._lib))
        except AttributeError:
            raise DeviceUnavailableError(f"{name}: {library} does not export {symbol}", "UNAVAILABLE") from None

        self._iface = abi.DeviceInterface()
        self._iface.struct_size = C.sizeof(abi.DeviceInterface)
        status = entry(C.byref(self._iface), options.encode())
        if status != abi.OK:
            message = self.last_error() if not _is_null(self._iface.last_error) else ""
            raise error_for(status, f"{name}: {symbol}({options!r}) failed: {message}")
        major = self._iface.abi_version >> 16
        if major != abi.ABI_MAJOR:
            raise DeviceUnavailableError(
                f"{name}: {library} implements device ABI {major}.x, anychip needs {abi.ABI_MAJOR}.x",
                "UNAVAILABLE")
        missing = [f for f, _t, required in abi.FUNCTIONS if required and _is_null(getattr(self._iface, f))]
        if missing:
            raise DeviceUnavailableError(
                f"{name}: {library} leaves required function(s) NULL: {', '.join(missing)}", "UNAVAILABLE")
        self.call("initialize")
        self.device_count = self._count()

    def has(self, function: str) -> bool:
        return not _is_null(getattr(self._iface, function))

    def last_error(self) -> str:
        buf = C.create_string_buffer(512)
        self._iface.last_error(self._iface.runtime, buf, len(buf))
        return buf.value.decode(errors="replace")

    def call(self, function: str, *args, ok=(abi.OK,)) -> int:
        """Calls ``function`` and returns its status; raises unless the status is in ``ok``."""
        if self._closed:
            raise AnychipError(f"{self.name}: runtime is finalized", "UNAVAILABLE")
        status = getattr(self._iface, function)(self._iface.runtime, *args)
        if status not in ok:
            raise error_for(status, self.last_error() or f"{self.name}: {function} failed")
        return status

    def _count(self) -> int:
        count = C.c_size_t()
        self.call("get_device_count", C.byref(count))
        return count.value

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self.call("finalize")
                self._closed = True
