"""The current device for Paddle work: ``anychip.set_device``, ``--device``, ``ANYCHIP_DEVICE``."""

from __future__ import annotations

import os

from .runtime.open import open_device, parse_device

_current: str | None = None


def default_device() -> str:
    return os.environ.get("ANYCHIP_DEVICE") or "cpu"


def set_device(device: str | None = None) -> str:
    """Makes ``device`` ("npu", "npu:1"; default $ANYCHIP_DEVICE or "cpu") Paddle's current
    device and returns its canonical name. Raises a clear error, before any work runs, for an
    unknown name, an index out of range, a device that is unavailable here, or a simulated
    device under ANYCHIP_REQUIRE_HARDWARE=1."""
    global _current
    from .frontends.paddle import import_paddle, paddle_device_string

    text = device or default_device()
    name, index = parse_device(text)
    open_device(f"{name}:{index}")  # validates name, index, availability and hardware policy
    paddle = import_paddle()
    paddle.set_device(paddle_device_string(name, index))
    _current = f"{name}:{index}"
    return _current


def get_device() -> str:
    """The device set by set_device, or the default if none was set yet."""
    if _current is not None:
        return _current
    name, index = parse_device(default_device())
    return f"{name}:{index}"

