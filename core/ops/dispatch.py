"""How an anychip op reaches a kernel: device and dtype lookup, outputs, launch, autograd.

An op module (norm.py, attention.py, ...) validates its arguments, then calls :func:`run` with
an :class:`OpImpl` describing its kernel call and its reference implementation. ``run`` picks
the kernel registered for the tensors' device and dtype. Without one it runs the reference
(plain Paddle ops) and counts a fallback, or raises in strict mode.
"""

from __future__ import annotations

import ctypes
import functools

from .. import _launcher, fallback
from ..host_threads import num_threads
from ..kernels import NativeKernel
from ..frontends.paddle import bridge_library, device_of_place, import_paddle, paddle_device_string
from ..frontends.paddle import place as _place
from ..plugins import registry
from ..dtypes import DTYPE_BITS


class KernelError(RuntimeError):
    """A kernel reported a failure (the message is the kernel's own)."""


def paddle():
    return import_paddle()


# Paddle's dtypes are singletons, so their names are looked up by identity: hashing one costs
# ~0.4 us and str() ~1 us, paid about ten times per op. Each entry holds its dtype, so the id
# stays its own.
_DTYPE_NAMES: dict[int, tuple[object, str]] = {}


def dtype_name(t) -> str:
    dtype = t.dtype
    hit = _DTYPE_NAMES.get(id(dtype))
    if hit is not None and hit[0] is dtype:
        return hit[1]
    name = str(dtype).removeprefix("paddle.")
    _DTYPE_NAMES[id(dtype)] = (dtype, name)
    return name


def device_of(t) -> tuple[str, int]:
    return device_of_place(t.place)


def device_label(device: tuple[str, int]) -> str:
    return f"{device[0]}:{device[1]}"


def place(device: tuple[str, int]):
    """The Paddle place of ``device``: outputs go where the inputs are, whatever Paddle's
    current default device is."""
    return _place(*device)


@functools.lru_cache(maxsize=None)
def paddle_dtype(name: str):
    """Paddle's dtype object for ``name``: ops given the object skip parsing the string (6 of
    the 20 us a cache-cold ``empty`` took, after a 4096 x 4096 GEMV)."""
    return getattr(paddle(), name)


def empty(shape, dtype: str, device: tuple[str, int]):
    """An uninitialised tensor on ``device`` (kernels write every element of their outputs).
    Straight to the op under ``paddle.empty``: its argument handling cost ~3 of its 4.5 us."""
    return paddle()._C_ops.empty(list(shape), paddle_dtype(dtype), place(device))


def zeros(shape, dtype: str, device: tuple[str, int]):
    return paddle().zeros(list(shape), dtype=dtype, device=place(device))


def descriptor(t, index: int) -> tuple:
    return (t.data_ptr(), DTYPE_BITS[dtype_name(t)], tuple(t.shape), tuple(t.strides), index)


def dense_descriptor(t, dtype: str, shape: tuple, index: int) -> tuple:
    """:func:`descriptor` of a contiguous ``t`` whose dtype and shape the caller already holds:
    one call into Paddle (the address) instead of four, which after a large GEMV, with Python's
    caches cold, is worth a few microseconds a tensor."""
    return (t.data_ptr(), DTYPE_BITS[dtype], shape, _dense_strides(shape), index)


@functools.lru_cache(maxsize=256)
def _dense_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=None)
def _bridge_launch(name: str) -> int:
    lib = ctypes.CDLL(str(bridge_library(name)))
    return ctypes.cast(lib.anychip_bridge_launch, ctypes.c_void_p).value


def _stream(device: tuple[str, int]) -> int:
    return paddle().device.current_stream(paddle_device_string(*device)).stream_base.raw_stream


def attrs(op: str, grad: bool = False, **values) -> list[float]:
    """The attrs of a launch of anychip op ``op`` (``grad``: of its backward kernel), given by
    name: in its definition's order, defaults filled in (``OpDef.attr_values``)."""
    from .defs import BUILTIN  # here: the definitions import the op modules for their cases

    return BUILTIN[op].attr_values(grad, **values)


def launch(kernel, op: str, device: tuple[str, int], inputs, outputs, attrs=(), described=()) -> None:
    """Runs ``kernel`` for ``op`` on ``device``, ordered on the device's current Paddle stream:
    a host-code kernel in this thread for the host CPU, else through the device's bridge
    (returning when it is done); a device-code kernel is called with the stream to enqueue on.

    ``described`` holds ready :func:`descriptor` tuples for the last ``len(described)`` inputs,
    for an op that launches with the same (weight) tensors every time: describing a tensor takes
    about 1 us, which hundreds of them per launch would pay again and again."""
    if not isinstance(kernel, NativeKernel):
        kernel(inputs, outputs, attrs)
        return
    index = device[1]
    descs_in = [descriptor(t, index) for t in inputs[:len(inputs) - len(described)]]
    descs_in.extend(described)
    launch_described(kernel, op, device, descs_in, [descriptor(t, index) for t in outputs],
                     [float(a) for a in attrs])


