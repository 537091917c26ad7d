"""The ctypes mirror in anychip.runtime.abi must match device.h as a C compiler lays it out."""

import ctypes
import shutil
import subprocess

import pytest

from anychip.native import include_dir
from anychip.runtime import abi

PROGRAM = r"""
#include <stdio.h>
#include <stddef.h>
#include "anychip/device.h"
int main(void) {
  printf("%zu %zu %zu %zu %zu %d\n", sizeof(AnychipDeviceInterface), sizeof(AnychipDeviceProperties),
         sizeof(AnychipMemoryStats), offsetof(AnychipDeviceInterface, get_properties),
         offsetof(AnychipDeviceInterface, reserved), ANYCHIP_DEVICE_ABI_VERSION);
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_layout_matches_the_header(tmp_path):
    src = tmp_path / "layout.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c99", f"-I{include_dir()}", str(src), "-o", str(exe)], check=True)
    sizes = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert sizes == [
        ctypes.sizeof(abi.DeviceInterface), ctypes.sizeof(abi.DeviceProperties), ctypes.sizeof(abi.MemoryStats),
        abi.DeviceInterface.get_properties.offset, abi.DeviceInterface.reserved.offset,
        (abi.ABI_MAJOR << 16) | abi.ABI_MINOR,
    ]


def test_the_contract_has_about_thirty_functions():
    assert 30 <= len(abi.FUNCTIONS) <= 40
