"""The cpu plugin's row-wise and elementwise kernels (rms_norm, rotary_embedding, swiglu, their
grads, adamw_step) against a float64 numpy oracle of the formulas in anychip/kernel.h, for
float32, bfloat16 and float16, on every ISA path (test_every_isa_path reruns this file with
ANYCHIP_CPU_ISA capped; in-process the best path runs)."""

import ctypes
import ctypes.util
import os
import subprocess
import sys

import numpy as np
import pytest

from isa_paths import isa_params
from kernel_helpers import empty, run, store, value

DTYPES = ["float32", "bfloat16", "float16"]
# Outputs are compared with |actual - expected| <= TOL * (|expected| + rms(expected)): float32
# arithmetic, then one rounding to the storage dtype.
TOL = {"float32": 2e-5, "bfloat16": 1e-2, "float16": 2e-3}
# Outputs this large take the AVX-512 code's non-temporal-store path; the *_streamed tests,
# which only cover that, run in-process alone (the best path there is the AVX-512 code).
STREAM_BYTES = 8 << 20


def stored(values, dtype):
    """(storage array, its float64 values) of float64 ``values`` rounded to ``dtype``."""
    array = store(values, dtype)
    return array, value(array)


def assert_close(actual, expected, tol, what, scale=None):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    if scale is None:
        scale = np.sqrt(np.mean(expected ** 2)) if expected.size else 0.0
    err = np.abs(actual - expected)
    bad = ~(err <= tol * (np.abs(expected) + scale))  # NaN counts as bad
    if bad.any():
        worst = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(err, nan=np.inf), -1)), bad.shape)
        pytest.fail(f"{what}: {bad.sum()} of {bad.size} off, worst at {worst}: {actual[worst]} vs {expected[worst]}")


# ---- rms_norm -------------------------------------------------------------------------------

ROW_SHAPES = [(1, 1), (3, 17), (5, 2, 333), (31, 1000), (130, 4099)]


def rms_norm_case(rng, shape, dtype, residual):
    C = shape[-1]
    x, x64 = stored(rng.standard_normal(shape) * 2, dtype)
    w, w64 = stored(rng.uniform(0.5, 1.5, C), dtype)
    inputs, outputs = [x, w], [empty(shape, dtype), np.full(int(np.prod(shape[:-1])), np.nan, np.float32)]
    h64 = x64
    if residual:
        r, r64 = stored(rng.standard_normal(shape), dtype)
        inputs.append(r)
        outputs.append(empty(shape, dtype))
        h64 = value(store((x64.astype(np.float32) + r64.astype(np.float32)).astype(np.float64), dtype))
    eps = 1e-5
    run("rms_norm", inputs, outputs, [eps])
    inv = 1.0 / np.sqrt(np.mean(h64 ** 2, axis=-1) + eps)
    assert_close(outputs[1], inv.reshape(-1), 2e-6, "inv_rms")
    assert_close(value(outputs[0]), h64 * inv[..., None] * w64, TOL[dtype], "y")
    if residual:
        np.testing.assert_array_equal(value(outputs[2]), h64, "h = x + residual, rounded once")


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype, residual):
    rng = np.random.default_rng(1)
    for shape in ROW_SHAPES:
        rms_norm_case(rng, shape, dtype, residual)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_streamed(dtype):
    C = 2053
    R = STREAM_BYTES // (C * np.dtype(np.float16 if dtype != "float32" else np.float32).itemsize) + 3
    rms_norm_case(np.random.default_rng(2), (R, C), dtype, residual=True)


