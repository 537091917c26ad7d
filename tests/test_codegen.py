"""anychip CodeGen: descriptions -> c source -> ninja build -> cache -> registered kernels, run on
the simulated npu (through its launch_host_function, with ANYCHIP_SIM_CHECK guarding the memory)
against numpy; the cache, the autotuner, the cuda backend (compile-only) and a vendor backend
found through the plugin hook."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

try:
    import anychip_codegen as cg
except ImportError:  # not installed yet: the package is the repo's codegen/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import codegen as cg

    sys.modules["anychip_codegen"] = cg

import anychip
import anychip.runtime as rt
from anychip import _launcher
from anychip.kernels import KernelRegistry
from anychip.dtypes import DTYPE_BITS
from kernel_helpers import store, value

ir, ops = cg.ir, cg.ops
FLOATS = ("float32", "bfloat16", "float16")
NPU_DTYPES = ("float32", "bfloat16", "float16", "int32", "int64", "bool")
CAST_DTYPES = NPU_DTYPES + ("int8",)
# (rtol, atol) against float64 math on the stored inputs: float32 arithmetic, one rounding on store
TOL = {"float32": (2e-5, 1e-6), "bfloat16": (1e-2, 1e-2), "float16": (2e-3, 2e-3)}
SUM_TOL = {"float32": (1e-4, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (4e-3, 4e-3)}
NP_STORAGE = {"float32": np.float32, "bfloat16": np.uint16, "float16": np.float16, "int32": np.int32,
              "int64": np.int64, "int8": np.int8, "bool": np.bool_}


@pytest.fixture(scope="module")
def library():
    """The npu's library: the plugin built it at discovery into this session's cache, so this
    is a cache hit."""
    from anychip_plugins.npu import TRAITS

    return cg.generate("npu_kernels", ops.library(TRAITS.dtypes), "c")


@pytest.fixture(scope="module")
def kernels(library):
    return library.load()


@pytest.fixture(scope="module")
def npu():
    return rt.open_device("npu:0")


# ---- running a kernel on the simulated npu --------------------------------------------------


class Arg:
    """A tensor argument: ``base`` (a contiguous array in storage form) uploaded to the device,
    described as ``view(base)`` (a numpy view: broadcast, transposed, sliced) or as itself."""

    def __init__(self, base, dtype, view=None):
        self.base, self.dtype, self.view = np.ascontiguousarray(base), dtype, view

    def described(self):
        return self.view(self.base) if self.view else self.base


def run(npu, fn, inputs, outputs, attrs=()):
    """Runs kernel ``fn`` on npu:0 and returns the outputs' described views (host copies)."""
    buffers, descs = [], []
    for arg in (*inputs, *outputs):
        buf = npu.allocate(max(arg.base.nbytes, 1))
        if arg.base.nbytes:
            buf.copy_from_host(arg.base)
        v = arg.described()
        item = arg.base.itemsize
        offset = v.__array_interface__["data"][0] - arg.base.__array_interface__["data"][0] if v.size else 0
        buffers.append(buf)
        descs.append((buf.ptr + offset, DTYPE_BITS[arg.dtype], tuple(v.shape),
                      tuple(s // item for s in v.strides), 0))
    errors = []

    def work():
        try:
            _launcher.launch(fn.address, descs[:len(inputs)], descs[len(inputs):], [float(a) for a in attrs])
        except Exception as e:  # noqa: BLE001 - re-raised below with the kernel's message
            errors.append(e)
            raise

    stream = npu.stream()
    stream.launch_host(work, buffers)
    try:
        stream.synchronize()
    except Exception:
        if errors:
            raise errors[0] from None
        raise
    finally:
        stream.destroy()
    results = []
    for arg, buf in zip(outputs, buffers[len(inputs):]):
        host = np.empty_like(arg.base)
        if host.nbytes:
            buf.copy_to_host(host)
        results.append(arg.view(host) if arg.view else host)
    return results


def stored(rng_values, dtype):
    """(storage array, float64 values it holds)."""
    if dtype == "bool":
        a = np.asarray(rng_values) != 0
        return a, a
    if dtype in ("int32", "int64", "int8"):
        values = np.asarray(rng_values)
        a = (np.clip(np.trunc(values), -128, 127) if dtype == "int8" else values).astype(dtype)
        return a, a
    a = store(rng_values, dtype)
    return a, value(a)


def out_arg(shape, dtype, view=None):
    fill = {"bool": 2, "int32": -7, "int64": -7, "int8": -7}.get(dtype)
    if dtype == "bfloat16":
        return Arg(np.full(shape, 0x7FC0, np.uint16), dtype, view)
    return Arg(np.full(shape, np.nan if fill is None else fill, NP_STORAGE[dtype]), dtype, view)


def got(array, dtype):
    if dtype == "bool":
        return array.view(np.uint8).astype(np.int64)
    return value(array) if dtype in FLOATS else array.astype(np.int64)


def assert_close(actual, expected, dtype, tol=TOL, what=""):
    actual = got(actual, dtype) if not (dtype in FLOATS and actual.dtype == np.float64) else actual
    if dtype in FLOATS:
        rtol, atol = tol[dtype]
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, np.asarray(expected).astype(np.int64), err_msg=what)


# ---- elementwise ----------------------------------------------------------------------------

UNARY_REF = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v),
             "silu": lambda v: v / (1 + np.exp(-v)), "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
             "tanh": np.tanh, "abs": np.abs, "neg": np.negative}
