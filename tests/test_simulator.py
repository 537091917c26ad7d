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


def test_host_functions_run_in_stream_order_with_only_their_buffers_open():
    dev = small_device(checking=1)
    data = dev.upload(np.arange(1024, dtype=np.float32))
    out = dev.allocate(4096)
    other = dev.upload(np.ones(1024, dtype=np.float32))
    seen = []
    with dev.stream() as s:
        out.copy_from(data, stream=s)

        def kernel():  # reads `out` directly: legal only inside the launch, on its open range
            seen.append(np.ctypeslib.as_array((ctypes.c_float * 1024).from_address(out.ptr)).sum())

        s.launch_host(kernel, [out])
        s.synchronize()
    assert seen == [float(np.arange(1024).sum())]
    assert other.to_numpy(np.float32)[0] == 1.0


def test_host_function_ranges_are_checked_at_the_call_and_errors_reach_synchronize():
    dev = small_device(checking=1)
    buf = dev.allocate(4096)
    with dev.stream() as s:
        with pytest.raises(InvalidArgumentError, match=r"ranges\[0\]"):
            s.launch_host(lambda: None, [(_Unallocated(buf.ptr + (1 << 19)), 0, 16)])

        def failing():
            raise RuntimeError("kernel failed")

        s.launch_host(failing, [buf])
        with pytest.raises(Exception, match="host function"):
            s.synchronize()


def test_a_buffer_collected_inside_host_work_is_freed_later_not_waited_for():
    """The garbage collector may run inside a host function, on the stream's own thread, where
    device_free would wait for that stream: it hung CI once. The free is deferred instead."""
    code = textwrap.dedent(f"""
        from anychip.runtime import Device, Runtime
        dev = Device(Runtime("tiny", {SIM!r}, options="name=tiny;capacity=1048576"), 0)
        held = [dev.allocate(4096)]
        with dev.stream() as s:
            s.launch_host(held.clear)  # drops the last reference on the stream's thread
            s.synchronize()
        assert dev.memory_stats().allocated_bytes >= 4096  # not freed there ...
        dev.allocate(256).free()
        assert dev.memory_stats().allocated_bytes == 0, dev.memory_stats()  # ... but next time
        print("ok")
    """)
    r = run_python(code, timeout=60)
    assert r.stdout.strip() == "ok", r.stderr


def test_waiting_for_a_stream_from_its_own_work_is_an_error_not_a_hang():
    """Inside a host function, synchronous calls skip the stream that runs it (its earlier work
    is done), and synchronizing or destroying that stream is refused with the reason."""
    code = textwrap.dedent(f"""
        import ctypes
        from anychip.runtime import Device, Runtime
        dev = Device(Runtime("tiny", {SIM!r}, options="name=tiny;capacity=1048576"), 0)
        buf, other = dev.allocate(4096), dev.allocate(4096)
        seen = []
        with dev.stream() as s:
            def work():
                dev.call("device_free", ctypes.c_void_p(other.ptr))  # raw: no deferral
                other.ptr = None
                dev.synchronize()
                for fn in ("stream_synchronize", "stream_destroy"):
                    try:
                        dev.call(fn, s.handle)
                    except Exception as e:
                        seen.append(str(e))
            s.launch_host(work, [buf])
            s.synchronize()
        print(seen)
    """)
    r = run_python(code, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "stream_synchronize called from a host function running on that stream" in r.stdout, r.stdout
    assert "stream_destroy called from a host function running on that stream" in r.stdout, r.stdout


class _Unallocated:
    """A 'buffer' at an address the device never allocated."""

    def __init__(self, ptr):
        self.ptr, self.nbytes = ptr, 1 << 20

    def _range(self, offset, nbytes, what):
        return self.ptr + offset
