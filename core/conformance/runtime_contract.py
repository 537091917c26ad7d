"""The device runtime contract (``anychip/device.h``) as named checks that run on any device,
with no test framework: ``run("mychip:0")`` gives one Result per check (section "runtime").

Each check drives the plugin through ``anychip.runtime``, and where that layer would catch a
mistake before the plugin sees it (a copy outside a Buffer, a device index out of range), it
also calls the plugin's function directly, so the check measures the plugin and not anychip's
wrapper. Checks use fixed sizes and seeds: a failure repeats exactly.
"""

from __future__ import annotations

import ctypes as C
import re
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from ..runtime import Device, DeviceOutOfMemoryError, InvalidArgumentError, abi, open_device
from .result import FAIL, PASS, Result

SECTION = "runtime"
# Long enough for the checks' few hundred megabytes of copies on a loaded machine; a check that
# takes longer is a stream or event wait that never returns.
TIMEOUT_S = 120.0

CHECKS: dict[str, Callable[[Device], str | None]] = {}


class ContractViolation(AssertionError):
    """The device broke a rule of anychip/device.h; the message says which, and what it did."""


def _check(fn: Callable[[Device], str | None]) -> Callable[[Device], str | None]:
    """Registers ``fn`` under its name. A check raises on a violation, and may return a note for
    the report (what it could not check on this device, say)."""
    CHECKS[fn.__name__] = fn
    return fn


def _expect(condition, message: str) -> None:
    if not condition:
        raise ContractViolation(message)


def _expect_error(error_type: type, pattern: str | None, action: Callable[[], object], what: str) -> Exception:
    """Runs ``action``, which must raise ``error_type`` with a message matching ``pattern``."""
    try:
        action()
    except error_type as e:
        if pattern is not None and not re.search(pattern, str(e)):
            raise ContractViolation(f"{what}: raised {type(e).__name__} as it should, but its message "
                                    f"{str(e)!r} does not match {pattern!r}") from None
        return e
    except Exception as e:  # noqa: BLE001 - the wrong error is the finding
        raise ContractViolation(f"{what}: expected {error_type.__name__}, got {type(e).__name__}: {e}") from None
    raise ContractViolation(f"{what}: expected {error_type.__name__}, but the call succeeded")


def _first_difference(got: np.ndarray, want: np.ndarray) -> str:
    i = int(np.flatnonzero(got != want)[0])
    return f"{i} is {got[i].item()!r}, expected {want[i].item()!r} ({int((got != want).sum())} differ)"


# ---- memory ------------------------------------------------------------------------------------

# Sizes around the allocation granularity and a page, with offsets that misalign the copies.
ODD_SIZES = ((1, 0), (3, 1), (255, 7), (256, 0), (257, 255), (4095, 1), (4097, 300), (3 * 4096 + 17, 13))


@_check
def round_trip_odd_sizes(device: Device) -> None:
    rng = np.random.default_rng(0)
    for nbytes, offset in ODD_SIZES:
        data = rng.integers(0, 256, nbytes, dtype=np.uint8)
        buf = device.allocate(nbytes + offset)
        buf.copy_from_host(data, offset=offset)
        out = np.empty(nbytes, np.uint8)
        buf.copy_to_host(out, offset=offset)
        buf.free()
        if not np.array_equal(out, data):
            raise ContractViolation(f"{nbytes} bytes written at offset {offset} read back differently: "
                                    f"byte {_first_difference(out, data)}")


