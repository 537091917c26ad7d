"""Opening a registered device by name ("npu:0"): plugin lookup, loading, hardware policy."""

from __future__ import annotations

import os
import threading

from ..errors import HardwareRequiredError
from ..plugins import registry
from .device import Device
from .library import Runtime

_runtimes: dict[str, Runtime] = {}
_lock = threading.Lock()


def parse_device(text: str) -> tuple[str, int]:
    """"npu" -> ("npu", 0); "npu:1" -> ("npu", 1)."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"device must be a string like 'npu' or 'npu:0', got {text!r}")
    name, _, index = text.strip().lower().partition(":")
    if index == "":
        return name, 0
    if not index.isdigit():
        raise ValueError(f"device {text!r}: the index after ':' must be a non-negative integer")
    return name, int(index)


def require_hardware() -> bool:
    return os.environ.get("ANYCHIP_REQUIRE_HARDWARE", "0") == "1"


def open_runtime(name: str) -> Runtime:
    """The (cached) runtime of device kind ``name``; raises with the reason if it cannot load."""
    spec = registry().spec(name)
    with _lock:
        if name not in _runtimes:
            _runtimes[name] = Runtime(name, spec.library, spec.symbol, spec.options_string())
        return _runtimes[name]


def open_device(text: str) -> Device:
    name, index = parse_device(text)
    device = Device(open_runtime(name), index)
    if require_hardware() and device.properties.simulated:
        raise HardwareRequiredError(
            f"{device} is simulated ({device.properties.name}) and ANYCHIP_REQUIRE_HARDWARE=1; "
            "unset it to run on the simulator")
    return device
