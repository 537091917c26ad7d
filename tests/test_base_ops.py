"""The base operator set (anychip.ops.base): every op's hand-written host kernel, called directly with
descriptors for every dtype it declares, against the numpy reference (odd shapes, stride-0
broadcasting, strided views, rank 0, empty tensors, thread-count invariance); the indexing ops and
matmul also through the npu's CodeGen kernels (the other ops' generated kernels: test_codegen.py);
then the
anychip-level call path (anychip.ops.base_call) on xpu, which registers these kernels, and its
counted fallback on a device without them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from kernel_helpers import empty, kernel, store, value

from anychip.dtypes import FLOATS
from anychip.ops import BASE_OPS
from anychip.ops.base import reduction_attrs

RNG = np.random.default_rng(7)


def _stored(values, dtype):
    """(array the kernel gets, float64/int values the reference gets) for ``values`` in ``dtype``."""
    if dtype in FLOATS:
        a = store(np.asarray(values, np.float32), dtype)
        return a, value(a).astype(np.float32)
    a = np.asarray(values).astype("bool" if dtype == "bool" else dtype)
    return a, a


def _names(arrays):
    return ["bfloat16" if a.dtype == np.uint16 else None for a in arrays]


def _launch(op, inputs, outputs, attrs=(), num_threads=0):
    arrays = list(inputs) + list(outputs)
    kernel(op).run_host(inputs, outputs, attrs, num_threads=num_threads, dtypes=_names(arrays))


@pytest.fixture(scope="module")
def generated():
    """The npu's CodeGen kernels by "op.dtype" (a cache hit: the plugin built them at discovery)."""
    import anychip_codegen as cg
    from anychip_plugins.npu import TRAITS

    return cg.generate("npu_kernels", cg.ops.library(TRAITS.dtypes), "c").load()


@pytest.fixture(params=["hand-written", "generated"])
def launch(request):
    """``launch(op, dtype, inputs, outputs, attrs, num_threads)`` through the hand-written host
    kernel or the generated one registered for ``dtype``."""
    if request.param == "hand-written":
        return lambda op, dtype, *args, **kw: _launch(op, *args, **kw)
    found = request.getfixturevalue("generated")

    def go(op, dtype, inputs, outputs, attrs=(), num_threads=0):
        found[f"{op}.{dtype}"].run_host(inputs, outputs, attrs, num_threads=num_threads,
                                        dtypes=_names(list(inputs) + list(outputs)))
    return go


def _check(op, got, want, dtype):
    rtol, atol = BASE_OPS[op].tolerance[dtype]
    got = value(got) if got.dtype == np.uint16 or got.dtype.kind == "f" else got
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=f"{op} {dtype}")
    else:
        np.testing.assert_allclose(got, want.astype(np.float64), rtol=rtol, atol=atol, err_msg=f"{op} {dtype}")


def _out(shape, dtype):
    return empty(shape, dtype) if dtype in FLOATS else np.zeros(shape, "bool" if dtype == "bool" else dtype)


def _elementwise(op, dtype, arrays, attrs=(), out_dtype=None):
    """Runs ``op`` with inputs broadcast to the output shape by stride 0 and checks it."""
    decl = BASE_OPS[op]
    stored = [_stored(a, d) for a, d in arrays]
    shape = decl.output_shapes([s.shape for s, _ in stored], attrs)[0]
    odt = decl.resolve_output_dtypes(dtype, out_dtype)[0]
    out = _out(shape, odt)
    _launch(op, [np.broadcast_to(s, shape) for s, _ in stored], [out], attrs)
    want = decl.reference([np.broadcast_to(r, shape) for _, r in stored], attrs, out_dtype=out_dtype)[0]
    _check(op, out, want, odt)


