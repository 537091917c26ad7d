"""Kunlunxin XPU. Binds the Kunlun XPU runtime when present; until then, the simulator with P800 traits."""

import anychip


@anychip.hookimpl
def anychip_register_devices():
    traits = anychip.ChipTraits(
        model="Kunlunxin P800", vendor="Kunlunxin", memory_bytes=96 << 30, compute_capability=30,
        dtypes=("float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"))
    return [anychip.vendor_device(
        "xpu", traits, description="Kunlunxin XPU", paddle_type="anychip_kunlun",
        vendor_runtime="Kunlun XPU runtime (XRE)", libraries=("libxpurt.so",),
        env_dirs=("XPU_HOME", "XRE_HOME"))]
