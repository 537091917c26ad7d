"""Shared by the kernel tests: calling a host kernel on numpy arrays, and the storage form of
each float dtype (bfloat16 as uint16 bits, since numpy has no bfloat16)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anychip.kernels import NativeKernel

LIBRARY = str(Path(__file__).resolve().parents[1] / "plugins" / "host" / "libanychip_host_kernels.so")


def kernel(name):
    return NativeKernel(LIBRARY, f"anychip_cpu_{name}")


def run(name, inputs, outputs, attrs=(), num_threads=0):
    """Runs anychip_cpu_<name>; uint16 arrays are passed as bfloat16."""
    names = ["bfloat16" if a.dtype == np.uint16 else None for a in list(inputs) + list(outputs)]
    kernel(name).run_host(inputs, outputs, attrs, num_threads=num_threads, dtypes=names)


def store(values, dtype):
    """The array a kernel gets for float64 ``values`` in ``dtype`` (bf16 as uint16 bits)."""
    if dtype == "bfloat16":
        u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.ascontiguousarray(values, dtype=dtype)


def value(array):
    """The float64 values an array in storage form holds."""
    if array.dtype == np.uint16:
        return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return array.astype(np.float64)


def empty(shape, dtype):
    """An output filled with NaN, so that an element the kernel leaves unwritten shows."""
    if dtype == "bfloat16":
        return np.full(shape, 0x7FC0, np.uint16)
    return np.full(shape, np.nan, dtype)