@_check
def device_to_device_and_memset(device: Device) -> None:
    values = np.arange(1001, dtype=np.float32)
    src = device.upload(values)
    dst = device.upload(np.full(1001, -1, np.float32))
    dst.fill(0xA5)
    got = dst.to_numpy(np.uint8)
    if not (got == 0xA5).all():
        raise ContractViolation(f"memset 0xA5 over {dst.nbytes} bytes: byte "
                                f"{_first_difference(got, np.full_like(got, 0xA5))}")
    dst.copy_from(src)
    got = dst.to_numpy(np.float32)
    if not np.array_equal(got, values):
        raise ContractViolation(f"memcpy_d2d of {src.nbytes} bytes: element {_first_difference(got, values)}")
    dst.copy_from(src, nbytes=8, dst_offset=4, src_offset=400)  # views inside allocations
    got = dst.to_numpy(np.float32)[:4]
    _expect(got.tolist() == [0.0, 100.0, 101.0, 3.0],
            f"memcpy_d2d of 8 bytes from offset 400 to offset 4 left {got.tolist()}, expected [0, 100, 101, 3]")


@_check
def copy_past_allocation_is_rejected(device: Device) -> str | None:
    """anychip's Buffer refuses such a copy itself; a simulated device's plugin must refuse it too
    (device.h: a copy range lies within one live allocation, and the simulator always can tell).
    Only reads go past the end, so a plugin that does not check corrupts nothing. Hardware is
    not probed: reading past an allocation there may fault the device for the rest of the run."""
    chunk = device.properties.min_chunk_size
    buf = device.allocate(chunk)
    _expect_error(InvalidArgumentError, f"outside this {chunk}-byte buffer",
                  lambda: buf.copy_from_host(np.zeros(chunk + 1, np.uint8)), "Buffer.copy_from_host past the end")
    if not device.properties.simulated:
        return "hardware: the plugin was not probed with copies past an allocation"
    host = np.zeros(2 * chunk, np.uint8)
    other = device.allocate(2 * chunk)
    overruns = {
        f"memcpy_d2h of {chunk + 1} bytes from a {chunk}-byte allocation":
            lambda: device.call("memcpy_d2h", C.c_void_p(host.ctypes.data), C.c_void_p(buf.ptr), C.c_size_t(chunk + 1)),
        f"memcpy_d2h of {chunk // 2 + 1} bytes from the middle of a {chunk}-byte allocation":
            lambda: device.call("memcpy_d2h", C.c_void_p(host.ctypes.data), C.c_void_p(buf.ptr + chunk // 2),
                                C.c_size_t(chunk // 2 + 1)),
        f"memcpy_d2d of {chunk} bytes from 1 byte into a {chunk}-byte allocation":
            lambda: device.call("memcpy_d2d", C.c_void_p(other.ptr), C.c_void_p(buf.ptr + 1), C.c_size_t(chunk)),
    }
    accepted = []
    for what, action in overruns.items():
        try:
            action()
            accepted.append(what)
        except InvalidArgumentError:
            pass
        except Exception as e:  # noqa: BLE001 - the wrong error is the finding
            raise ContractViolation(f"{what}: expected INVALID_ARGUMENT, got {type(e).__name__}: {e}") from None
    with device.stream() as s:  # an asynchronous copy may report it when enqueued or at the next sync
        try:
            device.call("memcpy_d2h_async", s.handle, C.c_void_p(host.ctypes.data), C.c_void_p(buf.ptr),
                        C.c_size_t(chunk + 1))
            s.synchronize()
            accepted.append(f"memcpy_d2h_async of {chunk + 1} bytes from a {chunk}-byte allocation")
        except InvalidArgumentError:
            pass
    _expect(not accepted, f"the plugin accepted {'; '.join(accepted)} (a simulated device knows its allocations "
                          "and must return INVALID_ARGUMENT)")


# ---- streams, events, callbacks ----------------------------------------------------------------

@_check
def stream_keeps_order_under_load(device: Device) -> None:
    """Many async copies on one stream land in enqueue order: the last write wins."""
    n = 1 << 16
    buf = device.allocate(n * 4)
    with device.stream() as s:
        for i in range(200):
            buf.copy_from_host(np.full(n, i, np.int32), stream=s)
        out = np.empty(n, np.int32)
        buf.copy_to_host(out, stream=s)
        s.synchronize()
    _expect((out == 199).all(), f"after 200 ordered writes of 0..199 on one stream, the buffer holds "
                                f"{np.unique(out)[:5].tolist()}, expected 199 everywhere")


@_check
def threads_each_keep_their_stream_order(device: Device) -> None:
    """The runtime is thread-safe: eight threads, each with its own stream and buffer."""

    def worker(k):
        buf = device.allocate(4096 * 4)
        with device.stream() as s:
            for i in range(50):
                buf.copy_from_host(np.full(4096, k * 1000 + i, np.int32), stream=s)
            out = np.empty(4096, np.int32)
            buf.copy_to_host(out, stream=s)
            s.synchronize()
        buf.free()
        return np.unique(out).tolist()

    with ThreadPoolExecutor(8) as pool:
        finals = list(pool.map(worker, range(8)))
    wrong = [(k, got[:3]) for k, got in enumerate(finals) if got != [k * 1000 + 49]]
    _expect(not wrong, f"{len(wrong)} of 8 threads' buffers are wrong after 50 writes on their own streams "
            "(thread k writes k*1000+i): "
            + ", ".join(f"thread {k} holds {got}, expected [{k * 1000 + 49}]" for k, got in wrong[:3]))


@_check
def events_order_streams_without_blocking_the_host(device: Device) -> None:
    """stream_wait_event makes one stream wait for another's work. A plugin may run stream work
    synchronously (the template does); where streams are asynchronous, the host must not block."""
    n = 1 << 20
    a, b = device.allocate(n * 4), device.allocate(n * 4)
    b.fill(0)
    src = device.allocate_host(n * 4)
    src.numpy(np.int32)[:] = 7
    s1, s2 = device.stream(), device.stream()
    caller, gate = threading.get_ident(), threading.Event()
    try:
        # Holds s1 until the host lets it go -- unless the callback runs inline on this thread.
        s1.add_callback(lambda status: threading.get_ident() == caller or gate.wait(TIMEOUT_S))
        asynchronous = not s1.query()
        a.copy_from_host(src, stream=s1)
        done = device.event().record(s1)
        s2.wait_event(done)
        b.copy_from(a, stream=s2)  # must see s1's copy
        if asynchronous:
            _expect(not done.query(), "an event recorded behind a held stream reports complete")
            # a while, not one look: a stream that ignores the wait may take a moment to run
            held_until = time.monotonic() + 0.2
            while time.monotonic() < held_until:
                _expect(not s2.query(), "a stream waiting on an incomplete event ran its work")
                time.sleep(0.01)
        gate.set()
        s2.synchronize()
        _expect(done.query(), "event not complete after the stream waiting on it synchronized")
        got = b.to_numpy(np.int32)
        if not (got == 7).all():
            raise ContractViolation(f"the copy on the waiting stream ran before the event's work: "
                                    f"element {_first_difference(got, np.full_like(got, 7))}")
    finally:
        gate.set()
        s1.destroy()
        s2.destroy()


@_check
def events_time_and_synchronize(device: Device) -> str | None:
    s = device.stream()
    start, end = device.event(), device.event()
    _expect(start.query(), "a never-recorded event must query as complete")
    start.record(s)
    big = device.allocate(8 << 20)
    big.copy_from_host(np.ones(8 << 20, np.uint8), stream=s)
    end.record(s)
    end.synchronize()
    _expect(end.query(), "event_query after event_synchronize is not complete")
    s.synchronize()
    s.destroy()
    if not device.runtime.has("event_elapsed_ms"):
        return "event_elapsed_ms is not implemented (optional): timing not checked"
    forward, backward = start.elapsed_ms(end), end.elapsed_ms(start)
    _expect(forward >= 0 >= backward, f"elapsed_ms(start, end) = {forward}, elapsed_ms(end, start) = {backward}: "
                                      "expected >= 0 and <= 0")


@_check
def callbacks_run_in_order_after_work(device: Device) -> None:
    """Each callback sees the result of the copy enqueued before it (read from host memory: a
    callback must not call the runtime)."""
    n = 1 << 18
    buf, ahead = device.allocate(n), device.allocate(16 << 20)
    landed = [np.zeros(n, np.uint8) for _ in range(20)]
    seen = []
    with device.stream() as s:
        ahead.copy_from_host(np.ones(16 << 20, np.uint8), stream=s)  # keeps an asynchronous stream busy
        for i in range(20):
            buf.copy_from_host(np.full(n, i + 1, np.uint8), stream=s)
            buf.copy_to_host(landed[i], stream=s)
            s.add_callback(lambda status, i=i: seen.append((i, status, int(landed[i][0]), int(landed[i][-1]))))
        s.synchronize()
    want = [(i, "OK", i + 1, i + 1) for i in range(20)]
    if seen != want:
        k = next(k for k in range(max(len(seen), len(want)))
                 if k >= len(seen) or k >= len(want) or seen[k] != want[k])
        raise ContractViolation(
            f"{len(seen)} callbacks ran for 20 enqueued; run {k} was {seen[k] if k < len(seen) else 'missing'}, "
            f"expected {want[k] if k < len(want) else 'none'} (the callback's index, its status, and the first "
            "and last byte of the copy enqueued before it)")


# ---- accounting and errors ---------------------------------------------------------------------

@_check
def memory_stats_track_allocations(device: Device) -> None:
    before = device.memory_stats()
    bufs = [device.allocate(1000 + i) for i in range(5)]
    during = device.memory_stats()
    _expect(during.num_allocations == before.num_allocations + 5,
            f"num_allocations {before.num_allocations} -> {during.num_allocations} after 5 allocations")
    _expect(during.allocated_bytes >= before.allocated_bytes + sum(b.nbytes for b in bufs),
            f"allocated_bytes {before.allocated_bytes} -> {during.allocated_bytes} after allocating "
            f"{sum(b.nbytes for b in bufs)} bytes")
    _expect(during.peak_allocated_bytes >= during.allocated_bytes,
            f"peak_allocated_bytes {during.peak_allocated_bytes} < allocated_bytes {during.allocated_bytes}")
    # hardware may count other processes' memory as used too (device.h)
    room = during.total_bytes - during.allocated_bytes
    _expect(during.free_bytes == room if device.properties.simulated else during.free_bytes <= room,
            f"free_bytes {during.free_bytes}, total_bytes {during.total_bytes} - allocated_bytes "
            f"{during.allocated_bytes} = {room}: expected {'equal' if device.properties.simulated else 'at most that'}")
    for b in bufs:
        b.free()
    after = device.memory_stats()
    _expect(after.num_allocations == before.num_allocations,
            f"num_allocations {after.num_allocations} after freeing, was {before.num_allocations}")
    _expect(after.total_allocations == before.total_allocations + 5,
            f"total_allocations {before.total_allocations} -> {after.total_allocations} after 5 allocations")


@_check
def allocation_past_capacity_is_a_clear_error(device: Device) -> None:
    total = device.properties.total_memory
    _expect_error(DeviceOutOfMemoryError, "out of memory", lambda: device.allocate(total + (1 << 20)),
                  f"device_allocate of {total + (1 << 20)} bytes (capacity {total})")
    device.allocate(1024).free()  # and the device still works


@_check
def bad_frees_are_invalid_arguments(device: Device) -> None:
    buf = device.allocate(256)
    ptr = buf.ptr
    buf.free()
    _expect_error(InvalidArgumentError, None, lambda: device.call("device_free", C.c_void_p(ptr)),
                  "device_free of a freed pointer (double free)")
    foreign = np.zeros(16, np.uint8)
    _expect_error(InvalidArgumentError, None, lambda: device.call("device_free", C.c_void_p(foreign.ctypes.data)),
                  "device_free of a host pointer")
    big = device.allocate(1024)
    _expect_error(InvalidArgumentError, None, lambda: device.call("device_free", C.c_void_p(big.ptr + 256)),
                  "device_free of a pointer inside an allocation")
    big.free()


@_check
def device_index_out_of_range_is_an_invalid_argument(device: Device) -> None:
    runtime, count = device.runtime, device.runtime.device_count
    _expect_error(InvalidArgumentError, f"device index 99 out of range: {runtime.name} has",
                  lambda: open_device(f"{runtime.name}:99"), f"open_device('{runtime.name}:99')")
    for index in (count, -1):  # straight to the plugin: anychip's own check is not in the way
        props = abi.DeviceProperties()
        props.struct_size = C.sizeof(props)
        _expect_error(InvalidArgumentError, None, lambda: runtime.call("get_properties", index, C.byref(props)),
                      f"get_properties(device={index}) with {count} device(s)")
        _expect_error(InvalidArgumentError, None,
                      lambda: runtime.call("device_allocate", index, C.byref(C.c_void_p()), C.c_size_t(256)),
                      f"device_allocate(device={index}) with {count} device(s)")


@_check
def properties_are_consistent(device: Device) -> None:
    p = device.properties
    _expect(p.name and p.vendor, f"name {p.name!r} and vendor {p.vendor!r} must both be set")
    _expect(p.total_memory > 0 and p.max_alloc_size <= p.total_memory,
            f"total_memory {p.total_memory}, max_alloc_size {p.max_alloc_size}: expected 0 < max_alloc_size <= total")
    _expect(p.min_chunk_size >= 256 and p.min_chunk_size & (p.min_chunk_size - 1) == 0,
            f"min_chunk_size {p.min_chunk_size} must be a power of two >= 256")
    _expect("float32" in p.dtypes, f"dtypes {list(p.dtypes)} lack float32")
    _expect(p.simulated == ("(simulated)" in p.name),
            f"simulated={p.simulated} but the name {p.name!r} {'lacks' if p.simulated else 'has'} '(simulated)'")


# ---- running them ------------------------------------------------------------------------------

def _describe(error: BaseException) -> str:
    if isinstance(error, ContractViolation):
        return str(error)
    # Unexpected: the exception and the check's line that met it, to find it in this file.
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == __file__]
    where = f" (at runtime_contract.py:{frames[-1].lineno}: {frames[-1].line})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def run_check(name: str, device: Device, timeout_s: float = TIMEOUT_S) -> Result:
    """Check ``name`` of :data:`CHECKS` on ``device``, as a PASS or FAIL Result. It runs in its own
    thread, so a wait that never returns becomes a FAIL after ``timeout_s`` seconds rather than
    a conformance run that hangs (the stuck thread is abandoned)."""
    if name not in CHECKS:
        raise ValueError(f"unknown runtime check {name!r}; known: {', '.join(CHECKS)}")
    outcome: dict = {}

    def target():
        try:
            outcome["note"] = CHECKS[name](device)
        except Exception as e:  # noqa: BLE001 - every failure becomes the check's result
            outcome["error"] = e

    worker = threading.Thread(target=target, name=f"anychip-contract-{name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return Result(SECTION, name, FAIL, detail=f"did not finish within {timeout_s:g} s "
                                                  "(a stream, event or callback that never completes?)")
    if "error" in outcome:
        return Result(SECTION, name, FAIL, detail=_describe(outcome["error"]))
    return Result(SECTION, name, PASS, detail=outcome.get("note") or "")


def run(device: str, timeout_s: float = TIMEOUT_S) -> list[Result]:
    """Every check of the contract on ``device`` ("npu" or "npu:0"), one Result each. A device that
    does not open gives a single FAIL "open_device" with the reason."""
    try:
        dev = open_device(device)
    except Exception as e:  # noqa: BLE001 - whatever stops the device opening is its result
        return [Result(SECTION, "open_device", FAIL, detail=f"{type(e).__name__}: {e}")]
    return [run_check(name, dev, timeout_s) for name in CHECKS]
