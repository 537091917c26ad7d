"""The host kernels weight_quantize, weight_only_linear(_grad) and w8a8_linear against numpy.

The oracle quantizes exactly as kernel.h states (float32 scale = absmax / qmax, float32 w / scale,
round half away from zero as sign(v) * floor(|v| + 0.5)), so qweight and scales must match bit
for bit; products are checked in float64 against the dequantized weights (W = q * scale, plus a
per-group offset for asymmetric weights such as GGUF's Q4_1), and w8a8_linear is emulated exactly
(int64 sums, then the same float32 operations), so it too must match bit for bit.
Every ISA path (scalar, AVX2, AVX-512, AMX) runs in a subprocess with ANYCHIP_CPU_ISA set (tiers the
CPU lacks skip).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from anychip.kernels import NativeKernel
from anychip_plugins.host import LIBRARY
from isa_paths import isa_params

FLOATS = ("float32", "bfloat16", "float16")


def kernel(name: str) -> NativeKernel:
    return NativeKernel(str(LIBRARY), f"anychip_cpu_{name}")


# ---- float storage ------------------------------------------------------------------------------

def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def store(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values in the storage numpy uses for `dtype` (bf16 as uint16 bits)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "bfloat16":
        return to_bf16_bits(values)
    return values.astype(np.float16) if dtype == "float16" else values


def value(stored: np.ndarray, dtype: str) -> np.ndarray:
    """The exact values of a stored tensor, as float64."""
    if dtype == "bfloat16":
        return from_bf16_bits(stored).astype(np.float64)
    return stored.astype(np.float64)


def empty(shape, dtype: str) -> np.ndarray:
    return np.full(shape, 0x7FC0 if dtype == "bfloat16" else np.nan,
                   dtype={"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[dtype])


def names(*dtypes):
    return [d if d == "bfloat16" else None for d in dtypes]


# ---- oracle -------------------------------------------------------------------------------------

def round_half_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5)


def quantize_ref(w: np.ndarray, bits: int, group_size: int):
    """w [K, N] (values exact in float32) -> q int8 [N, K], scales float32 [N, G]."""
    k, n = w.shape
    g = k if group_size == -1 else group_size
    qmax = np.float32(127 if bits == 8 else 7)
    wt = np.ascontiguousarray(w.T, dtype=np.float32).reshape(n, k // g, g)
    scale = np.abs(wt).max(axis=2) / qmax
    safe = np.where(scale > 0, scale, np.float32(1))
    v = np.clip(wt / safe[..., None], -qmax, qmax)
    q = np.where(scale[..., None] > 0, round_half_away(v), 0)
    return q.reshape(n, k).astype(np.int8), scale.astype(np.float32)


def pack4(q: np.ndarray) -> np.ndarray:
    """kernel.h's 4-bit layout: per 64 k a 32-byte block, byte i = (q[i] + 8) | (q[32 + i] + 8) << 4."""
    n, k = q.shape
    u = (q.astype(np.int16) + 8).astype(np.uint8).reshape(n, k // 64, 2, 32)
    return (u[:, :, 0, :] | (u[:, :, 1, :] << 4)).reshape(n, k // 2)


def per_column(groups: np.ndarray, k: int) -> np.ndarray:
    """[N, G] per-group values as float64 [N, K]."""
    return np.repeat(groups.astype(np.float64), k // groups.shape[1], axis=1)


def dequantize(q: np.ndarray, scales: np.ndarray, offsets=None) -> np.ndarray:
    w = q.astype(np.float64) * per_column(scales, q.shape[1])
    return w if offsets is None else w + per_column(offsets, q.shape[1])


def magnitude(q: np.ndarray, scales: np.ndarray, offsets=None) -> np.ndarray:
    """|q * scale| + |offset|: what float32 error in W scales with (W itself may cancel to 0)."""
    w = np.abs(dequantize(q, scales))
    return w if offsets is None else w + np.abs(per_column(offsets, q.shape[1]))


def w8a8_ref(x: np.ndarray, qw: np.ndarray, ws: np.ndarray, bias) -> np.ndarray:
    """float32 y of w8a8_linear for float32-exact x [M, K], bit for bit."""
    x = x.astype(np.float32)
    xs = (np.abs(x).max(axis=1) if x.shape[1] else np.zeros(len(x), np.float32)) / np.float32(127)
    safe = np.where(xs > 0, xs, np.float32(1))
    v = np.clip(x / safe[:, None], np.float32(-127), np.float32(127))
    qx = np.where(xs[:, None] > 0, round_half_away(v), 0).astype(np.int64)
    acc = qx @ qw.astype(np.int64).T
    y = acc.astype(np.float32) * xs[:, None].astype(np.float32)
    y = y * ws.reshape(1, -1).astype(np.float32)
    if bias is not None:
        y = y + bias.astype(np.float32)
    return y


def rounded(y32: np.ndarray, dtype: str) -> np.ndarray:
    """float32 results as the kernel stores them (round to nearest even), exact values."""
    return value(store(y32, dtype), dtype)


def tolerance(dtype: str) -> float:
    """Error bound relative to sum |x| |W|: float32 accumulation, the output's rounding (2^-8
    for bf16, 2^-11 for fp16) and, for bf16, the AMX paths' rounding of W to bf16 (2^-8)."""
    return {"float32": 4e-6, "float16": 1e-3, "bfloat16": 9e-3}[dtype]


def check_error(got, want, bound, dtype, what):
    excess = np.abs(got - want) - tolerance(dtype) * bound
    assert np.all(excess <= 1e-30), f"{what}: max excess {np.max(excess)}"


# ---- one case per kernel ------------------------------------------------------------------------

def quantized_weight(rng, k, n, dtype, bits, group_size):
    w_stored = store(rng.standard_normal((k, n)).astype(np.float32) * 0.5, dtype)
    w = value(w_stored, dtype)
    w[:, 0] = 0.0  # a zero channel: scale 0, q 0
    w_stored = store(w, dtype)
    q, scales = quantize_ref(w, bits, group_size)
    packed = q if bits == 8 else pack4(q)
    return w_stored, q, packed, scales


def random_offsets(rng, scales: np.ndarray) -> np.ndarray:
    """Per-group offsets as GGUF's Q4_1 gives them: min + 8 * scale."""
    return (rng.uniform(-0.6, 0.1, scales.shape) + 8 * scales).astype(np.float32)


def weight_args(packed, scales, offsets, bits, group_size):
    """The weight inputs and the attrs of weight_only_linear(_grad): has_offsets only when set."""
    if offsets is None:
        return [packed, scales], [bits, group_size]
    return [packed, scales, offsets], [bits, group_size, 1]


def check_quantize(rng, k, n, dtype, bits, group_size):
    w_stored, q, packed, scales = quantized_weight(rng, k, n, dtype, bits, group_size)
    qw = np.full(packed.shape, 0x55, dtype=packed.dtype)
    sc = np.full(scales.shape, np.nan, dtype=np.float32)
    kernel("weight_quantize").run_host([w_stored], [qw, sc], [bits, group_size], dtypes=names(dtype, "", ""))
    np.testing.assert_array_equal(sc, scales)
    np.testing.assert_array_equal(qw, packed)


def check_linear(rng, m, k, n, dtype, bits, group_size, with_bias, with_offsets=False):
    _, q, packed, scales = quantized_weight(rng, k, n, dtype, bits, group_size)
    offsets = random_offsets(rng, scales) if with_offsets else None
    x_stored = store(rng.standard_normal((m, k)), dtype)
    x = value(x_stored, dtype)
    weights, attrs = weight_args(packed, scales, offsets, bits, group_size)
    inputs, dts = [x_stored] + weights, [dtype] + [""] * len(weights)
    ref, bound = x @ dequantize(q, scales, offsets).T, np.abs(x) @ magnitude(q, scales, offsets).T
    if with_bias:
        b_stored = store(rng.standard_normal(n), dtype)
        inputs.append(b_stored)
        dts.append(dtype)
        ref, bound = ref + value(b_stored, dtype), bound + np.abs(value(b_stored, dtype))
    y = empty((m, n), dtype)
    kernel("weight_only_linear").run_host(inputs, [y], attrs, dtypes=names(*dts, dtype))
    check_error(value(y, dtype), ref, bound, dtype, f"m={m} bits={bits} group={group_size} offsets={with_offsets}")


def check_grad(rng, m, k, n, dtype, bits, group_size, with_offsets=False):
    _, q, packed, scales = quantized_weight(rng, k, n, dtype, bits, group_size)
    offsets = random_offsets(rng, scales) if with_offsets else None
    dy_stored = store(rng.standard_normal((m, n)), dtype)
    dy = value(dy_stored, dtype)
    weights, attrs = weight_args(packed, scales, offsets, bits, group_size)
    dx = empty((m, k), dtype)
    kernel("weight_only_linear_grad").run_host([dy_stored] + weights, [dx], attrs,
                                               dtypes=names(dtype, *[""] * len(weights), dtype))
    check_error(value(dx, dtype), dy @ dequantize(q, scales, offsets), np.abs(dy) @ magnitude(q, scales, offsets),
                dtype, f"m={m} bits={bits} group={group_size} offsets={with_offsets}")


def check_w8a8(rng, m, k, n, dtype, with_bias):
    _, q, _, scales = quantized_weight(rng, k, n, "float32", 8, -1)
    x_stored = store(rng.standard_normal((m, k)) * np.exp(rng.uniform(-3, 3, (m, 1))), dtype)
    if m > 1:
        x_stored[1] = store(np.zeros(k), dtype)  # a zero row: scale 0
    inputs, dts = [x_stored, q, scales], [dtype, "", ""]
    bias = None
    if with_bias:
        b_stored = store(rng.standard_normal(n), dtype)
        bias = value(b_stored, dtype)
        inputs.append(b_stored)
        dts.append(dtype)
    y = empty((m, n), dtype)
    kernel("w8a8_linear").run_host(inputs, [y], [], dtypes=names(*dts, dtype))
    np.testing.assert_array_equal(value(y, dtype), rounded(w8a8_ref(value(x_stored, dtype), q, scales, bias), dtype))


# (M, with offsets): with AMX and bf16 x, M = 3 and 8 take the tile GEMV, 17 and more the tile
# GEMM; otherwise M <= 8 the float32 GEMV and more the float32 GEMM.
ISA_ROWS = ((1, False), (1, True), (3, True), (8, False), (17, True), (37, False), (65, True))


def isa_cases(seed: int = 0) -> None:
    """Every kernel, dtype, bit width and group size, with and without offsets, at decode and
    prefill sizes (for one ISA)."""
    rng = np.random.default_rng(seed)
    for dtype in FLOATS:
        for bits in (4, 8):
            for group_size in (-1, 64, 128, 32):
                check_quantize(rng, 256, 19, dtype, bits, group_size)
                for m, with_offsets in ISA_ROWS:
                    check_linear(rng, m, 256 if m < 17 else 384, 21, dtype, bits, group_size,
                                 with_bias=m != 3, with_offsets=with_offsets)
                    check_grad(rng, m, 384 if m < 17 else 256, 23, dtype, bits, group_size, with_offsets)
        for m in (1, 7, 40):
            check_w8a8(rng, m, 200, 29, dtype, with_bias=m != 7)
    for bits, group_size, with_offsets in ((4, 32, True), (8, 64, False)):
        for m in (1, 5, 40):
            check_bf16_products(rng, m, 576, 37, bits, group_size, with_offsets)
    bf16_products_invariance_case()


def check_bf16_products(rng, m, k, n, bits, group_size, with_offsets):
    """bf16_products (attr 4) on float32 x gives the sums of the same call on x rounded to bf16,
    bit for bit: the bf16 call's y is the float32 y rounded."""
    _, _, packed, scales = quantized_weight(rng, k, n, "float32", bits, group_size)
    offsets = random_offsets(rng, scales) if with_offsets else None
    weights, attrs = weight_args(packed, scales, offsets, bits, group_size)
    attrs = attrs + [0] * (3 - len(attrs))
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = from_bf16_bits(to_bf16_bits(rng.standard_normal(n)))  # the same bias in both calls
    y = empty((m, n), "float32")
    kernel("weight_only_linear").run_host([x] + weights + [bias], [y], attrs + [0, 1])
    y_bf16 = empty((m, n), "bfloat16")
    kernel("weight_only_linear").run_host([to_bf16_bits(x)] + weights + [to_bf16_bits(bias)], [y_bf16], attrs,
                                          dtypes=["bfloat16"] + [None] * len(weights) + ["bfloat16", "bfloat16"])
    np.testing.assert_array_equal(to_bf16_bits(y), y_bf16, err_msg=f"bf16_products m={m} bits={bits}")


# ---- tests --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [-1, 64, 128])
def test_weight_quantize(dtype, bits, group_size):
    rng = np.random.default_rng(bits * 1000 + group_size)
    for k, n in ((128, 1), (256, 37), (512, 70)):
        check_quantize(rng, k, n, dtype, bits, group_size)


@pytest.mark.parametrize("bits", [4, 8])
def test_weight_quantize_rounds_half_away_from_zero(bits):
    qmax = 127 if bits == 8 else 7
    # absmax qmax gives scale 1, so w / scale lands exactly on the halves.
    col = np.array([qmax, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5] + [0.0] * 56, dtype=np.float32)
    w = np.stack([col, -col], axis=1)
    q, scales = quantize_ref(w, bits, -1)
    assert list(q[0, 1:8]) == [1, 2, 3, -1, -2, -3, 4]
    qw = np.zeros((2, 64) if bits == 8 else (2, 32), dtype=np.int8 if bits == 8 else np.uint8)
    sc = np.zeros((2, 1), dtype=np.float32)
    kernel("weight_quantize").run_host([w], [qw, sc], [bits, -1])
    np.testing.assert_array_equal(sc, scales)
    np.testing.assert_array_equal(qw, q if bits == 8 else pack4(q))


def test_weight_quantize_8bit_any_k():
    check_quantize(np.random.default_rng(3), 300, 9, "float32", 8, 100)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [-1, 64, 128, 32])
@pytest.mark.parametrize("with_offsets", [False, True])
def test_weight_only_linear(dtype, bits, group_size, with_offsets):
    rng = np.random.default_rng(7 + bits + group_size)
    for m in (1, 2, 3, 8, 9, 17, 65):
        check_linear(rng, m, 384, 67, dtype, bits, group_size, with_bias=m % 2 == 1, with_offsets=with_offsets)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [-1, 64, 128, 32])
@pytest.mark.parametrize("with_offsets", [False, True])
def test_weight_only_linear_grad(dtype, bits, group_size, with_offsets):
    rng = np.random.default_rng(11 + bits + group_size)
    for m in (1, 3, 4, 8, 17, 65):
        check_grad(rng, m, 384, 67, dtype, bits, group_size, with_offsets)


@pytest.mark.parametrize("dtype", FLOATS)
def test_blocked_products_span_blocks(dtype):
    # More rows than one pass over a packed block, contraction over several blocks, several
    # column blocks; and an 8-bit K that is no multiple of 16 or 64 (masked tails).
    rng = np.random.default_rng(5)
    check_linear(rng, 500, 576, 131, dtype, 4, 64, with_bias=True)
    check_grad(rng, 490, 384, 300, dtype, 4, 128)
    check_linear(rng, 20, 300, 45, dtype, 8, 100, with_bias=True)
    check_linear(rng, 3, 300, 45, dtype, 8, 100, with_bias=False)
    check_grad(rng, 20, 300, 45, dtype, 8, 60)
    check_grad(rng, 2, 300, 45, dtype, 8, -1)


@pytest.mark.parametrize("x_int8", [False, True])
def test_gemv_rows_split_between_threads(x_int8):
    """Decode-sized products over many units of rows, the threads owning runs of units of
    different lengths (and taking what is left of each other's from the back): the oracle's
    values, and the same bits whatever the thread count."""
    rng = np.random.default_rng(41)
    for m, bits, group_size, k, n in ((1, 4, 128, 4096, 1000), (3, 8, -1, 2048, 700)):
        _, q, packed, scales = quantized_weight(rng, k, n, "float32", bits, group_size)
        offsets = random_offsets(rng, scales)
        weights, attrs = weight_args(packed, scales, offsets, bits, group_size)
        x = rng.standard_normal((m, k)).astype(np.float32)
        ys = []
        for threads in (1, 2, 3):
            ys.append(empty((m, n), "float32"))
            kernel("weight_only_linear").run_host([x] + weights, [ys[-1]], attrs + [int(x_int8)], num_threads=threads)
        if x_int8:
            want, bound = x_int8_ref(x.astype(np.float64), q, scales, offsets, None, bits)
        else:
            want, bound = x @ dequantize(q, scales, offsets).T, np.abs(x) @ magnitude(q, scales, offsets).T
        check_error(ys[0].astype(np.float64), want, bound, "float32", f"m={m} bits={bits} x_int8={x_int8}")
        for threads, y in zip((2, 3), ys[1:]):
            np.testing.assert_array_equal(y, ys[0], err_msg=f"{threads} threads, m={m} bits={bits}")


def test_gemv_runs_of_threads_openmp_did_not_start_are_taken_from_the_back(tmp_path):
    """One run of rows per thread asked for: with OpenMP held to one thread, that thread takes
    the other runs' units from the back, and every row comes out as with one thread asked for."""
    code = f"""
import numpy as np
from test_kernels_quant import kernel, quantized_weight, empty
rng = np.random.default_rng(43)
_, q, packed, scales = quantized_weight(rng, 512, 1000, "float32", 4, 128)
x = rng.standard_normal((2, 512)).astype(np.float32)
for threads in (1, 3):
    y = empty((2, 1000), "float32")
    # bits, group_size, no offsets, x_int8
    kernel("weight_only_linear").run_host([x, packed, scales], [y], [4, 128, 0, 1], num_threads=threads)
    np.save(r"{tmp_path}/y%d.npy" % threads, y)
"""
    env = dict(os.environ, OMP_THREAD_LIMIT="1", PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    one, three = np.load(tmp_path / "y1.npy"), np.load(tmp_path / "y3.npy")
    assert not np.isnan(three).any()
    np.testing.assert_array_equal(three, one)


@pytest.mark.parametrize("dtype", FLOATS)
def test_unusual_group_sizes(dtype):
    # 48: groups change inside the 64-wide blocks; 24: no multiple of 16, the generic path.
    rng = np.random.default_rng(23)
    for group_size in (48, 24):
        check_quantize(rng, 192, 7, dtype, 4, group_size)
        for m in (1, 3, 12):
            check_linear(rng, m, 192, 37, dtype, 4, group_size, with_bias=True)
            check_grad(rng, m, 192, 37, dtype, 4, group_size)
            check_linear(rng, m, 240, 37, dtype, 8, group_size, with_bias=False)
            check_grad(rng, m, 240, 37, dtype, 8, group_size)


@pytest.mark.parametrize("dtype", FLOATS)
def test_w8a8_linear(dtype):
    rng = np.random.default_rng(17)
    for m, k, n in ((1, 64, 5), (3, 100, 33), (8, 256, 64), (17, 130, 70), (64, 512, 97)):
        check_w8a8(rng, m, k, n, dtype, with_bias=m % 2 == 1)


@pytest.mark.parametrize("m", [1, 6, 30])
def test_leading_dims_are_rows(m):
    rng = np.random.default_rng(m)
    _, q, packed, scales = quantized_weight(rng, 128, 24, "float32", 4, 64)
    x = rng.standard_normal((2, m, 128)).astype(np.float32)
    y3, y2 = empty((2, m, 24), "float32"), empty((2 * m, 24), "float32")
    kernel("weight_only_linear").run_host([x, packed, scales], [y3], [4, 64])
    kernel("weight_only_linear").run_host([x.reshape(2 * m, 128), packed, scales], [y2], [4, 64])
    np.testing.assert_array_equal(y3.reshape(2 * m, 24), y2)
    dx = empty((2, m, 128), "float32")
    kernel("weight_only_linear_grad").run_host([y3, packed, scales], [dx], [4, 64])
    np.testing.assert_allclose(dx.reshape(2 * m, 128), y2 @ dequantize(q, scales), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [2, 20])
def test_grad_of_no_features_is_zero(m):
    dx = np.full((m, 64), np.nan, np.float32)
    kernel("weight_only_linear_grad").run_host(
        [np.zeros((m, 0), np.float32), np.zeros((0, 32), np.uint8), np.zeros((0, 1), np.float32)], [dx], [4, -1])
    np.testing.assert_array_equal(dx, 0)


def test_w8a8_of_no_inputs_is_bias():
    bias = np.arange(5, dtype=np.float32)
    y = np.full((3, 5), np.nan, np.float32)
    kernel("w8a8_linear").run_host([np.zeros((3, 0), np.float32), np.zeros((5, 0), np.int8),
                                    np.ones((5, 1), np.float32), bias], [y], [])
    np.testing.assert_array_equal(y, np.broadcast_to(bias, (3, 5)))


def test_rejects_what_it_cannot_do():
    w = np.zeros((96, 8), np.float32)
    with pytest.raises(RuntimeError, match="K"):
        kernel("weight_quantize").run_host([w], [np.zeros((8, 48), np.uint8), np.zeros((8, 1), np.float32)], [4, -1])
    x = np.zeros((4, 128), np.float32)[:, ::2]
    qw, sc = np.zeros((8, 32), np.uint8), np.zeros((8, 1), np.float32)
    with pytest.raises(RuntimeError, match="contiguous"):
        kernel("weight_only_linear").run_host([x, qw, sc], [np.zeros((4, 8), np.float32)], [4, -1])
    x, y, dy = np.zeros((4, 64), np.float32), np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32)
    for offsets in (np.zeros((8, 2), np.float32), np.zeros((8, 1), np.float64), np.zeros((1, 8), np.float32),
                    np.zeros((8, 2), np.float32)[:, :1]):
        with pytest.raises(RuntimeError, match=r"offsets must be contiguous float32 \[8, 1\]"):
            kernel("weight_only_linear").run_host([x, qw, sc, offsets], [y], [4, -1, 1])
        with pytest.raises(RuntimeError, match=r"offsets must be contiguous float32 \[8, 1\]"):
            kernel("weight_only_linear_grad").run_host([dy, qw, sc, offsets], [x], [4, -1, 1])
    with pytest.raises(RuntimeError, match="has_offsets must be 0 or 1"):
        kernel("weight_only_linear").run_host([x, qw, sc, sc], [y], [4, -1, 2])
    with pytest.raises(RuntimeError, match="expects x, qweight, scales, offsets"):
        kernel("weight_only_linear").run_host([x, qw, sc], [y], [4, -1, 1])


def test_has_offsets_0_reads_input_3_as_bias():
    rng = np.random.default_rng(2)
    _, _, packed, scales = quantized_weight(rng, 128, 10, "float32", 8, 32)
    x, bias = rng.standard_normal((3, 128)).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    y_absent, y_zero = empty((3, 10), "float32"), empty((3, 10), "float32")
    kernel("weight_only_linear").run_host([x, packed, scales, bias], [y_absent], [8, 32])
    kernel("weight_only_linear").run_host([x, packed, scales, bias], [y_zero], [8, 32, 0])
    np.testing.assert_array_equal(y_zero, y_absent)


@pytest.mark.parametrize("isa", isa_params("scalar", "avx2", "avx512", "amx"))
def test_isa_path(isa):
    code = ("import sys; sys.path.insert(0, {!r}); import test_kernels_quant as t; t.isa_cases()"
            .format(os.path.dirname(__file__)))
    env = dict(os.environ, ANYCHIP_CPU_ISA=isa)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bf16_products_rows_do_not_depend_on_m():
    bf16_products_invariance_case()


def bf16_products_invariance_case() -> None:
    """A row's bf16_products result is the same bit for bit whatever the number of rows (with AMX
    the tile GEMV up to 16 rows, the tile GEMM beyond; without, the blocked product for all):
    serving prefills a prompt alone or in a batch."""
    rng = np.random.default_rng(4)
    _, _, packed, scales = quantized_weight(rng, 576, 70, "float32", 4, 32)
    offsets = random_offsets(rng, scales)
    x = rng.standard_normal((40, 576)).astype(np.float32)

    def run(rows):
        y = empty((len(rows), 70), "float32")
        kernel("weight_only_linear").run_host([x[rows], packed, scales, offsets], [y], [4, 32, 1, 0, 1])
        return y

    full = run(list(range(40)))
    for rows in ([0], [0, 1], [3, 4, 5], list(range(17))):
        np.testing.assert_array_equal(run(rows), full[rows])


def test_bf16_products_rejects_what_it_cannot_do():
    rng = np.random.default_rng(5)
    _, _, packed, scales = quantized_weight(rng, 128, 8, "float32", 8, 32)
    x = rng.standard_normal((2, 128)).astype(np.float32)
    y = empty((2, 8), "float32")
    with pytest.raises(RuntimeError, match="x_int8 and bf16_products exclude each other"):
        kernel("weight_only_linear").run_host([x, packed, scales], [y], [8, 32, 0, 1, 1])
    with pytest.raises(RuntimeError, match="bf16_products takes float32 x"):
        kernel("weight_only_linear").run_host([to_bf16_bits(x), packed, scales], [empty((2, 8), "bfloat16")],
                                              [8, 32, 0, 0, 1], dtypes=["bfloat16", None, None, "bfloat16"])
    with pytest.raises(RuntimeError, match="bf16_products must be 0 or 1"):
        kernel("weight_only_linear").run_host([x, packed, scales], [y], [8, 32, 0, 0, 2])


# ---- x_int8: x quantized per run, integer products ----------------------------------------------

def x_run(bits: int, group: int) -> int:
    """kernel.h's x_int8 run: 32 for 8-bit W; for 4-bit W the largest of 128, 64, 32 dividing
    the group size (K for one group per row)."""
    return 32 if bits == 8 else next(r for r in (128, 64, 32) if group % r == 0)


def quantize_x_ref(x: np.ndarray, run: int):
    """kernel.h's x_int8 quantization of x [M, K] (values exact in float32) per run of ``run``,
    in float32 as the kernel does it: xq int64 [M, K], sx float32 [M, K / run]."""
    m, k = x.shape
    runs = x.astype(np.float32).reshape(m, k // run, run)
    sx = np.abs(runs).max(axis=2) / np.float32(127)
    safe = np.where(sx > 0, sx, np.float32(1))
    v = np.clip(runs / safe[..., None], np.float32(-127), np.float32(127))
    xq = np.where(sx[..., None] > 0, round_half_away(v), 0)
    return xq.reshape(m, k).astype(np.int64), sx.astype(np.float32)


def x_int8_ref(x, q, scales, offsets, bias, bits):
    """(y, bound) in float64: y exactly as kernel.h states the x_int8 product (the integer sums
    exact), bound the sum of the magnitudes of its float terms, which float32 error scales with
    (a kernel may convert partial integer sums, so each product's magnitude counts)."""
    m, k = x.shape
    run = x_run(bits, k // scales.shape[1])
    n, runs = q.shape[0], k // run
    xq, sx = quantize_x_ref(x, run)
    xr, qr = xq.reshape(m, runs, run), q.astype(np.int64).reshape(n, runs, run)
    sums = np.einsum("mrj,nrj->mnr", xr, qr)
    magnitudes = np.einsum("mrj,nrj->mnr", np.abs(xr), np.abs(qr))
    scale = sx.astype(np.float64)[:, None, :] * np.repeat(scales.astype(np.float64), runs // scales.shape[1], axis=1)
    y, bound = (sums * scale).sum(axis=2), (magnitudes * np.abs(scale)).sum(axis=2)
    if offsets is not None:
        grouped = x.reshape(m, offsets.shape[1], -1)
        y = y + grouped.sum(axis=2) @ offsets.T.astype(np.float64)
        bound = bound + np.abs(grouped).sum(axis=2) @ np.abs(offsets.T.astype(np.float64))
    if bias is not None:
        y, bound = y + bias, bound + np.abs(bias)
    return y, bound


def check_x_int8(rng, m, k, n, dtype, bits, group_size, with_offsets, with_bias):
    _, q, packed, scales = quantized_weight(rng, k, n, dtype, bits, group_size)
    offsets = random_offsets(rng, scales) if with_offsets else None
    x = rng.standard_normal((m, k)) * np.exp(rng.uniform(-2, 2, (m, k // 32)).repeat(32, axis=1))
    x[0, :32] = 0.0  # a zero run: sx 0
    x_stored = store(x, dtype)
    weights, attrs = weight_args(packed, scales, offsets, bits, group_size)
    attrs = (attrs + [0])[:3] + [1]
    inputs, dts, bias = [x_stored] + weights, [dtype] + [""] * len(weights), None
    if with_bias:
        b_stored = store(rng.standard_normal(n), dtype)
        bias = value(b_stored, dtype)
        inputs.append(b_stored)
        dts.append(dtype)
    y = empty((m, n), dtype)
    kernel("weight_only_linear").run_host(inputs, [y], attrs, dtypes=names(*dts, dtype))
    want, bound = x_int8_ref(value(x_stored, dtype), q, scales, offsets, bias, bits)
    check_error(value(y, dtype), want, bound, dtype,
                f"x_int8 m={m} k={k} bits={bits} group={group_size} offsets={with_offsets}")


def x_int8_cases() -> None:
    """bits 4 and 8, every usual group size, K with half chunks (4 bits: K % 128 == 64; 8 bits:
    K % 64 == 32), M below, at and above a GEMV row block and gemm_int8x's first rows (for one
    ISA)."""
    rng = np.random.default_rng(31)
    ks = {4: (64, 192, 384), 8: (32, 96, 160, 384)}
    for bits in (4, 8):
        for group_size in (32, 64, 128, -1):
            for k in ks[bits]:
                if group_size != -1 and k % group_size:
                    continue
                # 4+ rows: gemm_int8x, in blocks of up to 8 rows (13: 8 + 5)
                for m, with_offsets in ((1, False), (3, True), (9, True), (1, True), (9, False), (4, True),
                                        (13, False)):
                    check_x_int8(rng, m, k, 37, "float32", bits, group_size, with_offsets, with_bias=m == 3)
    for dtype in ("bfloat16", "float16"):
        check_x_int8(rng, 2, 256, 19, dtype, 4, 32, True, True)
        check_x_int8(rng, 5, 160, 19, dtype, 8, -1, False, False)
    check_x_int8_extremes()
    check_x_int8_rows_stand_alone(rng)


def check_x_int8_rows_stand_alone(rng) -> None:
    """A row of x gets the same bits in any batch of fewer than 4 rows, and in any of 4 or more
    (gemm_int8x, in row blocks), whatever the other rows: what continuous batching relies on."""
    for bits in (4, 8):
        _, _, packed, scales = quantized_weight(rng, 192, 21, "float32", bits, 64)
        weights, attrs = weight_args(packed, scales, None, bits, 64)
        x = rng.standard_normal((13, 192)).astype(np.float32)

        def run(rows):
            y = empty((len(rows), 21), "float32")
            kernel("weight_only_linear").run_host([np.ascontiguousarray(rows)] + weights, [y],
                                                  (attrs + [0])[:3] + [1])
            return y

        small, large = run(x[:3]), run(x)
        np.testing.assert_array_equal(run(x[1:2]), small[1:2], err_msg=f"{bits} bits, 1 row of 3")
        for rows in (slice(0, 4), slice(5, 13), slice(2, 7)):
            np.testing.assert_array_equal(run(x[rows]), large[rows], err_msg=f"{bits} bits, rows {rows} of 13")


def check_x_int8_extremes() -> None:
    """8-bit codes at -128 (a GGUF Q8_0 block may hold one) and +-127 against x codes at +-127,
    same and opposite signs: the largest integer products, which an int16 pair must hold."""
    k, n = 128, 4
    q = np.full((n, k), -128, dtype=np.int8)
    q[1] = 127
    q[2, ::2], q[2, 1::2] = -128, 127
    q[3] = -127
    scales = np.full((n, 1), 0.5, dtype=np.float32)
    x = np.ones((5, k), dtype=np.float32)
    x[1::2, 1::2] = -1.0  # codes +-127: each run's absmax is 1
    for m in (2, 5):  # the GEMV tiles, gemm_int8x
        y = empty((m, n), "float32")
        kernel("weight_only_linear").run_host([x[:m], q, scales], [y], [8, -1, 0, 1])
        want, bound = x_int8_ref(x[:m].astype(np.float64), q, scales, None, None, 8)
        check_error(y.astype(np.float64), want, bound, "float32", f"x_int8 extreme 8-bit codes, {m} rows")


@pytest.mark.parametrize("isa", isa_params("scalar", "avx2", "avx512"))
def test_x_int8_isa_path(isa):
    code = ("import sys; sys.path.insert(0, {!r}); import test_kernels_quant as t; t.x_int8_cases()"
            .format(os.path.dirname(__file__)))
    env = dict(os.environ, ANYCHIP_CPU_ISA=isa)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_x_int8_is_the_float_product_within_its_quantization_error():
    """Against the float product (no quantization of x): the error llama.cpp-style int8
    activations cost, ~1e-3 relative for Gaussian x and weights (the test can fail if the
    kernel mixes up the layout's halves, which the exact oracle would also catch)."""
    rng = np.random.default_rng(4)
    _, q, packed, scales = quantized_weight(rng, 512, 64, "float32", 4, 32)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    y = empty((2, 64), "float32")
    kernel("weight_only_linear").run_host([x, packed, scales], [y], [4, 32, 0, 1])
    exact = x.astype(np.float64) @ dequantize(q, scales).T
    assert 1e-4 < np.linalg.norm(y - exact) / np.linalg.norm(exact) < 1e-2


def test_x_int8_rejects_runs_it_cannot_make():
    x, y = np.zeros((2, 96), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(RuntimeError, match="x_int8 needs K and the group size to be multiples of 32"):
        kernel("weight_only_linear").run_host([x, np.zeros((4, 96), np.int8), np.zeros((4, 6), np.float32)], [y],
                                              [8, 16, 0, 1])
    x = np.zeros((2, 80), np.float32)
    with pytest.raises(RuntimeError, match="x_int8 needs K"):
        kernel("weight_only_linear").run_host([x, np.zeros((4, 80), np.int8), np.zeros((4, 1), np.float32)], [y],
                                              [8, -1, 0, 1])
    with pytest.raises(RuntimeError, match="x_int8 must be 0 or 1"):
        kernel("weight_only_linear").run_host([x, np.zeros((4, 80), np.int8), np.zeros((4, 1), np.float32)], [y],
                                              [8, -1, 0, 2])