def placed_copy(array, offset):
    """``array`` copied to a buffer starting ``offset`` bytes past a 64-byte boundary (numpy's
    own alignment is 16: either may happen)."""
    raw = np.empty(array.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_streamed_interleaved_rows(dtype, aligned):
    """Large outputs with rows of whole 64-element chunks take the interleaved, pipelined path
    when the output is 64-byte aligned (Paddle's allocations are), else the row-by-row one."""
    rng = np.random.default_rng(3)
    C = 1024
    R = STREAM_BYTES // (C * (4 if dtype == "float32" else 2)) + 5
    x, x64 = stored(rng.standard_normal((R, C)) * 2, dtype)
    w, w64 = stored(rng.uniform(0.5, 1.5, C), dtype)
    y, inv = empty((R, C), dtype), np.full(R, np.nan, np.float32)
    x, y = placed_copy(x, 0 if aligned else 16), placed_copy(y, 0 if aligned else 16)
    run("rms_norm", [x, w], [y, inv], [1e-5], num_threads=3)
    want_inv = 1.0 / np.sqrt(np.mean(x64 ** 2, axis=-1) + 1e-5)
    assert_close(inv, want_inv, 2e-6, "inv_rms")
    assert_close(value(y), x64 * want_inv[:, None] * w64, TOL[dtype], "y")


def rms_norm_grad_case(rng, shape, dtype, extra, num_threads=0, offset=None):
    """``offset``: place dy, h and dh that many bytes past a 64-byte boundary (None: numpy's)."""
    C = shape[-1]
    dy, dy64 = stored(rng.standard_normal(shape), dtype)
    h, h64 = stored(rng.standard_normal(shape) * 3, dtype)
    w, w64 = stored(rng.uniform(0.5, 1.5, C), dtype)
    inv = (1.0 / np.sqrt(np.mean(h64 ** 2, axis=-1) + 1e-6)).astype(np.float32).reshape(-1)
    inv64 = inv.astype(np.float64).reshape(shape[:-1] + (1,))
    inputs = [dy, h, w, inv]
    g = dy64 * w64
    dh64 = inv64 * g - h64 * inv64 ** 3 * np.sum(g * h64, axis=-1, keepdims=True) / C
    if extra:
        e, e64 = stored(rng.standard_normal(shape), dtype)
        inputs.append(e)
        dh64 = dh64 + e64
    outputs = [empty(shape, dtype), empty(C, dtype)]
    if offset is not None:
        inputs[:2] = [placed_copy(a, offset) for a in inputs[:2]]
        outputs[0] = placed_copy(outputs[0], offset)
    run("rms_norm_grad", inputs, outputs, num_threads=num_threads)
    # the two terms of dh can cancel (C = 1 gives dh ~ 0): scale by the first one's size
    assert_close(value(outputs[0]), dh64, TOL[dtype], "dh", scale=np.sqrt(np.mean((inv64 * g) ** 2)))
    terms = (dy64 * h64 * inv64).reshape(-1, C)
    # float32 sums over the rows, then one rounding
    assert_close(value(outputs[1]), terms.sum(0), TOL[dtype], "dweight",
                 scale=1e-6 * np.abs(terms).sum(0) / TOL[dtype])
    return outputs


@pytest.mark.parametrize("extra", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_grad(dtype, extra):
    rng = np.random.default_rng(3)
    for shape in ROW_SHAPES:
        rms_norm_grad_case(rng, shape, dtype, extra)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_grad_streamed(dtype):
    C = 1031
    R = STREAM_BYTES // (C * (4 if dtype == "float32" else 2)) + 5
    rms_norm_grad_case(np.random.default_rng(4), (R, C), dtype, extra=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_grad_streamed_interleaved_rows(dtype):
    """The aligned, interleaved path and the row-by-row one: both right, same dweight bits."""
    C = 1024
    R = STREAM_BYTES // (C * (4 if dtype == "float32" else 2)) + 5
    aligned = rms_norm_grad_case(np.random.default_rng(5), (R, C), dtype, extra=False, offset=0)
    unaligned = rms_norm_grad_case(np.random.default_rng(5), (R, C), dtype, extra=False, offset=16)
    np.testing.assert_array_equal(aligned[1], unaligned[1])


def test_rms_norm_grad_dweight_is_deterministic():
    """dweight's row order of summation is fixed: the same bits for any thread count."""
    results = [rms_norm_grad_case(np.random.default_rng(5), (1000, 257), "float32", False, num_threads=t)[1]
               for t in (1, 2, 3, 2)]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


# ---- rotary_embedding ------------------------------------------------------------------------

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.powf.restype = ctypes.c_float
_libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]


def rotary_oracle(x64, positions, theta, sign):
    """x rotated by sign * pos * theta^(-2i/D), the angle computed in float32 as the reference
    does (libm's powf for theta^(2i/D), a float32 product), cos and sin in float64."""
    D = x64.shape[-1]
    half = D // 2
    inv_freq = np.array([np.float32(1.0) / np.float32(_libm.powf(theta, np.float32(2 * i) / np.float32(D)))
                         for i in range(half)], np.float32)
    angle = (positions.astype(np.float32)[..., None] * inv_freq).astype(np.float64)[:, :, None, :]
    c, s = np.cos(angle), sign * np.sin(angle)
    a, b = x64[..., :half], x64[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


ROTARY_SHAPES = [  # B, S, Hq, Hk, D, largest position
    (1, 1, 1, 1, 2, 10), (2, 5, 4, 2, 8, 100), (1, 7, 3, 1, 34, 5000), (2, 33, 8, 2, 128, 4096),
    (1, 3, 2, 2, 64, 1 << 20)]


def rotary_case(rng, B, S, Hq, Hk, D, top, dtype, grad):
    q, q64 = stored(rng.standard_normal((B, S, Hq, D)), dtype)
    k, k64 = stored(rng.standard_normal((B, S, Hk, D)), dtype)
    positions = rng.integers(0, top + 1, (B, S)).astype(np.int64)
    positions[0, 0] = top
    theta = 10000.0 if D != 64 else 500000.0
    outputs = [empty(q.shape, dtype), empty(k.shape, dtype)]
    run("rotary_embedding_grad" if grad else "rotary_embedding", [q, k, positions], outputs, [theta])
    sign = -1.0 if grad else 1.0
    assert_close(value(outputs[0]), rotary_oracle(q64, positions, theta, sign), TOL[dtype], "q")
    assert_close(value(outputs[1]), rotary_oracle(k64, positions, theta, sign), TOL[dtype], "k")


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding(dtype, grad):
    rng = np.random.default_rng(6)
    for shape in ROTARY_SHAPES:
        rotary_case(rng, *shape, dtype, grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding_streamed(dtype):
    S = STREAM_BYTES // (8 * 128 * (4 if dtype == "float32" else 2)) + 1
    rotary_case(np.random.default_rng(7), 1, S, 6, 2, 128, 8192, dtype, grad=False)


def test_rotary_grad_undoes_rotation_and_may_run_in_place():
    rng = np.random.default_rng(8)
    q, k = rng.standard_normal((2, 9, 4, 96)).astype(np.float32), rng.standard_normal((2, 9, 2, 96)).astype(np.float32)
    positions = rng.integers(0, 3000, (2, 9)).astype(np.int64)
    rotated = [np.empty_like(q), np.empty_like(k)]
    run("rotary_embedding", [q, k, positions], rotated, [10000.0])
    back = [np.empty_like(q), np.empty_like(k)]
    run("rotary_embedding_grad", rotated + [positions], back, [10000.0])
    np.testing.assert_allclose(back[0], q, atol=2e-6)
    np.testing.assert_allclose(back[1], k, atol=2e-6)
    run("rotary_embedding", [q, k, positions], [q, k], [10000.0])  # in place
    np.testing.assert_array_equal(q, rotated[0])
    np.testing.assert_array_equal(k, rotated[1])


# ---- swiglu ---------------------------------------------------------------------------------

ELEMENTWISE_SHAPES = [(1,), (15,), (3, 17), (4, 5, 77), (129, 1001)]


def gates(rng, shape):
    g = rng.uniform(-12, 12, shape)
    special = np.array([0.0, -100.0, 100.0, -88.0, 30.0, -1e-30])
    flat = g.reshape(-1)
    flat[:min(flat.size, special.size)] = special[:flat.size]
    return g


def swiglu_case(rng, shape, dtype):
    g, g64 = stored(gates(rng, shape), dtype)
    u, u64 = stored(rng.standard_normal(shape), dtype)
    dy, dy64 = stored(rng.standard_normal(shape), dtype)
    s = 1.0 / (1.0 + np.exp(-g64))
    y = empty(shape, dtype)
    run("swiglu", [g, u], [y])
    assert_close(value(y), g64 * s * u64, TOL[dtype], "y")
    dg, du = empty(shape, dtype), empty(shape, dtype)
    run("swiglu_grad", [dy, g, u], [dg, du])
    assert_close(value(dg), dy64 * u64 * s * (1 + g64 * (1 - s)), TOL[dtype], "dgate")
    assert_close(value(du), dy64 * g64 * s, TOL[dtype], "dup")


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu(dtype):
    rng = np.random.default_rng(9)
    for shape in ELEMENTWISE_SHAPES:
        swiglu_case(rng, shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_streamed(dtype):
    n = STREAM_BYTES // (4 if dtype == "float32" else 2) + 37
    swiglu_case(np.random.default_rng(10), (n,), dtype)


# ---- adamw_step -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_adamw_step(dtype):
    rng = np.random.default_rng(11)
    shapes = [(1,), (0,), (3,), (16,), (17, 3), (1000,), (40000,), (2, 77)]  # split across threads
    lr, b1, b2, eps, wd, step = 0.05, 0.9, 0.999, 1e-8, 0.1, 3
    grads, params, ms, vs, expected = [], [], [], [], []
    for shape in shapes:
        g, g64 = stored(rng.standard_normal(shape), dtype)
        p, p64 = stored(rng.standard_normal(shape), dtype)
        m = rng.standard_normal(shape).astype(np.float32) * 0.1
        v = rng.uniform(0, 0.1, shape).astype(np.float32)
        v.reshape(-1)[:1] = 0.0  # the eps matters where g and v are tiny
        p64 = p64 - lr * wd * p64
        m64 = b1 * m.astype(np.float64) + (1 - b1) * g64
        v64 = b2 * v.astype(np.float64) + (1 - b2) * g64 ** 2
        p64 = p64 - lr * (m64 / (1 - b1 ** step)) / (np.sqrt(v64 / (1 - b2 ** step)) + eps)
        grads.append(g)
        params.append(p)
        ms.append(m)
        vs.append(v)
        expected.append((p64, m64, v64))
    run("adamw_step", grads, params + ms + vs, [lr, b1, b2, eps, wd, step])
    for shape, p, m, v, (p64, m64, v64) in zip(shapes, params, ms, vs, expected):
        assert_close(value(p), p64, TOL[dtype], f"p {shape}")
        assert_close(m, m64, 2e-6, f"m {shape}")
        assert_close(v, v64, 2e-6, f"v {shape}")


def test_adamw_step_float32_update_is_exact_to_float32():
    """Checks the update itself (not just p): p - p_new against the float64 update."""
    rng = np.random.default_rng(12)
    p0 = rng.standard_normal(5000).astype(np.float32)
    g = rng.standard_normal(5000).astype(np.float32)
    p, m, v = p0.copy(), np.zeros(5000, np.float32), np.zeros(5000, np.float32)
    run("adamw_step", [g], [p, m, v], [1e-3, 0.9, 0.95, 1e-6, 0.0, 1])
    g64 = g.astype(np.float64)
    update = 1e-3 * (0.1 * g64 / 0.1) / (np.sqrt(0.05 * g64 ** 2 / 0.05) + 1e-6)
    assert_close(p0.astype(np.float64) - p, update, 3e-4, "update", scale=0.0)


def test_empty_tensors():
    f32 = np.float32
    run("rms_norm", [np.ones((0, 5), f32), np.ones(5, f32)], [np.ones((0, 5), f32), np.ones(0, f32)], [1e-6])
    run("rms_norm", [np.ones((3, 0), f32), np.ones(0, f32)], [np.ones((3, 0), f32), np.ones(3, f32)], [1e-6])
    dweight = np.full(5, np.nan, np.float32)
    run("rms_norm_grad", [np.ones((0, 5), np.float32)] * 2 + [np.ones(5, np.float32), np.ones(0, np.float32)],
        [np.ones((0, 5), np.float32), dweight])
    np.testing.assert_array_equal(dweight, 0.0)
    q = np.ones((2, 0, 3, 8), np.float32)
    run("rotary_embedding", [q, q, np.zeros((2, 0), np.int64)], [q.copy(), q.copy()], [10000.0])
    run("swiglu", [np.ones(0, np.float32)] * 2, [np.ones(0, np.float32)])


# ---- what the kernels refuse ------------------------------------------------------------------

def test_refusals():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(RuntimeError, match="not contiguous"):
        run("rms_norm", [x[:, ::2], np.ones(4, np.float32)], [np.empty((4, 4), np.float32), np.empty(4, np.float32)],
            [1e-6])
    with pytest.raises(RuntimeError, match="outputs"):
        run("adamw_step", [x], [x.copy(), x.copy()], [1e-3, 0.9, 0.999, 1e-8, 0.0, 1])
    with pytest.raises(RuntimeError, match="float32"):
        run("adamw_step", [x], [x.copy(), x.copy(), x.astype(np.float16)], [1e-3, 0.9, 0.999, 1e-8, 0.0, 1])
    q = np.ones((1, 2, 1, 5), np.float32)
    with pytest.raises(RuntimeError, match="even"):
        run("rotary_embedding", [q, q, np.zeros((1, 2), np.int64)], [q.copy(), q.copy()], [10000.0])
    with pytest.raises(RuntimeError, match="dtype"):
        run("swiglu", [x.astype(np.float64), x.astype(np.float64)], [np.empty((4, 8))])


@pytest.mark.skipif(bool(os.environ.get("ANYCHIP_CPU_ISA")), reason="this run is already capped")
@pytest.mark.parametrize("isa", isa_params("scalar", "avx512"))
def test_every_isa_path(isa):
    """Reruns this file with the kernels capped to `isa` (each picks its path per call)."""
    result = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-x", "-p", "no:cacheprovider",
                             "-k", "not streamed"],
                            env={**os.environ, "ANYCHIP_CPU_ISA": isa}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
