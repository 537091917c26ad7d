"""anychip plugin for the {{name}} device: the device runtime lib{{name}}_runtime.so (built from
runtime.c), the hand-written kernels of lib{{name}}_kernels.so (built from kernels.c) and the
kernels anychip_codegen generates for {{name}} with the target in codegen_target.py."""

from pathlib import Path

import anychip
import anychip_codegen
from anychip.kernels import NativeKernel

from .codegen_target import Target

KERNEL_LIBRARY = Path(__file__).with_name("lib{{name}}_kernels.so")
# The element types {{name}}'s kernels handle: rt_get_properties (runtime.c) reports the same.
DTYPES = ("float32", "float16", "bfloat16")
# The kernels CodeGen builds for {{name}}, by their names in anychip_codegen.ops (rms_norm_grad is
# registered as rms_norm's backward).
GENERATED = ("rms_norm", "rms_norm_grad")
TARGET = Target()


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


@anychip.hookimpl
def anychip_register_codegen_backends():
    return [TARGET]  # others can then build for {{name}}: anychip_codegen.find_backend("{{name}}-c")


def _kernel(symbol: str) -> NativeKernel:
    # host_code=False: anychip calls the kernel directly with the stream to enqueue on, as
    # for kernels that run on the chip itself (see kernels.c for why that works as generated).
    kernel = NativeKernel(str(KERNEL_LIBRARY), symbol, host_code=False)
    kernel.address  # resolve now: a missing symbol disables the kernels with its reason, not a later call
    return kernel


def generated_library() -> anychip_codegen.Library:
    """The GENERATED kernels for DTYPES, built with TARGET: compiled the first time, then found
    in anychip's CodeGen cache (keyed by the sources, the commands and the compiler)."""
    kernels = [k for k in anychip_codegen.ops.library(DTYPES) if k.name in GENERATED]
    return anychip_codegen.generate("{{name}}_generated", kernels, TARGET)


@anychip.hookimpl
def anychip_register_kernels(registry):
    # One registration per op and device; the ops and their kernel contracts are anychip/ops.h's op table.
    registry.register("swiglu", "{{name}}", ("float32",),
                      forward=_kernel("anychip_{{name}}_swiglu"),
                      backward=_kernel("anychip_{{name}}_swiglu_grad"))
    # Last: a failed build raised here disables only the generated kernels; `anychip devices`
    # shows why, and swiglu above stays registered.
    anychip_codegen.register(registry, "{{name}}", generated_library())
