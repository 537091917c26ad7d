"""Not a plugin: the host kernels (``libanychip_host_kernels.so``, sources in ``kernels/``, C
ABI of ``anychip/kernel.h``, AMX / AVX-512 / AVX2 / scalar picked at run time) and how a plugin
whose device memory is host memory registers them: the cpu device registers all of them, and
each simulated chip those of the dtypes its traits allow.

The base ops' hand-written kernels (``kernels/base_*.cc``, their definitions in
``anychip.ops.defs``) are registered separately, by :func:`register_base_kernels`: a chip
chooses them (xpu) or generated ones (npu, anychip codegen); the cpu device does not need them,
since Paddle's own CPU kernels serve it."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from anychip.kernels import NativeKernel
from anychip.ops import BASE_OPS, OPS

LIBRARY = Path(__file__).with_name("libanychip_host_kernels.so")


ISAS = ("scalar", "avx2", "avx512", "amx")  # the kernels' tiers, lowest first


@functools.cache
def kernel_isa() -> str:
    """The instruction set the host kernels use in this process: the best of :data:`ISAS` this
    CPU allows, capped by ``ANYCHIP_CPU_ISA``."""
    fn = ctypes.CDLL(str(LIBRARY)).anychip_cpu_isa
    fn.restype = ctypes.c_char_p
    return fn().decode()


def fma_peak(threads: int, seconds: float = 0.5) -> float:
    """The float32 FLOP/s that ``threads`` threads sustain in FMA chains on the kernels' ISA
    (:func:`kernel_isa`) for ``seconds``: the host's measured compute roofline."""
    fn = ctypes.CDLL(str(LIBRARY)).anychip_cpu_fma_peak
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_int, ctypes.c_double]
    return fn(threads, seconds)


def read_pass(address: int, nbytes: int, threads: int) -> int:
    """One plain read of the ``nbytes`` bytes at ``address`` by ``threads`` threads, each a
    contiguous share, on the kernels' ISA: timed around a call, the host's read bandwidth for a
    buffer of that size (the benchmarks' paired read roofline). Returns the or of the bytes as
    64-bit words: nonzero exactly when some byte is, so that no byte goes unread."""
    return _read_pass_fn()(address, nbytes, threads)


@functools.cache
def _read_pass_fn():
    fn = ctypes.CDLL(str(LIBRARY)).anychip_cpu_read_pass
    fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    return fn


def _kernel(name: str) -> NativeKernel:
    kernel = NativeKernel(str(LIBRARY), f"anychip_cpu_{name}")
    kernel.address  # resolve now: a missing kernel disables the plugin with its reason, not a later call
    return kernel


def register_host_kernels(registry, device: str, dtypes, exclude=()) -> None:
    """Registers the host kernel of every anychip fused op (``anychip.ops.OPS``: exported as
    ``anychip_cpu_<op>``, its backward as ``anychip_cpu_<grad>``) for ``device``, for the op's
    dtypes among ``dtypes``, except the ops in ``exclude`` (which the device gets elsewhere,
    e.g. from CodeGen)."""
    for op in OPS.values():
        allowed = [d for d in op.dtypes if d in dtypes and op.name not in exclude]
        if allowed:
            registry.register(op.name, device, allowed, forward=_kernel(op.name),
                              backward=_kernel(op.grad) if op.grad else None)


def register_base_kernels(registry, device: str, dtypes, exclude=()) -> None:
    """Registers the hand-written kernel of every anychip base op (exported as ``anychip_cpu_<op>``) for
    ``device``, restricted to ``dtypes``, except the ops in ``exclude``. A grad op is registered
    under its own name and also as the backward of its forward op."""
    for op in BASE_OPS.values():
        allowed = [d for d in op.dtypes if d in dtypes and op.name not in exclude]
        if not allowed:
            continue
        backward = _kernel(op.grad) if op.grad else None
        registry.register(op.name, device, allowed, forward=_kernel(op.name), backward=backward)
