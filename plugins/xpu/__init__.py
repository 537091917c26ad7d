"""Kunlunxin XPU, on anychip's simulator with P800 traits. anychip does not bind the Kunlun XPU
runtime yet: `anychip devices` says whether it was found on this machine, and the chip runs on the
simulator either way. Its kernels are the shared host kernels, base ops included, by hand."""

import anychip
from anychip_plugins.host import register_base_kernels, register_host_kernels

TRAITS = anychip.ChipTraits(
    model="Kunlunxin P800", vendor="Kunlunxin", memory_bytes=96 << 30, compute_capability=30,
    dtypes=("float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"))


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.vendor_device(
        "xpu", TRAITS, description="Kunlunxin XPU", paddle_type="anychip_kunlun",
        vendor_runtime="Kunlun XPU runtime (XRE)", libraries=("libxpurt.so",),
        env_dirs=("XPU_HOME", "XRE_HOME"))]


@anychip.hookimpl
def anychip_register_kernels(registry):
    register_host_kernels(registry, "xpu", TRAITS.dtypes)
    register_base_kernels(registry, "xpu", TRAITS.dtypes)  # hand-written (npu's come from codegen)
