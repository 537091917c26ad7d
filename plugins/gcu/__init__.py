"""Enflame GCU. Binds TopsRider when present; until then, the simulator with S60 traits."""

import anychip


@anychip.hookimpl
def anychip_register_devices():
    traits = anychip.ChipTraits(
        model="Enflame S60", vendor="Enflame", memory_bytes=48 << 30, compute_capability=0,
        dtypes=("float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"))
    return [anychip.vendor_device(
        "gcu", traits, description="Enflame GCU", paddle_type="anychip_enflame",
        vendor_runtime="Enflame TopsRider (topsrt)", libraries=("libtopsrt.so",),
        env_dirs=("TOPS_HOME", "TOPSRIDER_HOME"))]
