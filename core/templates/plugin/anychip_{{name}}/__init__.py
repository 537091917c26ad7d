"""anychip plugin for the {{name}} device: the device runtime lib{{name}}_runtime.so (built from
runtime.c) and the kernels of lib{{name}}_kernels.so (built from kernels.c)."""

from pathlib import Path

import anychip
from anychip.kernels import NativeKernel

KERNEL_LIBRARY = Path(__file__).with_name("lib{{name}}_kernels.so")


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.DeviceSpec(
        name="{{name}}",
        description="{{name}} accelerator",
        library=str(Path(__file__).with_name("lib{{name}}_runtime.so")),
        paddle_type="anychip_{{name}}",
        # Passed to anychip_device_init as "devices=1;capacity=1073741824" (see runtime.c).
        options={"devices": 1, "capacity": 1 << 30},
        # Shown by `anychip devices` next to the "simulated" status; say what really runs.
        note="template runtime: host memory, synchronous",
    )]


def _kernel(symbol: str) -> NativeKernel:
    # host_code=False: anychip calls the kernel directly with the stream to enqueue on, as
    # for kernels that run on the chip itself (see kernels.c for why that works as generated).
    kernel = NativeKernel(str(KERNEL_LIBRARY), symbol, host_code=False)
    kernel.address  # resolve now: a missing symbol disables the kernels with its reason, not a later call
    return kernel


@anychip.hookimpl
def anychip_register_kernels(registry):
    # One registration per op and device; the ops and their kernel contracts are kernel.h's op table.
    registry.register("swiglu", "{{name}}", ("float32",),
                      forward=_kernel("anychip_{{name}}_swiglu"),
                      backward=_kernel("anychip_{{name}}_swiglu_grad"))
