"""The framework front ends: how a framework's tensors reach anychip's devices and kernels.

``torch`` presents the chip behind any anychip plugin as PyTorch's PrivateUse1 device
(``anychip:0``). Paddle's bridge is the CustomDevice one (``anychip.paddle_frontend`` and
``core/src/paddle_bridge``). Both drive a plugin only through ``anychip/device.h`` and
``anychip/kernel.h``: the same compiled plugin serves either framework.
"""
