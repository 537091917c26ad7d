"""ATen's copies and fills on the anychip device: moving data in and out, and within it.

Host <-> device goes through the plugin's synchronous copies of dense bytes; anything strided,
broadcast or of another dtype is first made dense on its own side (by the device's ``copy`` and
``cast`` kernels, or by PyTorch on the CPU).
"""

from __future__ import annotations

import torch

from ...ops.dispatch import attrs
from . import bridge
from .launch import kernel_for, launch, record_fallback
from .registration import impl

BACKEND = bridge.BACKEND
# kernel.h's cast: any pair of these
CAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.int8, torch.bool)


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type == BACKEND


def _dense_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _device_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst = src on one device: src already broadcast to dst's shape; any strides either side."""
    if src.dtype == dst.dtype:
        kernel = kernel_for("copy", src.dtype)
        if kernel is not None:
            launch(kernel, "copy", [src], [dst])
            return
    elif dst.dtype in CAST_DTYPES:
        kernel = kernel_for("cast", src.dtype)
        if kernel is not None:
            if dst.is_contiguous():
                launch(kernel, "cast", [src], [dst])
            else:
                tmp = torch.empty(dst.shape, dtype=dst.dtype, device=dst.device)
                launch(kernel, "cast", [src], [tmp])
                _device_copy(tmp, dst)
            return
    record_fallback("copy_", src.dtype, f"no copy/cast kernel for {src.dtype} -> {dst.dtype}")
    _from_host(_to_host(src), dst)


def _to_host(src: torch.Tensor) -> torch.Tensor:
    """A dense CPU copy of device tensor ``src`` (same dtype and shape)."""
    if not src.is_contiguous():
        dense = torch.empty(src.shape, dtype=src.dtype, device=src.device)
        _device_copy(src, dense)
        src = dense
    host = torch.empty(src.shape, dtype=src.dtype)
    bridge.copy(bridge.D2H, src.device.index, host.data_ptr(), src.data_ptr(), _dense_bytes(src))
    return host


def _from_host(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst (device) = src (CPU), src broadcastable to dst, any dtype."""
    src = src.to(dst.dtype).expand(dst.shape).contiguous()
    if dst.is_contiguous():
        bridge.copy(bridge.H2D, dst.device.index, dst.data_ptr(), src.data_ptr(), _dense_bytes(src))
    else:
        dense = torch.empty(dst.shape, dtype=dst.dtype, device=dst.device)
        bridge.copy(bridge.H2D, dst.device.index, dense.data_ptr(), src.data_ptr(), _dense_bytes(src))
        _device_copy(dense, dst)


@impl("_copy_from")
def copy_from(self, dst, non_blocking=False):
    if dst.numel() == 0:
        return dst
    if _on_device(self) and _on_device(dst):
        if self.device == dst.device:
            _device_copy(self.expand(dst.shape), dst)
        else:  # between two devices of the chip: through the host
            _from_host(_to_host(self), dst)
    elif _on_device(dst):
        _from_host(self, dst)
    else:
        dst.copy_(_to_host(self))
    return dst


@impl("_copy_from_and_resize")
def copy_from_and_resize(self, dst):
    dst.resize_(self.shape)
    return copy_from(self, dst)


@impl("fill_.Scalar")
def fill_scalar(self, value):
    if self.numel() == 0:
        return self
    kernel = kernel_for("fill", self.dtype)
    if kernel is None or isinstance(value, complex):
        record_fallback("fill_.Scalar", self.dtype, "no fill kernel for this dtype")
        _from_host(torch.full((), value, dtype=self.dtype), self)
        return self
    target = self if self.is_contiguous() else torch.empty(self.shape, dtype=self.dtype, device=self.device)
    launch(kernel, "fill", [], [target], attrs("fill", value=value))
    if target is not self:
        _device_copy(target, self)
    return self


@impl("fill_.Tensor")
def fill_tensor(self, value):
    return fill_scalar(self, value.item())


@impl("zero_")
def zero(self):
    return fill_scalar(self, 0)