SHAPE_PAIRS = [((), ()), ((0, 3), (3,)), ((7,), (7,)), ((3, 1, 5), (4, 5)), ((2, 3), ()), ((5, 130), (5, 1))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", [n for n, d in BASE_OPS.items() if d.category == "unary"])
def test_unary(op, dtype):
    positive = op in ("log", "sqrt", "rsqrt", "pow")
    attrs = {"scale": [1.5, -0.25, 1.0], "pow": [2.5]}.get(op, [])
    for shape in [(), (0,), (1,), (3, 257), (2, 3, 40)]:
        x = RNG.uniform(0.1, 3.0, shape) if positive else RNG.standard_normal(shape) * 3
        _elementwise(op, dtype, [(x, dtype)], attrs)
    if op == "scale":  # bias before scale
        _elementwise(op, dtype, [(RNG.standard_normal((4, 9)), dtype)], [2.0, 0.5, 0.0])
    # a strided view (every other column) as input
    x, ref = _stored(RNG.uniform(0.1, 3.0, (6, 34)), dtype)
    out = _out((6, 17), dtype)
    _launch(op, [x[:, ::2]], [out], attrs)
    _check(op, out, BASE_OPS[op].reference([ref[:, ::2]], attrs)[0], dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", [n for n, d in BASE_OPS.items() if d.category == "binary"])
def test_binary_broadcasting(op, dtype):
    for sx, sy in SHAPE_PAIRS + [(sy, sx) for sx, sy in SHAPE_PAIRS]:
        x = RNG.uniform(0.5, 2.0, sx) if op == "elementwise_pow" else RNG.standard_normal(sx)
        y = RNG.uniform(0.5, 2.0, sy) * RNG.choice([-1, 1], sy) if op == "divide" else RNG.standard_normal(sy)
        _elementwise(op, dtype, [(x, dtype), (y, dtype)])


def test_maximum_minimum_propagate_nan():
    x, y = np.array([np.nan, 1.0, 2.0], np.float32), np.array([0.0, np.nan, 1.0], np.float32)
    for op, want in (("maximum", [np.nan, np.nan, 2.0]), ("minimum", [np.nan, np.nan, 1.0])):
        out = np.empty(3, np.float32)
        _launch(op, [x, y], [out])
        np.testing.assert_array_equal(out, np.array(want, np.float32))


@pytest.mark.parametrize("dtype", FLOATS + ("int32", "int64"))
@pytest.mark.parametrize("op", [n for n, d in BASE_OPS.items() if d.category == "compare"])
def test_compare(op, dtype):
    for sx, sy in SHAPE_PAIRS:
        _elementwise(op, dtype, [(RNG.integers(-2, 3, sx), dtype), (RNG.integers(-2, 3, sy), dtype)])


@pytest.mark.parametrize("dtype", BASE_OPS["where"].dtypes)
def test_where(dtype):
    for sc, sx, sy in [((), (), ()), ((4, 1), (1, 5), (4, 5)), ((3, 7), (3, 7), ()), ((0, 2), (2,), (2,))]:
        values = (lambda s: RNG.integers(-5, 5, s)) if dtype != "bool" else (lambda s: RNG.random(s) < 0.5)
        _elementwise("where", dtype, [(RNG.random(sc) < 0.5, "bool"), (values(sx), dtype), (values(sy), dtype)])


@pytest.mark.parametrize("src", BASE_OPS["cast"].dtypes)
def test_cast_every_pair(src):
    x = np.concatenate([RNG.standard_normal(40) * 50, [0.0, -0.0, 2.7, -2.7, 1.0, 255.5, -130.25, 3.5]])
    for dst in BASE_OPS["cast"].dtypes:
        values = x if src in FLOATS else (np.trunc(x) if src != "bool" else x > 0)
        _elementwise("cast", src, [(values.reshape(3, -1)[:, ::2], src)], out_dtype=dst)


@pytest.mark.parametrize("dtype", BASE_OPS["fill"].dtypes)
def test_fill(dtype):
    decl = BASE_OPS["fill"]
    for shape, v in [((), 1.0), ((0,), 3.0), ((3, 5), -2.75), ((2, 3, 4), 7.0)]:
        out = _out(shape, dtype)
        _launch("fill", [], [out], [v])
        _check("fill", out, decl.reference([], [v], out_dtype=dtype, out_shape=shape)[0], dtype)
    big = np.zeros(3, np.int64)
    _launch("fill", [], [big], [float(2**40 + 1)])  # int64 fill is exact, not rounded through float32
    assert (big == 2**40 + 1).all()


@pytest.mark.parametrize("dtype", BASE_OPS["copy"].dtypes)
def test_copy_strided_in_and_out(dtype):
    src, _ = _stored(RNG.integers(-9, 9, (4, 6, 5)), dtype)
    # transpose -> dense (contiguous)
    out = _out((5, 6, 4), dtype)
    _launch("copy", [src.transpose(2, 1, 0)], [out])
    np.testing.assert_array_equal(out, src.transpose(2, 1, 0))
    # a slice written into a column band of a larger tensor (concat's piece); the rest untouched
    big = np.zeros((4, 6, 9), src.dtype)
    _launch("copy", [src[:, :, 1:4]], [big[:, :, 2:5]])
    np.testing.assert_array_equal(big[:, :, 2:5], src[:, :, 1:4])
    assert not big[:, :, :2].any() and not big[:, :, 5:].any()
    scalar = np.zeros((), src.dtype)
    _launch("copy", [src[1, 2, 3, ...]], [scalar])
    assert scalar == src[1, 2, 3]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_reductions(op, dtype):
    decl = BASE_OPS[op]
    x4, r4 = _stored(RNG.standard_normal((3, 5, 7, 9)), dtype)
    for axes, keepdim in [(None, False), ((0,), True), ((1, 3), False), ((3,), False), ((0, 1, 2, 3), True),
                          ((2,), True)]:
        for source, ref in [(x4, r4), (x4[:, ::2, :, 1:8], r4[:, ::2, :, 1:8])]:
            attrs = reduction_attrs(axes, 4, keepdim)
            out = _out(decl.output_shapes([source.shape], attrs)[0], dtype)
            _launch(op, [source], [out], attrs)
            _check(op, out, decl.reference([ref], attrs)[0], dtype)
    scalar, sref = _stored(np.array(2.5), dtype)
    out = _out((), dtype)
    _launch(op, [scalar], [out], reduction_attrs(None, 0, False))
    _check(op, out, decl.reference([sref], [0, 0])[0], dtype)


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_reductions_do_not_depend_on_threads(op):
    x = RNG.standard_normal((3, 200_001)).astype(np.float32)  # several blocks per output
    results = []
    for threads in (1, 2, 3):
        for axes in (None, (1,)):
            attrs = reduction_attrs(axes, 2, False)
            out = np.empty(BASE_OPS[op].output_shapes([x.shape], attrs)[0], np.float32)
            _launch(op, [x], [out], attrs, num_threads=threads)
            results.append(out)
    assert all(np.array_equal(results[i], results[i % 2]) for i in range(len(results)))


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_and_grad(dtype):
    for shape, axis in [((5,), 0), ((3, 4, 129), -1), ((3, 4, 7), 1), ((6, 2, 3), 0), ((2, 0, 3), 1)]:
        x, xr = _stored(RNG.standard_normal(shape) * 3, dtype)
        out = _out(shape, dtype)
        _launch("softmax", [x], [out], [axis])
        _check("softmax", out, BASE_OPS["softmax"].reference([xr], [axis])[0], dtype)
        o, orf = _stored(value(out) if out.dtype == np.uint16 else out, dtype)
        dy, dyr = _stored(RNG.standard_normal(shape), dtype)
        dx = _out(shape, dtype)
        _launch("softmax_grad", [o, dy], [dx], [axis])
        _check("softmax_grad", dx, BASE_OPS["softmax_grad"].reference([orf, dyr], [axis])[0], dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_cross_entropy_with_softmax_and_grad(dtype):
    rows, v = (2, 3), 37
    logits, lr = _stored(RNG.standard_normal(rows + (v,)) * 2, dtype)
    label = RNG.integers(0, v, rows + (1,)).astype(np.int64)
    label[0, 1, 0] = -100  # ignored
    sm, loss = _out(rows + (v,), dtype), _out(rows + (1,), dtype)
    _launch("cross_entropy_with_softmax", [logits, label], [sm, loss], [-100])
    want_sm, want_loss = BASE_OPS["cross_entropy_with_softmax"].reference([lr, label], [-100])
    _check("cross_entropy_with_softmax", sm, want_sm, dtype)
    _check("cross_entropy_with_softmax", loss, want_loss, dtype)
    assert value(loss)[0, 1, 0] == 0
    s, sr = _stored(value(sm) if sm.dtype == np.uint16 else sm, dtype)
    dl, dlr = _stored(RNG.standard_normal(rows + (1,)), dtype)
    dx = _out(rows + (v,), dtype)
    _launch("cross_entropy_with_softmax_grad", [label, s, dl], [dx], [-100])
    _check("cross_entropy_with_softmax_grad", dx,
           BASE_OPS["cross_entropy_with_softmax_grad"].reference([label, sr, dlr], [-100])[0], dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_embedding_and_grad(launch, dtype):
    v, c = 11, 19
    w, wr = _stored(RNG.standard_normal((v, c)), dtype)
    ids = RNG.integers(0, v, (3, 7)).astype(np.int64)
    ids[0, :3] = 4  # repeated ids sum in the grad
    for pad in (-1, 2):
        out = _out((3, 7, c), dtype)
        launch("embedding", dtype, [ids, w], [out], [pad])
        _check("embedding", out, BASE_OPS["embedding"].reference([ids, wr], [pad])[0], dtype)
        dout, dr = _stored(RNG.standard_normal((3, 7, c)), dtype)
        dw = _out((v, c), dtype)
        launch("embedding_grad", dtype, [ids, dout], [dw], [pad])
        _check("embedding_grad", dw, BASE_OPS["embedding_grad"].reference([ids, dr], [pad], out_shape=(v, c))[0],
               dtype)


@pytest.mark.parametrize("op", ["embedding", "embedding_grad", "index_select"])
def test_indexing_rejects_an_index_out_of_range(launch, op):
    ids = np.array([1, 4], np.int64)
    table, out = np.zeros((4, 3), np.float32), np.empty((2, 3), np.float32)
    args = {"embedding": ([ids, table], [out]), "embedding_grad": ([ids, out], [table]),
            "index_select": ([table, ids], [out])}[op]
    with pytest.raises(RuntimeError, match=r"4 .*outside \[0, 4\)"):
        launch(op, "float32", *args, [-1 if op != "index_select" else 0])


@pytest.mark.parametrize("dtype", BASE_OPS["index_select"].dtypes)
def test_index_select(launch, dtype):
    x, xr = _stored(RNG.integers(-50, 50, (4, 5, 6)), dtype)
    for axis, index in [(0, [3, 0, 3]), (1, [4]), (2, [5, 1, 0, 2]), (-1, [])]:
        index = np.array(index, np.int64)
        shape = BASE_OPS["index_select"].output_shapes([x.shape, index.shape], [axis])[0]
        out = _out(shape, dtype)
        launch("index_select", dtype, [x, index], [out], [axis])
        _check("index_select", out, BASE_OPS["index_select"].reference([xr, index], [axis])[0], dtype)


@pytest.mark.parametrize("dtype", BASE_OPS["arange"].dtypes)
def test_arange(dtype):
    for n, start, step in [(0, 0.0, 1.0), (1, 5.0, 1.0), (17, -3.0, 0.5 if dtype in FLOATS else 2.0)]:
        out = _out((n,), dtype)
        _launch("arange", [], [out], [start, step])
        _check("arange", out, BASE_OPS["arange"].reference([], [start, step], out_dtype=dtype, out_shape=(n,))[0],
               dtype)


MATMUL_CASES = [  # x shape, y shape, transpose_x, transpose_y
    ((1, 1), (1, 1), 0, 0), ((5, 7), (7, 3), 0, 0), ((7, 5), (7, 3), 1, 0), ((5, 7), (3, 7), 0, 1),
    ((2, 3, 33, 70), (70, 300), 0, 0), ((4, 9, 6), (1, 10, 9), 1, 1), ((2, 1, 5, 4), (3, 4, 2), 0, 0),
    ((0, 4), (4, 3), 0, 0), ((3, 0), (0, 2), 0, 0),
]


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_and_grad(launch, dtype):
    for sx, sy, tx, ty in MATMUL_CASES:
        x, xr = _stored(RNG.standard_normal(sx), dtype)
        y, yr = _stored(RNG.standard_normal(sy), dtype)
        attrs = [tx, ty]
        shape = BASE_OPS["matmul"].output_shapes([sx, sy], attrs)[0]
        batch = shape[:-2]
        xb, yb = np.broadcast_to(x, batch + sx[-2:]), np.broadcast_to(y, batch + sy[-2:])
        out = _out(shape, dtype)
        launch("matmul", dtype, [xb, yb], [out], attrs)
        _check("matmul", out, BASE_OPS["matmul"].reference([xr, yr], attrs)[0], dtype)
        d, dr = _stored(RNG.standard_normal(shape), dtype)
        dx, dy = _out(sx, dtype), _out(sy, dtype)
        launch("matmul_grad", dtype, [xb, yb, d], [dx, dy], attrs)
        want_dx, want_dy = BASE_OPS["matmul_grad"].reference([xr, yr, dr], attrs)
        _check("matmul_grad", dx, want_dx, dtype)
        _check("matmul_grad", dy, want_dy, dtype)


def test_matmul_strided_operands_and_threads(launch):
    x = RNG.standard_normal((70, 40)).astype(np.float32)
    y = RNG.standard_normal((90, 60)).astype(np.float32)
    xs, ys = x[::2, 1:33], y[1:33:1, ::3]  # views with row and column strides
    want = xs.astype(np.float64) @ ys
    results = []
    for threads in (1, 2):
        out = np.empty((35, 20), np.float32)
        launch("matmul", "float32", [xs, ys], [out], [0, 0], num_threads=threads)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        results.append(out)
    assert np.array_equal(*results)


def test_every_op_has_a_host_kernel_and_a_declared_grad():
    for name, decl in BASE_OPS.items():
        assert kernel(name).address
        if decl.grad:
            assert decl.grad in BASE_OPS


def test_shape_rules_name_the_problem():
    with pytest.raises(ValueError, match="do not broadcast"):
        BASE_OPS["add"].output_shapes([(3,), (4,)])
    with pytest.raises(ValueError, match="contraction sizes 4 and 5"):
        BASE_OPS["matmul"].output_shapes([(3, 4), (5, 6)], [0, 0])
    with pytest.raises(ValueError, match="axes must be sorted"):
        BASE_OPS["sum"].output_shapes([(3, 4)], [0, 2, 1, 0])


# ---- the anychip-level call path (Paddle tensors on a device) -----------------------------------

def _tensor(array, device, dtype):
    from ops_helpers import tensor

    return tensor(array, device, dtype)


def test_base_call_on_xpu_runs_the_kernels():
    import anychip
    from ops_helpers import host

    from anychip.ops import base_call

    anychip.reset_fallbacks()
    x, y = RNG.standard_normal((3, 1, 5)), RNG.standard_normal((4, 5))
    (out,) = base_call.run("multiply", [_tensor(x, "xpu", "bfloat16"), _tensor(y, "xpu", "bfloat16")])
    assert list(out.shape) == [3, 4, 5] and str(out.dtype) == "paddle.bfloat16"
    np.testing.assert_allclose(host(out), x * y, rtol=3e-2, atol=3e-2)
    (s,) = base_call.run("sum", [_tensor(x, "xpu", "float32")], reduction_attrs(-1, 3, True))
    np.testing.assert_allclose(host(s), x.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    a, b = RNG.standard_normal((2, 6, 4)), RNG.standard_normal((6, 3))
    (m,) = base_call.run("matmul", [_tensor(a, "xpu", "float32"), _tensor(b, "xpu", "float32")], [1, 0])
    np.testing.assert_allclose(host(m), np.swapaxes(a, -1, -2) @ b, rtol=1e-5, atol=1e-5)
    (c,) = base_call.run("cast", [_tensor(x, "xpu", "float32")], out_dtype="int64")
    np.testing.assert_array_equal(host(c), np.trunc(x.astype(np.float32)).astype(np.int64))
    (f,) = base_call.run("fill", [], [1.0], out_dtype="float16", out_shape=[2, 2], device="xpu:0")
    np.testing.assert_array_equal(host(f), np.ones((2, 2)))
    t = _tensor(RNG.standard_normal((4, 6)), "xpu", "float32")
    (sm,) = base_call.run("softmax", [t.transpose([1, 0])], [0])  # a strided view, made dense by `copy`
    np.testing.assert_allclose(host(sm), BASE_OPS["softmax"].reference([host(t).T], [0])[0], rtol=1e-5, atol=1e-6)
    assert not [k for k in anychip.fallback_counts() if k[1].startswith("anychip.")]


def test_base_call_falls_back_counted_without_a_kernel(monkeypatch):
    import anychip
    from ops_helpers import host

    from anychip.ops import base_call

    anychip.reset_fallbacks()
    x = RNG.standard_normal((2, 3))
    (out,) = base_call.run("exp", [_tensor(x, "cpu", "float32")])  # cpu registers no base kernels
    np.testing.assert_allclose(host(out), np.exp(x), rtol=1e-6)
    assert anychip.fallback_counts()[("cpu", "anychip.exp", "float32")] == 1
    monkeypatch.setenv("ANYCHIP_STRICT", "1")
    from anychip.fallback import KernelFallbackError

    with pytest.raises(KernelFallbackError, match="anychip.ops.exp on cpu"):
        base_call.run("exp", [_tensor(x, "cpu", "float32")])


def test_base_call_argument_errors_name_the_op_and_argument():
    from anychip.ops import OpArgumentError, base_call

    x = _tensor(np.ones((2, 3)), "xpu", "float32")
    with pytest.raises(OpArgumentError, match=r"add: expected 2 input\(s\) \(x, y\), got 1"):
        base_call.run("add", [x])
    with pytest.raises(OpArgumentError, match="add: y has dtype int64, expected float32"):
        base_call.run("add", [x, _tensor(np.ones(3, np.int64), "xpu", "int64")])
    with pytest.raises(OpArgumentError, match="do not broadcast"):
        base_call.run("add", [x, _tensor(np.ones(4), "xpu", "float32")])
    with pytest.raises(OpArgumentError, match="out_dtype is required"):
        base_call.run("cast", [x])
    with pytest.raises(ValueError, match="op must be a base op"):
        base_call.run("nope", [x])


def test_declarations_cover_the_abi():
    names = set(BASE_OPS)
    for expected in ("exp", "scale", "pow", "add", "elementwise_pow", "equal", "where", "cast", "fill", "copy",
                     "sum", "mean", "max", "softmax", "softmax_grad", "cross_entropy_with_softmax",
                     "cross_entropy_with_softmax_grad", "embedding", "embedding_grad", "index_select", "arange",
                     "matmul", "matmul_grad"):
        assert expected in names
    assert {d.category for d in BASE_OPS.values()} <= set(itertools.chain(
        ["unary", "binary", "compare", "where", "cast", "fill", "copy", "reduction", "softmax", "loss",
         "embedding", "index", "arange", "matmul"]))
