"""Huawei Ascend NPU. Binds Ascend ACL when present; until then, the simulator with 910B traits."""

import anychip


@anychip.hookimpl
def anychip_register_devices():
    traits = anychip.ChipTraits(
        model="Ascend 910B", vendor="Huawei", memory_bytes=64 << 30, compute_capability=0,
        dtypes=("float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"))
    return [anychip.vendor_device(
        "npu", traits, description="Huawei Ascend NPU", paddle_type="anychip_ascend",
        vendor_runtime="Ascend ACL (CANN)", libraries=("libascendcl.so",),
        env_dirs=("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"))]
