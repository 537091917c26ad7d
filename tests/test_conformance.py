"""The conformance kit's op checks, report, CLI and pytest plugin: a simulated chip passes, and
each check catches the break it exists for (a wrong kernel, a raising one, a missing backward,
a missing kernel, a broken e2e entry point)."""

import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest

from anychip.conformance import FAIL, FALLBACK, NOT_DECLARED, PASS, SKIPPED, Result, run_e2e
from anychip.conformance.report import Report
from anychip.ops.support import OPS

# Zeroes the last column of rms_norm's output after the real kernel ran: a tail-loop bug.
BREAK_RMS_NORM_TAIL = """
from anychip.ops.dispatch import launch
from anychip.plugins import registry

def break_rms_norm_tail(kernels, device="npu", dtype="float32"):
    real = kernels.find("rms_norm", device, dtype)

    def forward(inputs, outputs, attrs):
        launch(real.forward, "rms_norm", (device, 0), inputs, outputs, attrs)
        outputs[0][..., -1] = 0.0

    kernels._kernels.pop(("rms_norm", device, dtype))
    kernels.register("rms_norm", device, [dtype], forward, real.backward)
"""
namespace = {}
exec(BREAK_RMS_NORM_TAIL, namespace)
break_rms_norm_tail = namespace["break_rms_norm_tail"]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_SIM_CHECK"}
    return env | extra


@pytest.fixture
def kernels(monkeypatch):
    """The kernel registry, as it was before the test once the test ends."""
    from anychip.plugins import registry

    reg = registry().kernels
    monkeypatch.setattr(reg, "_kernels", dict(reg._kernels))
    return reg


def by_key(results):
    return {(r.name, r.dtype, r.direction): r for r in results}


# ---- the CLI ------------------------------------------------------------------------------------


