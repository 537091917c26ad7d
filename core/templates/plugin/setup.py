"""Builds anychip_{{name}}/lib{{name}}_runtime.so, the device runtime anychip dlopen()s.

It is a plain shared library, not a Python extension. The build needs anychip's headers, so
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


class BuildRuntime(build_ext):
    def get_ext_filename(self, ext_name):
        # The DeviceSpec names the library exactly; the usual extension suffix
        # (.cpython-311-x86_64-linux-gnu.so) would not match it.
        return os.path.join(*ext_name.split(".")) + ".so"


setup(
    ext_modules=[Extension(
        "anychip_{{name}}.lib{{name}}_runtime",
        sources=["anychip_{{name}}/runtime.c"],
        include_dirs=[anychip.native.include_dir()],
        extra_compile_args=["-std=c99", "-O2", "-fvisibility=hidden", "-pthread"],
        extra_link_args=["-pthread"],
    )],
    cmdclass={"build_ext": BuildRuntime},
)
