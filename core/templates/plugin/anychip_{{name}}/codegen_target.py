"""The {{name}} CodeGen target: how anychip_codegen turns a kernel description into a {{name}}
kernel (render the source, compile it, link the library, load its kernels). __init__.py
registers it through the anychip_register_codegen_backends hook and builds rms_norm with it.

As generated it is anychip's built-in `c` target (C++ with OpenMP, one exported
``acg_<kernel>_<dtype>`` function per kernel and dtype, anychip/kernel.h's ABI) under the name
"{{name}}-c": that code computes on the CPU, which is right while the template's runtime keeps
device memory in host memory and runs streams synchronously, exactly as for kernels.c.

TODO(vendor): once device memory is on the chip, make each method produce chip code: `render`
writes the kernel in your kernel language (start from the `c` text, anychip_codegen.ir holds
the description), `compile_command` and `link_command` call your SDK's compiler, and `load`
returns the kernels that enqueue on call->stream. docs/codegen.md in anychip ("A vendor
target") is the contract; `anychip_codegen.backends.cuda` is a device-code target to copy from.
"""

from dataclasses import replace

import anychip_codegen


class Target:
    name = "{{name}}-c"  # part of the cache key: the library is rebuilt under another name
    source_suffix = ".cc"
    # The kernels are called directly with the stream (see `load`): the tuner, which times
    # host code on host memory, leaves them their default schedule.
    host_code = False

    def __init__(self):
        self._c = anychip_codegen.find_backend("c")

    def render(self, kernel) -> str:
        return self._c.render(kernel)

    def compile_command(self, source_path: str, output_path: str) -> list:
        return self._c.compile_command(source_path, output_path)

    def link_command(self, object_paths: list, output_path: str) -> list:
        return self._c.link_command(object_paths, output_path)

    def toolchain(self) -> str:
        # what else decides the binary (the compiler's version): a new compiler rebuilds
        return self._c.toolchain()

    def load(self, library_path: str, kernels) -> dict:
        # The `c` target marks its kernels host_code=True: anychip would run them through the
        # runtime's launch_host_function, which the template leaves NULL. host_code=False calls
        # them directly, as kernels.c's are.
        found = self._c.load(library_path, kernels)
        return {key: replace(kernel, host_code=False) for key, kernel in found.items()}
