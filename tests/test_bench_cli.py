"""`anychip bench` and `anychip bench compare` from the command line: a tiny run on the host and a
simulated chip writes valid JSON, Markdown and PNGs with the simulated device labelled as such;
compare flags a slowdown beyond the threshold and passes identical runs; bad arguments say
which argument is wrong and what was expected."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from png_helpers import png_text

SIMULATED = "simulated (host speed)"
OPS = ("rms_norm", "weight_only_linear")


def anychip(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "anychip.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    result = anychip("bench", "--devices", "cpu,npu", "--ops", ",".join(OPS), "--shapes", "tiny", "--repeats", "2",
                     "--warmup", "1", "--copy-mb", "8", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_bench_writes_json_with_every_device_and_implementation(run_dir):
    out, _ = run_dir
    doc = json.loads((out / "bench.json").read_text())
    assert doc["format"] == "anychip-bench/1" and doc["settings"]["shapes"] == "tiny"
    assert doc["roofline"]["copy_gbps"] > 0 and doc["roofline"]["read_gbps"] > 0
    devices = {d["device"]: d for d in doc["devices"]}
    assert devices["cpu"]["status"] == "hardware" and devices["cpu"]["label"] == "cpu"
    assert devices["npu"]["simulated"] and devices["npu"]["label"] == f"npu, {SIMULATED}"
    cases = {c["case"]: c for c in doc["cases"]}
    assert {c["op"] for c in cases.values()} == set(OPS)
    assert len(cases) == 4  # rms_norm; int4 and int8 GEMV and the int4 prefill GEMM
    for case in cases:
        for device in ("cpu", "npu"):
            rows = {r["impl"]: r for r in doc["records"] if r["case"] == case and r["device"] == device}
            assert {"anychip", "reference"} <= set(rows), (case, device, sorted(rows))
            # a peer ran beside anychip, or the case says why none could here (Paddle's
            # fused_rms_norm needs AVX-512; torch may be absent)
            assert any(r["role"] == "peer" for r in rows.values()) or cases[case]["unavailable"], (case, device)
            me = rows["anychip"]
            assert me["where"] == device and not me["fallback"] and me["ms"] > 0 and me["rate"] > 0
            assert me["speedup_vs_reference"] == pytest.approx(rows["reference"]["ms"] / me["ms"])
            assert me["roofline_share"] is not None and me["roofline_basis"]
            for r in rows.values():
                if r["role"] != "anychip":
                    assert r["where"] == "cpu"  # the reference of a simulated chip and the peers: on the host
                    assert r["anychip_speedup"] == pytest.approx(r["ms"] / me["ms"])
    for r in doc["records"]:
        assert r["simulated"] == (r["device"] == "npu")
        if r["simulated"]:
            assert SIMULATED in r["device_label"] and "host CPU" in r["roofline_basis"]


def test_bench_writes_markdown_terminal_table_and_labelled_charts(run_dir):
    out, result = run_dir
    md = (out / "bench.md").read_text()
    assert md.startswith("# anychip bench") and f"| npu, {SIMULATED} |" in md
    assert "![roofline](roofline.png)" in md and all(f"## {op}" in md and f"![{op}]({op}.png)" in md for op in OPS)
    assert f"npu, {SIMULATED}" in result.stdout and "anychip speedup" in result.stdout
    for name in (*OPS, "roofline"):
        title = png_text(out / f"{name}.png")["Title"]
        assert f"npu: {SIMULATED}" in title, (name, title)


def test_compare_passes_identical_runs_and_flags_an_injected_regression(run_dir, tmp_path):
    out, _ = run_dir
    same = anychip("bench", "compare", str(out / "bench.json"), str(out / "bench.json"))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "REGRESSION" not in same.stdout and "0 regression(s) beyond 10%" in same.stdout

    doc = json.loads((out / "bench.json").read_text())
    slowed = next(r for r in doc["records"] if r["role"] == "anychip" and r["device"] == "npu")
    slowed["ms"] *= 1.5
    nudged = next(r for r in doc["records"] if r["role"] == "anychip" and r["device"] == "cpu")
    nudged["ms"] *= 1.05  # within the threshold
    after = tmp_path / "after.json"
    after.write_text(json.dumps(doc))
    result = anychip("bench", "compare", str(out / "bench.json"), str(after), "--threshold", "0.1")
    assert result.returncode == 1, result.stdout + result.stderr
    flagged = [line for line in result.stdout.splitlines() if "REGRESSION" in line]
    assert len(flagged) == 1 and slowed["case"] in flagged[0] and SIMULATED in flagged[0], result.stdout
    assert "1 regression(s) beyond 10%" in result.stdout
    # a looser threshold lets the same slowdown through
    assert anychip("bench", "compare", str(out / "bench.json"), str(after), "--threshold", "0.6").returncode == 0


def test_hardware_is_rated_against_its_declared_peaks_the_host_and_simulated_chips_against_the_host():
    """A hardware device other than the host gets the share of the peaks its plugin declares
    (DeviceSpec.peaks), or none (no GPU is needed: the document is built from recorded timings)."""
    from anychip_bench import benchlib, report
    from anychip_bench.cases import Target, build_cases

    (case,) = build_cases("tiny", "float32", ["rms_norm"])
    roofline = benchlib.Roofline(20.0, threads=2, read_gbps=15.0)
    targets = [Target("cpu", 0, "hardware", "host", True), Target("npu", 0, "simulated", "910B", False),
               Target("gpu", 0, "hardware", "H200", False, (("memory_gbps", 4800.0),)),
               Target("gpu", 1, "hardware", "H200", False)]
    collectors, listed = {}, {}
    for t in targets:
        collectors[t.key] = benchlib.Collector(roofline if t.host or t.simulated else None)
        collectors[t.key].record(case.harness_case(), "anychip", [1e-3, 2e-3], label="anychip ops.rms_norm")
        listed[(case.name, "anychip", t.key)] = (t.key, "anychip", "anychip ops.rms_norm", False)
    doc = report.document([case], targets, collectors, listed, {}, roofline, {}, {})
    rows = {r["device"]: r for r in doc["records"]}
    assert rows["gpu"]["roofline_share"] == pytest.approx(case.bytes / 1.5e-3 / 1e9 / 4800.0)
    assert rows["gpu"]["roofline_basis"].startswith("declared peak 4800 GB/s (memory_gbps")
    assert rows["gpu:1"]["roofline_share"] is None and rows["gpu:1"]["roofline_basis"] == "no declared peak"
    assert rows["cpu"]["roofline_share"] == pytest.approx(case.bytes / 1.5e-3 / 1e9 / 20.0)
    assert rows["npu"]["roofline_share"] == rows["cpu"]["roofline_share"]
    assert "host copy bandwidth 20.0 GB/s" in rows["npu"]["roofline_basis"]
    gpu_row = next(r for r in report.table_rows(doc) if r[1] == "gpu:1")
    assert gpu_row[5] == "no declared peak"


def test_declared_peaks_are_checked():
    from anychip import DeviceSpec

    with pytest.raises(ValueError, match="unknown key 'hbm'"):
        DeviceSpec("chip", "a chip", "lib.so", peaks={"hbm": 1.0})
    with pytest.raises(ValueError, match=r"peaks\['bfloat16_tflops'\] must be a positive number"):
        DeviceSpec("chip", "a chip", "lib.so", peaks={"bfloat16_tflops": 0})
    assert DeviceSpec("chip", "a chip", "lib.so", peaks={"float32_tflops": 67.0}).peaks["float32_tflops"] == 67.0


@pytest.mark.parametrize("args,message", [
    (["--ops", "rms_norm,softmax"], "--ops: unknown op(s) 'softmax'; choose from rms_norm, attention"),
    (["--devices", "cpu,tpu"], "--devices: unknown device 'tpu'; known devices: cpu"),
    (["--shapes", "huge"], "argument --shapes: invalid choice: 'huge' (choose from 'tiny', 'smollm2', 'llama-7b')"),
    (["--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
])
def test_bad_arguments_name_the_argument_and_the_choices(args, message):
    result = anychip("bench", *args, "--out", "/nonexistent/never-written")
    assert result.returncode in (1, 2) and message in result.stderr, result.stderr


def test_compare_rejects_a_file_that_is_not_a_bench_result(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"cases": []}))
    result = anychip("bench", "compare", str(other), str(other))
    assert result.returncode == 1 and f"{other}: not a bench.json written by `anychip bench`" in result.stderr
    missing = anychip("bench", "compare", str(tmp_path / "missing.json"), str(other))
    assert missing.returncode == 1 and "missing.json: no such file" in missing.stderr
