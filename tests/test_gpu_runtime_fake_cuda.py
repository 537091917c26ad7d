"""The gpu plugin's CUDA runtime (plugins/gpu/cuda_runtime.cc) keeps the device.h contract, run
here without a GPU: tests/fake_cuda/fake_cudart.c stands in for libcudart over host memory, found
first through LD_LIBRARY_PATH. What this checks is the plugin's own part, its bookkeeping (the
runtime book) and argument handling; CUDA itself is only run on a machine with a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

FAKE = Path(__file__).with_name("fake_cuda") / "fake_cudart.c"


@pytest.fixture(scope="module")
def fake_cuda_env(tmp_path_factory) -> dict:
    compiler = sysconfig.get_config_var("CC") or "cc"
    compiler = compiler.split()[0]
    if shutil.which(compiler) is None:
        compiler = "cc"
    folder = tmp_path_factory.mktemp("fake_cuda")
    subprocess.run([compiler, "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
                    str(folder / "libcudart.so"), str(FAKE)], check=True)
    paths = [str(folder)] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    return dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(paths))


def run(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_the_runtime_contract_holds(fake_cuda_env):
    result = subprocess.run([sys.executable, "-m", "anychip.cli.main", "conformance", "--device", "gpu",
                             "--sections", "runtime"], capture_output=True, text=True, env=fake_cuda_env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "anychip conformance gpu: PASSED (13 pass)" in result.stdout, result.stdout


def test_the_book_keeps_handles_and_allocations(fake_cuda_env):
    """Beyond the contract checks: a stream waits on another device's event (CUDA allows it), a
    handle of one device is refused on another, and a double free names the pointer."""
    code = """
import ctypes, anychip.runtime as rt
gpu0, gpu1 = rt.open_device("gpu:0"), rt.open_device("gpu:1")
stream0, stream1 = gpu0.stream(), gpu1.stream()
event1 = gpu1.event().record(stream1)
stream0.wait_event(event1)
try:
    gpu0.call("stream_query", stream1.handle)
except rt.InvalidArgumentError as e:
    print("foreign stream:", e)
buf = gpu0.allocate(1000)
ptr = buf.ptr
print("allocated", gpu0.memory_stats().allocated_bytes)
buf.free()
try:
    gpu0.call("device_free", ctypes.c_void_p(ptr))
except rt.InvalidArgumentError as e:
    print("double free:", e)
print("after free", gpu0.memory_stats().allocated_bytes)
"""
    result = run(code, fake_cuda_env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "foreign stream: " in out and "is not a live stream of this device" in out, out
    assert "allocated 1024" in out, out  # charged in whole 256-byte chunks
    assert "double free: " in out and "is not a live allocation (double free" in out, out
    assert "after free 0" in out, out
