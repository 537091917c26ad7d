"""The kernel registry: which kernel runs an op on which device for which dtypes.

Plugins fill it through the ``anychip_register_kernels`` hook. A kernel is either a
:class:`NativeKernel` (a C function following ``anychip/kernel.h``, found by symbol in a shared
library) or a Python callable ``fn(inputs, outputs, attrs)`` over Paddle tensors (for backends
that generate Python-level code).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .dtypes import DTYPE_BITS

_NUMPY_DTYPES = {
    np.dtype("float32"): "float32", np.dtype("float16"): "float16", np.dtype("float64"): "float64",
    np.dtype("int8"): "int8", np.dtype("uint8"): "uint8", np.dtype("int16"): "int16",
    np.dtype("int32"): "int32", np.dtype("int64"): "int64", np.dtype("bool"): "bool",
}


@functools.lru_cache(maxsize=None)
def _library(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path)


@dataclass(frozen=True)
class NativeKernel:
    """An ``AnychipKernelFn`` exported as ``symbol`` by the shared library at ``library``.

    ``host_code=True`` (the default): the kernel computes on the host CPU, so on a non-host
    device it runs through the runtime's ``launch_host_function``, ordered on the stream with
    its tensors' memory open. ``host_code=False``: the kernel enqueues device work itself on
    ``call->stream`` and returns (a chip with its own compute, e.g. CUDA kernels)."""

    library: str
    symbol: str
    host_code: bool = True

    @functools.cached_property
    def address(self) -> int:
        try:
            fn = getattr(_library(self.library), self.symbol)
        except OSError as e:
            raise OSError(f"kernel library {self.library} does not load: {e}") from None
        except AttributeError:
            raise LookupError(f"{self.library} exports no kernel {self.symbol!r}") from None
        return ctypes.cast(fn, ctypes.c_void_p).value

    def run_host(self, inputs, outputs, attrs=(), num_threads: int = 0, dtypes=None) -> None:
        """Runs the kernel on numpy arrays in host memory (for kernel authors' tests).
        ``dtypes`` overrides the anychip dtype name per tensor (e.g. "bfloat16" for a uint16
        array holding bf16 bits); outputs are written in place."""
        from . import _launcher

        arrays = list(inputs) + list(outputs)
        names = list(dtypes) if dtypes is not None else [None] * len(arrays)
        descs = [host_descriptor(a, n) for a, n in zip(arrays, names)]
        _launcher.launch(self.address, descs[:len(inputs)], descs[len(inputs):],
                         [float(a) for a in attrs], num_threads=num_threads)


def host_descriptor(array: np.ndarray, dtype: str | None = None) -> tuple:
    """The launcher's descriptor ``(ptr, dtype, shape, strides, device)`` of a numpy array."""
    name = dtype or _NUMPY_DTYPES.get(array.dtype)
    if name is None:
        raise TypeError(f"numpy dtype {array.dtype} has no anychip dtype; pass dtype=")
    item = array.dtype.itemsize
    if any(s % item for s in array.strides):
        raise ValueError("array strides are not whole elements")
    return (array.ctypes.data, DTYPE_BITS[name], tuple(array.shape),
            tuple(s // item for s in array.strides), 0)


@dataclass(frozen=True)
class Kernel:
    op: str
    device: str
    dtypes: tuple[str, ...]
    forward: NativeKernel | Callable
    backward: NativeKernel | Callable | None = None
    capabilities: tuple[str, ...] = field(default_factory=tuple)


class KernelRegistry:
    def __init__(self) -> None:
        self._kernels: dict[tuple[str, str, str], Kernel] = {}

    def register(self, op, device, dtypes, forward, backward=None, capabilities=()):
        """Registers ``forward`` (and optionally ``backward``) for ``op`` on ``device`` for each
        of ``dtypes``. Kernels are NativeKernel instances or Python callables."""
        for role, fn in (("forward", forward), ("backward", backward)):
            if fn is not None and not isinstance(fn, NativeKernel) and not callable(fn):
                raise TypeError(f"register({op!r}, {device!r}): {role} must be a NativeKernel or callable")
        if forward is None:
            raise TypeError(f"register({op!r}, {device!r}): forward is required")
        unknown = [d for d in dtypes if d not in DTYPE_BITS]
        if unknown:
            raise ValueError(f"register({op!r}, {device!r}): unknown dtype(s) {unknown}")
        kernel = Kernel(op, device, tuple(dtypes), forward, backward, tuple(capabilities))
        for dtype in kernel.dtypes:
            key = (op, device, dtype)
            if key in self._kernels:
                raise ValueError(f"kernel {op!r} for {device}/{dtype} is registered twice")
            self._kernels[key] = kernel

    def unregister(self, keys) -> None:
        """Removes the kernels at ``keys``, (op, device, dtype) triples: what a plugin added
        before it was disabled."""
        for key in keys:
            self._kernels.pop(key, None)

    def find(self, op: str, device: str, dtype: str) -> Kernel | None:
        return self._kernels.get((op, device, dtype))

    def kernels(self) -> list[Kernel]:
        return list(dict.fromkeys(self._kernels.values()))

    def count(self, device: str) -> int:
        """Number of distinct ops with a kernel on ``device``."""
        return len({op for (op, dev, _dtype) in self._kernels if dev == device})
