"""Builds the two shared libraries anychip loads from anychip_{{name}}/: lib{{name}}_runtime.so
(the device runtime, from runtime.c and anychip's runtime book) and lib{{name}}_kernels.so (the
kernels, from kernels.c).

They are plain shared libraries, not Python extensions. The build needs anychip's headers, so
install with the installed anychip visible: ``pip install --no-build-isolation .``
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    import anychip.native
except ImportError:
    raise SystemExit("anychip-{{name}}: building needs anychip installed in this environment; "
                     "use `pip install --no-build-isolation`") from None


class BuildLibraries(build_ext):
    def finalize_options(self):
        super().finalize_options()
        # Always recompile (it takes a second): setuptools compares mtimes in whole seconds, so
        # an edit right after a build could otherwise install the stale library from build/.
        self.force = True

    def get_ext_filename(self, ext_name):
        # The plugin names each library exactly; the usual extension suffix
        # (.cpython-311-x86_64-linux-gnu.so) would not match it.
        return os.path.join(*ext_name.split(".")) + ".so"


def library(name, sources, **kwargs):
    return Extension(
        f"anychip_{{name}}.{name}",
        sources=sources,
        include_dirs=[anychip.native.include_dir()],
        # hidden: each library exports only what anychip looks up (marked in the source)
        extra_compile_args=["-std=c99", "-O2", "-fvisibility=hidden", "-pthread"],
        extra_link_args=["-pthread"],
        **kwargs,
    )


setup(
    # runtime_book.c compiles in anychip's runtime book (anychip/runtime_book.h): the contract's bookkeeping
    ext_modules=[library("lib{{name}}_runtime", ["anychip_{{name}}/runtime.c", "anychip_{{name}}/runtime_book.c"]),
                 library("lib{{name}}_kernels", ["anychip_{{name}}/kernels.c"], libraries=["m"])],
    cmdclass={"build_ext": BuildLibraries},
)
