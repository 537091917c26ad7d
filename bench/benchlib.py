"""The anychip benchmark harness: the machine's roofline, the record of every measurement, the
targets, and the summary (terminal table, JSON, PNG chart).

Plain numpy and the standard library at import (Paddle, torch and matplotlib are imported
where they are used), so ``tests/test_bench_harness.py`` can check it quickly.

Conventions
  - A case is one piece of work (an op on fixed shapes) done by several implementations: the
    subject (``anychip``) and its peers, all measured in the same run.
  - Memory-bound cases count the minimum bytes the work must move (each input read once, each
    output written once) and are judged in GB/s against the copy bandwidth measured in this run.
    Compute-bound cases count the useful FLOPs (masked-out work excluded) and are judged against
    the compute roofs (PEAK_UNITS): FP32 FMA measured in this run, AMX documented.
  - ``speedup`` of a peer = peer time / anychip time: above 1 means anychip is faster.
  - Targets are reported PASS / MISS, never asserted: these machines are shared and noisy.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# One module under both of its names: the pytest benches import it as ``benchlib`` (conftest.py
# puts bench/ on sys.path), the installed package's modules as ``anychip_bench.benchlib``; two
# copies would hold two sets of classes and Paddle handles.
if __name__ == "benchlib":
    sys.modules.setdefault("anychip_bench.benchlib", sys.modules[__name__])

SUBJECT = "anychip"
THREADS = int(os.environ.get("ANYCHIP_BENCH_THREADS", min(2, os.cpu_count() or 1)))

# Compute roofs, by the number format of a case's products. "fp32" is measured in the run
# (measure_compute_peaks: FMA chains on the kernels' vector width). The AMX roofs are the
# per-core peaks documented for the AMX CPU of shared/notes/platform-facts.md ("Measured peaks,
# per core"; upper ends of the ranges), x threads, and apply only where this CPU has the unit:
# without AMX-BF16, bfloat16 products run on the FP32 FMA units, so the fp32 roof is theirs;
# without AMX-INT8 there is no int8 roof (shares n/a).
PEAK_UNITS = {"fp32": "FLOP/s", "bf16": "FLOP/s", "int8": "OP/s"}
AMX_PEAKS_PER_CORE = {"bf16": (1.8e12, "AMX-BF16", "amx_bf16"), "int8": (4.0e12, "AMX-INT8", "amx_int8")}


# --------------------------------------------------------------------------------------------
# Paddle (imported on first use only)

_paddle = None


def paddle_mod():
    """Paddle, imported through anychip (which registers its devices), with THREADS CPU threads."""
    global _paddle
    if _paddle is None:
        from anychip.frontends.paddle import import_paddle

        _paddle = import_paddle()
        _paddle.base.core.set_num_threads(THREADS)  # Paddle's import sets OMP_NUM_THREADS=1
    return _paddle


def aligned_empty_like(array: np.ndarray) -> np.ndarray:
    """An uninitialised array like ``array`` starting on a 64-byte boundary, as Paddle's
    allocations do (numpy only guarantees 16, and kernels may pick a faster path when aligned)."""
    raw = np.empty(array.nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)


def host_tensor(array, dtype: str | None = None, grad: bool = False):
    """A Paddle tensor on the host CPU (explicit place: Paddle's default place is a custom device
    once anychip registers them), cast to ``dtype`` on the host."""
    p = paddle_mod()
    t = p.to_tensor(np.ascontiguousarray(array), place=p.CPUPlace())
    if dtype is not None and str(t.dtype).removeprefix("paddle.") != dtype:
        t = t.astype(dtype)
    t.stop_gradient = not grad
    return t


# --------------------------------------------------------------------------------------------
# The machine


def cpu_model() -> str:
    """The host CPU as anychip's cpu device reports it."""
    from anychip.devices import describe

    return describe("cpu").model


def l3_bytes(default: int = 300 * 2**20) -> int:
    """The largest cache's size (sysfs), or ``default`` when the system does not say."""
    best = 0
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in root.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if text[-1:].isalpha() else text
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best or default


