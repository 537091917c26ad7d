"""The device runtime contract (core/include/anychip/device.h), on every available device."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import anychip.runtime as rt
from anychip.runtime import DeviceOutOfMemoryError, InvalidArgumentError


@settings(max_examples=25, deadline=None)
@given(nbytes=st.integers(1, 3 * 4096 + 17), offset=st.integers(0, 300))
def test_round_trip_odd_sizes(device, nbytes, offset):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    buf = device.allocate(nbytes + offset)
    buf.copy_from_host(data, offset=offset)
    out = np.empty(nbytes, np.uint8)
    buf.copy_to_host(out, offset=offset)
    np.testing.assert_array_equal(out, data)
    buf.free()


def test_device_to_device_and_memset(device):
    src = device.upload(np.arange(1001, dtype=np.float32))
    dst = device.allocate(src.nbytes)
    dst.fill(0)
    assert not dst.to_numpy(np.float32).any()
    dst.copy_from(src)
    np.testing.assert_array_equal(dst.to_numpy(np.float32), np.arange(1001, dtype=np.float32))
    dst.copy_from(src, nbytes=8, dst_offset=4, src_offset=400)  # views inside allocations
    assert dst.to_numpy(np.float32)[1:3].tolist() == [100.0, 101.0]


def test_copy_past_allocation_is_rejected(device):
    buf = device.allocate(64)
    with pytest.raises(InvalidArgumentError, match="outside this 64-byte buffer"):
        buf.copy_from_host(np.zeros(65, np.uint8))


def test_stream_keeps_order_under_load(device):
    """Many async copies on one stream land in enqueue order; the last write wins."""
    n = 1 << 16
    buf = device.allocate(n * 4)
    with device.stream() as s:
        for i in range(200):
            buf.copy_from_host(np.full(n, i, np.int32), stream=s)
        out = np.empty(n, np.int32)
        buf.copy_to_host(out, stream=s)
        s.synchronize()
    assert (out == 199).all()


def test_threads_sharing_a_device_each_keep_their_stream_order(device):
    """The runtime is thread-safe: eight threads, each with its own stream and buffer."""
    from concurrent.futures import ThreadPoolExecutor

    def worker(k):
        buf = device.allocate(4096 * 4)
        with device.stream() as s:
            for i in range(50):
                buf.copy_from_host(np.full(4096, k * 1000 + i, np.int32), stream=s)
            out = np.empty(4096, np.int32)
            buf.copy_to_host(out, stream=s)
            s.synchronize()
        buf.free()
        return bool((out == k * 1000 + 49).all())

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(worker, range(8)))


def test_events_order_streams_without_blocking_the_host(device):
    """stream_wait_event makes one stream wait for another's work. A plugin may run stream work
    synchronously (the template does); where streams are asynchronous, the host must not block."""
    n = 1 << 20
    a, b = device.allocate(n * 4), device.allocate(n * 4)
    src = device.allocate_host(n * 4)
    src.numpy(np.int32)[:] = 7
    s1, s2 = device.stream(), device.stream()
    caller, gate = threading.get_ident(), threading.Event()
    # Holds s1 until the host lets it go -- unless the callback runs inline on this thread.
    s1.add_callback(lambda status: threading.get_ident() == caller or gate.wait(10))
    asynchronous = not s1.query()
    a.copy_from_host(src, stream=s1)
    done = device.event().record(s1)
    s2.wait_event(done)
    b.copy_from(a, stream=s2)  # must see s1's copy
    if asynchronous:
        assert not done.query() and not s2.query()
    gate.set()
    s2.synchronize()
    assert done.query()
    assert (b.to_numpy(np.int32) == 7).all()
    s1.destroy()
    s2.destroy()


def test_events_time_and_synchronize(device):
    s = device.stream()
    start, end = device.event(), device.event()
    assert start.query()  # never recorded: complete
    start.record(s)
    big = device.allocate(8 << 20)
    big.copy_from_host(np.ones(8 << 20, np.uint8), stream=s)
    end.record(s)
    end.synchronize()
    assert end.query()
    assert end.elapsed_ms(start) <= 0 <= start.elapsed_ms(end)
    s.synchronize()


def test_callbacks_run_in_order_after_work(device):
    seen = []
    s = device.stream()
    for i in range(20):
        s.add_callback(lambda status, i=i: seen.append((i, status)))
    s.synchronize()
    assert seen == [(i, "OK") for i in range(20)]


def test_memory_stats_track_allocations(device):
    before = device.memory_stats()
    bufs = [device.allocate(1000 + i) for i in range(5)]
    during = device.memory_stats()
    assert during.num_allocations == before.num_allocations + 5
    assert during.allocated_bytes >= before.allocated_bytes + sum(b.nbytes for b in bufs)
    assert during.peak_allocated_bytes >= during.allocated_bytes
    assert during.free_bytes == during.total_bytes - during.allocated_bytes
    for b in bufs:
        b.free()
    after = device.memory_stats()
    assert after.num_allocations == before.num_allocations
    assert after.total_allocations == before.total_allocations + 5


def test_allocation_past_capacity_is_a_clear_error(device):
    total = device.properties.total_memory
    with pytest.raises(DeviceOutOfMemoryError, match="out of memory"):
        device.allocate(total + (1 << 20))
    device.allocate(1024).free()  # and the device still works


def test_double_free_and_foreign_pointer(device):
    buf = device.allocate(256)
    ptr = buf.ptr
    buf.free()
    with pytest.raises(InvalidArgumentError, match="double free|not a live allocation"):
        device.call("device_free", __import__("ctypes").c_void_p(ptr))
    foreign = np.zeros(16, np.uint8)
    with pytest.raises(InvalidArgumentError):
        device.call("device_free", __import__("ctypes").c_void_p(foreign.ctypes.data))


def test_index_out_of_range_names_the_range(device):
    name = device.runtime.name
    with pytest.raises(InvalidArgumentError, match=f"device index 99 out of range: {name} has"):
        rt.open_device(f"{name}:99")


def test_properties_are_consistent(device):
    p = device.properties
    assert p.total_memory > 0 and p.max_alloc_size <= p.total_memory
    assert p.min_chunk_size >= 256 and p.min_chunk_size & (p.min_chunk_size - 1) == 0
    assert "float32" in p.dtypes
    assert p.simulated == ("(simulated)" in p.name)
