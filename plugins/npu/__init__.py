"""Huawei Ascend NPU, on anychip's simulator with 910B traits. anychip does not bind Ascend ACL
(CANN) yet: `anychip devices` says whether it was found on this machine, and the chip runs on the
simulator either way.

Every base op (matmul, embedding and index_select included) and its RMSNorm come from CodeGen
(``anychip_codegen``, the ``c`` backend: the simulator's memory is host memory): no hand-written
kernel for those. The library is built the first time the plugin registers its kernels and
cached; a build failure disables only the generated kernels, with the reason listed by
``anychip devices``.
"""

import anychip
from anychip_plugins.host import register_host_kernels

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
    import anychip_codegen

    generated = {k.name for k in anychip_codegen.ops.all_kernels()}
    # The fused ops CodeGen does not describe (attention, linear, ...) stay the shared host kernels.
    register_host_kernels(registry, "npu", TRAITS.dtypes, exclude=generated)
    # Last: a build failure raised here leaves the registrations above in place.
    library = anychip_codegen.generate("npu_kernels", anychip_codegen.ops.library(TRAITS.dtypes), "c")
    anychip_codegen.register(registry, "npu", library)