def cpu_flags() -> set[str]:
    """The host CPU's feature flags (/proc/cpuinfo); empty where the system does not say."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# Paddle 3.3.1's CPU fused_rms_norm (phi::fusion::RmsNormAvxKernel) runs AVX-512 instructions
# without checking for them: on a CPU without AVX-512 the process dies of SIGILL.
PADDLE_FUSED_RMS_NORM_NEEDS = "avx512f"
PADDLE_FUSED_RMS_NORM_MISSING = ("Paddle's CPU fused_rms_norm uses AVX-512 without checking for it (SIGILL on "
                                 "this CPU, which has none)")


def machine_info() -> dict:
    return {
        "cpu": cpu_model(),
        "hardware": "real host CPU (not simulated)",
        "logical_cpus": os.cpu_count(),
        "last_level_cache_mb": round(l3_bytes() / 2**20),
        "python": platform.python_version(),
    }


def stream_count(bytes_each: int, cache_bytes: int | None = None, factor: float = 2.0, minimum: int = 2) -> int:
    """How many distinct buffers of ``bytes_each`` to cycle through so that the set exceeds
    ``factor`` x the last-level cache, so each use comes from DRAM, not from the cache."""
    cache = l3_bytes() if cache_bytes is None else cache_bytes
    return max(minimum, math.ceil(factor * cache / max(1, bytes_each)) + 1)


def _parallel_bandwidth(pass_fn, threads: int, repeats: int, nbytes: int, buffer_bytes: int, method: str) -> dict:
    """Times ``repeats`` passes in which ``threads`` Python threads each run ``pass_fn(i)`` (numpy
    releases the GIL) after one pass that touches every page; ``nbytes`` moved per pass."""
    barrier = threading.Barrier(threads + 1)

    def work(i):
        for _ in range(repeats + 1):
            barrier.wait()
            pass_fn(i)
            barrier.wait()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    meter = ForeignLoad().start()
    for w in workers:
        w.start()
    samples = []
    for r in range(repeats + 1):
        barrier.wait()
        t0 = time.perf_counter()
        barrier.wait()
        if r:  # the first pass pays the page faults
            samples.append(time.perf_counter() - t0)
    for w in workers:
        w.join()
    rates = sorted(nbytes / s / 1e9 for s in samples)
    return {
        "gbps": nbytes / statistics.median(samples) / 1e9,
        "min_gbps": rates[0], "max_gbps": rates[-1],
        "buffer_mb": round(buffer_bytes / 2**20), "threads": threads, "repeats": repeats,
        "foreign_load": meter.stop(), "method": f"{method}, median of {repeats}",
    }


def _slices(n: int, threads: int) -> list[slice]:
    bounds = np.linspace(0, n, threads + 1).astype(np.int64)
    return [slice(bounds[i], bounds[i + 1]) for i in range(threads)]


def measure_copy_bandwidth(buffer_bytes: int, threads: int = 2, repeats: int = 9) -> dict:
    """STREAM-style copy bandwidth: ``threads`` Python threads each ``np.copyto`` one slice of a
    ``buffer_bytes`` array into another. Bytes counted as STREAM does: read + written =
    2 x buffer_bytes per pass. The roofline of a kernel that reads and writes (RMSNorm)."""
    n = max(threads, buffer_bytes // 4)
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)
    parts = _slices(n, threads)
    return _parallel_bandwidth(
        lambda i: np.copyto(dst[parts[i]], src[parts[i]]), threads, repeats, 2 * src.nbytes, src.nbytes,
        f"{threads}-thread numpy copy of a {src.nbytes / 2**20:.0f} MB buffer into another, bytes = read + written")


def measure_read_bandwidth(buffer_bytes: int, threads: int = 2, repeats: int = 9) -> dict:
    """Read bandwidth: ``threads`` Python threads each take the dot product of one slice of a
    float32 buffer with itself (BLAS streams it once). Bytes counted: the buffer, once per pass.
    The roofline of a kernel that streams its input and writes little (decode GEMV)."""
    n = max(threads, buffer_bytes // 4)
    buf = np.empty(n, np.float32)
    buf.fill(0.5)  # real pages (np.zeros' untouched pages would all map the one zero page)
    parts = _slices(n, threads)
    return _parallel_bandwidth(
        lambda i: np.dot(buf[parts[i]], buf[parts[i]]), threads, repeats, buf.nbytes, buf.nbytes,
        f"{threads}-thread numpy dot of each half of a {buf.nbytes / 2**20:.0f} MB float32 buffer with "
        "itself, bytes = read")


class PairedRead:
    """The read roofline of a streaming case, taken at the moment it runs: before each timed
    round of an implementation, one plain read (the cpu plugin's ``anychip_cpu_read_pass``, the
    same threads) of ``nbytes``, from the next of ``count`` buffers placed as the weights are (2
    MB pages where :func:`anychip.host_memory.huge_pages_for` can), so each read is as cold as the
    round's weights. On a shared VM the bandwidth swings 2x within seconds (one 9-pass probe of
    the run's roofline ran 17-61 GB/s); a share of a roofline measured minutes apart measures
    that swing as much as the kernel, a share of the read between its rounds does not."""

    def __init__(self, nbytes: int, count: int, threads: int):
        from anychip.host_memory import huge_pages_for
        from anychip_plugins.host import read_pass

        self.nbytes, self.threads, self._read = int(nbytes), threads, read_pass
        self._buffers = [host_tensor(np.ones(self.nbytes, np.uint8)) for _ in range(count)]
        huge_pages_for(self._buffers)
        self._next = Cycle([t.data_ptr() for t in self._buffers])
        self.samples: list[float] = []

    def __call__(self) -> None:
        """One timed read (a pytest-benchmark ``setup``: it runs untimed by the benchmark)."""
        address = self._next()
        t0 = time.perf_counter()
        self._read(address, self.nbytes, self.threads)
        self.samples.append(time.perf_counter() - t0)

    def warm(self, reads: int) -> None:
        """Untimed reads, as the warmup calls of the implementation it pairs with."""
        for _ in range(reads):
            self()
        self.samples.clear()

    def gbps(self) -> float:
        """The median read's rate."""
        return self.nbytes / statistics.median(self.samples) / 1e9

    def share(self, rounds_s, nbytes: float) -> float:
        """The median over rounds of (``nbytes`` / the round's time) / (the rate of the read just
        before it): each round against the bandwidth of its own moment, so that a swing in the
        middle of the rounds cancels instead of landing on one side of a ratio of medians."""
        return statistics.median(nbytes / t * r / self.nbytes for t, r in zip(rounds_s, self.samples))


