"""The {{name}} runtime through anychip.runtime, as every anychip user will drive it."""

import numpy as np
import pytest

import anychip.runtime
from anychip_{{name}} import DTYPES


@pytest.fixture
def device():
    return anychip.runtime.open_device("{{name}}:0")


def test_round_trip_and_memory_stats(device):
    data = np.arange(1000, dtype=np.float32)
    before = device.memory_stats()

    buf = device.upload(data)
    during = device.memory_stats()
    np.testing.assert_array_equal(buf.to_numpy(np.float32), data)
    assert during.num_allocations == before.num_allocations + 1
    assert during.allocated_bytes >= before.allocated_bytes + data.nbytes
    assert during.free_bytes == during.total_bytes - during.allocated_bytes
    assert during.peak_allocated_bytes >= during.allocated_bytes

    buf.free()
    after = device.memory_stats()
    assert after.num_allocations == before.num_allocations
    assert after.allocated_bytes == before.allocated_bytes
    assert after.total_allocations == before.total_allocations + 1


def test_allocation_past_capacity_fails_cleanly(device):
    with pytest.raises(anychip.runtime.DeviceOutOfMemoryError, match="out of memory"):
        device.allocate(device.properties.total_memory + 1)


def test_kernels_are_built_for_the_dtypes_the_device_reports(device):
    # DTYPES (the generated kernels' dtypes) and rt_get_properties in runtime.c must agree
    assert set(device.properties.dtypes) == set(DTYPES)
