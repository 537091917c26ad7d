"""The device runtime contract (core/include/anychip/device.h) on every available device, through
the checks ``anychip conformance`` runs (anychip.conformance.runtime_contract), and proof that
each check fails on a runtime that breaks the rule it checks."""

import ctypes as C
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import anychip.runtime as rt
from anychip.conformance import runtime_contract
from anychip.conformance.result import FAIL, PASS
from anychip.runtime import abi
from anychip.runtime.errors import error_for


@pytest.mark.parametrize("check", list(runtime_contract.CHECKS))
def test_contract(device, check):
    result = runtime_contract.run_check(check, device)
    assert result.status == PASS, f"{device}: {check}: {result.detail}"


@settings(max_examples=25, deadline=None)
@given(nbytes=st.integers(1, 3 * 4096 + 17), offset=st.integers(0, 300))
def test_round_trip_any_size(device, nbytes, offset):
    """Beyond the check's fixed odd sizes."""
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    buf = device.allocate(nbytes + offset)
    buf.copy_from_host(data, offset=offset)
    out = np.empty(nbytes, np.uint8)
    buf.copy_to_host(out, offset=offset)
    np.testing.assert_array_equal(out, data)
    buf.free()


def test_run_names_a_device_that_does_not_open():
    [result] = runtime_contract.run("npu:9")
    assert (result.name, result.status) == ("open_device", FAIL)
    assert "device index 9 out of range: npu has" in result.detail


# ---- each check catches the break it is about --------------------------------------------------

class FaultyRuntime:
    """The npu runtime with one function replaced by ``fault(real, *args, ok=...)``: a plugin with
    one bug. Everything else goes to the real runtime."""

    def __init__(self, real, function, fault):
        self._real, self._function, self._fault = real, function, fault
        self.name, self.device_count = real.name, real.device_count

    def __getattr__(self, attr):
        return getattr(self._real, attr)

    def call(self, function, *args, ok=(abi.OK,)):
        if function == self._function:
            return self._fault(self._real, *args, ok=ok)
        return self._real.call(function, *args, ok=ok)


def drops_last_byte(real, index, dst, src, size, ok):
    return real.call("memcpy_h2d", index, dst, src, C.c_size_t(max(size.value - 1, 0)), ok=ok)


def does_nothing(real, *args, ok):
    return abi.OK


def accepts_bad_ranges(function):
    def fault(real, *args, ok):
        try:
            return real.call(function, *args, ok=ok)
        except rt.InvalidArgumentError:
            return abi.OK
    return fault


def shared_staging_buffer():
    """Async host-to-device copies staged through one buffer for all threads, unlocked: the
    barrier makes every thread's copy meet the others' in it, as a race would sooner or later."""
    staging, barrier = np.zeros(1 << 16, np.uint8), threading.Barrier(8, timeout=30)

    def fault(real, index, stream, dst, src, size, ok):
        C.memmove(staging.ctypes.data, src, size.value)
        barrier.wait()
        return real.call("memcpy_h2d", index, dst, C.c_void_p(staging.ctypes.data), size, ok=ok)
    return fault


def never_ready(real, *args, ok):
    if abi.ERROR_NOT_READY not in ok:
        raise error_for(abi.ERROR_NOT_READY, "not ready")
    return abi.ERROR_NOT_READY


def calls_back_at_once(real, index, stream, callback, user_data, ok):
    callback(user_data, abi.OK)
    return abi.OK


def edits(function, struct_field, value):
    """Lets the real ``function`` fill its struct (the last argument), then overwrites one field."""
    def fault(real, *args, ok):
        status = real.call(function, *args, ok=ok)
        setattr(args[-1]._obj, struct_field, value)
        return status
    return fault


def internal_error_when_full(real, *args, ok):
    try:
        return real.call("device_allocate", *args, ok=ok)
    except rt.DeviceOutOfMemoryError as e:
        raise error_for(abi.ERROR_INTERNAL, f"allocator crashed: {e}") from None


def ignores_the_index(real, index, *args, ok):
    return real.call("get_properties", 0, *args, ok=ok)


# check -> (function replaced, fault, text the failure's detail must contain)
BREAKS = {
    "round_trip_odd_sizes": ("memcpy_h2d", drops_last_byte, "read back differently"),
    "device_to_device_and_memset": ("memset", does_nothing, "memset 0xA5"),
    "copy_past_allocation_is_rejected": ("memcpy_d2h", accepts_bad_ranges("memcpy_d2h"),
                                         "the plugin accepted memcpy_d2h of"),
    "stream_keeps_order_under_load": ("memcpy_h2d_async", does_nothing, "expected 199 everywhere"),
    "threads_each_keep_their_stream_order": ("memcpy_h2d_async", shared_staging_buffer(), "expected ["),
    "events_order_streams_without_blocking_the_host": ("stream_wait_event", does_nothing,
                                                       "waiting on an incomplete event ran its work"),
    "events_time_and_synchronize": ("event_query", never_ready, "never-recorded event"),
    "callbacks_run_in_order_after_work": ("stream_add_callback", calls_back_at_once, "expected (0, 'OK', 1, 1)"),
    "memory_stats_track_allocations": ("memory_stats", edits("memory_stats", "num_allocations", 0),
                                       "after 5 allocations"),
    "allocation_past_capacity_is_a_clear_error": ("device_allocate", internal_error_when_full,
                                                  "expected DeviceOutOfMemoryError, got AnychipError"),
    "bad_frees_are_invalid_arguments": ("device_free", accepts_bad_ranges("device_free"), "double free"),
    "device_index_out_of_range_is_an_invalid_argument": ("get_properties", ignores_the_index,
                                                         "get_properties(device="),
    "properties_are_consistent": ("get_properties", edits("get_properties", "simulated", 0),
                                  "simulated=False but the name 'Ascend 910B (simulated)' has"),
}


def test_every_check_has_a_break():
    assert set(BREAKS) == set(runtime_contract.CHECKS)


@pytest.mark.parametrize("check", list(BREAKS))
def test_check_catches_its_break(check):
    function, fault, message = BREAKS[check]
    real = rt.open_device("npu:0").runtime
    broken = rt.Device(FaultyRuntime(real, function, fault), 0)
    result = runtime_contract.run_check(check, broken)
    assert result.status == FAIL and message in result.detail, result
    assert runtime_contract.run_check(check, rt.open_device("npu:0")).status == PASS  # the fault was the cause


def test_a_check_that_never_returns_fails_after_the_timeout():
    def hangs(real, *args, ok):
        time.sleep(2)
        return real.call("stream_synchronize", *args, ok=ok)

    broken = rt.Device(FaultyRuntime(rt.open_device("npu:0").runtime, "stream_synchronize", hangs), 0)
    started = time.perf_counter()
    result = runtime_contract.run_check("stream_keeps_order_under_load", broken, timeout_s=0.5)
    assert result.status == FAIL and "did not finish within 0.5 s" in result.detail
    assert time.perf_counter() - started < 1.5