def measure_compute_peaks(threads: int = 2, repeats: int = 3, seconds: float = 0.5) -> dict:
    """The compute roofs (see PEAK_UNITS): per key, ``value`` (FLOP/s or OP/s for all
    ``threads``), ``what`` and ``source``. fp32: the best of ``repeats`` runs of the cpu
    plugin's FMA probe (anychip_cpu_fma_peak)."""
    from anychip_plugins.host import fma_peak, kernel_isa

    meter = ForeignLoad().start()
    fp32 = max(fma_peak(threads, seconds) for _ in range(repeats))
    load = meter.stop()
    fp32_entry = {"value": fp32, "what": f"FP32 FMA ({kernel_isa()})", "unit": "FLOP/s",
                  "source": f"measured: {threads}-thread FMA chains on the kernels' vectors, best of {repeats} x "
                            f"{seconds:g} s (other load {'unknown' if load is None else f'{load:.0%}'})"}
    peaks = {"fp32": fp32_entry}
    flags = cpu_flags()
    for key, (per_core, name, flag) in AMX_PEAKS_PER_CORE.items():
        if flag in flags:
            peaks[key] = {"value": per_core * threads, "what": name, "unit": PEAK_UNITS[key],
                          "source": f"documented per-core peak (shared/notes/platform-facts.md) x {threads} threads"}
        elif key == "bf16":
            peaks[key] = dict(fp32_entry, source=f"no {name} on this CPU: bfloat16 products run on the FP32 FMA "
                                                 f"units; {fp32_entry['source']}")
    return peaks


