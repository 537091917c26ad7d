"""anychip's devices as a PyTorch device: the chip behind any anychip plugin, as ``anychip:0``.

    import anychip.torch
    anychip.torch.enable("npu")          # or ANYCHIP_TORCH_CHIP=npu before the import
    x = torch.ones(4, device="anychip")  # tensor([1., 1., 1., 1.], device='anychip:0')

PyTorch's PrivateUse1 backend is renamed ``anychip``; device index i is the chip's device i. The
allocator, copies, streams, events and device guard come from the plugin's ``anychip/device.h``
table (``core/frontends/torch/csrc``), the ops from its ``anychip/kernel.h`` kernels
(``aten_*.py``, ``fused.py``). An ATen op without a device kernel runs on the CPU through
PyTorch's fallback, counted in ``anychip.fallback_report()``; strict mode (ANYCHIP_STRICT=1)
refuses it. One chip per process: PyTorch has one PrivateUse1 backend.
"""

from __future__ import annotations

import os

import torch

from ... import fallback
from ...plugins import registry
from . import bridge
from .bridge import BACKEND, BridgeError

__all__ = ["BACKEND", "BridgeError", "enable", "enabled_chip", "device"]

_modules_loaded = False
# c10::ScalarType's names, as the bridge reports a fallback's dtype -> anychip's
_SCALAR_TYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
                 "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}


def _load_modules() -> None:
    """Registers the backend's name, its device module and every Python ATen kernel: once."""
    global _modules_loaded
    if _modules_loaded:
        return
    bridge.library()
    if torch._C._get_privateuse1_backend_name() != BACKEND:
        torch.utils.rename_privateuse1_backend(BACKEND)
    from . import aten_math, aten_memory, aten_nn, device_module, fused  # noqa: F401  (registration on import)

    torch._register_device_module(BACKEND, device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    fallback.count_frontend("torch")
    bridge.set_fallback_hook(lambda op, dtype: fallback.record_fallback(
        bridge.device_name(), op, _SCALAR_TYPES.get(dtype, dtype), "no device kernel is registered for this ATen op"))
    _modules_loaded = True


def enable(chip: str | None = None) -> str:
    """Binds PyTorch's ``anychip`` device to ``chip`` (default: $ANYCHIP_TORCH_CHIP) and returns
    its name. Raises with the reason when the chip is unknown, unavailable or another chip is
    already bound in this process."""
    chip = chip or os.environ.get("ANYCHIP_TORCH_CHIP", "")
    if not chip:
        raise ValueError("anychip.torch.enable(chip): name a chip (e.g. 'npu') or set ANYCHIP_TORCH_CHIP")
    reg = registry()
    spec = reg.spec(chip)
    if spec.paddle_type is None:
        raise ValueError(f"anychip.torch.enable({chip!r}): {chip} is the host CPU, which is PyTorch's own "
                         "'cpu' device; name an accelerator chip")
    _load_modules()
    bridge.open_device(chip, spec.library, spec.symbol, spec.options_string())
    return chip


def enabled_chip() -> str:
    """The chip PyTorch's anychip device is bound to ("" before :func:`enable`)."""
    return bridge.device_name()


def device(index: int = 0) -> torch.device:
    return torch.device(BACKEND, index)


if os.environ.get("ANYCHIP_TORCH_CHIP"):
    enable()
