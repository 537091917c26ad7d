"""`anychip bench collectives`: a seconds-long run (2 ranks, two small sizes) writes the table, the
JSON and the PNG with the simulated device labelled as such; the bus-bandwidth factors and the
target's verdict are nccl-tests' and the issue's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from png_helpers import png_text

from anychip_bench.bench_collectives import COLLECTIVES, bus_factor, parse_sizes, verdict

SIMULATED = "simulated (host speed)"


def test_cli_writes_table_json_and_png_labelled_simulated(tmp_path):
    run = subprocess.run([sys.executable, "-m", "anychip.cli.main", "bench", "collectives", "--nproc", "2",
                          "--device", "npu", "--sizes", "4K,64K", "--iters", "3", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = run.stdout
    for collective in COLLECTIVES:
        assert f"{collective} on npu, {SIMULATED} (busbw = algbw x " in text, text
    assert "algbw (GB/s)  busbw (GB/s)  copy (GB/s)  busbw/copy" in text
    assert f"target [npu, {SIMULATED}]: all_reduce busbw >= 50% of the host copy bandwidth" in text
    assert "n/a (no size >= 16 MiB in this run)" in text
    doc = json.loads((tmp_path / "collectives.json").read_text())
    assert doc["device_label"] == f"npu, {SIMULATED}" and doc["simulated"] and doc["nproc"] == 2
    assert [c["bytes"] for c in doc["copy"]] == [4096, 65536] and all(c["copy_gbps"] > 0 for c in doc["copy"])
    assert {(r["collective"], r["bytes"]) for r in doc["rows"]} >= {("all_reduce", 4096), ("broadcast", 65536)}
    assert len(doc["rows"]) == 8
    for r in doc["rows"]:
        assert r["ok"] and r["time_us"] > 0 and r["device_label"] == f"npu, {SIMULATED}"
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(r["collective"], 2))
        assert r["share_of_copy"] == pytest.approx(r["busbw_gbps"] / r["copy_gbps"])
    assert SIMULATED in png_text(tmp_path / "collectives.png")["Title"]
    markdown = (tmp_path / "collectives.md").read_text()
    assert markdown.startswith(f"# anychip bench collectives: npu, {SIMULATED}")
    assert f"## all_reduce on npu, {SIMULATED}" in markdown
    assert "![busbw and copy bandwidth](collectives.png)" in markdown


def test_bus_factors_sizes_and_the_target():
    assert [bus_factor(c, 4) for c in COLLECTIVES] == [1.5, 0.75, 0.75, 1.0]
    assert parse_sizes("64K,4k,1M") == (4096, 65536, 1 << 20)
    with pytest.raises(ValueError, match="--sizes: expected sizes like 4K,1M,64M"):
        parse_sizes("4X")
    rows = [{"collective": "all_reduce", "bytes": b, "busbw_gbps": bw, "copy_gbps": 10.0, "share_of_copy": bw / 10}
            for b, bw in ((1 << 20, 1.0), (16 << 20, 6.0), (64 << 20, 4.0))]
    miss = verdict(rows, 2, "npu")
    assert miss["result"] == "MISS" and "16 MiB: 6.00 of 10.00 GB/s = 60%, 64 MiB: 4.00 of 10.00 GB/s = 40%" \
        in miss["detail"] and "1.25x the busbw needed at 64 MiB" in miss["detail"]
    rows[2]["share_of_copy"] = 0.5
    assert verdict(rows, 2, "npu")["result"] == "PASS"
    assert verdict(rows, 3, "npu")["result"] == "n/a"
