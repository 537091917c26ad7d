"""Counting the ops that fall back to the CPU on an anychip device.

Two kinds are counted in one table: anychip ops (``anychip.ops``) that have no kernel for the
device and dtype, which run their reference implementation instead (``record_op_fallback``),
and Paddle ops that Paddle itself runs on the CPU, described next.

A device without a kernel for an op makes Paddle run the op's CPU kernel, with copies through
the plugin each way. That is correct but slow, and on a real chip it hides missing work, so
anychip counts every such fallback by device, op and dtype.

Paddle exposes no hook for this; its only signal is one glog line per fallback, which
kernel_factory.cc writes at verbosity 3 (``missing <type> kernel: <op>, expected_kernel_key:
(<type>, <layout>, <dtype>), fallbacking to CPU one!``). The monitor turns that verbosity on for
kernel_factory alone (through glog's SetVLOGLevel: setting $GLOG_vmodule instead makes Paddle
3.3.1 corrupt its heap at exit, as its two glog copies both own the parsed list) and sends the
process's stderr through a small filter process (``anychip.stderr_filter``) that counts those
lines and passes every other byte through unchanged; a separate process, so a crash report
still reaches the terminal. Strict mode (ANYCHIP_STRICT=1) instead turns Paddle's
fallback off (FLAGS_enable_api_kernel_fallback=0), so a missing kernel raises at the op.
"""

from __future__ import annotations

import atexit
import collections
import os
import subprocess
import sys
import threading


def strict() -> bool:
    return os.environ.get("ANYCHIP_STRICT", "0") == "1"


class FallbackMonitor:
    """Routes this process's stderr through ``anychip.stderr_filter`` and counts what it finds."""

    def __init__(self, device_names: dict[str, str]):
        self._names = device_names  # Paddle device type -> anychip device name
        self.counts: collections.Counter = collections.Counter()
        self._lock = threading.Condition()
        self._synced = 0
        self._next_sync = 0

    def start(self) -> None:
        sys.stderr.flush()
        self._filter = subprocess.Popen(
            [sys.executable, "-m", "anychip.stderr_filter"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=2, close_fds=True)
        self._saved_stderr = os.dup(2)
        os.dup2(self._filter.stdin.fileno(), 2)
        self._pipe = os.fstat(2).st_ino
        self._filter.stdin.close()  # fd 2 is now the only writer
        self._reader = threading.Thread(target=self._read, name="anychip-fallbacks", daemon=True)
        self._reader.start()
        atexit.register(self.stop)

    def _read(self) -> None:
        for record in self._filter.stdout:
            kind, *fields = record.decode().split()
            with self._lock:
                if kind == "fallback":
                    paddle_type, op, dtype = fields
                    self.counts[(self._names.get(paddle_type, paddle_type), op, dtype)] += 1
                else:
                    self._synced = int(fields[0])
                self._lock.notify_all()

    def flush(self, timeout: float = 5.0) -> None:
        """Waits until everything written to stderr so far has been seen by the filter."""
        sys.stderr.flush()
        if self._filter is None or os.fstat(2).st_ino != self._pipe:
            return  # someone (e.g. pytest's capture) redirected fd 2 away from the filter
        with self._lock:
            self._next_sync += 1
            token = self._next_sync
        os.write(2, b"\x00anychip-sync %d\n" % token)
        with self._lock:
            self._lock.wait_for(lambda: self._synced >= token, timeout)

    def stop(self) -> None:
        if self._filter is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved_stderr, 2)  # closes the filter's input: it drains and exits
        self._filter.wait(timeout=10)
        self._reader.join(timeout=5)
        self._filter = None


def log_paddle_fallbacks(paddle) -> None:
    """Turns on kernel_factory's verbosity-3 log in every glog copy inside Paddle."""
    import ctypes
    from pathlib import Path

    root = Path(paddle.__file__).parent
    for lib in (root / "base" / "libpaddle.so", root / "libs" / "libphi_core.so"):
        try:
            set_level = getattr(ctypes.CDLL(str(lib)), "_ZN6google12SetVLOGLevelEPKci")
        except (OSError, AttributeError) as exc:
            raise RuntimeError(f"cannot enable Paddle's fallback log in {lib}: {exc}; "
                               "set ANYCHIP_STRICT=1 to run without fallback accounting") from None
        set_level.argtypes = [ctypes.c_char_p, ctypes.c_int]
        set_level(b"kernel_factory", 3)


_monitor: FallbackMonitor | None = None


_op_counts: collections.Counter = collections.Counter()
_op_lock = threading.Lock()


class KernelFallbackError(RuntimeError):
    """Strict mode (ANYCHIP_STRICT=1) and an op has no kernel for the device and dtype."""


def record_op_fallback(device: str, op: str, dtype: str, reason: str) -> None:
    """Counts one call of anychip op ``op`` that ran its reference implementation instead of a
    device kernel; in strict mode raises KernelFallbackError instead."""
    if strict():
        raise KernelFallbackError(
            f"anychip.ops.{op} on {device} ({dtype}): {reason}, and strict mode (ANYCHIP_STRICT=1) "
            "forbids running the reference implementation instead")
    record_fallback(device, f"anychip.{op}", dtype, reason)


def record_fallback(device: str, op: str, dtype: str, reason: str, instead: str = "running it on the CPU") -> None:
    """Counts one call of ``op`` (named as its framework names it, e.g. ``aten::cumsum``) that ran
    on the CPU instead of ``device``; in strict mode raises KernelFallbackError instead."""
    if strict():
        raise KernelFallbackError(
            f"{op} on {device} ({dtype}): {reason}, and strict mode (ANYCHIP_STRICT=1) forbids {instead}")
    with _op_lock:
        _op_counts[(device, op, dtype)] += 1


_counting_frontends: set[str] = set()


def count_frontend(name: str) -> None:
    """Says that front end ``name`` (e.g. "torch") counts its fallbacks here as they happen, so
    an empty report means none rather than "Paddle was never used"."""
    _counting_frontends.add(name)


def start_monitor(device_names: dict[str, str]) -> None:
    global _monitor
    if _monitor is None:
        _monitor = FallbackMonitor(device_names)
        _monitor.start()


def fallback_counts() -> dict[tuple[str, str, str], int]:
    """{(device, op, dtype): times the op ran on the CPU instead of the device}. anychip ops
    appear as ``anychip.<op>``, Paddle ops under their Paddle name."""
    with _op_lock:
        counts = dict(_op_counts)
    if _monitor is not None:
        _monitor.flush()
        with _monitor._lock:
            counts.update(_monitor.counts)
    return counts


def reset_fallbacks() -> None:
    with _op_lock:
        _op_counts.clear()
    if _monitor is not None:
        _monitor.flush()
        with _monitor._lock:
            _monitor.counts.clear()


def fallback_report() -> str:
    """A table of CPU fallbacks, most frequent first."""
    counts = fallback_counts()
    if strict():
        header = "CPU fallbacks: strict mode (ANYCHIP_STRICT=1), a fallback raises instead"
    elif _monitor is None and not counts:
        return "CPU fallbacks: none" + ("" if _counting_frontends else " (no anychip device was used with Paddle)")
    else:
        header = f"CPU fallbacks: {sum(counts.values())} op call(s) ran on the CPU"
    if not counts:
        return header + ("" if strict() else ", none")
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    width = max(len(op) for (_d, op, _t), _n in rows)
    lines = [header, f"  {'device':8} {'op':{width}} {'dtype':9} calls"]
    lines += [f"  {dev:8} {op:{width}} {dtype:9} {n}" for (dev, op, dtype), n in rows]
    return "\n".join(lines)