@dataclass
class Roofline:
    """The memory rooflines: ``copy_gbps`` for kernels that read and write about equally
    (RMSNorm), ``read_gbps`` for kernels that stream their input (decode GEMV); each the best
    of its measurements at the run's start and end (the least disturbed one). ``peaks``: the
    compute roofs (measure_compute_peaks)."""

    copy_gbps: float
    threads: int = 2
    copy: dict = field(default_factory=dict)
    copy_end: dict | None = None
    read_gbps: float | None = None
    read: dict = field(default_factory=dict)
    read_end: dict | None = None
    peaks: dict = field(default_factory=dict)

    def with_end(self, end: dict, read_end: dict | None = None) -> "Roofline":
        read_gbps = self.read_gbps
        if read_end is not None and read_gbps is not None:
            read_gbps = max(read_gbps, read_end["gbps"])
        return Roofline(max(self.copy_gbps, end["gbps"]), self.threads, self.copy, end,
                        read_gbps, self.read, read_end, self.peaks)

    def memory(self, pattern: str) -> float:
        if pattern == "read":
            if self.read_gbps is None:
                raise ValueError("no read bandwidth was measured in this run")
            return self.read_gbps
        return self.copy_gbps

    def peak(self, key: str) -> float | None:
        """The compute roof ``key`` (all threads), None where this CPU has none (or none was measured)."""
        entry = self.peaks.get(key)
        return None if entry is None else entry["value"]

    def describe(self) -> dict:
        return {
            "copy_gbps": round(self.copy_gbps, 2),
            "copy": self.copy,
            "copy_end": self.copy_end,
            "read_gbps": None if self.read_gbps is None else round(self.read_gbps, 2),
            "read": self.read,
            "read_end": self.read_end,
            "peaks": self.peaks,
            "peaks_source": peaks_summary(self.peaks),
        }


def measure_roofline(buffer_bytes: int, threads: int) -> Roofline:
    """The host's roofline at the start of a run: copy and read bandwidth over ``buffer_bytes``
    buffers (beyond the last-level cache) and the compute roofs."""
    copy = measure_copy_bandwidth(buffer_bytes, threads=threads)
    read = measure_read_bandwidth(buffer_bytes, threads=threads)
    return Roofline(copy["gbps"], threads=threads, copy=copy, read_gbps=read["gbps"], read=read,
                    peaks=measure_compute_peaks(threads))


def peaks_summary(peaks: dict) -> str:
    """The compute roofs in one line, each with where it comes from."""
    if not peaks:
        return "no compute roofs measured"
    return "; ".join(f"{k}: {p['what']} {p['value'] / 1e12:.2f} T{p['unit']} ({p['source']})" for k, p in peaks.items())


def cpu_busy_seconds() -> float | None:
    """CPU seconds all CPUs have been busy since boot (/proc/stat), None where unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class ForeignLoad:
    """How busy the CPUs were with work of other processes between start() and stop(): the
    busy time of all CPUs (/proc/stat) minus this process's own CPU time, as a share of
    wall time x CPUs. Other processes on a 2-core machine slow a 2-thread measurement a lot
    (an OpenMP barrier waits for a descheduled thread), so each result carries it."""

    def __init__(self):
        self._t0 = None

    @staticmethod
    def _snapshot():
        busy = cpu_busy_seconds()
        if busy is None:
            return None
        own = os.times()
        return time.perf_counter(), busy, own.user + own.system

    def start(self) -> "ForeignLoad":
        self._t0 = self._snapshot()
        return self

    def stop(self) -> float | None:
        """Foreign CPU load in [0, 1] since start(), or None where /proc/stat is unreadable."""
        t1 = self._snapshot()
        if self._t0 is None or t1 is None:
            return None
        wall = t1[0] - self._t0[0]
        if wall <= 0:
            return None
        foreign = (t1[1] - self._t0[1]) - (t1[2] - self._t0[2])
        return min(1.0, max(0.0, foreign / (wall * (os.cpu_count() or 1))))


def wait_for_quiet(max_wait_s: float, threshold: float = 0.10, probe_s: float = 0.5) -> float | None:
    """Waits (up to ``max_wait_s``) until other processes use less than ``threshold`` of the
    CPUs over a ``probe_s`` window; returns the last load seen (None: not measurable)."""
    deadline = time.perf_counter() + max_wait_s
    load = None
    while True:
        meter = ForeignLoad().start()
        time.sleep(probe_s)
        load = meter.stop()
        if load is None or load < threshold or time.perf_counter() >= deadline:
            return load


# --------------------------------------------------------------------------------------------
# Cases, targets, results


@dataclass(frozen=True)
class RooflineShare:
    """PASS when anychip reaches ``share`` of the case's roofline (copy bandwidth or peak).
    ``paired``: of the read bandwidth that :class:`PairedRead` measured between anychip's own
    rounds (a read case whose rows were timed with ``paired_read``), not of the run's roofline."""

    share: float
    paired: bool = False

    def label(self, case) -> str:
        if self.paired:
            return f">= {self.share:.0%} of read bandwidth (paired: same bytes, read between the calls)"
        what = f"{case.pattern} bandwidth" if case.kind == "memory" else f"the {case.peak} compute roof"
        return f">= {self.share:.0%} of {what}"

    def judge(self, case, rows) -> tuple[str, str]:
        key = "paired_share" if self.paired else "share"
        me = rows.get(SUBJECT)
        if me is None or me.get(key) is None:
            return "n/a", "anychip not measured" if me is None else f"anychip has no {key.replace('_', ' ')}"
        return ("PASS" if me[key] >= self.share else "MISS"), f"{me[key]:.0%}"


