"""Argument checks shared by the ops. Each raises before any kernel runs, naming the argument
and what was expected."""

from __future__ import annotations

from ..dtypes import FLOATS as FLOAT_DTYPES
from .dispatch import device_label, device_of, dtype_name, paddle


class OpArgumentError(ValueError):
    """An op was called with arguments it cannot take."""


def tensor(op: str, name: str, t, *, optional: bool = False):
    if t is None and optional:
        return None
    if not isinstance(t, paddle().Tensor):
        raise OpArgumentError(f"{op}: {name} must be a paddle.Tensor, got {type(t).__name__}")
    return t


def dtype(op: str, name: str, t, allowed) -> str:
    got = dtype_name(t)
    if got not in allowed:
        raise OpArgumentError(f"{op}: {name} has dtype {got}, expected one of {', '.join(allowed)}")
    return got


def same_dtype(op: str, ref_name: str, ref, **others) -> None:
    want = dtype_name(ref)
    for name, t in others.items():
        if t is not None and dtype_name(t) != want:
            raise OpArgumentError(f"{op}: {name} has dtype {dtype_name(t)} but {ref_name} has {want}; they must match")


def rank(op: str, name: str, t, expected: int, layout: str) -> None:
    if len(t.shape) != expected:
        raise OpArgumentError(f"{op}: {name} must be {expected}-D {layout}, got shape {list(t.shape)}")


def shape(op: str, name: str, t, expected, what: str = "") -> None:
    if list(t.shape) != list(expected):
        extra = f" ({what})" if what else ""
        raise OpArgumentError(f"{op}: {name} must have shape {list(expected)}{extra}, got {list(t.shape)}")


def same_device(op: str, **tensors) -> tuple[str, int]:
    """The one device all given tensors live on."""
    found = {name: device_of(t) for name, t in tensors.items() if t is not None}
    devices = set(found.values())
    if len(devices) > 1:
        where = ", ".join(f"{name} on {device_label(d)}" for name, d in found.items())
        raise OpArgumentError(f"{op}: tensors must be on one device, got {where}")
    return devices.pop()


def contiguous(op: str, name: str, t, device: tuple[str, int]):
    """``t`` itself if dense; on the host a dense copy; elsewhere an error, since a copy would
    need a `contiguous` kernel that the device may lack."""
    if t is None or t.is_contiguous():
        return t
    if device[0] == "cpu":
        return t.contiguous()
    raise OpArgumentError(f"{op}: {name} is a non-contiguous view on {device_label(device)}; "
                          "pass a dense tensor (e.g. build it with paddle.clone on the host first)")
