"""The conformance kit's "collectives" section: it passes on a simulated chip (ranks as devices of
one process and as processes), catches and names a wrong collective, and reports a plugin built
against ABI 1.1 (no collectives) as skipped, not failed."""

import json
import shutil
import subprocess
import sys

import pytest

import anychip.runtime as rt
from anychip.conformance import DEFAULT_SECTIONS, FAIL, PASS, SKIPPED, collectives, run_collectives
from anychip.conformance.report import Report
from anychip.runtime.collectives import Communicator
from collective_helpers import old_abi_runtime

NAMES = {"send_recv_order", "group", "missing_rank_times_out"}


def test_the_section_passes_on_npu_from_the_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "anychip.cli.main", "conformance", "--device", "npu", "--sections",
                          "collectives", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Collectives (device.h ABI 1.2)" in out.stdout
    assert "  all_reduce bfloat16" in out.stdout
    assert "anychip conformance npu (simulated): PASSED (57 pass)" in out.stdout
    report = json.loads((tmp_path / "conformance.json").read_text())
    results = report["results"]
    assert {r["section"] for r in results} == {"collectives"}
    assert all(r["status"] == PASS for r in results), [r for r in results if r["status"] != PASS]
    dtypes = rt.open_device("npu:0").properties.dtypes
    assert {(r["name"], r["dtype"]) for r in results if r["dtype"]} == \
        {(c, d) for c in collectives.COLLECTIVES for d in dtypes}
    assert {r["name"] for r in results if not r["dtype"]} == NAMES
    by_name = {r["name"]: r for r in results if not r["dtype"]}
    # both ways of running ranks were used: the chip has 2 devices, so world 3 ran as processes
    assert "2 ranks on devices 0..1 of one process; 3 ranks as processes" in by_name["group"]["detail"]
    assert "not arrived: 1" in by_name["missing_rank_times_out"]["detail"]
    assert "| all_reduce float16 | pass |" in (tmp_path / "conformance.md").read_text()


def test_the_section_is_not_in_the_default_run():
    assert "collectives" not in DEFAULT_SECTIONS


def test_a_wrong_all_reduce_is_caught_and_named(monkeypatch):
    """A plugin whose all_reduce computes max for sum: every dtype where that differs fails,
    naming the case, the rank and the element; the other collectives still pass."""
    original = Communicator.all_reduce

    def wrong(self, send, recv, count, dtype, op, stream):
        return original(self, send, recv, count, dtype, "max" if op == "sum" else op, stream)

    monkeypatch.setattr(Communicator, "all_reduce", wrong)
    results = collectives.run("npu", world_sizes=(2,))
    failed = {(r.name, r.dtype) for r in results if r.status == FAIL}
    dtypes = set(rt.open_device("npu:0").properties.dtypes) - {"bool"}  # or == max on bool
    assert failed == {("all_reduce", d) for d in dtypes} | {("group", None)}, failed
    detail = next(r.detail for r in results if (r.name, r.dtype) == ("all_reduce", "float32"))
    assert "all_reduce, float32, world 2 (devices), count 1, op sum, out of place: rank 0: recv element 0 is" in detail
    assert next(r for r in results if (r.name, r.dtype) == ("all_reduce", "bool")).status == PASS
    assert next(r for r in results if (r.name, r.dtype) == ("reduce", "float32")).status == PASS


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_plugin_built_against_abi_1_1_is_skipped_not_failed(tmp_path):
    old = rt.Device(old_abi_runtime(tmp_path), 0)
    (result,) = run_collectives(old)
    assert (result.section, result.name, result.status) == ("collectives", "plugin", SKIPPED)
    assert result.detail.startswith("no collectives (ABI 1.1): oldchip's plugin leaves the collective functions")
    report = Report("oldchip", [result], simulated=True)
    text = report.matrix_text()
    assert "Collectives (device.h ABI 1.2)\n  plugin  skipped" in text
    assert "Skipped:\n  collectives plugin: no collectives (ABI 1.1)" in text
    assert text.endswith("anychip conformance oldchip (simulated): PASSED (1 skipped)")
    assert report.exit_code == 0


def test_a_timeout_that_does_not_name_the_missing_rank_fails(monkeypatch):
    def vague(dev, comm, stream, rank, n, params):
        return {"error": "AnychipError: all_reduce timed out (ANYCHIP_COLLECTIVE_TIMEOUT=1 s)", "elapsed": 1.0} \
            if rank == 0 else {}

    monkeypatch.setitem(collectives.PROGRAMS, "missing", vague)
    result = collectives._missing_result("npu", 2, True, None)
    assert result.status == FAIL
    assert result.detail.startswith("the error does not name the missing rank 1: AnychipError: all_reduce timed out")
