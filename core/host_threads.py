"""How many host threads anychip's kernels and Paddle's CPU ops use, and how their two OpenMP
runtimes share the cores.

The host kernels run on GNU OpenMP; Paddle's CPU ops (MKL, oneDNN) on Intel's. Intel's idle
workers keep spinning for 200 ms after a parallel region, on the very cores anychip's kernels
need next: measured on 2 cores, a float32 SmolLM2 prefill alternating Paddle matmuls with
anychip ops took 1.08 s with the defaults and 0.62 s with short spins. So, unless the user set
it, Intel's runtime is told to give idle cores back at once (KMP_BLOCKTIME=0). That has to
happen before it loads, hence at ``import anychip``.

GNU OpenMP keeps its default spin (GOMP_SPINCOUNT 300000), which bridges the gap between two
kernel launches: with it shortened to 10000 as well, each op paid a worker wake-up, and a LoRA
train step ran 5-10% slower, op-by-op decode 6-14% slower and a 4-bit GEMV op 8% slower (prefill
unchanged; measured 2026-11-30).
"""

from __future__ import annotations

import functools
import os

_SHORT_SPINS = {"KMP_BLOCKTIME": "0"}


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
