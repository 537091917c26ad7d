"""The {{name}} kernels on numpy arrays in host memory, without Paddle or the device: the
quickest check while writing one, hand-written or generated. (`anychip conformance` then checks
them on the device.)"""

import numpy as np
import pytest

from anychip.kernels import NativeKernel
from anychip_{{name}} import KERNEL_LIBRARY, generated_library

SWIGLU = NativeKernel(str(KERNEL_LIBRARY), "anychip_{{name}}_swiglu")
SWIGLU_GRAD = NativeKernel(str(KERNEL_LIBRARY), "anychip_{{name}}_swiglu_grad")


def _inputs(*shape, count):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(shape) * 4).astype(np.float32) for _ in range(count)]


def _silu_and_slope(gate):
    g = gate.astype(np.float64)
    s = 1 / (1 + np.exp(-g))
    return g * s, s + g * s * (1 - s)


def test_swiglu_matches_its_formula():
    gate, up = _inputs(3, 37, count=2)  # odd sizes: no vector width divides them
    y = np.empty_like(gate)
    SWIGLU.run_host([gate, up], [y])
    silu, _slope = _silu_and_slope(gate)
    np.testing.assert_allclose(y, silu * up, rtol=1e-5, atol=1e-6)


def test_swiglu_grad_matches_its_formula():
    dy, gate, up = _inputs(5, 11, count=3)
    dgate, dup = np.empty_like(gate), np.empty_like(up)
    SWIGLU_GRAD.run_host([dy, gate, up], [dgate, dup])
    silu, slope = _silu_and_slope(gate)
    np.testing.assert_allclose(dup, dy * silu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dgate, dy * up * slope, rtol=1e-5, atol=1e-6)


def test_swiglu_refuses_a_dtype_it_does_not_handle():
    gate, up = (a.astype(np.float16) for a in _inputs(4, count=2))
    with pytest.raises(RuntimeError, match="float32"):
        SWIGLU.run_host([gate, up], [np.empty_like(gate)])


def test_generated_rms_norm_matches_its_formula():
    rms_norm = generated_library().load()["rms_norm.float32"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    weight = rng.standard_normal(37).astype(np.float32)
    y, inv_rms = np.empty_like(x), np.empty(3, np.float32)
    eps = 0.25  # large enough that a kernel ignoring attrs[0] fails
    rms_norm.run_host([x, weight], [y, inv_rms], [eps])
    expected_inv = 1 / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1) + eps)
    np.testing.assert_allclose(inv_rms, expected_inv, rtol=1e-5)
    np.testing.assert_allclose(y, x * expected_inv[:, None] * weight, rtol=1e-5, atol=1e-6)
