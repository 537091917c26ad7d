"""pytest configuration of the anychip benchmarks (``python -m pytest bench -q``).

Not part of the default test run (pyproject's ``testpaths`` is ``tests``). Collects ``bench_*.py``
here, measures the machine's copy bandwidth once per session (the memory roofline), times
anychip and its peers with pytest-benchmark, and ends with a summary table (terminal, JSON, PNG)
in ``--bench-out``. Targets are reported PASS/MISS, never asserted.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# Before Paddle (and its OpenMP runtime) loads. Paddle's own CPU fallbacks write device memory
# directly, so the simulated-memory guard the tests use stays off here. KMP_BLOCKTIME=0: Paddle's
# Intel OpenMP workers sleep right after a parallel region instead of spinning for 200 ms on the
# cores that anychip's and torch's GNU OpenMP threads need next (2 cores, 2 runtimes).
os.environ.pop("ANYCHIP_SIM_CHECK", None)
os.environ.setdefault("KMP_BLOCKTIME", "0")

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402

import benchlib  # noqa: E402
from benchlib import THREADS, paddle_mod  # noqa: E402

COLLECTOR = pytest.StashKey[benchlib.Collector]()
STATE = pytest.StashKey[dict]()


def pytest_addoption(parser):
    group = parser.getgroup("anychip-bench", "anychip benchmarks")
    group.addoption("--bench-out", default=".benchmarks/anychip",
                    help="folder for summary.json and speedup.png (default: .benchmarks/anychip)")
    group.addoption("--bench-copy-mb", type=int, default=0,
                    help="size of each copy-bandwidth buffer in MB (default: max(256, 2 x last-level cache): the source alone must not fit in the cache, since the copy's non-temporal stores bypass it)")
    group.addoption("--bench-budget", type=float, default=1.5,
                    help="seconds of timed rounds per implementation (within each case's min/max rounds)")
    group.addoption("--bench-no-torch", action="store_true", help="skip the torch peers")
    group.addoption("--bench-wait-quiet", type=float, default=0.0, metavar="S",
                    help="before timing each implementation, wait up to S seconds for other processes "
                         "to use < 10%% of the CPUs (default 0: do not wait)")


def pytest_collect_file(file_path, parent):
    # A file named on the command line is collected by pytest's python plugin already.
    if file_path.suffix == ".py" and file_path.name.startswith("bench_") and not parent.session.isinitpath(file_path):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_configure(config):
    config.stash[STATE] = {"start": time.time(), "torch": None, "load": benchlib.ForeignLoad().start()}


# ---------------------------------------------------------------------------------------------
# Paddle and torch, each with THREADS threads


@pytest.fixture(scope="session")
def pd():
    return paddle_mod()


@pytest.fixture(scope="session")
def torch(request, pd):
    """torch in this process (after Paddle), THREADS threads; skips its peers when it is
    missing or --bench-no-torch. Both share GNU OpenMP; Paddle brings Intel OpenMP."""
    state = request.config.stash[STATE]
    if request.config.getoption("--bench-no-torch"):
        state["torch"] = "off (--bench-no-torch)"
        pytest.skip("--bench-no-torch")
    # torch's switch for 2 MB pages under its large CPU tensors: its peers then stream weights
    # from the same kind of pages as anychip's bound weights and numpy's roofline probe.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    try:
        import torch as torch_mod
    except Exception as e:  # noqa: BLE001 -- a broken install is as good as none here
        state["torch"] = f"not available ({type(e).__name__}: {e})"
        pytest.skip(f"torch is not available: {e}")
    torch_mod.set_num_threads(THREADS)
    state["torch"] = (f"torch {torch_mod.__version__}, in this process, {torch_mod.get_num_threads()} threads, "
                      f"THP_MEM_ALLOC_ENABLE={os.environ['THP_MEM_ALLOC_ENABLE']}")
    return torch_mod


# ---------------------------------------------------------------------------------------------
# Roofline and the recording runner


@pytest.fixture(scope="session")
def roofline(request):
    mb = request.config.getoption("--bench-copy-mb") or max(256, 2 * -(-benchlib.l3_bytes() // 2**20))
    r = benchlib.measure_roofline(mb * 2**20, THREADS)
    collector = request.config.stash[COLLECTOR]
    collector.roofline = r
    yield r
    # After the last benchmark, before pytest-benchmark saves its JSON: measure again, keep the
    # better of the two as the roofline (the less disturbed one) and rescore every result.
    end = benchlib.measure_copy_bandwidth(mb * 2**20, threads=THREADS, repeats=5)
    read_end = benchlib.measure_read_bandwidth(mb * 2**20, threads=THREADS, repeats=5)
    collector.set_roofline(r.with_end(end, read_end))


class Runner:
    """Times one implementation of a case with ``benchmark.pedantic`` and records it."""

    def __init__(self, config, collector: benchlib.Collector):
        self.config, self.collector = config, collector
        self.budget = config.getoption("--bench-budget")
        self.wait_quiet = config.getoption("--bench-wait-quiet")
        # The PairedRead of the last run() (None without paired_read): for a caller that records
        # the same rounds under another case and implementation.
        self.last_probe = None

    def run(self, benchmark, case: benchlib.Case, impl: str, fn, label: str = "", min_rounds: int = 5,
            max_rounds: int = 100, warmup: int = 2, budget_s: float | None = None, notes: str = "",
            also=(), amount: float | None = None, paired_read: bool = False):
        """Times ``fn`` (no arguments) and records it as ``impl`` of ``case``, and of each case in
        ``also`` (the same work measured once: e.g. one fp32 peer compared with several
        quantized variants). Rounds: what ``--bench-budget`` allows at the first call's time.
        ``amount``: this implementation's own bytes or FLOPs where they differ from the case's.
        ``paired_read`` (memory cases): a :class:`benchlib.PairedRead` of the same bytes before
        each round, for the rows' paired read share."""
        import anychip

        paddle_mod()
        if self.wait_quiet > 0:
            benchlib.wait_for_quiet(self.wait_quiet)
        before = anychip.fallback_counts()
        # Untimed calls: the first one (page faults, caches, lazy setup), then the warmup (just
        # one when a call is slow), the last of which sizes the rounds in the steady state.
        t0 = time.perf_counter()
        fn()
        estimate = time.perf_counter() - t0
        for _ in range(warmup if estimate < 0.25 else min(warmup, 1)):
            t0 = time.perf_counter()
            fn()
            estimate = time.perf_counter() - t0
        rounds = benchlib.plan_rounds(estimate, self.budget if budget_s is None else budget_s,
                                      min_rounds, max_rounds)
        benchmark.group = case.name
        probe = None
        if paired_read and case.kind == "memory":
            nbytes = case.amount if amount is None else amount
            probe = benchlib.PairedRead(nbytes, benchlib.stream_count(nbytes), THREADS)
            probe.warm(warmup)
        meter = benchlib.ForeignLoad().start()
        benchmark.pedantic(fn, setup=probe, rounds=rounds, warmup_rounds=0, iterations=1)
        foreign = meter.stop()
        self.last_probe = probe
        stats = getattr(benchmark, "stats", None)
        samples = list(stats.stats.data) if stats is not None else benchlib.time_calls(fn, rounds, 0)
        fell = {k: v - before.get(k, 0) for k, v in anychip.fallback_counts().items()
                if k[1].startswith("anychip.") and v != before.get(k, 0)}
        if fell:
            ops = ", ".join(sorted({f"{k[1]}/{k[2]}" for k in fell}))
            label = f"{label or impl} [FALLBACK to reference: {ops}]"
            notes = (notes + "; " if notes else "") + f"fallbacks: {ops}"
        for other in also:
            self.collector.record(other, impl, samples, None, label=label, notes=notes, foreign_load=foreign,
                                  amount=amount, paired=probe)
        return self.collector.record(case, impl, samples, benchmark.extra_info, label=label, notes=notes,
                                     foreign_load=foreign, amount=amount, paired=probe)