def test_cli_passes_on_a_simulated_chip_and_writes_the_matrix(tmp_path):
    out = subprocess.run([sys.executable, "-m", "anychip.cli.main", "conformance", "--device", "npu", "--out",
                          str(tmp_path)], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "anychip conformance: npu (simulated)" in out.stdout
    assert "anychip conformance npu (simulated): PASSED" in out.stdout
    report = json.loads((tmp_path / "conformance.json").read_text())
    assert report["device"] == "npu" and report["simulated"] and report["passed"] and report["plugin"] == "npu"
    assert {r["section"] for r in report["results"]} == {"runtime", "op", "e2e"}
    op_rows = {(r["name"], r["dtype"], r["direction"]) for r in report["results"] if r["section"] == "op"}
    from anychip.ops import definitions

    want = {(op, d, x) for op, spec in definitions().items() for d in spec.dtypes
            for x in (("fwd", "bwd") if spec.backward else ("fwd",))}
    assert op_rows == want
    markdown = (tmp_path / "conformance.md").read_text()
    assert markdown.startswith("# anychip conformance: npu (simulated)")
    assert "| `rms_norm` | pass | pass | pass | pass | pass | pass |" in markdown


@pytest.mark.parametrize("argv, message", [
    (["--device", "npu", "--ops", "rms_norm,nope"], "argument --ops: unknown op 'nope'; choose from adamw_step, attention,"),
    (["--device", "npu", "--dtypes", "float64"], "argument --dtypes: unknown dtype 'float64'"),
    (["--device", "npu", "--skip", "ops"], "argument --skip: unknown section 'ops'; choose from runtime, op, e2e"),
])
def test_cli_bad_arguments_exit_2_naming_them(capsys, argv, message):
    from anychip.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["conformance", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("device, message", [
    ("nope", "--device nope: unknown device 'nope'; known devices: cpu,"),
    ("npu:7", "--device npu:7: device 'npu:7' cannot be checked on this machine: device index 7 out of range"),
])
def test_cli_bad_device_exits_2_naming_it(capsys, device, message):
    from anychip.cli.main import main

    assert main(["conformance", "--device", device]) == 2
    assert message in capsys.readouterr().err


# ---- the op checks ----------------------------------------------------------------------------


def test_every_op_has_cases_for_every_dtype():
    from anychip.conformance import cases

    for op, spec in OPS.items():
        for dtype in spec.dtypes:
            assert cases.cases(op, dtype), (op, dtype)
        if spec.backward:
            assert any(c.grads for c in cases.cases(op, spec.dtypes[0])), op


def test_an_op_cannot_be_defined_without_cases():
    from dataclasses import replace

    with pytest.raises(ValueError, match=r"op 'swiglu': cases must be a function"):
        replace(OPS["swiglu"], cases=None)


def test_a_wrong_kernel_fails_naming_the_case_output_and_worst_element(kernels):
    from anychip.conformance.op_checks import run_ops

    break_rms_norm_tail(kernels)
    results = by_key(run_ops("npu", ops=["rms_norm"], dtypes=["float32"]))
    fwd = results["rms_norm", "float32", "fwd"]
    assert fwd.status == FAIL and fwd.max_error > 0.1
    lines = fwd.detail.splitlines()
    assert len(lines) == 5  # every case fails, each on its own line
    assert lines[2].startswith("case 3/5 'width 257 (not a multiple of a vector)' (x[5, 257], weight[257]; "
                               "eps=1e-05): output 0 (y): 5 of 1285 elements outside tolerance")
    assert "worst at [2, 256]: got 0, want" in lines[2]  # the last column, in every case
    assert results["rms_norm", "float32", "bwd"].status == PASS  # the backward kernel is fine
    text = Report("npu", list(results.values()), simulated=True).matrix_text()
    assert re.search(rf"\nrms_norm +{re.escape(f'FAIL {fwd.max_error:.1e}')} +pass\n", text)
    assert "Failures:\n  op rms_norm float32 fwd: case 1/5 'one element'" in text


def test_a_wrong_backward_kernel_fails_naming_the_gradient(kernels):
    from anychip.conformance.op_checks import run_ops
    from anychip.ops.dispatch import launch

    real = kernels.find("rms_norm", "npu", "float32")

    def backward(inputs, outputs, attrs):  # forgets the first row of dx
        launch(real.backward, "rms_norm_grad", ("npu", 0), inputs, outputs, attrs)
        outputs[0][0] = 0.0

    kernels._kernels.pop(("rms_norm", "npu", "float32"))
    kernels.register("rms_norm", "npu", ["float32"], real.forward, backward)
    results = by_key(run_ops("npu", ops=["rms_norm"], dtypes=["float32"]))
    assert results["rms_norm", "float32", "fwd"].status == PASS
    bwd = results["rms_norm", "float32", "bwd"]
    assert bwd.status == FAIL
    assert "case 2/5 'prime width, residual'" in bwd.detail and "gradient of x: 17 of 51 elements" in bwd.detail
    assert "gradient of residual: 17 of 51 elements" in bwd.detail  # the same dh
    assert "gradient of weight" not in bwd.detail  # computed apart, still right


def test_integer_outputs_compare_as_codes():
    import numpy as np

    from anychip.conformance.op_checks import compare

    want = (np.arange(2000) % 200 - 100).astype(np.int8).reshape(40, 50)
    one_off = want.copy()
    one_off[3, 7] += 1  # a value at a .5 boundary rounded the other way: allowed (2 of 2000 may)
    assert compare(one_off, want, 0, 0) == (1.0, "")
    two_off = want.copy()
    two_off[3, 7] += 2
    assert "worst at [3, 7]: got" in compare(two_off, want, 0, 0)[1]
    assert compare(want + np.int8(1), want, 0, 0)[1].startswith("2000 of 2000 codes differ (at most 2 may")


def test_a_raising_kernel_fails_and_the_run_goes_on(kernels):
    from anychip.conformance.op_checks import run_ops

    real = kernels.find("swiglu", "npu", "float32")

    def boom(inputs, outputs, attrs):
        raise RuntimeError("boom: no such instruction")

    kernels._kernels.pop(("swiglu", "npu", "float32"))
    kernels.register("swiglu", "npu", ["float32"], boom, real.backward)
    results = by_key(run_ops("npu", ops=["swiglu", "rms_norm"], dtypes=["float32"]))
    fwd = results["swiglu", "float32", "fwd"]
    assert fwd.status == FAIL and fwd.max_error is None
    assert "raised RuntimeError: boom: no such instruction" in fwd.detail
    assert results["swiglu", "float32", "bwd"].status == SKIPPED
    assert results["rms_norm", "float32", "fwd"].status == PASS


def test_a_kernel_without_backward_is_a_fallback(kernels):
    from anychip.conformance.op_checks import run_ops

    real = kernels.find("rms_norm", "npu", "float32")
    kernels._kernels.pop(("rms_norm", "npu", "float32"))
    kernels.register("rms_norm", "npu", ["float32"], real.forward)
    results = by_key(run_ops("npu", ops=["rms_norm"], dtypes=["float32"]))
    assert results["rms_norm", "float32", "fwd"].status == PASS
    bwd = results["rms_norm", "float32", "bwd"]
    assert bwd.status == FALLBACK
    assert "the backward ran the Paddle reference on npu instead of a kernel" in bwd.detail
    assert "anychip.rms_norm_grad fallbacks" in bwd.detail


def test_an_op_without_a_kernel_is_not_declared(kernels):
    from anychip.conformance.op_checks import run_ops

    kernels._kernels.pop(("swiglu", "npu", "float16"))
    results = run_ops("npu", ops=["swiglu"], dtypes=["float16"])
    assert [(r.direction, r.status) for r in results] == [("fwd", NOT_DECLARED), ("bwd", NOT_DECLARED)]
    assert "npu registers no swiglu kernel for float16, so the op runs its Paddle reference" in results[0].detail
    assert re.search(r"\nswiglu +— +—\n", Report("npu", results).matrix_text())


# ---- e2e entry points ---------------------------------------------------------------------------


class FakeEntryPoint:
    def __init__(self, name, load):
        self.name, self.value, self._load = name, f"vendor_pkg.{name}", load

    def load(self):
        return self._load()


class Module:
    def __init__(self, run=None):
        if run is not None:
            self.run = run


def _raise(exc):
    raise exc


@pytest.mark.parametrize("load, message", [
    (lambda: _raise(ImportError("no module named vendor_pkg")),
     "loading entry point 'vendor_pkg.broken' raised ImportError: no module named vendor_pkg"),
    (lambda: Module(), "entry point 'vendor_pkg.broken' has no run(device) -> list[Result]"),
    (lambda: Module(lambda device: _raise(ValueError(f"{device} fell over"))),
     "vendor_pkg.broken.run('npu') raised ValueError: npu fell over"),
    (lambda: Module(lambda device: "ok"), "broken.run returned str, expected a list of anychip.conformance.Result"),
])
def test_a_broken_e2e_entry_point_is_a_failure_naming_it(load, message):
    (result,) = run_e2e("npu", FakeEntryPoint("broken", load))
    assert (result.section, result.name, result.status) == ("e2e", "broken", FAIL)
    assert message in result.detail


# ---- the report -------------------------------------------------------------------------------


def test_report_cells_labels_and_json():
    results = [
        Result("runtime", "streams_keep_order", PASS),
        Result("op", "swiglu", PASS, "float32", "fwd", 1e-7),
        Result("op", "swiglu", FAIL, "float32", "bwd", 3.1e-2, "case 1/3 'x': gradient of up: ...\ncase 2/3 'y': ..."),
        Result("op", "swiglu", FALLBACK, "bfloat16", "fwd", 0.0, "the forward ran the Paddle reference"),
        Result("op", "swiglu", NOT_DECLARED, "bfloat16", "bwd"),
        Result("op", "adamw_step", FAIL, "float32", "fwd", math.inf, "case 1/3: output 0 (param0): got nan"),
        Result("e2e", "llama", FAIL, max_error=2e-3, detail="loss differs | from cpu"),
    ]
    report = Report("mychip", results, simulated=True, plugin="mychip", package="anychip-mychip 0.1.0")
    text = report.matrix_text()
    assert text.startswith("anychip conformance: mychip (simulated)\n  plugin: mychip (package anychip-mychip 0.1.0)")
    assert re.search(r"\nswiglu +pass +FAIL 3\.1e-02 +fallback +—\nadamw_step +FAIL inf +· +· +·\n", text)
    assert "  streams_keep_order  pass" in text and "  llama  FAIL 2.0e-03" in text
    assert "  op swiglu float32 bwd: case 1/3 'x': gradient of up: ...\n    case 2/3 'y': ..." in text
    assert text.endswith("anychip conformance mychip (simulated): FAILED (2 pass, 3 fail, 1 fallback, "
                         "1 not declared)")
    markdown = report.markdown()
    assert "# anychip conformance: mychip (simulated)" in markdown
    assert "| `swiglu` | pass | FAIL 3.1e-02 | fallback | — |" in markdown
    assert "| llama | fail | 2.0e-03 | loss differs \\| from cpu |" in markdown
    data = json.loads(report.as_json())
    assert data["passed"] is False and data["simulated"] is True and data["counts"]["fail"] == 3
    assert data["results"][5]["max_error"] == "inf"
    assert report.exit_code == 1 and Report("cpu", results[:2]).exit_code == 0


# ---- the pytest plugin --------------------------------------------------------------------------


def test_pytest_plugin_runs_the_checks_as_items_from_any_folder(tmp_path):
    """A folder with no tests; its conftest breaks npu's float32 rms_norm, so one item fails
    with the check's detail and the others pass. Plugin autoload is off: -p names it."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(BREAK_RMS_NORM_TAIL) + textwrap.dedent("""
        break_rms_norm_tail(registry().kernels)
    """))
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "anychip_conformance", "-p", "no:cacheprovider",
                          "--anychip-device=npu", "--anychip-ops", "rms_norm", "--anychip-skip", "runtime,e2e",
                          "-q", "-rA"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=clean_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"))
    assert out.returncode == 1, out.stdout[-4000:] + out.stderr[-2000:]
    assert "1 failed, 5 passed" in out.stdout
    assert "PASSED anychip-conformance[npu]::rms_norm[bfloat16-bwd]" in out.stdout
    assert "FAILED anychip-conformance[npu]::rms_norm[float32-fwd]" in out.stdout
    assert "rms_norm float32 fwd: fail, max |error|" in out.stdout
    assert "worst at [2, 256]: got 0" in out.stdout
    assert "anychip conformance npu (simulated): FAILED (5 pass, 1 fail)" in out.stdout


@pytest.mark.parametrize("device", ["xpu", "npu", "gcu", "dcu"])
def test_every_base_op_passes_on_every_simulated_chip(device):
    """Each chip's base kernels (hand-written on xpu, generated on npu, mixed on gcu and dcu)
    against the references, broadcasting and odd shapes included (the cases)."""
    from anychip.conformance.op_checks import run_ops
    from anychip.ops import BASE_OPS

    results = run_ops(device, ops=list(BASE_OPS))
    assert [r for r in results if r.status == FAIL] == []
    assert sum(r.status == PASS for r in results) > 100
