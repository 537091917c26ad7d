"""Hygon DCU, on anychip's simulator with Z100 traits. anychip does not bind DTK (HIP) yet:
`anychip devices` says whether it was found on this machine, and the chip runs on the simulator
either way.

The Z100 has no bfloat16, so bf16 work on ``dcu`` exercises the dtype fallback paths.

Its kernels mix both ways in: the elementwise, reduction and softmax base ops are generated
(built on first use, cached); matmul and the indexing ops (as a vendor would take them from its
own BLAS) and every fused op are hand-written (the shared host kernels); a build failure drops
only the generated kernels.
"""

import anychip
from anychip_plugins.host import register_base_kernels, register_host_kernels

TRAITS = anychip.ChipTraits(
    model="Hygon Z100", vendor="Hygon", memory_bytes=32 << 30, compute_capability=0,
    dtypes=("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"))


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.vendor_device(
        "dcu", TRAITS, description="Hygon DCU", paddle_type="anychip_hygon",
        vendor_runtime="Hygon DTK (HIP)", libraries=("libgalaxyhip.so", "libamdhip64.so"),
        env_dirs=("DTK_HOME", "ROCM_PATH"))]


HAND_WRITTEN = {"rms_norm", "matmul", "matmul_grad", "embedding", "embedding_grad", "index_select"}


@anychip.hookimpl
def anychip_register_kernels(registry):
    import anychip_codegen

    kernels = [k for k in anychip_codegen.ops.library(TRAITS.dtypes) if k.name not in HAND_WRITTEN]
    register_host_kernels(registry, "dcu", TRAITS.dtypes)
    register_base_kernels(registry, "dcu", TRAITS.dtypes, exclude={k.name for k in kernels})
    anychip_codegen.register(registry, "dcu", anychip_codegen.generate("dcu_kernels", kernels, "c"))
