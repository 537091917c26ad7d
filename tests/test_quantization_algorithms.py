"""Post-training quantization math (anychip_models.quantization.algorithms) in numpy: RTN against
weight_quantize's numpy twin, GPTQ against RTN on a layer with correlated inputs, SmoothQuant's
effect on A8W8 error with outlier channels, and the A8W8 emulation against w8a8_linear on cpu."""

from __future__ import annotations

import numpy as np
import pytest

from anychip.ops.quant import quantize_numpy
from anychip_models.checkpoint import QuantWeight
from anychip_models.quantization.algorithms import (
    Hessian,
    fake_w8a8,
    gptq,
    pack_int4,
    quant_codes,
    rtn,
    smooth_scales,
    unpack_int4,
    w8a8,
)

CASES = [(8, -1), (8, 64), (8, 128), (4, -1), (4, 64), (4, 128)]
K, N = 256, 96


def relative(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def out_error(x: np.ndarray, w: np.ndarray, q: QuantWeight) -> float:
    """||X W^T - X Q^T||_F."""
    return float(np.linalg.norm(x @ w.T - x @ q.dequantize().astype(np.float64).T))


def check_valid(q: QuantWeight, n: int, k: int, bits: int, group_size: int) -> None:
    groups = 1 if group_size == -1 else k // group_size
    assert q.bits == bits and q.group_size == group_size and q.offsets is None
    assert q.shape == (n, k)
    assert q.qweight.dtype == (np.int8 if bits == 8 else np.uint8)
    assert q.qweight.shape == ((n, k) if bits == 8 else (n, k // 2))
    assert q.scales.dtype == np.float32 and q.scales.shape == (n, groups)
    codes = quant_codes(q)
    qmax = 127 if bits == 8 else 7
    assert codes.min() >= -qmax and codes.max() <= qmax
    deq = q.dequantize()
    assert deq.shape == (n, k) and np.isfinite(deq).all()
    np.testing.assert_array_equal(deq, (codes.reshape(n, groups, -1) * q.scales[:, :, None]).reshape(n, k))


# ---- RTN ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits,group_size", CASES)
def test_rtn_is_weight_quantize(bits, group_size):
    rng = np.random.default_rng(bits * 1000 + group_size)
    w = rng.standard_normal((N, K)) * rng.uniform(0.01, 1.0, (N, 1))
    w[3] = 0.0  # an all-zero row: scale 0, q 0
    q = rtn(w, bits, group_size)
    want_q, want_scales = quantize_numpy(w.T, bits, group_size)
    np.testing.assert_array_equal(q.qweight, want_q)
    np.testing.assert_array_equal(q.scales, want_scales)
    check_valid(q, N, K, bits, group_size)
    group = K if group_size == -1 else group_size
    scale = np.repeat(q.scales.astype(np.float64), group, axis=1)
    err = np.abs(w - q.dequantize().astype(np.float64))
    assert (err <= scale / 2 * (1 + 1e-6) + 1e-12).all()
    assert not q.dequantize()[3].any()


def test_pack_int4_layout():
    rng = np.random.default_rng(5)
    q = rng.integers(-8, 8, (3, 128))
    packed = pack_int4(q)
    assert packed.dtype == np.uint8 and packed.shape == (3, 64)
    assert packed[1, 32 + 5] == (q[1, 64 + 5] + 8) | ((q[1, 64 + 32 + 5] + 8) << 4)
    np.testing.assert_array_equal(unpack_int4(packed), q)
    np.testing.assert_array_equal(QuantWeight(packed, np.ones((3, 1), np.float32), 4, -1).dequantize(), q)


def test_rejects_bad_arguments():
    w = np.ones((4, 96))
    with pytest.raises(ValueError, match="multiple of 64"):
        rtn(w, 4, 32)
    with pytest.raises(ValueError, match="group_size"):
        rtn(w, 8, 40)
    with pytest.raises(ValueError, match="bits"):
        gptq(w, np.eye(96), 3, -1)
    with pytest.raises(ValueError, match="hessian"):
        gptq(w, np.eye(64), 8, -1)


# ---- GPTQ ---------------------------------------------------------------------------------------

def correlated_layer(seed: int = 0):
    """W [N, K] and a sampler of inputs x = z M with a few large-variance channels."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((K, K)) / np.sqrt(K)
    loud = rng.choice(K, 4, replace=False)

    def sample(rows: int) -> np.ndarray:
        x = rng.standard_normal((rows, K)) @ mix
        x[:, loud] *= 8.0
        return x

    w = rng.standard_normal((N, K)) * 0.05
    return w, sample


def test_hessian_accumulates_2_over_n_x_xt():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 16))
    h = Hessian(16)
    h.add(x[:20])
    h.add(x[20:].reshape(3, 10, 16))
    assert h.count == 50 and h.matrix.dtype == np.float64
    np.testing.assert_allclose(h.matrix, 2.0 / 50 * x.T @ x, rtol=1e-12)


@pytest.mark.parametrize("bits,group_size,margin", [(4, 64, 0.8), (4, -1, 0.8), (8, -1, 0.9)])
def test_gptq_beats_rtn_on_correlated_inputs(bits, group_size, margin):
    w, sample = correlated_layer()
    x, held_out = sample(2048), sample(1024)
    h = Hessian(K)
    h.add(x)
    r = rtn(w, bits, group_size)
    for act_order in (False, True):
        g = gptq(w, h.matrix, bits, group_size, act_order=act_order)
        check_valid(g, N, K, bits, group_size)
        calib = out_error(x, w, g) / out_error(x, w, r)
        held = out_error(held_out, w, g) / out_error(held_out, w, r)
        assert calib <= margin and held <= margin, (act_order, calib, held)


@pytest.mark.parametrize("bits,group_size", CASES)
def test_gptq_with_identity_hessian_rounds_to_nearest(bits, group_size):
    """No correlation, no error feedback: GPTQ rounds each weight to the nearest step of its
    searched scale (damping only scales H), a scale at most abs-max's that errs no more than RTN."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((N, K))
    r = rtn(w, bits, group_size)
    qmax = 2 ** (bits - 1) - 1
    gs = K if group_size == -1 else group_size
    for act_order in (False, True):
        g = gptq(w, np.eye(K), bits, group_size, act_order=act_order)
        assert np.all(g.scales <= r.scales) and np.any(g.scales < r.scales)
        step = np.repeat(g.scales.astype(np.float64), gs, axis=1)
        nearest = np.clip(np.sign(w) * np.floor(np.abs(w) / step + 0.5), -qmax, qmax)
        np.testing.assert_array_equal(quant_codes(g), nearest)
        assert np.linalg.norm(w - g.dequantize()) < np.linalg.norm(w - r.dequantize())


@pytest.mark.parametrize("group_size", [64, 128, -1])
def test_gptq_does_not_depend_on_block_size(group_size):
    """Lazy block updates are exact, and group scales use the fully updated weights, even for a
    group that runs past the current block."""
    w, sample = correlated_layer(3)
    h = Hessian(K)
    h.add(sample(512))
    want = gptq(w, h.matrix, 4, group_size, block=128)
    for block in (32, 96, 1000):
        got = gptq(w, h.matrix, 4, group_size, block=block)
        np.testing.assert_array_equal(got.qweight, want.qweight)
        np.testing.assert_allclose(got.scales, want.scales, rtol=1e-6)


def test_gptq_dead_inputs_and_act_order_validity():
    w, sample = correlated_layer(4)
    x = sample(1024)
    x[:, [0, 10, 200]] = 0.0  # inputs never active
    h = Hessian(K)
    h.add(x)
    for bits, group_size in CASES:
        for act_order in (False, True):
            g = gptq(w, h.matrix, bits, group_size, act_order=act_order)
            check_valid(g, N, K, bits, group_size)
            assert not quant_codes(g)[:, [0, 10, 200]].any()
            assert out_error(x, w, g) < out_error(x, w, rtn(w, bits, group_size))


# ---- SmoothQuant / A8W8 -----------------------------------------------------------------------------

def test_smooth_scales_formula():
    act = np.array([4.0, 0.0, 1e-12, 9.0])
    w1 = np.array([[1.0, 2.0, 1.0, 0.0], [-4.0, 0.0, 1.0, 0.0]])
    w2 = np.array([[0.5, 1.0, -9.0, 0.0]])
    s = smooth_scales(act, [w1, w2], alpha=0.5)
    np.testing.assert_allclose(s, [np.sqrt(4.0) / np.sqrt(4.0), 1.0, 1e-5, np.sqrt(9.0) / np.sqrt(1e-5)])
    np.testing.assert_allclose(smooth_scales(act, [w1], alpha=1.0)[[0, 3]], [4.0, 9.0])


def test_smoothing_lowers_a8w8_error_with_outlier_channels():
    rng = np.random.default_rng(11)
    k, n = 256, 128
    x = rng.standard_normal((512, k))
    outliers = [5, 77, 130, 241]
    x[:, outliers] *= rng.uniform(50.0, 100.0, len(outliers))
    w = rng.standard_normal((n, k)) * 0.05
    ref = x @ w.T
    plain = relative(fake_w8a8(x, *w8a8(w)), ref)
    s = smooth_scales(np.abs(x).max(axis=0), [w], alpha=0.5)
    smoothed = relative(fake_w8a8(x / s, *w8a8(w * s)), ref)
    assert smoothed <= 0.5 * plain, (plain, smoothed)


def test_w8a8_layout():
    rng = np.random.default_rng(12)
    w = rng.standard_normal((40, 96))
    qweight, scales = w8a8(w)
    assert qweight.dtype == np.int8 and qweight.shape == (40, 96)
    assert scales.dtype == np.float32 and scales.shape == (40, 1)
    np.testing.assert_array_equal(qweight, rtn(w, 8, -1).qweight)
    assert np.abs(qweight).max() == 127


def test_fake_w8a8_matches_w8a8_linear_on_cpu():
    from ops_helpers import host, tensor

    import anychip.ops as ops

    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 5, 96)).astype(np.float32)
    x[1, 2] = 0.0  # an all-zero row
    qweight, scales = w8a8(rng.standard_normal((24, 96)) * 0.1)
    got = host(ops.w8a8_linear(tensor(x, "cpu"), tensor(qweight, "cpu"), tensor(scales, "cpu")))
    want = fake_w8a8(x, qweight, scales)
    assert want.shape == got.shape == (2, 5, 24)
    np.testing.assert_allclose(want, got, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(fake_w8a8(x, qweight, scales.reshape(-1)), want)