@dataclass(frozen=True)
class FasterThan:
    """PASS when anychip's time x ``factor`` <= the peer's time (speedup >= factor)."""

    peer: str
    factor: float = 1.0
    peer_label: str = ""

    def label(self, case) -> str:
        who = self.peer_label or self.peer
        if self.factor == 1.0:
            return f"time <= {who}"
        return f">= {self.factor:g}x faster than {who}"

    def judge(self, case, rows) -> tuple[str, str]:
        me, peer = rows.get(SUBJECT), rows.get(self.peer)
        if me is None or peer is None:
            return "n/a", f"{'anychip' if me is None else self.peer} not measured"
        speedup = peer["ms"] / me["ms"]
        return ("PASS" if speedup >= self.factor else "MISS"), f"{speedup:.2f}x"


@dataclass(frozen=True)
class Case:
    """One piece of work. ``kind`` "memory" (``amount`` = bytes, judged against the roofline of
    its access ``pattern``: "copy" for read + write, "read" for a streamed input) or "compute"
    (``amount`` = FLOPs or integer OPs, judged against ``peak``, a key of PEAK_UNITS)."""

    name: str
    kind: str
    amount: float
    peak: str | None = None
    targets: tuple = ()
    note: str = ""
    pattern: str = "copy"

    @property
    def unit(self) -> str:
        if self.kind == "memory":
            return "GB/s"
        return "TOP/s" if PEAK_UNITS[self.peak] == "OP/s" else "TFLOP/s"

    def rate(self, seconds: float) -> float:
        return self.amount / seconds / (1e9 if self.kind == "memory" else 1e12)

    def roof(self, roofline: Roofline) -> float | None:
        """The roofline in this case's unit (None: this CPU has no roof for the case's products)."""
        if self.kind == "memory":
            return roofline.memory(self.pattern)
        peak = roofline.peak(self.peak)
        return peak / 1e12 if peak else None


def _shares(row: dict) -> str:
    """A row's roofline share, and its paired read share where it has one."""
    share = "" if row.get("share") is None else f"{row['share']:.0%}"
    if row.get("paired_share") is None:
        return share
    return f"{share} (paired {row['paired_share']:.0%} of {row['paired_read_gbps']:.1f} GB/s)".lstrip()