POSITIVE = ("log", "sqrt", "rsqrt")
SHAPES = [(), (7,), (3, 5, 17)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", list(UNARY_REF))
def test_unary(npu, kernels, op, dtype):
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        raw = rng.uniform(0.1, 3.0, shape) if op in POSITIVE else rng.standard_normal(shape) * 2
        x, xv = stored(raw, dtype)
        # a transposed (strided) input where the rank allows
        view = (lambda a: a.T) if len(shape) > 1 else None
        xv_seen = xv.T if view else xv
        (out,) = run(npu, kernels[f"{op}.{dtype}"], [Arg(x, dtype, view)], [out_arg(xv_seen.shape, dtype)])
        assert_close(out, UNARY_REF[op](xv_seen), dtype, what=f"{op} {shape}")


def test_exp_is_within_one_ulp_over_its_whole_range(npu, kernels):
    """The c backend's e^x (a vectorisable polynomial, not expf): within 1 ulp of the exact value
    at 200k points from overflow down through the subnormals, with inf, 0 and NaN where they
    belong. (Its worst case is 1.01 ulp, over 100M random points: the float32 evaluation's own
    rounding.)"""
    sweep = np.concatenate([np.linspace(-104.5, 89.0, 200_003), np.linspace(-1e-3, 1e-3, 1001),
                            [0.0, -0.0, 88.72283, 88.7229, -87.33655, -103.97, -103.98, 1e30, -1e30]])
    x = sweep.astype(np.float32)
    specials = np.array([np.inf, -np.inf, np.nan], np.float32)
    # specials first too: there they go through the 16-lane variant, at the end through the scalar tail
    (out,) = run(npu, kernels["exp.float32"], [Arg(np.concatenate([specials, x, specials]), "float32")],
                 [out_arg((len(x) + 6,), "float32")])
    assert out[0] == np.inf and out[1] == 0.0 and np.isnan(out[2])
    out = out[3:]
    with np.errstate(over="ignore"):
        exact = np.exp(x.astype(np.float64))
        want = exact.astype(np.float32)
    finite = np.isfinite(want) & (want > 0)
    ulps = np.abs(out[:len(x)][finite] - exact[finite]) / np.spacing(want[finite])
    assert ulps.max() <= 1.0, f"{ulps.max():.2f} ulp at x = {x[finite][ulps.argmax()]!r}"
    assert np.all(out[:len(x)][want == np.inf] == np.inf)
    assert np.all(out[:len(x)][want == 0] <= np.float32(1.5e-45))  # 0, or the last subnormal rounding
    assert out[-3] == np.inf and out[-2] == 0.0 and np.isnan(out[-1])


@pytest.mark.parametrize("dtype", FLOATS)
def test_scale_and_pow(npu, kernels, dtype):
    rng = np.random.default_rng(2)
    x, xv = stored(rng.uniform(0.5, 2.0, (4, 33)), dtype)
    for after in (1.0, 0.0):
        (out,) = run(npu, kernels[f"scale.{dtype}"], [Arg(x, dtype)], [out_arg(x.shape, dtype)], [1.5, -0.25, after])
        ref = 1.5 * xv - 0.25 if after else 1.5 * (xv - 0.25)
        assert_close(out, ref, dtype, what=f"scale bias_after_scale={after}")
    (out,) = run(npu, kernels[f"pow.{dtype}"], [Arg(x, dtype)], [out_arg(x.shape, dtype)], [2.5])
    assert_close(out, xv ** 2.5, dtype, what="pow")


BINARY_REF = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
              "maximum": np.maximum, "minimum": np.minimum, "elementwise_pow": np.power}
# (x shape, y shape): broadcast patterns, scalars and odd sizes
BROADCASTS = [((5, 7), (5, 7)), ((3, 1, 5), (1, 4, 5)), ((2, 3, 129), ()), ((), (6,)), ((4, 1), (1, 1))]


def broadcast_args(rng, xs, ys, dtype, positive=False, ints=False):
    out_shape = np.broadcast_shapes(xs, ys)
    gen = (lambda s: rng.integers(-3, 4, s)) if ints else (
        (lambda s: rng.uniform(0.5, 2.0, s)) if positive else (lambda s: rng.standard_normal(s)))
    (x, xv), (y, yv) = stored(gen(xs), dtype), stored(gen(ys), dtype)
    to = lambda a: np.broadcast_to(a, out_shape)  # noqa: E731 - stride-0 descriptors, as the ABI says
    return out_shape, [Arg(x, dtype, to), Arg(y, dtype, to)], np.broadcast_to(xv, out_shape), np.broadcast_to(yv, out_shape)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", list(BINARY_REF))