def launch_described(kernel: NativeKernel, op: str, device: tuple[str, int], descs_in: list, descs_out: list,
                     attrs: list[float]) -> None:
    """:func:`launch` of a native kernel on tensors already described, attrs already floats."""
    host = device[0] == "cpu"
    bridge = 0 if host or not kernel.host_code else _bridge_launch(device[0])
    try:
        _launcher.launch(kernel.address, descs_in, descs_out, attrs, bridge, device[1],
                         0 if host else _stream(device), num_threads())
    except RuntimeError as e:
        _status, _, message = str(e).partition(":")
        raise KernelError(f"anychip.ops.{op} on {device_label(device)}: {message}") from None


class OpImpl:
    """One call of an op. Subclasses set ``name`` and implement:

    - ``forward(kernel, *tensors)`` -> (outputs, saved, non_differentiable): runs the forward
      kernel; ``saved`` are tensors for backward, ``non_differentiable`` outputs without grads.
    - ``backward(kernel, saved, grads)`` -> one grad (or None) per input tensor.
    - ``reference(*tensors)`` -> outputs, written with plain Paddle ops (autograd through Paddle).
    """

    name = ""

    def forward(self, kernel, *tensors):
        raise NotImplementedError

    def backward(self, kernel, saved, grads):
        raise NotImplementedError

    def reference(self, *tensors):
        raise NotImplementedError


def _needs_grad(tensors) -> bool:
    return paddle().is_grad_enabled() and any(t is not None and not t.stop_gradient for t in tensors)


def _with_reference_grads(impl: OpImpl, kernel, tensors):
    """The kernel's outputs, carrying the gradients of impl.reference: a kernel registered
    without a backward. Paddle cannot differentiate inside a PyLayer's backward, so the
    reference's forward runs now and its autograd graph is spliced onto the kernel's values
    (``o + (r - r.detach())`` is ``o`` exactly, with r's gradient). The kernel runs without
    autograd: a Python kernel made of Paddle ops would otherwise add its own gradient to r's."""
    with paddle().no_grad():
        outs, _saved, nondiff = impl.forward(kernel.forward, *tensors)
    refs = impl.reference(*tensors)
    single = not isinstance(outs, (tuple, list))
    outs, refs = ((outs,), (refs,)) if single else (tuple(outs), tuple(refs))
    nondiff_ids = {id(t) for t in nondiff}
    spliced = tuple(o if id(o) in nondiff_ids or r.stop_gradient else o + (r - r.detach())
                    for o, r in zip(outs, refs))
    return spliced[0] if single else spliced


def _make_layer():
    class KernelLayer(paddle().autograd.PyLayer):
        @staticmethod
        def forward(ctx, impl, kernel, *tensors):
            outs, saved, nondiff = impl.forward(kernel.forward, *tensors)
            ctx.impl, ctx.kernel = impl, kernel
            ctx.needs_grad = tuple(not t.stop_gradient for t in tensors)
            ctx.save_for_backward(*saved)
            for t in nondiff:
                ctx.mark_non_differentiable(t)
            return outs

        @staticmethod
        def backward(ctx, *grads):
            result = ctx.impl.backward(ctx.kernel.backward, ctx.saved_tensor(), grads)
            # Paddle wants None, not a gradient, for an input that does not require one
            result = tuple(g if need else None for g, need in zip(result, ctx.needs_grad))
            return result if len(result) > 1 else result[0]

    return KernelLayer


_layer = None


def run(impl: OpImpl, device: tuple[str, int], dtype: str, *tensors, differentiable: bool = True):
    """Runs ``impl`` on ``tensors`` (all on ``device``) with the registered kernel, with autograd
    when any input needs a gradient; without a kernel, runs the reference (a counted fallback)."""
    global _layer
    kernel = registry().kernels.find(impl.name, device[0], dtype)
    if kernel is None:
        fallback.record_op_fallback(device[0], impl.name, dtype,
                                    f"no kernel is registered for {device[0]}/{dtype}")
        return impl.reference(*tensors)
    if not (differentiable and _needs_grad(tensors)):
        outs, _saved, _nondiff = impl.forward(kernel.forward, *tensors)
        return outs
    if kernel.backward is None:
        fallback.record_op_fallback(device[0], impl.name + "_grad", dtype,
                                    f"no backward kernel is registered for {device[0]}/{dtype}")
        return _with_reference_grads(impl, kernel, tensors)
    if _layer is None:
        _layer = _make_layer()
    return _layer.apply(impl, kernel, *tensors)