class Collector:
    """Every measurement of the run, by case and implementation, in the order measured."""

    def __init__(self, roofline: Roofline | None = None):
        self.roofline = roofline
        self.cases: dict[str, Case] = {}
        self.results: dict[str, dict[str, dict]] = {}
        self._extra: dict[tuple[str, str], dict] = {}

    def record(self, case: Case, impl: str, samples_s, extra_info: dict | None = None, label: str = "",
               notes: str = "", foreign_load: float | None = None, amount: float | None = None,
               paired: "PairedRead | None" = None) -> dict:
        """Records the timings (seconds) of ``impl`` on ``case``; with ``extra_info`` (a
        pytest-benchmark ``benchmark.extra_info``), fills it in, and keeps the speedups in every
        extra_info of the case up to date as more implementations are measured. ``amount``:
        the bytes (or FLOPs) this implementation itself moves, where they differ from the
        case's (an fp32 peer of a 4-bit kernel): its rate and roofline share use them.
        ``paired``: the :class:`PairedRead` timed before each of its rounds (its share:
        :meth:`PairedRead.share`)."""
        self.cases.setdefault(case.name, case)
        med = statistics.median(samples_s)
        own = case.amount if amount is None else amount
        row = {"impl": impl, "label": label or impl, "ms": med * 1e3, "rounds": len(samples_s),
               "min_ms": min(samples_s) * 1e3, "rate": own / med / (1e9 if case.kind == "memory" else 1e12),
               "amount": own, "unit": case.unit, "notes": notes, "foreign_load": foreign_load}
        if paired is not None and paired.samples:
            row["paired_read_gbps"] = paired.gbps()
            row["paired_share"] = paired.share(samples_s, own)
        if self.roofline is not None:
            roof = case.roof(self.roofline)
            row["share"] = None if roof is None else row["rate"] / roof
        self.results.setdefault(case.name, {})[impl] = row
        if extra_info is not None:
            self._extra[(case.name, impl)] = extra_info
        self._refresh(case.name)
        return row

    def set_roofline(self, roofline: Roofline) -> None:
        """Replaces the roofline and recomputes every share (and every extra_info)."""
        self.roofline = roofline
        for name, rows in self.results.items():
            for row in rows.values():
                roof = self.cases[name].roof(roofline)
                row["share"] = None if roof is None else row["rate"] / roof
            self._refresh(name)

    def speedups(self, case_name: str) -> dict[str, float]:
        """peer -> peer time / anychip time, for the peers of a case measured so far."""
        rows = self.results.get(case_name, {})
        me = rows.get(SUBJECT)
        if me is None:
            return {}
        return {impl: r["ms"] / me["ms"] for impl, r in rows.items() if impl != SUBJECT}

    def verdicts(self, case_name: str) -> list[dict]:
        case, rows = self.cases[case_name], self.results.get(case_name, {})
        out = []
        for t in case.targets:
            result, value = t.judge(case, rows)
            out.append({"target": t.label(case), "result": result, "value": value})
        return out

    def _refresh(self, case_name: str) -> None:
        case = self.cases[case_name]
        speedups = self.speedups(case_name)
        for impl, row in self.results[case_name].items():
            info = self._extra.get((case_name, impl))
            if info is None:
                continue
            info.update({
                "case": case_name, "impl": impl, "label": row["label"], "ms": round(row["ms"], 4),
                case.unit: round(row["rate"], 4),
            })
            if row.get("share") is not None:
                info["roofline_share"] = round(row["share"], 4)
            if row.get("paired_share") is not None:
                info["paired_read_gbps"] = round(row["paired_read_gbps"], 3)
                info["paired_read_share"] = round(row["paired_share"], 4)
            if row.get("foreign_load") is not None:
                info["foreign_cpu_load"] = round(row["foreign_load"], 3)
            if impl == SUBJECT:
                info["speedup_vs"] = {p: round(s, 3) for p, s in speedups.items()}
                info["targets"] = self.verdicts(case_name)
            elif impl in speedups:
                info["anychip_speedup"] = round(speedups[impl], 3)

    # ---- output

    def table_rows(self) -> list[dict]:
        """One row per (case, implementation), anychip first, then its peers; each case's
        targets on its first rows (extra blank rows if it has more targets than rows)."""
        rows = []
        for name in self.cases:
            results = self.results.get(name, {})
            speedups = self.speedups(name)
            block = []
            for r in sorted(results.values(), key=lambda r: r["impl"] != SUBJECT):
                block.append({
                    "case": "", "impl": r["label"], "ms": r["ms"], "rate": f"{r['rate']:.3g} {r['unit']}",
                    "share": _shares(r),
                    "speedup": f"{speedups[r['impl']]:.2f}x" if r["impl"] in speedups else "",
                    "foreign": "" if r.get("foreign_load") is None else f"{r['foreign_load']:.0%}",
                    "target": "", "result": ""})
            verdicts = self.verdicts(name)
            while len(block) < max(1, len(verdicts)):
                block.append({"case": "", "impl": "", "ms": None, "rate": "", "share": "", "speedup": "",
                              "foreign": "", "target": "", "result": ""})
            for r, v in zip(block, verdicts):
                r["target"], r["result"] = v["target"], f"{v['result']} ({v['value']})"
            block[0]["case"] = name
            rows.extend(block)
        return rows

    def format_table(self) -> str:
        head = ["case", "implementation", "ms (median)", "rate", "roofline", "anychip speedup", "other load",
                "target", "result"]
        body = [[r["case"], r["impl"], "" if r["ms"] is None else f"{r['ms']:.3f}", r["rate"], r["share"],
                 r["speedup"], r["foreign"], r["target"], r["result"]] for r in self.table_rows()]
        widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(head)]
        fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        lines = [fmt(head), fmt(["-" * w for w in widths])]
        for b in body:
            if b[0] and len(lines) > 2:
                lines.append("")
            lines.append(fmt(b))
        return "\n".join(lines)

    def summary(self, machine: dict | None = None) -> dict:
        cases = []
        for name, case in self.cases.items():
            cases.append({
                "case": name, "kind": case.kind, "unit": case.unit, "note": case.note,
                "amount": case.amount, "peak": case.peak,
                "results": self.results.get(name, {}),
                "speedup_vs": self.speedups(name),
                "targets": self.verdicts(name),
            })
        counts = {"PASS": 0, "MISS": 0, "n/a": 0}
        for c in cases:
            for t in c["targets"]:
                counts[t["result"]] = counts.get(t["result"], 0) + 1
        return {
            "machine": machine or machine_info(),
            "roofline": self.roofline.describe() if self.roofline else None,
            "speedup": "peer time / anychip time (above 1: anychip faster)",
            "targets_are": "reported, not asserted (shared, noisy machines: 10-20% run to run)",
            "target_counts": counts,
            "cases": cases,
        }

    def write_json(self, path: Path, machine: dict | None = None) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.summary(machine), indent=2, default=str) + "\n")
        return path

    def write_png(self, path: Path) -> Path | None:
        """A horizontal bar chart of anychip's speedup over each peer (log scale); None without
        matplotlib or without any pair to plot."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        bars = []  # (label, speedup, case index)
        for ci, name in enumerate(self.cases):
            for peer, sp in self.speedups(name).items():
                if self.results[name][peer]["label"].startswith("(diagnostic)"):
                    continue  # anychip's kernel without the framework: not a peer
                bars.append((f"{name}\nvs {self.results[name][peer]['label']}", sp, ci))
        if not bars:
            return None
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(13, 0.55 * len(bars) + 1.8))
        values = [b[1] for b in bars]
        y = np.arange(len(bars))[::-1]
        shade = ["#2a9d8f", "#457b9d"]
        ax.barh(y, values, color=[shade[b[2] % 2] if b[1] >= 1 else "#e63946" for b in bars])
        ax.set_yticks(y, [b[0] for b in bars], fontsize=7)
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", lw=0.8)
        for yi, v in zip(y, values):
            ax.text(v, yi, f" {v:.2f}x", va="center", fontsize=7)
        ax.set_xlabel("anychip speedup = peer time / anychip time (log scale; > 1: anychip faster, red: slower)")
        roof = f", copy {self.roofline.copy_gbps:.1f} GB/s" if self.roofline else ""
        ax.set_title(f"anychip vs peers, measured in the same run on {cpu_model()} (real hardware){roof}",
                     fontsize=9)
        fig.subplots_adjust(left=0.42, right=0.95, top=1 - 0.5 / fig.get_figheight(),
                            bottom=0.9 / fig.get_figheight())
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


# --------------------------------------------------------------------------------------------
# Timing


class Cycle:
    """Hands out ``items`` in turn, one per call: each round of a streamed benchmark takes the
    next of enough distinct buffers (see :func:`stream_count`) that none is still cached."""

    def __init__(self, items):
        self.items, self.i = list(items), 0

    def __call__(self):
        item = self.items[self.i % len(self.items)]
        self.i += 1
        return item


def time_calls(fn, rounds: int, warmup: int = 1) -> list[float]:
    """Seconds of each of ``rounds`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def plan_rounds(estimate_s: float, budget_s: float, min_rounds: int = 3, max_rounds: int = 200) -> int:
    """Rounds that fit ``budget_s`` at ``estimate_s`` a call, within [min_rounds, max_rounds]."""
    if estimate_s <= 0:
        return max_rounds
    return int(min(max_rounds, max(min_rounds, math.floor(budget_s / estimate_s + 1e-9))))