def test_binary_broadcasting(npu, kernels, op, dtype):
    rng = np.random.default_rng(3)
    for xs, ys in BROADCASTS:
        out_shape, args, xv, yv = broadcast_args(rng, xs, ys, dtype, positive=op == "elementwise_pow")
        (out,) = run(npu, kernels[f"{op}.{dtype}"], args, [out_arg(out_shape, dtype)])
        assert_close(out, BINARY_REF[op](xv, yv), dtype, what=f"{op} {xs} {ys}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_elementwise_outputs_stream_out_unchanged(npu, kernels, dtype):
    """Flat elementwise outputs past 8 MiB are written a whole cache line at a time with
    non-temporal stores: an output that starts mid-line (the part before its first line is
    written directly) and a length that leaves a partial last block, against numpy; nothing
    outside the output's window is written."""
    rng = np.random.default_rng(13)
    item = 4 if dtype == "float32" else 2
    n = (8 << 20) // item + 1037
    x, xv = stored(rng.standard_normal(n), dtype)
    y, yv = stored(rng.standard_normal(n), dtype)
    for start in (0, 3):
        out = out_arg((n + 8,), dtype, lambda a, s=start: a[s:s + n])
        (window,) = run(npu, kernels[f"add.{dtype}"], [Arg(x, dtype), Arg(y, dtype)], [out])
        assert_close(window, xv + yv, dtype, what=f"add of {n} from element {start}")
        outside = np.concatenate([window.base[:start], window.base[start + n:]])
        fill = out.base[0]
        assert (outside.view(np.uint16) == fill).all() if dtype == "bfloat16" else np.isnan(outside).all()


COMPARE_REF = {"equal": np.equal, "not_equal": np.not_equal, "less_than": np.less, "less_equal": np.less_equal,
               "greater_than": np.greater, "greater_equal": np.greater_equal}


@pytest.mark.parametrize("dtype", FLOATS + ("int32", "int64"))
@pytest.mark.parametrize("op", list(COMPARE_REF))
def test_compare(npu, kernels, op, dtype):
    rng = np.random.default_rng(4)
    for xs, ys in BROADCASTS:
        out_shape, args, xv, yv = broadcast_args(rng, xs, ys, dtype, ints=True)
        (out,) = run(npu, kernels[f"{op}.{dtype}"], args, [out_arg(out_shape, "bool")])
        assert_close(out, COMPARE_REF[op](xv, yv), "bool", what=f"{op} {xs} {ys}")


@pytest.mark.parametrize("dtype", NPU_DTYPES)
def test_where(npu, kernels, dtype):
    rng = np.random.default_rng(5)
    shape = (3, 4, 9)
    c, cv = stored(rng.integers(0, 2, (3, 1, 9)), "bool")
    x, xv = stored(rng.integers(-5, 5, shape), dtype)
    y, yv = stored(rng.integers(-5, 5, (9,)), dtype)
    to = lambda a: np.broadcast_to(a, shape)  # noqa: E731
    (out,) = run(npu, kernels[f"where.{dtype}"], [Arg(c, "bool", to), Arg(x, dtype, to), Arg(y, dtype, to)],
                 [out_arg(shape, dtype)])
    assert_close(out, np.where(to(cv), xv, to(yv)), dtype)


@pytest.mark.parametrize("src", CAST_DTYPES)
def test_cast_every_pair(npu, kernels, src):
    rng = np.random.default_rng(6)
    raw = np.concatenate([rng.standard_normal(20) * 50, [0.0, -0.0, 2.5, -2.5, 1.0, -1.7, 65504.0, 3.0e-8]])
    x, xv = stored(raw, src)
    for dst in CAST_DTYPES:
        (out,) = run(npu, kernels[f"cast.{src}"], [Arg(x, src)], [out_arg(x.shape, dst)])
        if dst == "int8":  # from a float: toward zero and saturating; from an int: wrapping
            floats = src in FLOATS
            expected = (np.clip(np.trunc(xv.astype(np.float64)), -128, 127) if floats else
                        np.asarray(xv).astype(np.int64).astype(np.int8))
        elif dst in ("int32", "int64"):
            expected = np.trunc(xv.astype(np.float64))
        elif dst == "bool":
            expected = xv != 0
        else:  # one rounding to the target (nearest even), as kernel_helpers.store does; may overflow to inf
            with np.errstate(over="ignore"):
                expected = value(store(xv.astype(np.float64), dst)) if dst != "float32" else xv.astype(np.float32)
        tol = {d: (0.0, 0.0) for d in FLOATS}
        assert_close(out, np.asarray(expected, np.float64) if dst in FLOATS else expected, dst, tol, f"{src}->{dst}")


@pytest.mark.parametrize("dtype", NPU_DTYPES)
def test_fill_copy_arange(npu, kernels, dtype):
    (out,) = run(npu, kernels[f"fill.{dtype}"], [], [out_arg((3, 0, 2), dtype)], [1.0])  # empty: nothing to do
    (out,) = run(npu, kernels[f"fill.{dtype}"], [], [out_arg((5, 3), dtype)], [3.0 if dtype != "bool" else 1.0])
    assert_close(out, np.full((5, 3), 3.0 if dtype != "bool" else 1.0), dtype, what="fill")
    rng = np.random.default_rng(7)
    x, xv = stored(rng.integers(-9, 9, (4, 6)), dtype)
    # copy a transposed view into a strided window of a larger output (the copy-only rule)
    window = lambda a: a[1:7, 2:6]  # noqa: E731
    (out,) = run(npu, kernels[f"copy.{dtype}"], [Arg(x, dtype, lambda a: a.T)], [out_arg((8, 7), dtype, window)])
    assert_close(out, xv.T, dtype, what="copy into a window")
    if dtype in FLOATS + ("int64",):
        (out,) = run(npu, kernels[f"arange.{dtype}"], [], [out_arg((11,), dtype)], [-3.0, 2.0])
        assert_close(out, -3.0 + 2.0 * np.arange(11), dtype, what="arange")


def test_copy_writes_only_its_window(npu, kernels):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (window,) = run(npu, kernels["copy.float32"], [Arg(x, "float32")],
                    [out_arg((4, 5), "float32", lambda a: a[1:3, 1:4])])
    np.testing.assert_array_equal(window, x)
    outside = np.ones((4, 5), bool)
    outside[1:3, 1:4] = False
    assert np.isnan(window.base[outside]).all()


# ---- reductions, softmax, cross entropy ----------------------------------------------------

REDUCE_REF = {"sum": np.sum, "mean": np.mean, "max": np.max}
AXES = [((6, 35), (1,), 0), ((4, 5, 33), (0, 2), 1), ((4, 5, 33), (), 0), ((3, 1, 7), (0,), 1), ((2, 9), (1,), 1)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", list(REDUCE_REF))
def test_reductions(npu, kernels, op, dtype):
    rng = np.random.default_rng(8)
    for shape, axes, keepdim in AXES:
        x, xv = stored(rng.standard_normal(shape), dtype)
        all_axes = axes or tuple(range(len(shape)))
        ref = REDUCE_REF[op](xv, axis=all_axes, keepdims=bool(keepdim))
        strided = (lambda a: a[:, ::-1]) if len(shape) == 2 else None  # a reversed view: negative strides
        if strided:
            ref = REDUCE_REF[op](xv[:, ::-1], axis=all_axes, keepdims=bool(keepdim))
        (out,) = run(npu, kernels[f"{op}.{dtype}"], [Arg(x, dtype, strided)], [out_arg(ref.shape, dtype)],
                     [keepdim, len(axes), *axes])
        assert_close(out, ref, dtype, SUM_TOL, f"{op} {shape} axes={axes}")


def softmax_ref(v, axis):
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_and_grad(npu, kernels, dtype):
    rng = np.random.default_rng(9)
    for shape, axis in (((5, 37), -1), ((3, 4, 6), 0), ((2, 3, 5), 1), ((1,), 0)):
        x, xv = stored(rng.standard_normal(shape) * 3, dtype)
        (out,) = run(npu, kernels[f"softmax.{dtype}"], [Arg(x, dtype)], [out_arg(shape, dtype)], [axis])
        assert_close(out, softmax_ref(xv, axis), dtype, SUM_TOL, f"softmax {shape} axis {axis}")
        o, ov = stored(softmax_ref(xv, axis), dtype)
        d, dv = stored(rng.standard_normal(shape), dtype)
        (dx,) = run(npu, kernels[f"softmax_grad.{dtype}"], [Arg(o, dtype), Arg(d, dtype)], [out_arg(shape, dtype)], [axis])
        assert_close(dx, ov * (dv - (dv * ov).sum(axis=axis, keepdims=True)), dtype, SUM_TOL, "softmax_grad")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cols", [2051, 1024, 8256])
def test_large_row_outputs_stream_out_unchanged(npu, kernels, dtype, cols):
    """Row kernels whose outputs pass 8 MiB write their rows with non-temporal stores (RMSNorm
    block by block, where a block is aligned; softmax through a buffer): rows of an odd length
    (none 64-byte aligned but the first) and of whole 64-element blocks (reduced as four quarters,
    side by side or one after another as the target walks them), two outputs of different dtypes
    (rms_norm's y and float32 inv_rms; softmax's one), against the reference."""
    rng = np.random.default_rng(12)
    shape = (2100 if dtype == "float32" else 4100) * 2051 // cols + 1, cols  # over 8 MiB of y
    x, xv = stored(rng.standard_normal(shape), dtype)
    w, wv = stored(rng.uniform(0.5, 1.5, shape[1]), dtype)
    y, inv = run(npu, kernels[f"rms_norm.{dtype}"], [Arg(x, dtype), Arg(w, dtype)],
                 [out_arg(shape, dtype), out_arg((shape[0],), "float32")], [1e-5])
    want_inv = 1 / np.sqrt((xv ** 2).mean(-1, keepdims=True) + 1e-5)
    assert_close(y, xv * want_inv * wv, dtype, SUM_TOL, "rms_norm y")
    np.testing.assert_allclose(inv, want_inv.reshape(-1), rtol=1e-5)
    # rms_norm's large outputs take the pipelined path (the next row read while this one is
    # written); a small call takes the plain one: the same rows come out bit for bit
    few = 64
    y_few, inv_few = run(npu, kernels[f"rms_norm.{dtype}"], [Arg(x[:few], dtype), Arg(w, dtype)],
                         [out_arg((few, shape[1]), dtype), out_arg((few,), "float32")], [1e-5])
    assert np.array_equal(y_few, y[:few]) and np.array_equal(inv_few, inv[:few])
    (out,) = run(npu, kernels[f"softmax.{dtype}"], [Arg(x, dtype)], [out_arg(shape, dtype)], [-1])
    assert_close(out, softmax_ref(xv, -1), dtype, SUM_TOL, "softmax")


def test_long_rows_sum_as_accurately_as_torchs_cpu(npu, kernels):
    """A vocabulary-wide row (49152 words) sums in double lanes (codegen's WIDE_LEN). Measured on
    these rows: 3e-8 relative (float lanes: 1.1e-7, which put 1.3e-6 into a training step's
    cross-entropy over SmolLM2's vocabulary; tests/test_torch_transformers.py)."""
    rng = np.random.default_rng(13)
    x, xv = stored(rng.uniform(0.5, 1.5, (3, 49152)), "float32")
    (total,) = run(npu, kernels["sum.float32"], [Arg(x, "float32")], [out_arg((3,), "float32")], [0, 1, 1])
    sum_err = np.abs(total - xv.sum(-1)).max() / xv.sum(-1).min()
    assert sum_err < 6e-8, f"sum over 49152 off by {sum_err:.2e} relative"
    (out,) = run(npu, kernels["softmax.float32"], [Arg(x, "float32")], [out_arg(x.shape, "float32")], [-1])
    ref = softmax_ref(xv, -1)
    soft_err = (np.abs(out - ref) / ref).max()
    assert soft_err < 3e-7, f"softmax over 49152 off by {soft_err:.2e} relative"


@pytest.mark.parametrize("dtype", FLOATS)
def test_cross_entropy_and_grad(npu, kernels, dtype):
    rng = np.random.default_rng(10)
    rows, V = (2, 3), 50
    x, xv = stored(rng.standard_normal((*rows, V)) * 2, dtype)
    label = rng.integers(0, V, (*rows, 1)).astype(np.int64)
    label[0, 1, 0] = -100
    sm, loss = run(npu, kernels[f"cross_entropy_with_softmax.{dtype}"], [Arg(x, dtype), Arg(label, "int64")],
                   [out_arg(xv.shape, dtype), out_arg((*rows, 1), dtype)], [-100])
    ref_sm = softmax_ref(xv, -1)
    lse = np.log(np.exp(xv - xv.max(-1, keepdims=True)).sum(-1, keepdims=True)) + xv.max(-1, keepdims=True)
    picked = np.take_along_axis(xv, np.clip(label, 0, V - 1), -1)
    ref_loss = np.where(label == -100, 0.0, lse - picked)
    assert_close(sm, ref_sm, dtype, SUM_TOL, "softmax")
    assert_close(loss, ref_loss, dtype, SUM_TOL, "loss")
    s, sv = stored(ref_sm, dtype)
    dl, dlv = stored(rng.uniform(0.5, 1.5, (*rows, 1)), dtype)
    (dx,) = run(npu, kernels[f"cross_entropy_with_softmax_grad.{dtype}"], [Arg(label, "int64"), Arg(s, dtype), Arg(dl, dtype)],
                [out_arg(xv.shape, dtype)], [-100])
    onehot = np.arange(V) == label
    assert_close(dx, np.where(label == -100, 0.0, (sv - onehot) * dlv), dtype, SUM_TOL, "dlogits")


# ---- rms_norm (the ABI in anychip/kernel.h) --------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (5, 2, 333)])
def test_rms_norm_forward_and_grad(npu, kernels, dtype, residual, shape):
    rng = np.random.default_rng(11)
    C, R = shape[-1], int(np.prod(shape[:-1]))
    eps = 1e-5
    x, xv = stored(rng.standard_normal(shape) * 2, dtype)
    w, wv = stored(rng.uniform(0.5, 1.5, C), dtype)
    ins, outs = [Arg(x, dtype), Arg(w, dtype)], [out_arg(shape, dtype), out_arg((R,), "float32")]
    hv = xv
    if residual:
        r, rv = stored(rng.standard_normal(shape), dtype)
        ins.append(Arg(r, dtype))
        outs.append(out_arg(shape, dtype))
        hv = value(store(xv + rv, dtype)) if dtype != "float32" else (xv + rv).astype(np.float32).astype(np.float64)
    results = run(npu, kernels[f"rms_norm.{dtype}"], ins, outs, [eps])
    inv = 1 / np.sqrt((hv ** 2).mean(-1, keepdims=True) + eps)
    assert_close(results[0], hv * inv * wv, dtype, SUM_TOL, "y")
    np.testing.assert_allclose(results[1], inv.reshape(-1), rtol=1e-5)
    if residual:
        assert_close(results[2], hv, dtype, TOL, "h")
    # grad: dy, h, weight, inv_rms, dh_extra? -> dh, dweight
    dy, dyv = stored(rng.standard_normal(shape), dtype)
    h, _ = stored(hv, dtype)
    inv32 = inv.reshape(-1).astype(np.float32)
    ins = [Arg(dy, dtype), Arg(h, dtype), Arg(w, dtype), Arg(inv32, "float32")]
    extra_v = 0.0
    if residual:
        e, extra_v = stored(rng.standard_normal(shape), dtype)
        ins.append(Arg(e, dtype))
    dh, dw = run(npu, kernels[f"rms_norm_grad.{dtype}"], ins, [out_arg(shape, dtype), out_arg((C,), dtype)])
    g = dyv * wv
    ref_dh = inv * g - hv * inv ** 3 * (g * hv).mean(-1, keepdims=True) + extra_v
    ref_dw = (dyv * hv * inv).reshape(-1, C).sum(0)
    assert_close(dh, ref_dh, dtype, SUM_TOL, "dh")
    assert_close(dw, ref_dw, dtype, SUM_TOL, "dweight")


def test_kernel_reports_bad_calls(npu, kernels):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(RuntimeError, match="add \\(generated\\): expected 2 inputs"):
        run(npu, kernels["add.float32"], [Arg(x, "float32")], [out_arg((2, 3), "float32")])
    with pytest.raises(RuntimeError, match="rank"):
        run(npu, kernels["add.float32"], [Arg(x, "float32"), Arg(np.ones(3, np.float32), "float32")],
            [out_arg((2, 3), "float32")])
    with pytest.raises(RuntimeError, match="dtype"):
        run(npu, kernels["exp.float32"], [Arg(np.ones(3, np.float16), "float16")], [out_arg((3,), "float32")])


# ---- the npu plugin registers them ------------------------------------------------------------


def test_npu_registers_generated_kernels(library):
    from anychip.plugins import registry

    reg = registry()
    assert not [p for p in reg.problems if p.plugin == "npu"], reg.problems
    from anychip.ops import BASE_OPS
    from anychip_plugins.npu import TRAITS

    # every base op, in every dtype the npu has, from the generated library: none hand-written
    for op in (*BASE_OPS, "rms_norm"):
        dtypes = [d for d in BASE_OPS[op].dtypes if d in TRAITS.dtypes] if op in BASE_OPS else ["bfloat16"]
        assert dtypes, op
        for dtype in dtypes:
            k = reg.kernels.find(op, "npu", dtype)
            assert k is not None and Path(k.forward.library).resolve() == Path(library.path).resolve(), (op, dtype)
    assert reg.kernels.find("matmul", "npu", "float32").backward.symbol == "acg_matmul_grad_float32"
    assert reg.kernels.find("embedding", "npu", "bfloat16").backward.symbol == "acg_embedding_grad_bfloat16"
    rms = reg.kernels.find("rms_norm", "npu", "float16")
    assert rms.backward.symbol == "acg_rms_norm_grad_float16"
    assert reg.kernels.find("softmax", "npu", "float32").backward.symbol == "acg_softmax_grad_float32"
    # what CodeGen does not describe stays a host kernel
    assert "libanychip_host_kernels" in reg.kernels.find("attention", "npu", "float32").forward.library


def test_broken_codegen_disables_only_npus_generated_kernels(tmp_path):
    """A compiler that fails: npu's generated kernels are off, with the reason (naming the
    generated sources) in `anychip devices`; npu's host kernels and the other chips stay."""
    from conftest import run_python

    code = ("from anychip.devices import describe_all\n"
            "from anychip.plugins import registry\n"
            "info = {i.name: i for i in describe_all()}\n"
            "print('REASON', info['npu'].reason)\n"
            "print('XPU', info['xpu'].status, registry().kernels.find('add', 'xpu', 'float32') is not None)\n"
            "print('NPU', registry().kernels.find('add', 'npu', 'float32') is None,\n"
            "      registry().kernels.find('attention', 'npu', 'float32') is not None)\n")
    env = {"CXX": "false", "ANYCHIP_CODEGEN_CACHE": str(tmp_path), "PYTHONPATH": _pythonpath()}
    done = run_python(code, env)
    assert done.returncode == 0, done.stderr
    assert "building generated library 'npu_kernels' failed" in done.stdout and str(tmp_path) in done.stdout
    assert "XPU simulated True" in done.stdout
    assert "NPU True True" in done.stdout


def _pythonpath() -> str:
    """A PYTHONPATH under which a child process imports anychip_codegen as this one does."""
    parent = Path(cg.__file__).resolve().parent.parent
    if cg.__name__ == "anychip_codegen":
        return os.environ.get("PYTHONPATH", "")
    link = Path(os.environ["ANYCHIP_CACHE_DIR"]) / "pythonpath"
    link.mkdir(parents=True, exist_ok=True)
    if not (link / "anychip_codegen").exists():
        (link / "anychip_codegen").symlink_to(parent / "codegen")
    return os.pathsep.join([str(link), os.environ.get("PYTHONPATH", "")])


# ---- build, cache, tuner ---------------------------------------------------------------------


def small_kernels():
    x, y = ir.Input(0), ir.Input(1)
    T = ir.Arg("T")
    return [ir.Elementwise("axpy", (T, T), (ir.Out("T", ir.Attr(0, 2.0) * x + y),), ("float32", "float16"))]


def test_rebuild_is_a_cache_hit_without_a_compiler(tmp_path, monkeypatch):
    backend = cg.find_backend("c")
    first = cg.build_library("toy", small_kernels(), backend, root=tmp_path)
    assert first.built and Path(first.path).exists()
    assert (first.folder / "build.ninja").exists() and (first.folder / "axpy.cc").exists()
    build_module = sys.modules[cg.__name__ + ".build"]
    monkeypatch.setattr(build_module, "_run_ninja", lambda *a: pytest.fail("the compiler ran on a cache hit"))
    second = cg.build_library("toy", small_kernels(), backend, root=tmp_path)
    assert not second.built and second.path == first.path
    # a different description is a different library
    other = [ir.Elementwise("axpy", (ir.Arg("T"), ir.Arg("T")), (ir.Out("T", ir.Input(0) - ir.Input(1)),), ("float32",))]
    assert build_module.library_key("toy", other, backend) != \
        build_module.library_key("toy", small_kernels(), backend)
    fn = second.load()["axpy.float16"]
    x, y = np.arange(4, dtype=np.float16), np.ones(4, np.float16)
    out = np.zeros(4, np.float16)
    fn.run_host([x, y], [out], [3.0])
    np.testing.assert_array_equal(out, 3 * x + y)


def test_compiler_errors_name_the_generated_source(tmp_path, monkeypatch):
    backend = cg.find_backend("c")
    monkeypatch.setattr(backend, "render", lambda kernel: "this is not C++;\n")
    with pytest.raises(cg.CodeGenBuildError) as info:
        cg.build_library("broken", small_kernels(), backend, root=tmp_path)
    assert "axpy.cc" in str(info.value) and str(tmp_path) in str(info.value)


def test_tuner_picks_measures_once_and_caches(tmp_path, monkeypatch):
    backend = cg.find_backend("c")
    tune_module = sys.modules[cg.__name__ + ".tune"]
    monkeypatch.setenv("ANYCHIP_CODEGEN_TUNE", "1")
    (kernel,) = small_kernels()
    measured = []
    fake_times = iter([3.0, 1.0, 2.0])  # deterministic: the second candidate wins

    def measure(fn, candidate, dtype, repeats):
        measured.append(dict(candidate.schedule))
        fn.address  # the candidate really was built and loads
        return next(fake_times)

    monkeypatch.setattr(tune_module, "_measure", measure)
    record = cg.tune(kernel, backend, root=tmp_path)
    candidates = [dict(c) for c in backend.schedules(kernel)]
    assert measured == candidates and record["choice"] == candidates[1]
    assert cg.tuned(kernel, backend, root=tmp_path).schedule == tuple(sorted(candidates[1].items()))
    # a second tuning reads the cache: nothing is measured again
    monkeypatch.setattr(tune_module, "_measure", lambda *a: pytest.fail("measured twice"))
    assert cg.tune(kernel, backend, root=tmp_path)["choice"] == candidates[1]
    # the choice changes the source (the grain is compiled in)
    assert backend.render(cg.tuned(kernel, backend, root=tmp_path)) != backend.render(kernel)


def test_tuner_measures_for_real(tmp_path):
    record = cg.tune(small_kernels()[0], cg.find_backend("c"), root=tmp_path, repeats=1)
    assert len(record["times"]) == 3 and all(t > 0 for t in record["times"])


def test_tuning_can_be_disabled(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYCHIP_CODEGEN_TUNE", "0")
    backend = cg.find_backend("c")
    record = cg.tune(small_kernels()[0], backend, root=tmp_path)
    assert record["times"] is None and record["choice"] == dict(backend.schedules(small_kernels()[0])[0])


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.delenv("ANYCHIP_CODEGEN_CACHE", raising=False)
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    assert cg.cache_root() == tmp_path / "codegen"
    monkeypatch.setenv("ANYCHIP_CODEGEN_CACHE", str(tmp_path / "x"))
    assert cg.cache_root() == tmp_path / "x"


def test_description_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="reads input 1"):
        ir.Elementwise("bad", (ir.Arg(),), (ir.Out("T", ir.Input(1)),), FLOATS)
    with pytest.raises(ValueError, match="elementwise kernel 'bad' uses Reduce"):
        ir.Elementwise("bad", (ir.Arg(),), (ir.Out("T", ir.row_sum(ir.Input(0))),), FLOATS)
    with pytest.raises(ValueError, match="index input must be int64"):
        ir.Gather("bad", (ir.Arg(), ir.Arg()), (ir.Out("T", ir.Input(0)),), FLOATS, table=0, index=1)
    with pytest.raises(ValueError, match="every output must be one Product"):
        ir.Contraction("bad", (ir.Arg(), ir.Arg()), (ir.Out("T", ir.Input(0) + ir.Input(1)),), FLOATS)
    with pytest.raises(ValueError, match="reads input 2"):
        ir.Contraction("bad", (ir.Arg(), ir.Arg()), (ir.Out("T", ir.Product(0, 2)),), FLOATS)
    with pytest.raises(ValueError, match="row kernel 'bad' uses Product"):
        ir.Rows("bad", (ir.Arg(),), (ir.Out("T", ir.Product(0, 0)),), FLOATS)
    with pytest.raises(ValueError, match="Unary op 'cosh'"):
        ir.Unary("cosh", ir.Input(0))


# ---- cuda (compile-only) and a vendor backend through the hook ---------------------------------

CUDA = sys.modules[cg.__name__ + ".backends"].builtin()["cuda"]


@pytest.mark.skipif(sys.modules[cg.__name__ + ".backends.cuda"].nvcc() is None,
                    reason="nvcc is not installed: the cuda backend is compile-only here and needs it")
def test_cuda_backend_compiles(tmp_path):
    names = {"add", "cast", "softmax", "sum", "rms_norm", "rms_norm_grad", "cross_entropy_with_softmax", "embedding",
             "embedding_grad", "index_select", "matmul_grad"}
    kernels = [k for k in ops.library(FLOATS + ("int32", "int64", "bool")) if k.name in names]
    lib = cg.build_library("cuda_ops", kernels, CUDA, root=tmp_path)
    assert lib.built and Path(lib.path).stat().st_size > 0
    loaded = lib.load()
    assert not loaded["rms_norm.bfloat16"].host_code
    assert "__global__" in (lib.folder / "softmax.cu").read_text()
    assert "gemm_tile" in (lib.folder / "matmul_grad.cu").read_text()


class ToyBackend:
    """A vendor target in a few lines: the c backend's source under the vendor's own compiler
    flags, renamed so the library is the vendor's (docs/codegen.md quotes this class)."""

    name = "toychip-c"
    source_suffix = ".cc"
    host_code = True

    def __init__(self):
        self.c = cg.find_backend("c")
        self.rendered = []

    def render(self, kernel):
        self.rendered.append(kernel.name)
        return "// toychip\n" + self.c.render(kernel)

    def compile_command(self, source_path, output_path):
        return [*self.c.compile_command(source_path, output_path), "-DTOYCHIP=1"]

    def link_command(self, object_paths, output_path):
        return self.c.link_command(object_paths, output_path)

    def load(self, library_path, kernels):
        return self.c.load(library_path, kernels)


def test_vendor_backend_through_the_hook(tmp_path, monkeypatch):
    from anychip import plugins

    toy = ToyBackend()
    plugin = types.SimpleNamespace(anychip_register_codegen_backends=anychip.hookimpl(lambda: [toy]))
    real_discover = plugins.discover

    def discover():
        reg = real_discover()
        import pluggy

        pm = pluggy.PluginManager("anychip")
        pm.add_hookspecs(anychip.hookspecs)
        pm.register(plugin, name="toychip")
        for backends in pm.hook.anychip_register_codegen_backends():
            for b in backends:
                reg.codegen_backends[b.name] = b
        return reg

    monkeypatch.setattr(plugins, "_registry", None)
    monkeypatch.setattr(plugins, "discover", discover)
    found = cg.find_backend("toychip-c")
    assert found is toy
    lib = cg.build_library("toy_vendor", small_kernels(), found, root=tmp_path)
    assert set(toy.rendered) == {"axpy"} and "-DTOYCHIP=1" in (lib.folder / "build.ninja").read_text()
    registry = KernelRegistry()
    assert cg.register(registry, "toychip", lib) == ["axpy"]
    assert registry.find("axpy", "toychip", "float16").forward.symbol == "acg_axpy_float16"
    with pytest.raises(LookupError, match="no CodeGen backend 'nope'"):
        cg.find_backend("nope")
