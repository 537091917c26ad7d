"""bench/bench_codegen.py stays correct: its byte counts, its target, its no-compiler evidence,
and a tiny-shape run of everything it measures (a cold build of five float32 kernels into an
empty cache, cache hits, registration, generated vs hand-written on small buffers). The full
benchmark runs with `python -m pytest bench/bench_codegen.py`."""

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SMOKE_OPS = ("rms_norm", "softmax", "add", "exp", "multiply", "matmul")


@pytest.fixture(scope="module")
def bc():
    sys.path.insert(0, str(BENCH))  # bench_codegen imports benchlib as the benches do
    try:
        yield importlib.import_module("bench_codegen")
    finally:
        sys.path.remove(str(BENCH))


def test_calls_count_bytes_and_broadcast_by_stride_zero(bc):
    norm = bc.rms_norm_call(8, 16)
    assert norm.bytes() == 4 * (8 * 16 + 16 + 8 * 16 + 8)  # x, weight; y, inv_rms
    bias = bc.binary_call("add", (8, 16), (16,))
    assert bias.broadcast and bias.bytes() == 4 * (2 * 8 * 16 + 16)
    x, y = bias.views(bias.make_inputs(np.random.default_rng(0)))
    assert x.strides == (64, 4) and y.shape == (8, 16) and y.strides == (0, 4)
    col = bc.binary_call("add", (8, 16), (8, 1))
    assert col.views(col.make_inputs(np.random.default_rng(0)))[1].strides == (4, 0)
    assert not bc.binary_call("multiply", (8, 16)).broadcast
    for case, call in bc.KERNEL_CASES:
        amount = bc.matmul_flops(call) if case.kind == "compute" else call.bytes()
        assert case.amount == amount and call.op in case.name
    assert bc.matmul_flops(bc.matmul_call(3, 5, 7, transpose_y=True)) == 2 * 3 * 5 * 7


def test_time_within_target(bc):
    t = bc.TimeWithin("handwritten", 1.25, "hand-written")
    assert t.label(None) == "time <= 1.25x hand-written"
    assert t.judge(None, {"anychip": {"ms": 12.0}, "handwritten": {"ms": 10.0}}) == ("PASS", "1.20x")
    assert t.judge(None, {"anychip": {"ms": 13.0}, "handwritten": {"ms": 10.0}}) == ("MISS", "1.30x")
    assert t.judge(None, {"anychip": {"ms": 1.0}})[0] == "n/a"


def test_no_compiler_evidence(bc, tmp_path):
    with bc.child_processes() as seen:
        subprocess.run([sys.executable, "--version"], capture_output=True, check=True)
    assert seen == [[sys.executable, "--version"]] and bc.compiles(seen) == []
    assert bc.compiles([["ninja", "-C", "x"], ["g++", "--version"]]) == [["ninja", "-C", "x"]]
    (tmp_path / "a").write_text("1")
    before = bc.snapshot(tmp_path)
    (tmp_path / "b").write_text("2")
    assert bc.written_between(before, bc.snapshot(tmp_path)) == ["b"]

    def report(**kw):
        r = bc.BuildReport(kernels=1, symbols=1, cold_s=1.0, cold_built=True, cold_foreign_load=None,
                           cold_children=["ninja -C"], hit_ms=[1.0], hit_built=[False])
        for k, v in kw.items():
            setattr(r, k, v)
        return r

    assert report().no_compiler_on_hits()[0]
    assert not report(hit_built=[False, True]).no_compiler_on_hits()[0]
    assert not report(hit_children=[["ninja", "-C", "x"]]).no_compiler_on_hits()[0]
    assert not report(hit_files_written=["lib.so"]).no_compiler_on_hits()[0]
    assert not report(fresh_process={"built": True, "children": [], "files_written": []}).no_compiler_on_hits()[0]
    assert not report(hit_built=[]).no_compiler_on_hits()[0]  # no hit measured proves nothing
    assert any("MISS" in line for line in report(hit_built=[True]).lines())


def test_tiny_build_hits_register_and_kernels(bc, tmp_path):
    import anychip_codegen as cg

    kernels = [k for k in cg.ops.library(("float32",)) if k.name in SMOKE_OPS]
    assert sorted(k.name for k in kernels) == sorted(SMOKE_OPS)
    cache = tmp_path / "cache"
    library, report = bc.cold_build(kernels, cache)
    assert library.built and report.cold_built and report.symbols == len(SMOKE_OPS) and report.cold_s > 0
    with pytest.raises(ValueError, match="empty folder"):
        bc.cold_build(kernels, cache)

    bc.cache_hits(kernels, cache, report, rounds=3)
    bc.registrations(library, report, rounds=2)
    assert report.hit_built == [False] * 3 and len(report.register_ms) == 2
    ok, why = report.no_compiler_on_hits()
    assert ok, why
    _registry, symbols = bc.register_library(library)
    assert symbols == len(SMOKE_OPS)

    calls = [bc.rms_norm_call(6, 40), bc.softmax_call(5, 33), bc.binary_call("add", (4, 50)),
             bc.binary_call("add", (4, 50), (50,)), bc.binary_call("add", (4, 50), (4, 1)),
             bc.unary_call("exp", (3, 70)), bc.binary_call("multiply", (4, 50)), bc.matmul_call(5, 40, 33),
             bc.matmul_call(1, 40, 70, transpose_y=True)]
    for call in calls:
        generated, handwritten = bc.generated_kernel(library, call.op), bc.handwritten_kernel(call.op)
        bc.check_same_result(call, generated, handwritten)
        streams = bc.Streams(call, count=2)
        run = streams.runner(generated)
        run(), run()
        assert all(np.isfinite(o).all() for o in streams.outputs)

    # the comparison can fail: neg's kernel is not exp's
    with pytest.raises(AssertionError, match="differs from the hand-written"):
        bc.check_same_result(bc.unary_call("exp", (3, 70)), bc.generated_kernel(library, "exp"),
                             bc.handwritten_kernel("neg"))