@pytest.fixture(scope="session")
def bench(request, roofline, pd):
    return Runner(request.config, request.config.stash[COLLECTOR])


def pytest_sessionstart(session):
    session.config.stash[COLLECTOR] = benchlib.Collector()


# ---------------------------------------------------------------------------------------------
# The summary


def _pct(x) -> str:
    return "?" if x is None else f"{x:.0%}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    collector = config.stash.get(COLLECTOR, None)
    if collector is None or not collector.cases:
        return
    tr = terminalreporter
    state = config.stash[STATE]
    machine = benchlib.machine_info()
    machine["threads_per_implementation"] = THREADS
    machine["torch"] = state.get("torch") or "not used"
    if "paddle" in sys.modules:
        machine["paddle"] = f"paddle {sys.modules['paddle'].__version__}, {THREADS} threads (core.set_num_threads)"
    machine["host_malloc"] = (
        "glibc defaults (ANYCHIP_HOST_MALLOC=system)" if os.environ.get("ANYCHIP_HOST_MALLOC") == "system" else
        "freed memory kept for reuse (anychip's mallopt policy, process-wide: peers get it too)")
    session_load = state["load"].stop()
    machine["foreign_cpu_load_during_run"] = session_load
    tr.section("anychip benchmarks: anychip vs peers, measured in this run")
    tr.write_line(f"device: cpu = {machine['cpu']} ({machine['hardware']}), {THREADS} threads for every "
                  f"implementation; LLC {machine['last_level_cache_mb']} MB")
    tr.write_line(f"peers: {machine.get('paddle', 'paddle')}; torch: {machine['torch']}; host malloc: "
                  f"{machine['host_malloc']}")
    if collector.roofline:
        r = collector.roofline
        end = r.copy_end or {}
        tr.write_line(f"memory roofline: copy {r.copy_gbps:.1f} GB/s, the better of {r.copy['gbps']:.1f} GB/s at the "
                      f"start (range {r.copy['min_gbps']:.1f}-{r.copy['max_gbps']:.1f}, other load "
                      f"{_pct(r.copy['foreign_load'])}) and {end.get('gbps', float('nan')):.1f} GB/s at the end "
                      f"(other load {_pct(end.get('foreign_load'))}); {r.copy['method']}")
        if r.read_gbps is not None:
            read_end = r.read_end or {}
            tr.write_line(f"read roofline: {r.read_gbps:.1f} GB/s, the better of {r.read['gbps']:.1f} GB/s at the "
                          f"start and {read_end.get('gbps', float('nan')):.1f} GB/s at the end; {r.read['method']}")
        tr.write_line(f"compute roofs: {benchlib.peaks_summary(r.peaks)}")
    tr.write_line("speedup = peer time / anychip time (> 1: anychip faster); roofline = share of copy "
                  "bandwidth (GB/s rows that read and write), of read bandwidth (GB/s rows that stream "
                  "their input: GEMV) or of the compute roof (TFLOP/s, TOP/s rows); paired = share of a plain "
                  "read of the same bytes timed before each round (GEMV rows; what their targets judge)")
    tr.write_line(f"other load = CPU time of other processes while it was timed, share of all CPUs (whole run: "
                  f"{_pct(session_load)}); above ~10% the 2-thread figures are unreliable, rerun on a quiet machine")
    tr.write_line("targets are reported, not asserted: these machines are shared and noisy (10-20% run to run, "
                  "2-3x under foreign load)")
    tr.write_line("")
    for line in collector.format_table().splitlines():
        tr.write_line(line)
    summary = collector.summary(machine)
    counts = summary["target_counts"]
    tr.write_line("")
    tr.write_line(f"targets: {counts.get('PASS', 0)} PASS, {counts.get('MISS', 0)} MISS, "
                  f"{counts.get('n/a', 0)} n/a")
    out = Path(config.getoption("--bench-out"))
    json_path = collector.write_json(out / "summary.json", machine)
    png_path = collector.write_png(out / "speedup.png")
    if png_path:
        why = ""
    else:
        import importlib.util

        why = (" (no PNG: no anychip-vs-peer pair measured)" if importlib.util.find_spec("matplotlib")
               else " (no PNG: matplotlib is not installed)")
    tr.write_line(f"written: {json_path}" + (f", {png_path}" if png_path else why))
