"""The benchmark harness (bench/) stays importable and its roofline, record and summary helpers
work, on a tiny case (the benchmarks themselves run with `python -m pytest bench`)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def benchlib():
    spec = importlib.util.spec_from_file_location("anychip_benchlib_under_test", BENCH / "benchlib.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_bench_files_exist_and_are_not_default_tests():
    names = {p.name for p in BENCH.glob("bench_*.py")}
    assert {"bench_norm.py", "bench_attention.py", "bench_quant.py", "bench_misc.py"} <= names
    assert (BENCH / "conftest.py").exists() and (BENCH / "README.md").exists()
    pyproject = (BENCH.parent / "pyproject.toml").read_text()
    assert 'testpaths = ["tests"]' in pyproject  # the default run never collects bench/
    conftest = (BENCH / "conftest.py").read_text()
    assert "def pytest_collect_file" in conftest and "def pytest_terminal_summary" in conftest


def test_copy_bandwidth_tiny(benchlib):
    r = benchlib.measure_copy_bandwidth(4 * 2**20, threads=2, repeats=3)
    assert r["gbps"] > 0 and r["min_gbps"] <= r["gbps"] <= r["max_gbps"]
    assert r["threads"] == 2 and r["buffer_mb"] == 4 and "median of 3" in r["method"]
    assert r["foreign_load"] is None or 0.0 <= r["foreign_load"] <= 1.0


def test_read_bandwidth_tiny_and_read_cases_use_it(benchlib):
    r = benchlib.measure_read_bandwidth(4 * 2**20, threads=2, repeats=3)
    assert r["gbps"] > 0 and r["buffer_mb"] == 4 and "dot" in r["method"]
    roof = benchlib.Roofline(40.0, threads=2, read_gbps=20.0, read=r)
    gemv = benchlib.Case("gemv", "memory", 1e9, pattern="read", targets=(benchlib.RooflineShare(0.7),))
    assert gemv.roof(roof) == 20.0 and benchlib.Case("norm", "memory", 1e9).roof(roof) == 40.0
    assert "read bandwidth" in gemv.targets[0].label(gemv)
    assert roof.with_end({"gbps": 41.0}, {"gbps": 25.0}).read_gbps == 25.0


def test_stream_count_exceeds_twice_the_cache(benchlib):
    n = benchlib.stream_count(8 * 2**20, cache_bytes=300 * 2**20)
    assert n * 8 * 2**20 > 2 * 300 * 2**20
    assert benchlib.stream_count(10**12, cache_bytes=1) == 2
    assert benchlib.l3_bytes() > 0
    cycle = benchlib.Cycle("abc")
    assert [cycle() for _ in range(4)] == ["a", "b", "c", "a"]


def test_compute_roofs_fp32_measured_amx_only_where_the_cpu_has_it(benchlib, monkeypatch):
    monkeypatch.setattr(benchlib, "cpu_flags", lambda: {"avx2", "fma"})
    peaks = benchlib.measure_compute_peaks(threads=1, repeats=1, seconds=0.05)
    assert peaks["fp32"]["value"] > 1e9 and peaks["fp32"]["source"].startswith("measured")
    # no AMX: bf16 products run on the FP32 FMA units; int8 has no roof
    assert peaks["bf16"]["value"] == peaks["fp32"]["value"] and "no AMX-BF16" in peaks["bf16"]["source"]
    assert "int8" not in peaks
    monkeypatch.setattr(benchlib, "cpu_flags", lambda: {"amx_bf16", "amx_int8"})
    peaks = benchlib.measure_compute_peaks(threads=2, repeats=1, seconds=0.05)
    assert peaks["bf16"]["value"] == 2 * 1.8e12 and peaks["int8"]["value"] == 2 * 4.0e12
    assert peaks["int8"]["source"].startswith("documented")
    roof = benchlib.Roofline(20.0, peaks={k: v for k, v in peaks.items() if k != "int8"})
    case = benchlib.Case("w8a8", "compute", 1e9, peak="int8")
    assert case.unit == "TOP/s" and case.roof(roof) is None
    assert benchlib.Collector(roof).record(case, "anychip", [0.01])["share"] is None


def test_fma_probe_measures_the_kernels_vector_width():
    """The probe runs on the vectors the kernels use: capped to scalar it is several times slower."""
    code = ("from anychip_plugins.host import fma_peak, kernel_isa; "
            "print(kernel_isa(), max(fma_peak(1, 0.05) for _ in range(3)))")
    rates = {}
    for cap in ("scalar", "avx2"):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ANYCHIP_CPU_ISA": cap},
                             capture_output=True, text=True, check=True).stdout.split()
        rates[out[0]] = float(out[1])
    if "avx2" not in rates:
        pytest.skip("this CPU has no AVX2")
    assert rates["avx2"] > 3 * rates["scalar"] > 0


def test_read_probe_reads_every_byte():
    """anychip_cpu_read_pass or-s every byte it reads into its result, on every ISA path: a
    single nonzero byte anywhere (either side of the threads' boundaries, at 333_312 and 666_624;
    the last thread's tail past its vector loop) shows."""
    code = ("import numpy as np; from anychip_plugins.host import read_pass\n"
            "buf = np.zeros(1_000_003, np.uint8)\n"
            "assert read_pass(buf.ctypes.data, buf.nbytes, 3) == 0\n"
            "for i, bit in ((0, 1), (333_311, 2), (333_312, 4), (666_623, 8), (1_000_002, 128)):\n"
            "    buf[:] = 0; buf[i] = bit\n"
            "    assert read_pass(buf.ctypes.data, buf.nbytes, 3) != 0, i\n")
    for cap in ("scalar", "avx2", "avx512"):
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "ANYCHIP_CPU_ISA": cap}, check=True)


