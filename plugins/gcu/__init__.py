"""Enflame GCU, on anychip's simulator with S60 traits. anychip does not bind TopsRider yet:
`anychip devices` says whether it was found on this machine, and the chip runs on the simulator
either way.

Its kernels mix both ways in: the base ops are hand-written (the shared host kernels), while its
fused normalization, RMSNorm forward and backward, comes from CodeGen (built on first use,
cached; a build failure drops only the generated kernel, keeping the hand-written ones).
"""

import anychip
from anychip_plugins.host import register_base_kernels, register_host_kernels

GENERATED = ("rms_norm", "rms_norm_grad")

TRAITS = anychip.ChipTraits(
    model="Enflame S60", vendor="Enflame", memory_bytes=48 << 30, compute_capability=0,
    dtypes=("float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"))


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.vendor_device(
        "gcu", TRAITS, description="Enflame GCU", paddle_type="anychip_enflame",
        vendor_runtime="Enflame TopsRider (topsrt)", libraries=("libtopsrt.so",),
        env_dirs=("TOPS_HOME", "TOPSRIDER_HOME"))]


@anychip.hookimpl
def anychip_register_kernels(registry):
    import anychip_codegen

    register_host_kernels(registry, "gcu", TRAITS.dtypes, exclude=GENERATED)
    register_base_kernels(registry, "gcu", TRAITS.dtypes)
    kernels = [k for k in anychip_codegen.ops.library(TRAITS.dtypes) if k.name in GENERATED]
    anychip_codegen.register(registry, "gcu", anychip_codegen.generate("gcu_kernels", kernels, "c"))
