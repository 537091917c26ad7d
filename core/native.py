"""Where anychip's compiled parts live: its shared libraries and the C headers for plugins."""

from __future__ import annotations

import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def include_dir() -> str:
    """The directory to pass as ``-I`` when compiling a plugin against ``anychip/device.h``."""
    return str(_HERE / "include")


def library_path(name: str) -> Path:
    """Path of one of anychip's own shared libraries (``name`` without ``lib`` and ``.so``)."""
    return _HERE / "_lib" / f"lib{name}.so"


def cache_dir() -> Path:
    """anychip's cache: $ANYCHIP_CACHE_DIR, else ~/.cache/anychip."""
    return Path(os.environ.get("ANYCHIP_CACHE_DIR", Path.home() / ".cache" / "anychip"))
