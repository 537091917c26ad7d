"""Hygon DCU. Binds DTK (HIP) when present; until then, the simulator with Z100 traits.

The Z100 has no bfloat16, so bf16 work on ``dcu`` exercises the dtype fallback paths.
"""

import anychip
from anychip_plugins.cpu.host_kernels import register_host_kernels

TRAITS = anychip.ChipTraits(
    model="Hygon Z100", vendor="Hygon", memory_bytes=32 << 30, compute_capability=0,
    dtypes=("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"))


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.vendor_device(
        "dcu", TRAITS, description="Hygon DCU", paddle_type="anychip_hygon",
        vendor_runtime="Hygon DTK (HIP)", libraries=("libgalaxyhip.so", "libamdhip64.so"),
        env_dirs=("DTK_HOME", "ROCM_PATH"))]


@anychip.hookimpl
def anychip_register_kernels(registry):
    register_host_kernels(registry, "dcu", TRAITS.dtypes)