def test_paired_read_share_is_per_round(benchlib):
    """PairedRead times one read before each round; a row's paired share is the median over rounds
    of its rate against the read just before it, which a swing between rounds cannot skew."""
    probe = benchlib.PairedRead(2**20, 2, threads=2)
    probe.warm(2)
    assert probe.samples == []
    for _ in range(3):
        probe()
    assert len(probe.samples) == 3 and probe.gbps() > 0
    probe.samples = [1.0, 1.0, 4.0]  # the reads' times: the last round met a slow memory system
    rounds = [2.0, 1.0, 4.0]
    assert probe.share(rounds, 2**20) == pytest.approx(1.0)  # per round 0.5, 1, 1 (ratio of medians: 0.5)
    case = benchlib.Case("gemv", "memory", 2**20, pattern="read",
                         targets=(benchlib.RooflineShare(0.7, paired=True),))
    col = benchlib.Collector(benchlib.Roofline(40.0, threads=2, read_gbps=20.0))
    row = col.record(case, "anychip", rounds, paired=probe)
    assert row["paired_share"] == pytest.approx(1.0) and row["paired_read_gbps"] == pytest.approx(2**20 / 1e9)
    assert col.verdicts("gemv")[0] == {"target": ">= 70% of read bandwidth (paired: same bytes, read between the calls)",
                                       "result": "PASS", "value": "100%"}
    assert "(paired 100% of" in col.format_table()
    col.record(case, "anychip", rounds)  # timed without a probe: the paired target cannot judge it
    assert col.verdicts("gemv")[0]["result"] == "n/a"


def test_rounds_and_timing(benchlib):
    assert benchlib.plan_rounds(0.1, 1.0, 3, 100) == 10
    assert benchlib.plan_rounds(10.0, 1.0, 3, 100) == 3
    assert benchlib.plan_rounds(1e-6, 1.0, 3, 100) == 100
    samples = benchlib.time_calls(lambda: sum(range(100)), rounds=4, warmup=1)
    assert len(samples) == 4 and all(s >= 0 for s in samples)
    load = benchlib.wait_for_quiet(0.0, probe_s=0.05)  # one probe, no waiting
    assert load is None or 0.0 <= load <= 1.0


def _collector(benchlib):
    fp32 = {"value": 340e9, "what": "FP32 FMA (test)", "unit": "FLOP/s", "source": "test"}
    roof = benchlib.Roofline(20.0, threads=2, copy={"gbps": 20.0, "method": "test"}, peaks={"fp32": fp32})
    col = benchlib.Collector(roof)
    mem = benchlib.Case("norm", "memory", 2e9, targets=(benchlib.RooflineShare(0.8),))
    att = benchlib.Case("attn", "compute", 3.4e10, peak="fp32",
                        targets=(benchlib.FasterThan("torch", 1.0, "torch SDPA"),
                                 benchlib.FasterThan("dense", 2.5), benchlib.FasterThan("missing")))
    info = {}
    col.record(mem, "anychip", [0.1, 0.12, 0.11], extra_info=info, foreign_load=0.05)  # 2 GB in 0.11 s
    col.record(mem, "torch", [0.44, 0.44, 0.44], label="torch F.rms_norm")
    col.record(att, "torch", [0.5], label="torch SDPA")
    col.record(att, "anychip", [0.2])
    col.record(att, "dense", [0.4])
    col.record(mem, "fp32", [0.88], amount=8e9)  # a peer moving its own (4x) bytes
    return col, info


def test_collector_ratios_targets_and_extra_info(benchlib):
    col, info = _collector(benchlib)
    assert col.speedups("norm") == {"torch": pytest.approx(4.0), "fp32": pytest.approx(8.0)}
    assert col.results["norm"]["fp32"]["rate"] == pytest.approx(8e9 / 0.88 / 1e9)
    assert col.speedups("attn") == {"torch": pytest.approx(2.5), "dense": pytest.approx(2.0)}
    norm = col.verdicts("norm")
    assert norm[0]["result"] == "PASS" and norm[0]["value"] == "91%"  # 18.2 GB/s of 20
    attn = {v["target"]: v["result"] for v in col.verdicts("attn")}
    assert attn == {"time <= torch SDPA": "PASS", ">= 2.5x faster than dense": "MISS",
                    "time <= missing": "n/a"}
    # the anychip benchmark's extra_info caught up with the peer recorded after it
    assert info["ms"] == pytest.approx(110.0) and info["speedup_vs"] == {"torch": 4.0, "fp32": 8.0}
    assert info["roofline_share"] == pytest.approx(0.9091, abs=1e-4) and info["foreign_cpu_load"] == 0.05
    assert info["targets"][0]["result"] == "PASS"
    att = col.results["attn"]["anychip"]
    assert att["unit"] == "TFLOP/s" and att["rate"] == pytest.approx(0.17)
    assert att["share"] == pytest.approx(0.5)  # of 340 GFLOP/s


def test_summary_table_json_png(benchlib, tmp_path):
    col, _ = _collector(benchlib)
    table = col.format_table()
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["case", "implementation"]
    assert "anychip" in lines[2] and "PASS (91%)" in lines[2] and ">= 80% of copy bandwidth" in lines[2]
    assert "4.00x" in table and "MISS (2.00x)" in table and "n/a (missing not measured)" in table
    summary = json.loads(col.write_json(tmp_path / "out" / "summary.json").read_text())
    assert summary["target_counts"] == {"PASS": 2, "MISS": 1, "n/a": 1}
    assert summary["roofline"]["copy_gbps"] == 20.0 and summary["roofline"]["peaks_source"].startswith("fp32: FP32 FMA")
    assert [c["case"] for c in summary["cases"]] == ["norm", "attn"]
    png = col.write_png(tmp_path / "out" / "speedup.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
