"""Host memory policy for CPU tensors: freed memory kept for reuse, weights on huge pages.

Paddle's CPU allocator takes each tensor straight from malloc, and glibc serves large blocks
with a fresh mmap and unmaps them on free: every large output is faulted in page by page
again (a 64 MB RMSNorm output costs ~22 ms of faults for ~3 ms of kernel on these machines).
Telling glibc to serve everything from its heap and never trim it makes freed blocks reusable,
as a caching allocator would; the price is that the process keeps its peak footprint.
``ANYCHIP_HOST_MALLOC=system`` keeps glibc's defaults.

Large weights that a decode GEMV streams from DRAM on every call are worth moving onto 2 MB pages
(:func:`huge_pages_for`): Paddle's tensors get 4 KB ones, and on these machines the kernel of
a 4096 x 4096 4-bit GEMV streamed its weights 3-7% faster from huge pages (a plain read of
them 6-9%), the whole call through ops.WeightOnlyLinear 2-5%. numpy already asks for
huge pages for its large arrays. ``ANYCHIP_HUGE_PAGES=off`` leaves the weights where they are.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25  # Linux 6.1: collapse now, rather than when khugepaged gets round to it
_HUGE_PAGE = 2 << 20
# Smaller tensors stay put (numpy's threshold too): on these VMs collapsing costs ~3.5 ms per MB
# the first time, and SmolLM2's 1-2 MB matrices decoded no faster on huge pages.
_HUGE_PAGES_FROM = 4 << 20


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


def huge_pages_for(tensors) -> int:
    """Moves the host (``cpu``) tensors of 4 MB or more among ``tensors`` onto 2 MB pages,
    whole: each 2 MB range a tensor touches is advised (MADV_HUGEPAGE) and collapsed
    (MADV_COLLAPSE), its neighbours in the same range included, which changes only how the
    memory is mapped. A range must lie inside the tensor's mapping, so the ends of a tensor
    that reach past its mapping's outermost 2 MB boundaries stay on small pages. Others (a
    simulated chip's, smaller ones, None) are left alone. Returns how many bytes the kernel
    collapsed: 0 where THP is off, the kernel is older than 6.1, or the policy is off."""
    if os.environ.get("ANYCHIP_HUGE_PAGES", "on") == "off":
        return 0
    host = [t for t in tensors if t is not None and t.place.is_cpu_place() and _nbytes(t) >= _HUGE_PAGES_FROM]
    madvise = _madvise()
    if not host or madvise is None:
        return 0
    mappings = _anonymous_mappings()
    merged: list[list[int]] = []
    for lo, hi in sorted(r for t in host if (r := _covering(t, mappings)) is not None):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    done = 0
    for lo, hi in merged:
        # Either may fail for good reasons (THP "never", an old kernel, no huge page free): the
        # memory then stays as it was, which is correct, only slower.
        if madvise(lo, hi - lo, _MADV_HUGEPAGE) == 0 and madvise(lo, hi - lo, _MADV_COLLAPSE) == 0:
            done += hi - lo
    return done


def _covering(t, mappings):
    """The 2 MB-aligned range around ``t``'s bytes, clipped to its anonymous mapping; None if
    that leaves nothing (or t is not in one: a file's pages, say)."""
    start = t.data_ptr()
    end = start + _nbytes(t)
    for a, b in mappings:
        if a <= start < b:
            lo = max(start // _HUGE_PAGE * _HUGE_PAGE, -(-a // _HUGE_PAGE) * _HUGE_PAGE)
            hi = min(-(-end // _HUGE_PAGE) * _HUGE_PAGE, b // _HUGE_PAGE * _HUGE_PAGE)
            return (lo, hi) if lo < hi else None
    return None


def _nbytes(t) -> int:
    return math.prod(t.shape) * t.element_size()


def _anonymous_mappings() -> list[list[int]]:
    """The process's private anonymous read-write mappings (the heap among them), adjacent ones
    joined: advising part of one splits it, and the parts still form one block of memory."""
    spans: list[list[int]] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                if fields[1] != "rw-p" or (len(fields) > 5 and fields[5] != "[heap]"):
                    continue
                a, b = (int(v, 16) for v in fields[0].split("-"))
                if spans and spans[-1][1] == a:
                    spans[-1][1] = b
                else:
                    spans.append([a, b])
    except OSError:
        return []
    return spans


@functools.lru_cache(maxsize=None)
def _madvise():
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise
