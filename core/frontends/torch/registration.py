"""Registering Python implementations of ATen ops for the anychip device (PrivateUse1)."""

from __future__ import annotations

import torch

_aten = torch.library.Library("aten", "IMPL")
REGISTERED: list[str] = []


def impl(*names: str):
    """Registers the decorated function as the PrivateUse1 kernel of each ATen op ``names``."""
    def register(fn):
        for name in names:
            _aten.impl(name, fn, "PrivateUse1")
            REGISTERED.append(name)
        return fn
    return register
