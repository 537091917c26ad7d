"""A simple autotuner: a few candidate schedules per kernel (from the backend), each built and
measured once on a representative shape, the fastest remembered in the cache as json.

Later builds of the same kernel with the same backend and toolchain read the choice back
(:func:`tuned`) and measure nothing. Tuning runs host-code kernels on host memory, which is
where a host-code kernel computes on every device that runs it (the cpu and the simulated
chips); a backend without host-code kernels (cuda) keeps its default schedule here.
ANYCHIP_CODEGEN_TUNE=0 turns measuring off (the default schedule, or a cached choice, is used).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from . import ir
from .build import build, cache_root

ROWS, LEN = 256, 1024  # the representative shape: 256 rows of 1024 (elementwise: [256, 1024])


def enabled() -> bool:
    return os.environ.get("ANYCHIP_CODEGEN_TUNE", "1") != "0"


def _key(kernel, backend, dtype: str) -> str:
    bare = kernel.with_schedule()
    toolchain = backend.toolchain() if hasattr(backend, "toolchain") else ""
    text = "\0".join([backend.name, toolchain, repr(bare), repr(backend.schedules(kernel)), dtype])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _choice_path(kernel, backend, dtype: str, root: Path) -> Path:
    return root / "tune" / f"{kernel.name}-{backend.name}-{_key(kernel, backend, dtype)}.json"


def tuned(kernel, backend, root: Path | None = None):
    """``kernel`` with its cached schedule, if one was chosen; else ``kernel`` unchanged."""
    if not hasattr(backend, "schedules") or not kernel.dtypes:
        return kernel
    path = _choice_path(kernel, backend, kernel.dtypes[0], Path(root) if root else cache_root())
    if not path.exists():
        return kernel
    return kernel.with_schedule(**json.loads(path.read_text())["choice"])


def tune(kernel, backend, root: Path | None = None, repeats: int = 3) -> dict:
    """Chooses ``kernel``'s schedule (cached): each candidate is built and timed on the
    representative shape for the kernel's first dtype. Returns the json record."""
    root = Path(root) if root else cache_root()
    dtype = kernel.dtypes[0]
    path = _choice_path(kernel, backend, dtype, root)
    if path.exists():
        return json.loads(path.read_text())
    candidates = list(backend.schedules(kernel)) if hasattr(backend, "schedules") else []
    if not candidates or not getattr(backend, "host_code", False) or not enabled():
        return {"kernel": kernel.name, "choice": candidates[0] if candidates else {}, "times": None}
    times = []
    for knobs in candidates:
        candidate = kernel.with_schedule(**knobs)
        lib = build(f"tune_{kernel.name}", [candidate], backend, root)
        fn = lib.load()[f"{kernel.name}.{dtype}"]
        times.append(_measure(fn, candidate, dtype, repeats))
    best = int(np.argmin(times))
    record = {"kernel": kernel.name, "dtype": dtype, "candidates": candidates, "times": times,
              "choice": candidates[best]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return record


def _measure(fn, kernel, dtype: str, repeats: int) -> float:
    inputs, outputs, attrs, dtypes = representative_call(kernel, dtype)
    fn.run_host(inputs, outputs, attrs, dtypes=dtypes)  # warm up: pages, threads
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn.run_host(inputs, outputs, attrs, dtypes=dtypes)
        best = min(best, time.perf_counter() - start)
    return best


def _array(dtype: str, shape, rng) -> np.ndarray:
    if dtype in ("bfloat16", "float16"):
        return rng.integers(0x3C00, 0x3E00, size=shape).astype(np.uint16)  # modest finite values
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype in ("int32", "int64"):
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.uniform(0.5, 1.5, size=shape).astype(dtype)


def representative_call(kernel, dtype: str):
    """(inputs, outputs, attrs, anychip dtype names) for timing ``kernel``."""
    rng = np.random.default_rng(0)
    first = kernel.by_inputs[0][1] if isinstance(kernel, ir.Variants) else kernel
    shapes = {"row": (ROWS, LEN), "col": (LEN,), "per_row": (ROWS,), "col_sum": (LEN,)}
    tensors = [(ir.resolve(a.dtype, dtype), a.role) for a in first.inputs]
    tensors += [(dtype if o.dtype == "*" else ir.resolve(o.dtype, dtype), o.role) for o in first.outputs]
    arrays = [_array(d, shapes[role], rng) for d, role in tensors]
    attrs = [0.0] * 4
    if isinstance(first, ir.Rows) and first.rows.kind == "attr_axes":
        attrs[first.rows.attr:first.rows.attr + 2] = [1.0, 1.0]  # one axis: the last
    elif isinstance(first, ir.Rows) and first.rows.kind == "attr_axis":
        attrs[first.rows.attr] = -1.0
    n_in = len(first.inputs)
    return arrays[:n_in], arrays[n_in:], attrs, [d for d, _role in tensors]
