"""anychip's framework-agnostic runtime: devices, memory, streams and events over the C
interface in ``anychip/device.h``. Imports and works without Paddle, so plugins can be validated
on machines that have no framework installed.

    >>> import numpy as np, anychip.runtime as rt
    >>> dev = rt.open_device("npu:0")
    >>> buf = dev.upload(np.arange(10, dtype=np.float32))
    >>> buf.to_numpy(np.float32)[:3]
    array([0., 1., 2.], dtype=float32)
"""

from .device import Buffer, Device, HostBuffer, MemoryStats, Properties
from .errors import AnychipError, DeviceOutOfMemoryError, DeviceUnavailableError, InvalidArgumentError
from .library import Runtime
from .stream import Event, Stream
from .open import open_device, open_runtime

__all__ = [
    "AnychipError", "Buffer", "Device", "DeviceOutOfMemoryError", "DeviceUnavailableError", "Event",
    "HostBuffer", "InvalidArgumentError", "MemoryStats", "Properties", "Runtime", "Stream",
    "open_device", "open_runtime",
]
