"""Running anychip kernels on PyTorch tensors, and counting what runs on the CPU instead.

A kernel is looked up in anychip's registry by (op, chip, dtype) as for Paddle, described from
the tensors' addresses, shapes and strides, and launched through ``anychip._launcher``: a
host-code kernel as work of the current PyTorch stream (through the bridge's
``anychip_torch_launch``), a device-code kernel with that stream to enqueue on.
"""

from __future__ import annotations

import torch

from ... import _launcher, fallback
from ...host_threads import num_threads
from ...kernels import NativeKernel
from ...plugins import registry
from ... import dtypes
from ...dtypes import DTYPE_BITS
from . import bridge

DTYPE_NAMES = {getattr(torch, name): name for name in DTYPE_BITS}  # torch spells every contract dtype alike
FLOATS = tuple(getattr(torch, name) for name in dtypes.FLOATS)


class KernelError(RuntimeError):
    """A kernel reported a failure (its own message, naming the op)."""


def dtype_name(dtype: torch.dtype) -> str | None:
    return DTYPE_NAMES.get(dtype)


def kernel_for(op: str, dtype: torch.dtype) -> NativeKernel | None:
    """The chip's native kernel of ``op`` for ``dtype``, or None (Python kernels serve Paddle)."""
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        return None
    found = registry().kernels.find(op, bridge.device_name(), name)
    return found.forward if found is not None and isinstance(found.forward, NativeKernel) else None


def backward_kernel_for(op: str, dtype: torch.dtype) -> NativeKernel | None:
    name = DTYPE_NAMES.get(dtype)
    found = registry().kernels.find(op, bridge.device_name(), name) if name else None
    return found.backward if found is not None and isinstance(found.backward, NativeKernel) else None


def describe(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), DTYPE_BITS[DTYPE_NAMES[t.dtype]], tuple(t.shape), tuple(t.stride()),
            t.device.index or 0)


def launch(kernel: NativeKernel, op: str, inputs, outputs, attrs=()) -> None:
    """Runs ``kernel`` on device tensors ``inputs`` -> ``outputs`` (already allocated), ordered on
    the current stream of the outputs' device; returns when it is done."""
    device = (outputs[0] if outputs else inputs[0]).device.index or 0
    bridge_fn = bridge.launch_address() if kernel.host_code else 0
    try:
        _launcher.launch(kernel.address, [describe(t) for t in inputs], [describe(t) for t in outputs],
                         [float(a) for a in attrs], bridge_fn, device, bridge.current_stream(device), num_threads())
    except RuntimeError as e:
        _status, _, message = str(e).partition(":")
        raise KernelError(f"anychip kernel {op} on {bridge.device_name()}:{device}: {message.strip()}") from None


def record_fallback(op: str, dtype: torch.dtype | str, reason: str) -> None:
    """Counts one call of ``op`` (an ATen op's name, or a qualified one such as
    ``anychip::swiglu``) that runs on the CPU; raises in strict mode."""
    name = dtype if isinstance(dtype, str) else DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
    fallback.record_fallback(bridge.device_name(), op if "::" in op else f"aten::{op}", name, reason)


def on_host(op_label: str, op, dtype, *args, **kwargs):
    """Runs ``op`` on the CPU with device tensors copied there, results copied back: the
    counted fallback of an op registered for the device but without a kernel for these dtypes."""
    record_fallback(op_label, dtype, "no kernel for this dtype on the device")
    device = device_of(*args, **kwargs)
    out = op(*_to(args, "cpu"), **_to(kwargs, "cpu"))
    return _to(out, device)


def device_of(*args, **kwargs) -> torch.device:
    """The anychip device of the first anychip tensor among the arguments (lists searched too)."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor) and a.device.type == bridge.BACKEND:
            return a.device
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor) and b.device.type == bridge.BACKEND:
                    return b.device
    return torch.device(bridge.BACKEND, 0)


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value
