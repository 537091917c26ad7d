"""The framework front ends: how a framework's tensors reach anychip's devices and kernels.

``paddle`` registers every anychip device as a Paddle CustomDevice (its C++ half, ``csrc/bridge``
and ``csrc/kernels``, is the only anychip code that includes Paddle's headers); ``torch``
presents the chip behind any anychip plugin as PyTorch's PrivateUse1 device (``anychip:0``,
public name ``anychip.torch``). Both drive a plugin only through ``anychip/device.h`` and
``anychip/kernel.h``: the same compiled plugin serves either framework.
"""
