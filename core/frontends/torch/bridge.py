"""The compiled half of the PyTorch front end (``core/frontends/torch/csrc``), loaded into PyTorch.

Loading it registers the PrivateUse1 backend's allocator, device guard, hooks and the ATen ops
that only move metadata; :func:`open_device` then binds the backend to one chip's plugin, for
the life of the process. The C functions below are its ctypes face.
"""

from __future__ import annotations

import ctypes as C
import functools

from ...native import library_path
from ...runtime import abi

BACKEND = "anychip"

FallbackHook = C.CFUNCTYPE(C.c_int, C.c_char_p, C.c_char_p, C.c_void_p, C.c_size_t)


class BridgeError(RuntimeError):
    """The bridge library is missing or refused a call (the message says which and why)."""


@functools.lru_cache(maxsize=None)
def library() -> C.CDLL:
    """The bridge, loaded once into PyTorch (which must be imported first)."""
    import torch

    path = library_path("anychip_torch_bridge")
    if not path.exists():
        raise BridgeError(
            f"anychip's PyTorch bridge {path} is not built: it builds when torch is installed before "
            "anychip (pip install -r requirements-test.txt, then pip install --no-build-isolation -e .)")
    torch.ops.load_library(str(path))
    lib = C.CDLL(str(path))
    err = (C.c_char_p, C.c_size_t)
    for name, args, res in [
        ("anychip_torch_open", (C.c_char_p, C.c_char_p, C.c_char_p, C.c_char_p) + err, C.c_int),
        ("anychip_torch_device_name", (), C.c_char_p),
        ("anychip_torch_device_count", (), C.c_int),
        ("anychip_torch_copy", (C.c_int, C.c_int, C.c_void_p, C.c_void_p, C.c_size_t) + err, C.c_int),
        ("anychip_torch_current_stream", (C.c_int,), C.c_void_p),
        ("anychip_torch_memory_stats", (C.c_int, C.POINTER(abi.MemoryStats)) + err, C.c_int),
        ("anychip_torch_properties", (C.c_int, C.POINTER(abi.DeviceProperties)) + err, C.c_int),
        ("anychip_torch_set_fallback_hook", (FallbackHook,), None),
        ("anychip_torch_get_device", (), C.c_int),
        ("anychip_torch_set_device", (C.c_int,) + err, C.c_int),
        ("anychip_torch_synchronize", (C.c_int,) + err, C.c_int),
    ]:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def _checked(fn, *args) -> None:
    buf = C.create_string_buffer(1024)
    if fn(*args, buf, len(buf)) != 0:
        raise BridgeError(buf.value.decode(errors="replace"))


def open_device(name: str, library_file: str, symbol: str, options: str) -> None:
    """Binds PyTorch's anychip device to plugin ``library_file`` (a no-op if it is already
    ``name``; another chip is refused: one per process)."""
    _checked(library().anychip_torch_open, name.encode(), library_file.encode(), symbol.encode(), options.encode())


def device_name() -> str:
    return library().anychip_torch_device_name().decode()


def device_count() -> int:
    return library().anychip_torch_device_count()


H2D, D2H, D2D = 0, 1, 2


def current_device() -> int:
    return library().anychip_torch_get_device()


def set_device(index: int) -> None:
    _checked(library().anychip_torch_set_device, index)


def synchronize(index: int) -> None:
    _checked(library().anychip_torch_synchronize, index)


def copy(kind: int, device: int, dst: int, src: int, nbytes: int) -> None:
    """A synchronous copy of ``nbytes`` between raw addresses (kind H2D, D2H or D2D)."""
    _checked(library().anychip_torch_copy, kind, device, dst, src, nbytes)


def current_stream(device: int) -> int:
    """The plugin's handle of the calling thread's current PyTorch stream on ``device``."""
    return library().anychip_torch_current_stream(device) or 0


@functools.lru_cache(maxsize=None)
def launch_address() -> int:
    """``anychip_torch_launch``: anychip._launcher's bridge for host-code kernels."""
    return C.cast(library().anychip_torch_launch, C.c_void_p).value


def memory_stats(device: int) -> abi.MemoryStats:
    stats = abi.MemoryStats()
    stats.struct_size = C.sizeof(stats)
    _checked(library().anychip_torch_memory_stats, device, C.byref(stats))
    return stats


def properties(device: int) -> abi.DeviceProperties:
    props = abi.DeviceProperties()
    props.struct_size = C.sizeof(props)
    _checked(library().anychip_torch_properties, device, C.byref(props))
    return props


_hook = None  # the ctypes callback must outlive its registration


def set_fallback_hook(record) -> None:
    """``record(op, dtype)`` runs before an ATen op without a device kernel runs on the CPU; an
    exception it raises (strict mode) refuses the op with the exception's message."""
    global _hook

    def hook(op, dtype, message, size):
        try:
            record(op.decode(), dtype.decode())
            return 0
        except Exception as exc:  # noqa: BLE001 - any refusal reaches PyTorch as its message
            text = str(exc).encode()[:size - 1]
            C.memmove(message, text + b"\0", len(text) + 1)
            return 1

    _hook = FallbackHook(hook)
    library().anychip_torch_set_fallback_hook(_hook)
