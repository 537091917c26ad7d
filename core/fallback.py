"""Counting the Paddle ops that fall back to the CPU on an anychip device.

A device without a kernel for an op makes Paddle run the op's CPU kernel, with copies through
the plugin each way. That is correct but slow, and on a real chip it hides missing work, so
anychip counts every such fallback by device, op and dtype.

Paddle exposes no hook for this; its only signal is one glog line per fallback, which
kernel_factory.cc writes at verbosity 3 (``missing <type> kernel: <op>, expected_kernel_key:
(<type>, <layout>, <dtype>), fallbacking to CPU one!``). The monitor turns that verbosity on for
kernel_factory alone, reads the process's stderr through a pipe, counts those lines and passes
every other byte through unchanged. Strict mode (ANYCHIP_STRICT=1) instead turns Paddle's
fallback off (FLAGS_enable_api_kernel_fallback=0), so a missing kernel raises at the op.
"""

from __future__ import annotations

import atexit
import collections
import faulthandler
import os
import re
import threading

_FALLBACK = re.compile(
    rb"missing (\w+) kernel: (\w+), expected_kernel_key:\(\w+, [^,]+, (\w+)\), fallbacking to CPU one!")
# INFO lines Paddle prints while loading anychip's bridge: anychip's plumbing, not the user's.
_LOAD_NOISE = re.compile(rb"^I\d{4} [\d:.]+ +\d+ (init|custom_device_load|custom_kernel)\.cc:\d+\]")


def strict() -> bool:
    return os.environ.get("ANYCHIP_STRICT", "0") == "1"


class FallbackMonitor:
    def __init__(self, device_names: dict[str, str]):
        self._names = device_names  # Paddle device type -> anychip device name
        self.counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self._events = threading.Condition(self._lock)
        self._seen_bytes = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stderr = os.dup(2)
        # A crash must still reach the terminal, not die in the pipe with this process.
        faulthandler.enable(file=os.fdopen(os.dup(self._stderr), "w"), all_threads=True)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._read_fd = read_fd
        self._thread = threading.Thread(target=self._pump, name="anychip-fallback-monitor", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def _pump(self) -> None:
        pending = b""
        while True:
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = []
            for line in lines:
                m = _FALLBACK.search(line)
                if m:
                    key = (self._names.get(m[1].decode(), m[1].decode()), m[2].decode(), m[3].decode())
                    with self._lock:
                        self.counts[key] += 1
                elif not _LOAD_NOISE.match(line):
                    out.append(line + b"\n")
            if pending and not pending.startswith(b"I"):  # not a glog line: pass it through now
                out.append(pending)
                pending = b""
            if out:
                os.write(self._stderr, b"".join(out))
            with self._events:
                self._seen_bytes += len(chunk)
                self._events.notify_all()
        if pending:
            os.write(self._stderr, pending)

    def flush(self, timeout: float = 2.0) -> None:
        """Waits until everything written to stderr so far has been read and counted."""
        import sys

        sys.stderr.flush()
        marker = b"\n"
        with self._events:
            target = self._seen_bytes + len(marker)
        os.write(2, marker)  # consumed as an empty line; makes the pump catch up to "now"
        with self._events:
            self._events.wait_for(lambda: self._seen_bytes >= target, timeout)

    def stop(self) -> None:
        if self._thread is None:
            return
        os.dup2(self._stderr, 2)  # closes the pipe's last writer: the pump drains and ends
        self._thread.join(timeout=5)
        self._thread = None


_monitor: FallbackMonitor | None = None


def start_monitor(device_names: dict[str, str]) -> None:
    global _monitor
    if _monitor is None:
        _monitor = FallbackMonitor(device_names)
        _monitor.start()


def fallback_counts() -> dict[tuple[str, str, str], int]:
    """{(device, op, dtype): times the op ran on the CPU instead of the device}."""
    if _monitor is None:
        return {}
    _monitor.flush()
    with _monitor._lock:
        return dict(_monitor.counts)


def reset_fallbacks() -> None:
    if _monitor is not None:
        _monitor.flush()
        with _monitor._lock:
            _monitor.counts.clear()


def fallback_report() -> str:
    """A table of CPU fallbacks, most frequent first."""
    counts = fallback_counts()
    if strict():
        header = "CPU fallbacks: strict mode (ANYCHIP_STRICT=1), a fallback raises instead"
    elif _monitor is None:
        return "CPU fallbacks: none (no anychip device was used with Paddle)"
    else:
        header = f"CPU fallbacks: {sum(counts.values())} op call(s) ran on the CPU"
    if not counts:
        return header + ("" if strict() else ", none")
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    width = max(len(op) for (_d, op, _t), _n in rows)
    lines = [header, f"  {'device':8} {'op':{width}} {'dtype':9} calls"]
    lines += [f"  {dev:8} {op:{width}} {dtype:9} {n}" for (dev, op, dtype), n in rows]
    return "\n".join(lines)
