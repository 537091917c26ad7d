"""Huawei Ascend NPU. Binds Ascend ACL when present; until then, the simulator with 910B traits."""

import anychip
from anychip_plugins.cpu.host_kernels import register_host_kernels

TRAITS = anychip.ChipTraits(
    model="Ascend 910B", vendor="Huawei", memory_bytes=64 << 30, compute_capability=0,
    dtypes=("float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"))


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.vendor_device(
        "npu", TRAITS, description="Huawei Ascend NPU", paddle_type="anychip_ascend",
        vendor_runtime="Ascend ACL (CANN)", libraries=("libascendcl.so",),
        env_dirs=("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"))]


@anychip.hookimpl
def anychip_register_kernels(registry):
    register_host_kernels(registry, "npu", TRAITS.dtypes)
