"""Errors of device selection and plugin discovery (the runtime's own are in runtime/errors.py)."""

from __future__ import annotations


class UnknownDeviceError(ValueError):
    pass


class HardwareRequiredError(RuntimeError):
    """ANYCHIP_REQUIRE_HARDWARE=1 and the device is simulated."""


class PaddleImportOrderError(RuntimeError):
    """Paddle was imported before anychip could register its devices with it."""
