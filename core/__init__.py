"""anychip: one device layer for LLM work on PaddlePaddle, with a plugin per chip.

    import anychip
    anychip.set_device("npu:0")   # before `import paddle`; or --device / ANYCHIP_DEVICE
    ...                           # any paddle code now runs on npu:0
    print(anychip.fallback_report())

``anychip.runtime`` drives devices without Paddle. Plugin authors: see ``anychip.hookspecs``.
"""

from .host_threads import share_cores_between_openmp_runtimes

share_cores_between_openmp_runtimes()  # before any OpenMP runtime loads (see host_threads)

from . import native  # noqa: E402
from .errors import HardwareRequiredError, PaddleImportOrderError, UnknownDeviceError
from .fallback import fallback_counts, fallback_report, reset_fallbacks
from .hookspecs import hookimpl
from .kernels import KernelRegistry
from .selection import get_device, set_device
from .simulator import ChipTraits, simulated_device, simulator_options, vendor_device
from .dtypes import DTYPE_BITS
from .spec import DeviceSpec

__version__ = "0.1.0"

__all__ = [
    "ChipTraits", "DTYPE_BITS", "DeviceSpec", "HardwareRequiredError", "KernelRegistry",
    "PaddleImportOrderError", "UnknownDeviceError", "fallback_counts", "fallback_report",
    "get_device", "hookimpl", "native", "reset_fallbacks", "set_device", "simulated_device",
    "simulator_options", "vendor_device",
]
