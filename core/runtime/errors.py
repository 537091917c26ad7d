"""Exceptions raised by anychip's runtime layer, one per AnychipStatus that callers handle."""

from __future__ import annotations

from . import abi


class AnychipError(RuntimeError):
    """A runtime call failed; ``status`` is the AnychipStatus name."""

    def __init__(self, message: str, status: str = "ERROR"):
        super().__init__(message)
        self.status = status


class DeviceOutOfMemoryError(AnychipError, MemoryError):
    pass


class DeviceUnavailableError(AnychipError):
    pass


class InvalidArgumentError(AnychipError, ValueError):
    pass


def error_for(status: int, message: str) -> AnychipError:
    name = abi.STATUS_NAMES.get(status, f"status {status}")
    cls = {
        abi.ERROR_OUT_OF_MEMORY: DeviceOutOfMemoryError,
        abi.ERROR_UNAVAILABLE: DeviceUnavailableError,
        abi.ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    }.get(status, AnychipError)
    return cls(message or name, name)
