"""How many host threads anychip's kernels and Paddle's CPU ops use, and how their two OpenMP
runtimes share the cores.

The host kernels run on GNU OpenMP; Paddle's CPU ops (MKL, oneDNN) on Intel's. By default each
runtime's idle workers keep spinning after a parallel region (Intel's for 200 ms), on the very
cores the other runtime needs next: measured on 2 cores, a float32 SmolLM2 prefill alternating
Paddle matmuls with anychip ops took 1.08 s with the defaults and 0.62 s with short spins. So,
unless the user set them, both runtimes are told to give idle cores back quickly. That has to
happen before either runtime loads, hence at ``import anychip``.
"""

from __future__ import annotations

import functools
import os

_SHORT_SPINS = {"KMP_BLOCKTIME": "0", "GOMP_SPINCOUNT": "10000"}


def share_cores_between_openmp_runtimes() -> None:
    for name, value in _SHORT_SPINS.items():
        os.environ.setdefault(name, value)


@functools.lru_cache(maxsize=None)
def num_threads() -> int:
    """Host threads a kernel (and Paddle's CPU ops) may use: $ANYCHIP_NUM_THREADS, else the CPUs
    this process may run on. Passed with every launch, because importing Paddle sets
    OMP_NUM_THREADS=1 and OpenMP's own default would then depend on what happened to load first."""
    raw = os.environ.get("ANYCHIP_NUM_THREADS", "")
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"ANYCHIP_NUM_THREADS must be a positive integer, got {raw!r}")
        return int(raw)
    return len(os.sched_getaffinity(0))
