"""Keeping freed host memory for reuse, so CPU tensors stop paying page faults on every op.

Paddle's CPU allocator takes each tensor straight from malloc, and glibc serves large blocks
with a fresh mmap and unmaps them on free: every large output is faulted in page by page
again (a 64 MB RMSNorm output costs ~22 ms of faults for ~3 ms of kernel on these machines).
Telling glibc to serve everything from its heap and never trim it makes freed blocks reusable,
as a caching allocator would; the price is that the process keeps its peak footprint.
``ANYCHIP_HOST_MALLOC=system`` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def keep_freed_host_memory() -> bool:
    """Applies the policy once per process; returns whether it is in effect."""
    if os.environ.get("ANYCHIP_HOST_MALLOC", "cache") == "system":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc: its allocator has its own policy
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
