"""Paddle's own ops on an anychip device run the plugin's base-op C kernels through the
generated PD_REGISTER_PLUGIN_KERNEL wrappers (anychip.frontends.paddle.kernels).

The device is xpu (simulated), with a small set of counting float32 base kernels compiled here
and registered in the subprocess before Paddle is imported (a stand-in for a vendor's kernels:
every call bumps `test_calls`, which proves the plugin's kernel ran and not Paddle's CPU one).
Each check runs in a fresh interpreter, since Paddle registers devices once per process; they
share this session's ANYCHIP_CACHE_DIR, so the wrapper library is compiled once.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from conftest import run_python

TEST_KERNELS = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include "anychip/kernel.h"

extern "C" {
__attribute__((visibility("default"))) int64_t test_calls = 0;
}

namespace {
using T = const AnychipTensor&;
int64_t numel(T t) { int64_t n = 1; for (int i = 0; i < t.rank; ++i) n *= t.shape[i]; return n; }
// Offset of linear index i of `shape` (row-major) in tensor t (same rank).
int64_t offset(T shape, T t, int64_t i) {
  int64_t off = 0;
  for (int d = shape.rank - 1; d >= 0; --d) { off += (i % shape.shape[d]) * t.strides[d]; i /= shape.shape[d]; }
  return off;
}
double load(T t, int64_t off) {
  switch (t.dtype) {
    case ANYCHIP_DTYPE_FLOAT32: return static_cast<float*>(t.data)[off];
    case ANYCHIP_DTYPE_INT32: return static_cast<int32_t*>(t.data)[off];
    case ANYCHIP_DTYPE_INT64: return static_cast<double>(static_cast<int64_t*>(t.data)[off]);
    case ANYCHIP_DTYPE_BOOL: return static_cast<bool*>(t.data)[off];
    default: return NAN;
  }
}
void store(T t, int64_t off, double v) {
  switch (t.dtype) {
    case ANYCHIP_DTYPE_FLOAT32: static_cast<float*>(t.data)[off] = static_cast<float>(v); break;
    case ANYCHIP_DTYPE_INT32: static_cast<int32_t*>(t.data)[off] = static_cast<int32_t>(std::trunc(v)); break;
    case ANYCHIP_DTYPE_INT64: static_cast<int64_t*>(t.data)[off] = static_cast<int64_t>(std::trunc(v)); break;
    case ANYCHIP_DTYPE_BOOL: static_cast<bool*>(t.data)[off] = v != 0; break;
  }
}
template <class F> AnychipStatus elementwise(const AnychipKernelCall* c, F f) {
  ++test_calls;
  T out = c->outputs[0];
  for (int64_t i = 0, n = numel(out); i < n; ++i) {
    double a[3];
    for (int k = 0; k < c->num_inputs; ++k) a[k] = load(c->inputs[k], offset(out, c->inputs[k], i));
    store(out, offset(out, out, i), f(a, c->attrs));
  }
  return ANYCHIP_OK;
}
// Reductions over attrs [keepdim, n, axes...]: out offset of every input element.
std::vector<int64_t> reduce_map(const AnychipKernelCall* c) {
  T x = c->inputs[0], out = c->outputs[0];
  int n = static_cast<int>(c->attrs[1]);
  bool keep = c->attrs[0] != 0;
  std::vector<bool> reduced(x.rank, n == 0);
  for (int k = 0; k < n; ++k) reduced[static_cast<int>(c->attrs[2 + k])] = true;
  std::vector<int64_t> map(numel(x));
  for (int64_t i = 0; i < (int64_t)map.size(); ++i) {
    int64_t rest = i, off = 0;
    for (int d = x.rank - 1, o = out.rank - 1; d >= 0; --d) {
      int64_t coord = rest % x.shape[d]; rest /= x.shape[d];
      if (!reduced[d]) off += coord * out.strides[o--];
      else if (keep) --o;
    }
    map[i] = off;
  }
  return map;
}
template <class Init, class F, class Fin> AnychipStatus reduction(const AnychipKernelCall* c, Init init, F f, Fin fin) {
  ++test_calls;
  T x = c->inputs[0], out = c->outputs[0];
  std::vector<int64_t> map = reduce_map(c);
  int64_t span = 0;
  for (int64_t o : map) span = o + 1 > span ? o + 1 : span;
  std::vector<double> acc(span, init);
  std::vector<int64_t> count(span, 0);
  for (int64_t i = 0; i < (int64_t)map.size(); ++i) { acc[map[i]] = f(acc[map[i]], load(x, offset(x, x, i))); ++count[map[i]]; }
  for (int64_t i = 0; i < (int64_t)map.size(); ++i) store(out, map[i], fin(acc[map[i]], count[map[i]]));
  if (map.empty()) for (int64_t i = 0; i < numel(out); ++i) store(out, offset(out, out, i), fin(init, 0));
  return ANYCHIP_OK;
}
// Visits every line along `axis` of t: fn(offset of the line's first element, stride).
template <class F> void lines(T t, int axis, F fn) {
  for (int64_t i = 0, n = numel(t); i < n; ++i) {
    int64_t rest = i, coord_axis = 0;
    for (int d = t.rank - 1; d >= 0; --d) { if (d == axis) coord_axis = rest % t.shape[d]; rest /= t.shape[d]; }
    if (coord_axis == 0) fn(offset(t, t, i), t.strides[axis]);
  }
}
}  // namespace

#define KERNEL(name) extern "C" __attribute__((visibility("default"))) AnychipStatus test_##name(const AnychipKernelCall* c)
#define EW(name, expr) KERNEL(name) { return elementwise(c, [](const double* a, const double* at) { (void)at; return (expr); }); }
EW(add, a[0] + a[1]) EW(subtract, a[0] - a[1]) EW(multiply, a[0] * a[1]) EW(divide, a[0] / a[1])
EW(maximum, a[0] > a[1] ? a[0] : a[1]) EW(minimum, a[0] < a[1] ? a[0] : a[1])
EW(exp, std::exp(a[0])) EW(sqrt, std::sqrt(a[0])) EW(rsqrt, 1 / std::sqrt(a[0]))
EW(silu, a[0] / (1 + std::exp(-a[0]))) EW(sigmoid, 1 / (1 + std::exp(-a[0]))) EW(tanh, std::tanh(a[0]))
EW(scale, at[2] != 0 ? at[0] * a[0] + at[1] : at[0] * (a[0] + at[1]))
EW(equal, a[0] == a[1]) EW(not_equal, a[0] != a[1]) EW(less_than, a[0] < a[1])
EW(less_equal, a[0] <= a[1]) EW(greater_than, a[0] > a[1]) EW(greater_equal, a[0] >= a[1])
EW(where, a[0] != 0 ? a[1] : a[2]) EW(cast, a[0]) EW(copy, a[0]) EW(fill, at[0])
KERNEL(sum) { return reduction(c, 0.0, [](double a, double v) { return a + v; }, [](double a, int64_t) { return a; }); }
KERNEL(mean) { return reduction(c, 0.0, [](double a, double v) { return a + v; }, [](double a, int64_t n) { return a / n; }); }
KERNEL(max) { return reduction(c, -INFINITY, [](double a, double v) { return v > a ? v : a; }, [](double a, int64_t) { return a; }); }
KERNEL(softmax) {
  ++test_calls;
  T x = c->inputs[0], out = c->outputs[0];
  int axis = static_cast<int>(c->attrs[0]);
  int64_t n = x.shape[axis];
  std::vector<int64_t> outs;
  lines(out, axis, [&](int64_t off, int64_t) { outs.push_back(off); });
  size_t line = 0;
  lines(x, axis, [&](int64_t off, int64_t s) {
    double m = -INFINITY, z = 0;
    for (int64_t j = 0; j < n; ++j) m = std::fmax(m, load(x, off + j * s));
    for (int64_t j = 0; j < n; ++j) z += std::exp(load(x, off + j * s) - m);
    for (int64_t j = 0; j < n; ++j) store(out, outs[line] + j * out.strides[axis], std::exp(load(x, off + j * s) - m) / z);
    ++line;
  });
  return ANYCHIP_OK;
}
KERNEL(softmax_grad) {
  ++test_calls;
  T y = c->inputs[0], dy = c->inputs[1], dx = c->outputs[0];
  int axis = static_cast<int>(c->attrs[0]);
  int64_t n = y.shape[axis];
  lines(y, axis, [&](int64_t off, int64_t s) {  // all three dense and alike here
    double dot = 0;
    for (int64_t j = 0; j < n; ++j) dot += load(y, off + j * s) * load(dy, off + j * s);
    for (int64_t j = 0; j < n; ++j) store(dx, off + j * s, load(y, off + j * s) * (load(dy, off + j * s) - dot));
  });
  return ANYCHIP_OK;
}
namespace {
struct Mm {
  AnychipTensor x, y; bool tx, ty; int r; int64_t M, N, K;
  Mm(const AnychipKernelCall* c, T out) : x(c->inputs[0]), y(c->inputs[1]), tx(c->attrs[0] != 0), ty(c->attrs[1] != 0),
      r(out.rank), M(out.shape[out.rank - 2]), N(out.shape[out.rank - 1]), K(tx ? x.shape[r - 2] : x.shape[r - 1]) {}
  int64_t xo(int64_t m, int64_t k) const { return tx ? k * x.strides[r - 2] + m * x.strides[r - 1] : m * x.strides[r - 2] + k * x.strides[r - 1]; }
  int64_t yo(int64_t k, int64_t n) const { return ty ? n * y.strides[r - 2] + k * y.strides[r - 1] : k * y.strides[r - 2] + n * y.strides[r - 1]; }
};
// Batch offset of batch index b (over out's batch dims) in t; dims where t has 1 map to 0.
int64_t batch_off(T out, T t, int64_t b) {
  int64_t off = 0;
  for (int d = out.rank - 3; d >= 0; --d) { int64_t coord = b % out.shape[d]; b /= out.shape[d]; if (t.shape[d] != 1) off += coord * t.strides[d]; }
  return off;
}
}  // namespace
KERNEL(matmul) {
  ++test_calls;
  T out = c->outputs[0];
  Mm mm(c, out);
  int64_t batches = numel(out) / (mm.M * mm.N);
  for (int64_t b = 0; b < batches; ++b) {
    int64_t xb = batch_off(out, mm.x, b), yb = batch_off(out, mm.y, b), ob = batch_off(out, out, b);
    for (int64_t m = 0; m < mm.M; ++m) for (int64_t n = 0; n < mm.N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < mm.K; ++k) s += load(mm.x, xb + mm.xo(m, k)) * load(mm.y, yb + mm.yo(k, n));
      store(out, ob + m * out.strides[out.rank - 2] + n * out.strides[out.rank - 1], s);
    }
  }
  return ANYCHIP_OK;
}
KERNEL(matmul_grad) {
  ++test_calls;
  T dout = c->inputs[2], dx = c->outputs[0], dy = c->outputs[1];
  Mm mm(c, dout);
  // dx and dy come with x's and y's shapes at dout's rank; same layout as x and y when dense.
  AnychipTensor gx = mm.x, gy = mm.y;
  gx.data = dx.data; gy.data = dy.data;
  for (int d = 0; d < dout.rank; ++d) { gx.strides[d] = dx.strides[d]; gy.strides[d] = dy.strides[d]; gx.shape[d] = dx.shape[d]; gy.shape[d] = dy.shape[d]; }
  std::memset(dx.data, 0, numel(dx) * sizeof(float));
  std::memset(dy.data, 0, numel(dy) * sizeof(float));
  Mm g = mm; g.x = gx; g.y = gy;
  int64_t batches = numel(dout) / (mm.M * mm.N);
  for (int64_t b = 0; b < batches; ++b) {
    int64_t xb = batch_off(dout, mm.x, b), yb = batch_off(dout, mm.y, b), ob = batch_off(dout, dout, b);
    int64_t gxb = batch_off(dout, gx, b), gyb = batch_off(dout, gy, b);
    for (int64_t m = 0; m < mm.M; ++m) for (int64_t n = 0; n < mm.N; ++n) {
      double d = load(dout, ob + m * dout.strides[dout.rank - 2] + n * dout.strides[dout.rank - 1]);
      for (int64_t k = 0; k < mm.K; ++k) {
        int64_t xo = gxb + g.xo(m, k), yo = gyb + g.yo(k, n);
        store(gx, xo, load(gx, xo) + d * load(mm.y, yb + mm.yo(k, n)));
        store(gy, yo, load(gy, yo) + d * load(mm.x, xb + mm.xo(m, k)));
      }
    }
  }
  return ANYCHIP_OK;
}
"""

