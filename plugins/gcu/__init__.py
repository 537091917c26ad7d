"""Enflame GCU. Binds TopsRider when present; until then, the simulator with S60 traits."""

import anychip
from anychip_plugins.cpu.host_kernels import register_host_kernels

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
    register_host_kernels(registry, "gcu", TRAITS.dtypes)
