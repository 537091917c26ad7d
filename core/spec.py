"""What a plugin declares about a device (returned from ``anychip_register_devices``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Union

from .dtypes import DTYPE_BITS

# Paddle's Python layer changes behaviour when these appear in a device type (see
# shared/notes/platform-facts.md), so a bridged device must not use them.
_PADDLE_RESERVED = ("cpu", "gpu", "xpu", "npu", "dcu", "ipu", "mlu", "cuda")

Options = Union[Mapping[str, object], Callable[[], Mapping[str, object]]]


@dataclass(frozen=True)
class DeviceSpec:
    """One device kind a plugin provides.

    name:           what users type (``--device npu``); lowercase letters, digits, ``_``.
    description:    one line for ``anychip devices``.
    library:        path of the shared library implementing ``anychip/device.h``.
    symbol:         its entry point.
    options:        ``key=value`` pairs for the entry point, or a callable returning them
                    (evaluated each time the device is opened, so environment knobs apply).
    paddle_type:    the Paddle CustomDevice type the bridge registers, or None for a device
                    that is Paddle's own CPU place.
    vendor_runtime: the vendor SDK this device binds when present (shown in listings).
    note:           why the device runs the way it does (e.g. "Ascend ACL not found").
    peaks:          the hardware's published peaks, for the roofline of `anychip bench`:
                    "memory_gbps" and "<dtype>_tflops" (e.g. {"memory_gbps": 4800,
                    "bfloat16_tflops": 989}). Leave empty for the host (measured in each run) and
                    for a simulated device (which runs at the host's speed).
    """

    name: str
    description: str
    library: str
    symbol: str = "anychip_device_init"
    options: Options = ()
    paddle_type: str | None = None
    vendor_runtime: str = ""
    note: str = ""
    peaks: Mapping[str, float] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        for key, value in dict(self.peaks).items():
            if key != "memory_gbps" and not (key.endswith("_tflops") and key[:-len("_tflops")] in DTYPE_BITS):
                raise ValueError(f"DeviceSpec.peaks: unknown key {key!r}; expected 'memory_gbps' or '<dtype>_tflops'")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"DeviceSpec.peaks[{key!r}] must be a positive number, got {value!r}")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"DeviceSpec.name must match [a-z][a-z0-9_]*, got {self.name!r}")
        if self.paddle_type is not None:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", self.paddle_type):
                raise ValueError(f"DeviceSpec.paddle_type must match [a-z][a-z0-9_]*, "
                                 f"got {self.paddle_type!r}")
            bad = [r for r in _PADDLE_RESERVED if r in self.paddle_type]
            if bad:
                raise ValueError(f"DeviceSpec.paddle_type {self.paddle_type!r} contains {bad[0]!r}, "
                                 "which Paddle's Python treats specially; pick another name")

    def resolved_options(self) -> dict:
        opts = self.options() if callable(self.options) else self.options
        return dict(opts or {})

    def options_string(self) -> str:
        items = self.resolved_options().items()
        for key, value in items:
            if ";" in f"{key}{value}" or "=" in str(key):
                raise ValueError(f"{self.name}: option {key!r}={value!r} may not contain ';' or '='")
        return ";".join(f"{k}={v}" for k, v in items)
