"""host_memory.huge_pages_for: large host weights move onto 2 MB pages, values untouched; small
ones, other devices' and everything under ANYCHIP_HUGE_PAGES=off stay where they are."""

import os

import numpy as np
import pytest

from ops_helpers import host, paddle, tensor

paddle()

import anychip.ops as ops  # noqa: E402
from anychip.host_memory import huge_pages_for  # noqa: E402
from anychip.ops.quant import quantize_numpy  # noqa: E402


def collapsing_works() -> bool:
    """What this machine allows: THP not "never", and MADV_COLLAPSE (Linux 6.1)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return False
    major, minor = (int(v) for v in os.uname().release.split(".")[:2])
    return mode != "never" and (major, minor) >= (6, 1)


def huge_kb_at(address: int) -> int:
    """AnonHugePages of the mapping that holds ``address``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                lo, hi = (int(v, 16) for v in first.split("-"))
                inside = lo <= address < hi
            elif inside and first == "AnonHugePages:":
                return int(line.split()[1])
    raise AssertionError(f"{address:#x} is in no mapping")


def test_large_host_tensor_moves_whole_and_keeps_its_values(monkeypatch):
    monkeypatch.delenv("ANYCHIP_HUGE_PAGES", raising=False)
    values = np.random.default_rng(0).integers(0, 256, 9 << 20, dtype=np.uint8)  # 9 MB: odd 2 MB ranges
    t = tensor(values, "cpu")
    moved = huge_pages_for([t, None])
    assert np.array_equal(host(t), values)
    if not collapsing_works():
        assert moved == 0
        return
    assert moved >= 6 << 20, moved  # at least its interior; all of it unless at its mapping's end
    middle = t.data_ptr() + values.nbytes // 2
    assert huge_kb_at(middle) >= 2048


@pytest.mark.parametrize("case", ["small", "off", "simulated"])
def test_what_stays_on_small_pages(monkeypatch, case):
    big = np.ones(6 << 20, np.uint8)
    if case == "small":
        t = tensor(np.ones(1 << 20, np.uint8), "cpu")
    elif case == "off":
        monkeypatch.setenv("ANYCHIP_HUGE_PAGES", "off")
        t = tensor(big, "cpu")
    else:  # a simulated chip's memory is its own device's
        t = tensor(big, "npu")
    assert huge_pages_for([t]) == 0


def test_weight_only_linear_binds_its_large_weights_on_huge_pages(monkeypatch):
    monkeypatch.delenv("ANYCHIP_HUGE_PAGES", raising=False)
    rng = np.random.default_rng(1)
    qweight, scales = quantize_numpy(rng.standard_normal((2048, 4096)) * 0.1, 4, 128)  # 4 MB packed
    qw, sc = tensor(qweight, "cpu"), tensor(scales, "cpu")
    x = tensor(rng.standard_normal((1, 2048)), "cpu", "float32")
    lin = ops.WeightOnlyLinear(qw, sc, bits=4, group_size=128)
    assert (lin.huge_page_bytes > 0) == collapsing_works()
    np.testing.assert_array_equal(host(lin(x)), host(ops.weight_only_linear(x, qw, sc, bits=4, group_size=128)))
