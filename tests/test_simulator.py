"""Simulator specifics: capacity, fragmentation, checking mode, options validation."""

import ctypes
import textwrap

import numpy as np
import pytest

from anychip.native import library_path
from anychip.runtime import Device, DeviceOutOfMemoryError, InvalidArgumentError, Runtime

from conftest import run_python

SIM = str(library_path("anychip_sim"))


def small_device(capacity=1 << 20, checking=1) -> Device:
    return Device(Runtime("tiny", SIM, options=f"name=tiny;capacity={capacity};checking={checking}"), 0)


def test_capacity_is_enforced_and_reported():
    dev = small_device(1 << 20)
    a = dev.allocate(600 << 10)
    with pytest.raises(DeviceOutOfMemoryError, match=r"tiny:0 out of memory: requested 614400 bytes, \d+ of 1048576 free"):
        dev.allocate(600 << 10)
    a.free()
    dev.allocate(600 << 10)  # freed memory is reusable


def test_free_neighbours_coalesce():
    dev = small_device(1 << 20, checking=0)
    parts = [dev.allocate(256 << 10) for _ in range(4)]
    for p in (parts[1], parts[3], parts[2], parts[0]):
        p.free()
    dev.allocate(1 << 20).free()  # needs all four pieces merged back


def test_interior_pointer_free_is_rejected():
    dev = small_device()
    buf = dev.allocate(8192)
    with pytest.raises(InvalidArgumentError, match="points inside an allocation"):
        dev.call("device_free", ctypes.c_void_p(buf.ptr + 256))


def test_swapped_copy_direction_is_caught():
    dev = small_device()
    a, b = dev.allocate(64), dev.allocate(64)
    with pytest.raises(InvalidArgumentError, match="is device memory, but this copy expects a host pointer"):
        dev.call("memcpy_h2d", ctypes.c_void_p(a.ptr), ctypes.c_void_p(b.ptr), ctypes.c_size_t(64))


@pytest.mark.parametrize("options, message", [
    ("capacity=abc", "capacity must be an unsigned integer"),
    ("alignment=100", "alignment must be a power of two"),
    ("justakey", "expected key=value"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        Runtime("bad", SIM, options=options)


READ_BEHIND_THE_RUNTIMES_BACK = textwrap.dedent("""
    import ctypes, numpy as np
    from anychip.native import library_path
    from anychip.runtime import Device, Runtime
    dev = Device(Runtime("npu", str(library_path("anychip_sim")), options="name=npu;checking={checking}"), 0)
    buf = dev.upload(np.arange(4, dtype=np.int32))
    print("through the runtime:", buf.to_numpy(np.int32).tolist(), flush=True)
    print("direct read:", ctypes.c_int32.from_address(buf.ptr).value, flush=True)
""")


def test_checking_mode_kills_direct_host_access():
    result = run_python(READ_BEHIND_THE_RUNTIMES_BACK.format(checking=1))
    assert "through the runtime: [0, 1, 2, 3]" in result.stdout
    assert "direct read" not in result.stdout
    assert result.returncode == -11, result.stderr  # SIGSEGV, loudly


def test_without_checking_direct_access_goes_unnoticed():
    result = run_python(READ_BEHIND_THE_RUNTIMES_BACK.format(checking=0))
    assert result.returncode == 0, result.stderr
    assert "direct read: 0" in result.stdout
