"""The kernel registry: which op runs on which device for which dtypes.

Plugins fill it through the ``anychip_register_kernels`` hook; ``anychip devices`` reports how
many kernels each device has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Kernel:
    op: str
    device: str
    dtypes: tuple[str, ...]
    forward: Callable
    backward: Callable | None = None
    capabilities: tuple[str, ...] = field(default_factory=tuple)


class KernelRegistry:
    def __init__(self) -> None:
        self._kernels: dict[tuple[str, str, str], Kernel] = {}

    def register(self, op, device, dtypes, forward, backward=None, capabilities=()):
        if not callable(forward):
            raise TypeError(f"register({op!r}, {device!r}): forward must be callable")
        kernel = Kernel(op, device, tuple(dtypes), forward, backward, tuple(capabilities))
        for dtype in kernel.dtypes:
            key = (op, device, dtype)
            if key in self._kernels:
                raise ValueError(f"kernel {op!r} for {device}/{dtype} is registered twice")
            self._kernels[key] = kernel

    def count(self, device: str) -> int:
        """Number of distinct ops with a kernel on ``device``."""
        return len({op for (op, dev, _dtype) in self._kernels if dev == device})