F32 = ("float32",)
# base op -> dtypes the test kernels are registered for
TEST_OPS = {op: F32 for op in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "exp", "sqrt", "rsqrt", "silu",
    "sigmoid", "tanh", "scale", "equal", "not_equal", "less_than", "less_equal", "greater_than",
    "greater_equal", "where", "cast", "copy", "sum", "mean", "max", "softmax", "softmax_grad",
    "matmul", "matmul_grad")}
TEST_OPS["fill"] = ("float32", "int64", "bool")


@pytest.fixture(scope="session")
def kernel_lib(tmp_path_factory):
    from anychip.native import include_dir

    folder = tmp_path_factory.mktemp("paddle_kernels")
    (folder / "kernels.cc").write_text(TEST_KERNELS)
    lib = folder / "libtest_base_kernels.so"
    subprocess.run(["c++", "-std=c++17", "-O1", "-fPIC", "-shared", "-fvisibility=hidden", f"-I{include_dir()}",
                    str(folder / "kernels.cc"), "-o", str(lib)], check=True)
    return lib


def run_on_xpu(kernel_lib, body: str, env: dict | None = None, ops=None):
    """Runs ``body`` after importing Paddle with xpu's base kernels replaced by the test kernels
    ``ops`` (default all of them; ``kernel_lib`` None: xpu's own kernels are kept); ``calls()``
    there returns how many test-kernel launches ran so far. The body prints JSON on its last line."""
    ops = TEST_OPS if ops is None else ops
    code = textwrap.dedent(f"""
        import ctypes, json
        import numpy as np
        import anychip
        from anychip.kernels import NativeKernel
        from anychip.frontends.paddle.kernels import rows
        from anychip.plugins import registry
        calls = lambda: 0
        if {str(kernel_lib) if kernel_lib else None!r}:
            table = registry().kernels._kernels  # the plugin's own base kernels make way for the test's
            base_ops = {{op for ops in rows()[0].values() for op in ops}}
            for key in [k for k in table if k[1] == "xpu" and k[0] in base_ops]:
                del table[key]
            for op, dtypes in {ops!r}.items():
                registry().kernels.register(op, "xpu", dtypes, NativeKernel({str(kernel_lib)!r}, "test_" + op))
            _lib = ctypes.CDLL({str(kernel_lib)!r})
            calls = lambda: ctypes.c_int64.in_dll(_lib, "test_calls").value
        anychip.set_device("xpu")
        import paddle
        from anychip.frontends.paddle import kernels as paddle_kernels
    """) + textwrap.dedent(body)
    result = run_python(code, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_add_runs_the_plugin_kernel_with_broadcasting(kernel_lib):
    out = run_on_xpu(kernel_lib, """
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        y = np.array([10, 20, 30], dtype=np.float32)
        before = calls()
        z = paddle.add(paddle.to_tensor(x), paddle.to_tensor(y))
        launched = calls() - before
        print(json.dumps({"z": z.numpy().tolist(), "place": str(z.place), "launched": launched,
                          "problems": paddle_kernels.problems}))
    """)
    assert out["problems"] == {}
    assert "anychip_kunlun" in out["place"]
    assert out["z"] == [[10, 21, 32], [13, 24, 35]]
    assert out["launched"] == 1


# Each case: a Paddle expression over x [2, 3, 4], y [3, 1] (broadcast), c [2, 3, 4] and its
# numpy value. Every one must launch at least one test kernel.
ELEMENTWISE_CASES = {
    "subtract": ("x - y", "x - y"),
    "multiply": ("x * y", "x * y"),
    "divide": ("x / y", "x / y"),
    "maximum": ("paddle.maximum(x, y)", "np.maximum(x, y)"),
    "minimum": ("paddle.minimum(x, y)", "np.minimum(x, y)"),
    "scale": ("paddle.scale(x, 2.0, 1.0)", "2 * x + 1"),
    "scale_before": ("paddle.scale(x, 2.0, 1.0, bias_after_scale=False)", "2 * (x + 1)"),
    "exp": ("paddle.exp(x)", "np.exp(x)"),
    "sqrt": ("paddle.sqrt(c)", "np.sqrt(c)"),
    "rsqrt": ("paddle.rsqrt(c)", "1 / np.sqrt(c)"),
    "silu": ("F.silu(x)", "x / (1 + np.exp(-x))"),
    "sigmoid": ("F.sigmoid(x)", "1 / (1 + np.exp(-x))"),
    "tanh": ("paddle.tanh(x)", "np.tanh(x)"),
    "equal": ("x == y", "x == y"),
    "not_equal": ("x != y", "x != y"),
    "less_than": ("x < y", "x < y"),
    "less_equal": ("x <= y", "x <= y"),
    "greater_than": ("x > y", "x > y"),
    "greater_equal": ("x >= y", "x >= y"),
    "where": ("paddle.where(x > y, x, c)", "np.where(x > y, x, c)"),
    "cast_int64": ("x.astype('int64')", "np.trunc(x).astype(np.int64)"),
    "cast_bool": ("x.astype('bool')", "x != 0"),
    "full": ("paddle.full([2, 5], 1.5)", "np.full([2, 5], 1.5, np.float32)"),
    "full_int64": ("paddle.full([3], 7, dtype='int64')", "np.full([3], 7, np.int64)"),
    "full_like": ("paddle.full_like(x, -2.0)", "np.full_like(x, -2.0)"),
    "zeros_bool": ("paddle.zeros([4], dtype='bool')", "np.zeros([4], bool)"),
    "sum_all": ("paddle.sum(x)", "x.sum()"),
    "sum_axis": ("paddle.sum(x, axis=[0, 2])", "x.sum(axis=(0, 2))"),
    "sum_keepdim": ("paddle.sum(x, axis=-1, keepdim=True)", "x.sum(axis=-1, keepdims=True)"),
    "mean": ("paddle.mean(x, axis=1)", "x.mean(axis=1)"),
    "max": ("paddle.max(x, axis=[1, 2], keepdim=True)", "x.max(axis=(1, 2), keepdims=True)"),
    "softmax": ("F.softmax(x, axis=-1)", "np.exp(x) / np.exp(x).sum(-1, keepdims=True)"),
    "softmax_axis1": ("F.softmax(x, axis=1)", "np.exp(x) / np.exp(x).sum(1, keepdims=True)"),
    "matmul": ("paddle.matmul(x, m)", "x @ m"),
    "matmul_batch_bcast": ("paddle.matmul(m.T, x, transpose_y=True)", "m.T @ x.transpose(0, 2, 1)"),
    "matmul_vector": ("paddle.matmul(v, x, transpose_y=True)", "v @ x.transpose(0, 2, 1)"),
}

_INPUTS = """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x[0, 0, 0] = 0.0
    y = rng.standard_normal((3, 1)).astype(np.float32)
    y[1, 0] = x[0, 1, 2]  # an equal pair for the comparisons
    c = rng.uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
    m = rng.standard_normal((4, 5)).astype(np.float32)
    v = rng.standard_normal(4).astype(np.float32)
    host = dict(x=x, y=y, c=c, m=m, v=v, np=np)
    dev = dict(x=paddle.to_tensor(x), y=paddle.to_tensor(y), c=paddle.to_tensor(c),
               m=paddle.to_tensor(m), v=paddle.to_tensor(v), np=np, paddle=paddle, F=paddle.nn.functional)
"""


def test_forward_ops_match_numpy_and_launch_the_plugin_kernels(kernel_lib):
    out = run_on_xpu(kernel_lib, _INPUTS + f"""
    results = {{}}
    for name, (expr, ref) in {ELEMENTWISE_CASES!r}.items():
        before = calls()
        got = eval(expr, dev)
        launched = calls() - before
        want = np.asarray(eval(ref, host))
        got_np = got.numpy()
        ok = got_np.shape == want.shape and got_np.dtype == want.dtype and np.allclose(got_np, want, rtol=1e-5, atol=1e-6)
        results[name] = dict(ok=bool(ok), launched=launched, place=str(got.place),
                             got=str(got_np.dtype) + str(got_np.shape), want=str(want.dtype) + str(want.shape))
    print(json.dumps(results))
    """)
    bad = {k: v for k, v in out.items() if not v["ok"] or v["launched"] < 1 or "anychip_kunlun" not in v["place"]}
    assert not bad


_BACKWARD = """
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.uniform(0.5, 2.0, (3, 1)).astype(np.float32)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    g = rng.standard_normal((2, 3, 4)).astype(np.float32)
    gm = rng.standard_normal((2, 3, 5)).astype(np.float32)

    def leaf(v):
        t = paddle.to_tensor(v)
        t.stop_gradient = False
        return t

    def grads(fn, *arrays, seed):
        ts = [leaf(v) for v in arrays]
        before = calls()
        out = fn(*ts)
        out.backward(paddle.to_tensor(seed))
        return [t.grad.numpy().tolist() for t in ts], calls() - before

    F = paddle.nn.functional
    s = np.exp(a) / np.exp(a).sum(-1, keepdims=True)
    cases = {
        "add": (grads(lambda x, y: x + y, a, b, seed=g), [g, g.sum((0, 2)).reshape(3, 1)]),
        "subtract": (grads(lambda x, y: x - y, a, b, seed=g), [g, -g.sum((0, 2)).reshape(3, 1)]),
        "multiply": (grads(lambda x, y: x * y, a, b, seed=g), [g * b, (g * a).sum((0, 2)).reshape(3, 1)]),
        "divide": (grads(lambda x, y: x / y, a, b, seed=g), [g / b, (-g * a / b**2).sum((0, 2)).reshape(3, 1)]),
        "matmul": (grads(paddle.matmul, a, w, seed=gm), [gm @ w.T, np.einsum("bmk,bmn->kn", a, gm)]),
        "softmax": (grads(lambda x: F.softmax(x, axis=-1), a, seed=g),
                    [s * (g - (g * s).sum(-1, keepdims=True))]),
    }
    results = {}
    for name, ((got, launched), want) in cases.items():
        ok = all(np.allclose(np.array(gv), wv, rtol=1e-4, atol=1e-5) for gv, wv in zip(got, want))
        results[name] = dict(ok=bool(ok), launched=launched)
    print(json.dumps(results))
"""


@pytest.mark.parametrize("strict", [False, True], ids=["counted", "strict"])
def test_backward_through_the_plugin_kernels(kernel_lib, strict):
    env = {"ANYCHIP_STRICT": "1", "ANYCHIP_SIM_CHECK": "1"} if strict else {"ANYCHIP_STRICT": "0"}
    out = run_on_xpu(kernel_lib, _BACKWARD, env=env)
    assert {k: v for k, v in out.items() if not v["ok"] or v["launched"] < 2} == {}


def test_strict_mode_raises_without_the_plugin_kernels(kernel_lib):
    # the other side of the strict backward test: the same op with no base kernel registered
    out = run_on_xpu(kernel_lib, """
        x = paddle.to_tensor(np.ones((2, 3), np.float32))
        try:
            paddle.add(x, x)
            print(json.dumps("ran"))
        except Exception as exc:
            print(json.dumps(str(exc).splitlines()[-1] if str(exc) else repr(exc)))
    """, env={"ANYCHIP_STRICT": "1"}, ops={})
    assert out != "ran"


def test_fallback_counts_only_the_ops_without_a_plugin_kernel(kernel_lib):
    out = run_on_xpu(kernel_lib, """
        from anychip.fallback import fallback_counts
        x = paddle.to_tensor(np.ones((2, 3), np.float32))
        for _ in range(3):
            paddle.add(x, x)               # float32: the plugin's kernel
            paddle.add(x.astype("int64"), x.astype("int64"))  # no int64 kernel: CPU
        counts = {"/".join(k): v for k, v in fallback_counts().items() if k[0] == "xpu"}
        print(json.dumps(counts))
    """, env={"ANYCHIP_STRICT": "0"})
    assert out.get("xpu/add/int64") == 3
    assert "xpu/add/float32" not in out


def add_on_xpu_with_kernel_config(tmp_path, edit: str):
    """x + x on xpu, Paddle loaded from the CustomDevice folder as anychip writes it, after
    ``edit`` (Python over ``text``, the xpu kernel config) changed that config. Returns the
    sum, the fallbacks counted ("device/op/dtype") and stderr."""
    code = textwrap.dedent(f"""
        import json, os
        from pathlib import Path
        from anychip.frontends.paddle import root as paddle_root
        root = Path({str(tmp_path)!r})
        paddle_root.install(root)
        conf = root / "kernels" / "libanychip_xpu_kernels.so.conf"
        text = conf.read_text()
        conf.write_text({edit})
        os.environ["CUSTOM_DEVICE_ROOT"] = str(root)
        import numpy as np
        import paddle
        import anychip
        from anychip.fallback import fallback_counts
        anychip.set_device("xpu")
        x = paddle.to_tensor(np.ones((2, 3), np.float32))
        z = paddle.add(x, x).numpy().tolist()
        print(json.dumps({{"z": z, "fallbacks": ["/".join(k) for k in fallback_counts()]}}))
    """)
    result = run_python(code, env={"ANYCHIP_STRICT": "0"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    return out["z"], out["fallbacks"], result.stderr


def test_a_broken_kernel_config_registers_nothing_says_why_and_leaves_paddle_working(tmp_path):
    z, fallbacks, stderr = add_on_xpu_with_kernel_config(
        tmp_path, 'text.replace("serve=add float32", "serve=add float33", 1)')
    assert z == [[2.0] * 3] * 2
    assert "xpu/add/float32" in fallbacks
    assert "libanychip_xpu_kernels.so: no Paddle kernels registered: unknown dtype 'float33'" in stderr


def test_a_kernel_library_older_than_its_config_names_what_it_lacks(tmp_path):
    # a config planned by a newer table than the installed library was built from
    z, fallbacks, stderr = add_on_xpu_with_kernel_config(tmp_path, 'text + "serve=frobnicate float32\\n"')
    assert (z, fallbacks) == ([[2.0] * 3] * 2, [])  # the kernels it has are registered
    assert "libanychip_xpu_kernels.so lacks 1 Paddle kernel(s) its config names" in stderr
    assert "(reinstall anychip to rebuild it; until then they fall back to the CPU): frobnicate" in stderr


# ops the test kernels leave out, checked with xpu's own kernels
MORE_CASES = {
    "log": ("paddle.log(c)", "np.log(c)"),
    "abs": ("paddle.abs(x)", "np.abs(x)"),
    "pow": ("paddle.pow(c, 1.5)", "c ** 1.5"),
    "elementwise_pow": ("paddle.pow(c, paddle.to_tensor(np.float32(2.0)) + c * 0)", "c ** 2"),
    "add_bfloat16": ("paddle.add(x.astype('bfloat16'), y.astype('bfloat16')).astype('float32')",
                     "x + y"),
    "full_like_cpu_input": ("paddle.full_like(paddle.to_tensor(x, place=paddle.CPUPlace()), 3.0, "
                            "device=paddle.CustomPlace('anychip_kunlun', 0))", "np.full_like(x, 3.0)"),
}


def test_xpu_own_base_kernels_serve_paddle_ops_with_no_cpu_fallback():
    """The xpu plugin's hand-written base kernels, unchanged, under strict mode (a CPU fallback
    would raise): forward cases and the backward ones."""
    body = _INPUTS + f"""
    bad = {{}}
    for name, (expr, ref) in {dict(ELEMENTWISE_CASES, **MORE_CASES)!r}.items():
        if "m.T" in expr:
            continue  # a transpose: a strided-copy kernel, not one of these wrappers
        got, want = eval(expr, dev).numpy(), np.asarray(eval(ref, host))
        tol = 2e-2 if "bfloat16" in name else 1e-4
        if not (got.shape == want.shape and got.dtype == want.dtype and np.allclose(got, want, rtol=tol, atol=tol)):
            bad[name] = str(got)
    print(json.dumps(bad))
    """
    # no CPU fallback writes device memory here, so the simulator's guard stays on: the wrappers
    # must open exactly their tensors' memory for each launch
    env = {"ANYCHIP_STRICT": "1", "ANYCHIP_SIM_CHECK": "1"}
    assert run_on_xpu(None, body, env=env) == {}
    out = run_on_xpu(None, _BACKWARD, env=env)
    assert {k: v for k, v in out.items() if not v["ok"]} == {}


# The kernels a Llama training step and its decoding need beyond the elementwise set: copies
# through strided views (split, concat, slice, transpose, expand, set_value), gathers,
# cross-entropy, integer arithmetic. Checked with xpu's own kernels under strict mode.
_BRIDGE_INPUTS = _INPUTS + """
    idx = np.array([2, 0, 2], np.int64)
    ids = np.array([[3, 0, 1], [1, 3, 2]], np.int64)
    tidx = rng.integers(0, 3, (2, 2, 4)).astype(np.int64)
    label = np.array([[1], [3], [-100], [0], [2], [3]], np.int64)
    logits = x.reshape(6, 4)
    lse = np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logits, np.where(label < 0, 0, label), -1)
    host.update(idx=idx, ids=ids, tidx=tidx, label=label, logits=logits, ce=np.where(label < 0, 0.0, lse - picked))
    dev.update(idx=paddle.to_tensor(idx), ids=paddle.to_tensor(ids), tidx=paddle.to_tensor(tidx),
               label=paddle.to_tensor(label), logits=paddle.to_tensor(logits))

    def set_rows(t, value, index):
        t = t * 1.0  # a fresh tensor: the assignment writes into it in place
        t[index] = value
        return t

    def set_rows_np(t, value, index):
        t = t.copy()
        t[index] = value
        return t
    dev["set_rows"], host["set_rows"] = set_rows, set_rows_np
"""

BRIDGE_CASES = {
    "div_scale": ("x / 4", "x / np.float32(4)"),
    "split": ("paddle.split(x, [1, 3], axis=-1)[1]", "x[..., 1:]"),
    "split_first": ("paddle.split(x, [1, 3], axis=-1)[0]", "x[..., :1]"),
    "split_with_num": ("paddle.split(x, 2, axis=0)[1]", "x[1:]"),
    "concat": ("paddle.concat([x, c, x], axis=1)", "np.concatenate([x, c, x], axis=1)"),
    "concat_last": ("paddle.concat([x, c], axis=-1)", "np.concatenate([x, c], axis=-1)"),
    "slice": ("x[:, 1:]", "x[:, 1:]"),
    "slice_negative": ("x[:, -2:, 1:3]", "x[:, -2:, 1:3]"),
    "slice_decrease": ("x[1]", "x[1]"),
    "slice_int64": ("ids[:, 1:]", "ids[:, 1:]"),
    "unsqueeze": ("x.unsqueeze(1)", "x[:, None]"),
    "transpose": ("x.transpose([2, 0, 1])", "x.transpose(2, 0, 1)"),
    "transpose_then_add": ("x.transpose([0, 2, 1]) + 1", "x.transpose(0, 2, 1) + 1"),
    "expand": ("paddle.expand(y, [2, 3, 4])", "np.broadcast_to(y, (2, 3, 4))"),
    "expand_int64": ("paddle.expand(idx, [2, 3])", "np.broadcast_to(idx, (2, 3))"),
    "set_value": ("set_rows(x, c[:, 1:3] * 0 + 5, (slice(None), slice(1, 3)))",
                  "set_rows(x, 5, (slice(None), slice(1, 3)))"),
    "set_value_broadcast": ("set_rows(x, paddle.to_tensor(np.float32([7, 8, 9, 10])), (0, 1))",
                            "set_rows(x, np.float32([7, 8, 9, 10]), (0, 1))"),
    "gather": ("paddle.gather(x, idx, axis=1)", "x[:, idx]"),
    "gather_int32": ("paddle.gather(m, idx.astype('int32'))", "m[idx]"),
    "index_select": ("paddle.index_select(x, idx, axis=-1)", "x[..., idx]"),
    "embedding": ("F.embedding(ids, m)", "m[ids]"),
    "take_along_axis": ("paddle.take_along_axis(x, tidx, axis=1)", "np.take_along_axis(x, tidx, axis=1)"),
    "cross_entropy": ("F.cross_entropy(logits, label, reduction='none')", "ce"),
    "multiply_int64": ("ids * (ids + idx)", "ids * (ids + idx)"),
    "add_int64": ("ids + idx", "ids + idx"),
    "max_int32": ("paddle.maximum(ids.astype('int32'), idx.astype('int32'))", "np.maximum(ids, idx).astype(np.int32)"),
}

_BRIDGE_BACKWARD = """
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    g = rng.standard_normal((2, 3, 4)).astype(np.float32)
    idx = np.array([2, 0, 2], np.int64)
    ids = np.array([[3, 0, 1], [1, 3, 3]], np.int64)
    label = np.array([[1], [3], [-100], [0], [2], [3]], np.int64)
    F = paddle.nn.functional

    def leaf(v):
        t = paddle.to_tensor(v)
        t.stop_gradient = False
        return t

    def grads(fn, *arrays, seed):
        ts = [leaf(v) for v in arrays]
        out = fn(*ts)
        out.backward(paddle.to_tensor(seed))
        return [t.grad.numpy() for t in ts]

    def scatter(shape, index, rows, axis):  # np.add.at along axis
        out = np.zeros(shape, np.float64)
        np.add.at(np.moveaxis(out, axis, 0), index, np.moveaxis(rows, axis, 0))
        return out

    s = np.exp(a.reshape(6, 4)) / np.exp(a.reshape(6, 4)).sum(-1, keepdims=True)
    onehot = np.eye(4)[np.where(label[:, 0] < 0, 0, label[:, 0])] * (label >= 0)
    gl = rng.standard_normal((6, 1)).astype(np.float32)
    cases = {
        "sum": (grads(lambda x: x.sum(axis=1), a, seed=g[:, 0]), [np.broadcast_to(g[:, None, 0], a.shape)]),
        "sum_all": (grads(lambda x: x.sum(), a, seed=np.float32(3)), [np.full(a.shape, 3.0)]),
        "div_scale": (grads(lambda x: x / 4, a, seed=g), [g / 4]),
        "split": (grads(lambda x: paddle.split(x, [1, 3], axis=-1)[1] * 2, a, seed=g[..., 1:]),
                  [np.concatenate([np.zeros_like(a[..., :1]), 2 * g[..., 1:]], -1)]),
        "concat": (grads(lambda x, y: paddle.concat([x, y], axis=0), a, a[:1], seed=np.concatenate([g, g[:1]])),
                   [g, g[:1]]),
        "transpose": (grads(lambda x: x.transpose([2, 0, 1]), a, seed=g.transpose(2, 0, 1)), [g]),
        "gather": (grads(lambda x: paddle.gather(x, paddle.to_tensor(idx), axis=1), a, seed=g[:, idx]),
                   [scatter(a.shape, idx, g[:, idx], 1)]),
        "index_select": (grads(lambda x: paddle.index_select(x, paddle.to_tensor(idx), axis=-1), a,
                               seed=g[..., idx]), [scatter(a.shape, idx, g[..., idx], 2)]),
        "embedding": (grads(lambda t: F.embedding(paddle.to_tensor(ids), t), w, seed=g),
                      [scatter(w.shape, ids.reshape(-1), g.reshape(6, 4), 0)]),
        "cross_entropy": (grads(lambda x: F.cross_entropy(x, paddle.to_tensor(label), reduction="none"),
                                a.reshape(6, 4), seed=gl), [(s - onehot) * gl * (label >= 0)]),
    }
    results = {}
    for name, (got, want) in cases.items():
        results[name] = all(gv.shape == np.shape(wv) and np.allclose(gv, wv, rtol=1e-4, atol=1e-5)
                            for gv, wv in zip(got, want))
    print(json.dumps(results))
"""


def test_bridge_serves_the_copies_gathers_and_losses_a_llama_needs():
    """Forward cases against numpy and the gradients Paddle's backward takes through them, with
    xpu's own kernels under strict mode (a missing wrapper raises) and the memory guard on."""
    env = {"ANYCHIP_STRICT": "1", "ANYCHIP_SIM_CHECK": "1"}
    body = _BRIDGE_INPUTS + f"""
    bad = {{}}
    for name, (expr, ref) in {BRIDGE_CASES!r}.items():
        try:
            got = eval(expr, dev)
        except Exception as exc:
            bad[name] = str(exc).strip().splitlines()[-1][:300]
            continue
        got, want = got.numpy(), np.asarray(eval(ref, host))
        if not (got.shape == want.shape and got.dtype == want.dtype and np.allclose(got, want, rtol=1e-5, atol=1e-6)):
            bad[name] = f"{{got.dtype}}{{got.shape}} {{got.ravel()[:6]}} != {{want.dtype}}{{want.shape}} {{want.ravel()[:6]}}"
    print(json.dumps(bad))
    """
    assert run_on_xpu(None, body, env=env) == {}
    out = run_on_xpu(None, _BRIDGE_BACKWARD, env=env)
    assert {k for k, ok in out.items() if not ok} == set()


# ---- issue 37: the kernels composed for PaddleNLP's models, against Paddle's own CPU kernels ----
# Each expression runs twice in one process under strict mode: on xpu tensors (a missing or
# failing wrapper raises) and on CPU tensors (Paddle's reference semantics: axes, ties, keepdim,
# int64 indices). The random ops run after the same paddle.seed on both, so they must draw alike.

_COMPOSED_INPUTS = """
    F = paddle.nn.functional
    rng = np.random.default_rng(3)
    arrays = dict(
        x=rng.standard_normal((2, 3, 4)).astype(np.float32),
        y=rng.standard_normal((3, 1)).astype(np.float32),
        c=rng.uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32),
        v=rng.standard_normal(4).astype(np.float32),
        m=rng.standard_normal((4, 5)).astype(np.float32),
        z=np.array([[0.0, np.inf, -np.inf, np.nan, 1.0]], np.float32),
        t=np.array([[1.0, 3.0, 3.0, -1.0, 3.0]], np.float32),
        ids=np.array([[3, 0], [4, 1]], np.int64),
        nd=np.array([[1, 2], [0, 0], [1, 2]], np.int64),
        upd=rng.standard_normal((3, 4)).astype(np.float32),
        idx=np.array([2, 0, 2], np.int64),
        xs=rng.standard_normal((2, 3, 4)).astype(np.float32),
        tidx=np.array([[[0], [3], [3]], [[1], [1], [2]]], np.int64),  # repeated: the grad adds
    )
    arrays["y"][1, 0] = arrays["x"][0, 1, 2]  # a tie for maximum/minimum
    DEV = paddle.device.get_device()

    def tensors(place):
        return {k: paddle.to_tensor(v, place=place) for k, v in arrays.items()}

    def both(fn):
        got = fn(**tensors(paddle.CustomPlace(DEV.split(":")[0], 0)))
        paddle.set_device("cpu")
        try:
            want = fn(**tensors(paddle.CPUPlace()))
        finally:
            paddle.set_device(DEV)
        return got, want

    def compare(got, want, tol):
        got = got if isinstance(got, (list, tuple)) else [got]
        want = want if isinstance(want, (list, tuple)) else [want]
        for g, w in zip(got, want):
            g, w = g.numpy(), w.numpy()
            if g.shape != w.shape or g.dtype != w.dtype or not np.allclose(g, w, rtol=tol, atol=tol, equal_nan=True):
                return f"{g.dtype}{g.shape} {g.ravel()[:6]} != {w.dtype}{w.shape} {w.ravel()[:6]}"
        return None
"""

COMPOSED_FORWARD = {
    "tril": "paddle.tril(x, 1)", "triu": "paddle.triu(m, -1)", "flip": "paddle.flip(x, [0, 2])",
    "roll": "paddle.roll(x, [1, -2], [1, 2])", "roll_flat": "paddle.roll(x, 5)",
    "tile": "paddle.tile(m, [2, 1, 3])", "stack": "paddle.stack([x, xs], axis=1)",
    "squeeze": "x[:, :1].squeeze(1)", "reshape": "x.reshape([4, 6])", "flatten": "x.flatten(1)",
    "contiguous": "x.transpose([1, 0, 2]).contiguous() + 0", "expand_as": "paddle.expand_as(y, x)",
    "isnan": "paddle.isnan(z)", "isinf": "paddle.isinf(z)", "isfinite": "paddle.isfinite(z)",
    "logical_and": "paddle.logical_and(x > 0, y > 0)", "logical_or": "paddle.logical_or(x > 0, y > 0)",
    "logical_xor": "paddle.logical_xor(x > 0, y > 0)", "logical_not": "paddle.logical_not(x > 0)",
    "clip": "paddle.clip(x, -0.5, 0.5)", "min": "x.min(axis=1)", "min_all": "x.min()",
    "logsumexp": "paddle.logsumexp(x, axis=-1)", "logsumexp_all": "paddle.logsumexp(x)",
    "any": "paddle.any(x > 1, axis=1)", "all": "paddle.all(x > -2, axis=2, keepdim=True)",
    "log_softmax": "F.log_softmax(x, axis=1)", "cumsum": "paddle.cumsum(x, axis=1)", "cumsum_flat": "paddle.cumsum(x)",
    "argmax": "paddle.argmax(x, axis=-1)", "argmin_flat": "paddle.argmin(x)", "argmax_ties": "paddle.argmax(t, axis=1)",
    "topk": "paddle.topk(x, 2, axis=1)", "topk_ties": "paddle.topk(t, 2)[0]", "topk_smallest": "paddle.topk(x, 3, largest=False)",
    "argsort": "paddle.argsort(x, axis=-1)", "argsort_desc": "paddle.argsort(x, axis=0, descending=True)",
    "sort": "paddle.sort(x, axis=1)", "one_hot": "F.one_hot(ids, 5)", "eye": "paddle.eye(3, 4)",
    "gelu": "F.gelu(x)", "gelu_tanh": "F.gelu(x, approximate=True)",
    "layer_norm": "F.layer_norm(x, [4], weight=v, bias=v)", "layer_norm_2d": "F.layer_norm(x, [3, 4])",
    "square": "paddle.square(x)", "sign": "paddle.sign(x)", "reciprocal": "paddle.reciprocal(c)",
    "relu": "F.relu(x)", "leaky_relu": "F.leaky_relu(x, 0.1)", "mean_all": "x.mean()",
    "arange": "paddle.arange(2, 11, 3)", "arange_float": "paddle.arange(0.5, 3.0, 0.5)",
    "gather_nd": "paddle.gather_nd(x, nd)", "scatter_nd_add": "paddle.scatter_nd_add(x, nd, upd)",
    "index_add": "paddle.index_add(x, idx, 1, xs[:, :3])", "assign": "paddle.assign(x)",
    "strided_slice": "x[:, ::-2, 1::2]",
}

COMPOSED_BACKWARD = {
    "gelu": ("lambda x: F.gelu(x)", ["x"]), "gelu_tanh": ("lambda x: F.gelu(x, approximate=True)", ["x"]),
    "layer_norm": ("lambda x, v: F.layer_norm(x, [4], weight=v, bias=v * 2)", ["x", "v"]),
    "exp": ("paddle.exp", ["x"]), "tanh": ("paddle.tanh", ["x"]), "sigmoid": ("F.sigmoid", ["x"]),
    "sqrt": ("paddle.sqrt", ["c"]), "rsqrt": ("paddle.rsqrt", ["c"]), "log": ("paddle.log", ["c"]),
    "abs": ("paddle.abs", ["x"]), "silu": ("F.silu", ["x"]), "pow": ("lambda c: c ** 2.5", ["c"]),
    "maximum": ("lambda x, y: paddle.maximum(x, y)", ["x", "y"]), "minimum": ("lambda x, y: paddle.minimum(x, y)", ["x", "y"]),
    "where": ("lambda x, y: paddle.where(x > 0, x, y)", ["x", "y"]), "clip": ("lambda x: paddle.clip(x, -0.5, 0.5)", ["x"]),
    "mean": ("lambda x: x.mean(axis=[0, 2])", ["x"]), "mean_all": ("lambda x: x.mean()", ["x"]),
    "max": ("lambda t: t.max(axis=-1)", ["t"]), "min": ("lambda t: (-t).min(axis=-1)", ["t"]),
    "squeeze": ("lambda x: x[:, :1].squeeze(1)", ["x"]), "unsqueeze": ("lambda x: x.unsqueeze(0)", ["x"]),
    "reshape": ("lambda x: x.reshape([4, 6])", ["x"]), "tile": ("lambda m: paddle.tile(m, [2, 1, 3])", ["m"]),
    "roll": ("lambda x: paddle.roll(x, [1], [2])", ["x"]), "stack": ("lambda x, xs: paddle.stack([x, xs], 1)", ["x", "xs"]),
    "expand": ("lambda y: paddle.expand(y, [2, 3, 4])", ["y"]), "slice": ("lambda x: x[:, 1:, 1:3]", ["x"]),
    "tril": ("lambda x: paddle.tril(x)", ["x"]), "cumsum": ("lambda x: paddle.cumsum(x, axis=-1)", ["x"]),
    "topk": ("lambda x: paddle.topk(x, 2, axis=1)[0]", ["x"]), "sort": ("lambda x: paddle.sort(x, axis=-1)", ["x"]),
    "take_along_axis": ("lambda x, tidx: paddle.take_along_axis(x, tidx, 2)", ["x"]),
    "strided_slice": ("lambda x: x[:, 1:, ::2]", ["x"]),
    "log_softmax": ("lambda x: F.log_softmax(x, -1)", ["x"]), "gather_nd": ("lambda x, nd: paddle.gather_nd(x, nd)", ["x"]),
    "leaky_relu": ("lambda x: F.leaky_relu(x, 0.1)", ["x"]), "relu": ("F.relu", ["x"]), "square": ("paddle.square", ["x"]),
    "reciprocal": ("paddle.reciprocal", ["c"]),
}

COMPOSED_RANDOM = {
    "uniform": "paddle.uniform([3, 5], min=-2.0, max=1.0)", "rand": "paddle.rand([7])",
    "gaussian": "paddle.randn([3, 5])", "normal": "paddle.normal(1.0, 3.0, [9])",
    "randint": "paddle.randint(0, 7, [4, 4])", "randint_int32": "paddle.randint(-3, 3, [9], dtype='int32')",
    "dropout": "F.dropout(paddle.ones([6, 6]), 0.3)", "dropout_downgrade": "F.dropout(paddle.ones([5, 5]), 0.5, mode='downscale_in_infer')",
    "dropout_eval": "F.dropout(paddle.ones([5, 5]), 0.5, training=False)", "linear_init": "paddle.nn.Linear(4, 3).weight",
}


def test_composed_kernels_match_paddles_cpu_kernels():
    body = _COMPOSED_INPUTS + f"""
    bad = {{}}
    for name, expr in {COMPOSED_FORWARD!r}.items():
        try:
            bad[name] = compare(*both(lambda **t: eval(expr, dict(t, paddle=paddle, F=F))), 1e-5)
        except Exception as exc:
            bad[name] = str(exc).strip().splitlines()[-1][:300]
    for name, (fn, leaves) in {COMPOSED_BACKWARD!r}.items():
        def run(fn=fn, leaves=leaves, **t):
            for k in leaves:
                t[k].stop_gradient = False
            f = eval(fn, dict(paddle=paddle, F=F))
            out = f(*[t[k] for k in f.__code__.co_varnames[:f.__code__.co_argcount]]) if fn.startswith("lambda") else f(t[leaves[0]])
            (out * paddle.arange(out.size, dtype=out.dtype).reshape(out.shape)).sum().backward()
            return [t[k].grad for k in leaves]
        try:
            bad["grad_" + name] = compare(*both(run), 1e-5)
        except Exception as exc:
            bad["grad_" + name] = str(exc).strip().splitlines()[-1][:300]
    for name, expr in {COMPOSED_RANDOM!r}.items():
        def draw(expr=expr, **t):
            paddle.seed(11)
            first = eval(expr, dict(paddle=paddle, F=F))
            return [first, eval(expr, dict(paddle=paddle, F=F))]  # the generator moves on alike
        try:
            bad["random_" + name] = compare(*both(draw), 1e-6)
        except Exception as exc:
            bad["random_" + name] = str(exc).strip().splitlines()[-1][:300]
    print(json.dumps({{k: v for k, v in bad.items() if v}}))
    """
    assert run_on_xpu(None, body, env={"ANYCHIP_STRICT": "1", "ANYCHIP_SIM_CHECK": "1"}) == {}


@pytest.mark.parametrize("chip", ["xpu", "npu", "gcu", "dcu"])
def test_at_least_150_paddle_kernels_are_routed_on_every_chip(chip):
    """Counted as `anychip ops` plans a device's Paddle kernel library: the Paddle kernels whose
    base ops the chip's plugin has as C kernels, in at least one dtype."""
    from anychip.frontends.paddle.kernels import plan
    from anychip.plugins import registry

    served = plan(registry().kernels, chip)[1]
    assert len(served) >= 150, sorted(served)
    for name in ("layer_norm", "gelu_grad", "dropout", "uniform", "adamw", "topk", "cumsum", "contiguous"):
        assert "float32" in served[name], (name, served[name])
