"""The host kernels linear and linear_grad against a float64 numpy oracle, and anychip.ops.linear
(forward, backward, argument errors) on the host CPU and on a simulated chip.

The oracle multiplies the values the kernel was given (rounded to the dtype) in float64. Errors
are bounded relative to the sum of |products| of each output: float32 accumulation, the output's
rounding to its dtype and nothing else (bf16 x bf16 products are exact in float32, so the AMX
path rounds no input). Mixed precision (float32 tensors, compute bfloat16): the oracle multiplies
the bf16-rounded inputs in float64 and the float32 bound applies, on every ISA. Every ISA path
(scalar, AVX2, AVX-512, AMX) runs in a subprocess with ANYCHIP_CPU_ISA set (tiers the CPU lacks skip).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from isa_paths import isa_params
from kernel_helpers import empty, run, store, value

FLOATS = ("float32", "bfloat16", "float16")
MIXED = "float32+bfloat16"  # float32 tensors, bfloat16 products
COMPUTE = {"float32": 0, "float16": 1, "bfloat16": 2}  # AnychipDtype
# float32: K * 2^-24 summation error, generously; bf16 / fp16: one rounding of the output
TOLERANCE = {"float32": 1e-5, "bfloat16": 2.0**-8, "float16": 2.0**-10}


def check(got, want, bound, dtype, what):
    excess = np.abs(value(got) - want) - TOLERANCE[dtype] * bound - 1e-30
    assert np.all(excess <= 0), f"{what} {dtype}: max excess {np.max(excess):.3g}"


def operands(rng, lead, k, n, dtype):
    """x [*lead, K], weight [N, K], bias [N], dy [*lead, N] in storage form."""
    return (store(rng.standard_normal((*lead, k)), dtype), store(rng.standard_normal((n, k)) * 0.5, dtype),
            store(rng.standard_normal(n), dtype), store(rng.standard_normal((*lead, n)), dtype))


def split(dtype):
    """(tensor dtype, compute attr, rounded): MIXED keeps float32 tensors and rounds the products'
    inputs to bf16, as the oracle must."""
    if dtype == MIXED:
        return "float32", COMPUTE["bfloat16"], lambda a: value(store(a, "bfloat16"))
    return dtype, COMPUTE[dtype], value


def check_forward(rng, lead, k, n, dtype, with_bias):
    dtype, compute, rounded = split(dtype)
    x, w, b, _ = operands(rng, lead, k, n, dtype)
    y = empty((*lead, n), dtype)
    run("linear", [x, w] + ([b] if with_bias else []), [y], [compute])
    xv, wv = rounded(x), rounded(w)
    want = xv @ wv.T + (value(b) if with_bias else 0.0)
    check(y, want, np.abs(xv) @ np.abs(wv).T + (np.abs(value(b)) if with_bias else 0.0), dtype,
          f"y {lead}x{k}x{n}")


def check_grad(rng, lead, k, n, dtype, with_bias):
    dtype, compute, rounded = split(dtype)
    x, w, _, dy = operands(rng, lead, k, n, dtype)
    dx, dw = empty(x.shape, dtype), empty(w.shape, dtype)
    outputs = [dx, dw] + ([empty((n,), dtype)] if with_bias else [])
    run("linear_grad", [dy, x, w], outputs, [1, 1, compute])
    xv, wv, dyv = (rounded(a).reshape(-1, a.shape[-1]) for a in (x, w, dy))
    check(dx.reshape(-1, k), dyv @ wv, np.abs(dyv) @ np.abs(wv), dtype, f"dx {lead}x{k}x{n}")
    check(dw, dyv.T @ xv, np.abs(dyv).T @ np.abs(xv), dtype, f"dweight {lead}x{k}x{n}")
    if with_bias:  # a sum, not a product: of dy as it is
        dyv = value(dy).reshape(-1, n)
        check(outputs[2], dyv.sum(axis=0), np.abs(dyv).sum(axis=0), dtype, f"dbias {lead}x{k}x{n}")


# Odd sizes; K <= N and K > N (the two orientations of dweight's product); 3-D x; multiples of 32
# (the AMX path then reads x and dy in place); and sizes past the blocked products' blocks: 480
# rows and 256 deep (float32), 32-row tiles and 128 columns per task (AMX), and AMX contractions
# longer than its 4096-deep chunks (over N for dx, K for y); LoRA's products, narrow on one side
# (x A^T: N = the rank; h B^T: K = the rank) and their gradients.
SHAPES = [((7,), 33, 17), ((130,), 70, 45), ((2, 5), 33, 40), ((1,), 1, 1), ((3, 4, 3), 16, 32),
          ((33,), 64, 300), ((2, 32), 64, 96), ((2, 61), 64, 8), ((2, 61), 8, 130), ((61,), 576, 16),
          ((64,), 16, 576)]
LARGE_SHAPES = [((500,), 300, 150), ((40,), 96, 4200), ((5,), 4100, 3)]


def isa_cases(seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for dtype in FLOATS + (MIXED,):
        for lead, k, n in SHAPES + LARGE_SHAPES:
            check_forward(rng, lead, k, n, dtype, with_bias=k % 2 == 1)
            check_grad(rng, lead, k, n, dtype, with_bias=n % 2 == 1)


# ---- kernels ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS + (MIXED,))
@pytest.mark.parametrize("lead,k,n", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear(dtype, lead, k, n, with_bias):
    rng = np.random.default_rng(k * n)
    check_forward(rng, lead, k, n, dtype, with_bias)
    check_grad(rng, lead, k, n, dtype, with_bias)


@pytest.mark.parametrize("isa", isa_params("scalar", "avx2", "avx512", "amx"))
def test_isa_path(isa):
    code = ("import sys; sys.path.insert(0, {!r}); import test_kernels_linear as t; t.isa_cases()"
            .format(os.path.dirname(__file__)))
    env = dict(os.environ, ANYCHIP_CPU_ISA=isa)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dtype", FLOATS)
def test_grad_writes_only_the_outputs_asked_for(dtype):
    rng = np.random.default_rng(1)
    x, w, _, dy = operands(rng, (9,), 20, 12, dtype)
    dx, dw, db = empty(x.shape, dtype), empty(w.shape, dtype), empty((12,), dtype)
    run("linear_grad", [dy, x, w], [dx, empty((0,), dtype), db], [1, 0])
    assert np.all(np.isfinite(value(dx))) and np.all(np.isfinite(value(db)))
    run("linear_grad", [dy, x, w], [empty((0,), dtype), dw], [0, 1])
    check(dw, value(dy).T @ value(x), np.abs(value(dy)).T @ np.abs(value(x)), dtype, "dweight alone")
    dx2 = empty(x.shape, dtype)
    run("linear_grad", [dy, x, w], [dx2, empty((0,), dtype)], [1, 0])
    np.testing.assert_array_equal(dx2, dx)


def test_empty_sums_are_zero_and_empty_k_gives_the_bias():
    x, w, b = np.ones((3, 0), np.float32), np.ones((4, 0), np.float32), np.arange(4, dtype=np.float32)
    y = empty((3, 4), "float32")
    run("linear", [x, w, b], [y])
    np.testing.assert_array_equal(y, np.tile(b, (3, 1)))
    # no rows: dweight and dbias are zeros; no outputs: dx is zeros
    dw, db = empty((4, 5), "float32"), empty((4,), "float32")
    run("linear_grad", [np.ones((0, 4), np.float32), np.ones((0, 5), np.float32), np.ones((4, 5), np.float32)],
        [np.ones((0, 5), np.float32), dw, db], [1, 1])
    assert not dw.any() and not db.any()
    dx = empty((3, 5), "float32")
    run("linear_grad", [np.ones((3, 0), np.float32), np.ones((3, 5), np.float32), np.ones((0, 5), np.float32)],
        [dx, np.ones((0, 5), np.float32)], [1, 1])
    assert not dx.any()


def test_kernels_reject_what_they_cannot_do():
    x, w = np.ones((3, 8), np.float32), np.ones((4, 8), np.float32)
    with pytest.raises(RuntimeError, match="share a float dtype"):
        run("linear", [x, w.astype(np.float16)], [empty((3, 4), "float32")])
    with pytest.raises(RuntimeError, match=r"weight must be \[N, 8\]"):
        run("linear", [x, np.ones((4, 7), np.float32)], [empty((3, 4), "float32")])
    with pytest.raises(RuntimeError, match="contiguous"):
        run("linear", [np.ones((8, 3), np.float32).T, w], [empty((3, 4), "float32")])
    with pytest.raises(RuntimeError, match="needs_dx and needs_dweight must be 0 or 1"):
        run("linear_grad", [np.ones((3, 4), np.float32), x, w], [empty((3, 8), "float32"), empty((4, 8), "float32")],
            [2, 1])
    # bf16 products only for float32 tensors; float16 products for none
    with pytest.raises(RuntimeError, match="compute must be the tensors' dtype, or bfloat16 for float32"):
        run("linear", [x.astype(np.float16), w.astype(np.float16)], [empty((3, 4), "float16")], [COMPUTE["bfloat16"]])
    with pytest.raises(RuntimeError, match="compute must be"):
        run("linear_grad", [np.ones((3, 4), np.float32), x, w], [empty((3, 8), "float32"), empty((4, 8), "float32")],
            [1, 1, COMPUTE["float16"]])


def test_mixed_precision_rounds_the_inputs_of_the_products():
    """A float32 value that bf16 cannot hold: exact in float32 compute, rounded with compute bf16."""
    x, w = np.full((32, 64), 1.0 + 2.0**-10, np.float32), np.ones((32, 64), np.float32)
    y32, ymixed = empty((32, 32), "float32"), empty((32, 32), "float32")
    run("linear", [x, w], [y32], [COMPUTE["float32"]])
    run("linear", [x, w], [ymixed], [COMPUTE["bfloat16"]])
    np.testing.assert_array_equal(y32, 64 * (1.0 + 2.0**-10))
    np.testing.assert_array_equal(ymixed, 64.0)


# ---- the op -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pd():
    from ops_helpers import paddle

    return paddle()


def bf16_rounded(a):
    return value(store(a, "bfloat16"))


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype", FLOATS + (MIXED,))
def test_op_forward_and_backward(pd, device, dtype):
    import anychip
    import anychip.ops as ops
    from ops_helpers import host, tensor

    anychip.reset_fallbacks()
    rng = np.random.default_rng(3)
    lead, k, n = (2, 7), 45, 19
    compute = "bfloat16" if dtype == MIXED else None
    dtype = "float32" if dtype == MIXED else dtype
    x = tensor(rng.standard_normal((*lead, k)), device, dtype, grad=True)
    w = tensor(rng.standard_normal((n, k)), device, dtype, grad=True)
    b = tensor(rng.standard_normal(n), device, dtype, grad=True)
    dy = tensor(rng.standard_normal((*lead, n)), device, dtype)
    y = ops.linear(x, w, b, compute_dtype=compute)
    dx, dw, db = pd.grad([y], [x, w, b], [dy])
    rounded = bf16_rounded if compute else (lambda a: a)
    xv, wv, bv = rounded(host(x).reshape(-1, k)), rounded(host(w)), host(b)
    dyv = host(dy).reshape(-1, n)
    for got, want, bound, what in [
        (y, xv @ wv.T + bv, np.abs(xv) @ np.abs(wv).T + np.abs(bv), "y"),
        (dx, rounded(dyv) @ wv, np.abs(dyv) @ np.abs(wv), "dx"),
        (dw, rounded(dyv).T @ xv, np.abs(dyv).T @ np.abs(xv), "dweight"),
        (db, dyv.sum(0), np.abs(dyv).sum(0), "dbias"),
    ]:
        assert got.dtype == x.dtype, what
        err = np.abs(host(got).reshape(want.shape) - want) - TOLERANCE[dtype] * bound
        assert np.all(err <= 1e-30), f"{what} on {device}/{dtype}/{compute}: max excess {err.max():.3g}"
    assert list(y.shape) == [*lead, n] and list(dx.shape) == [*lead, k]
    assert not anychip.fallback_counts(), anychip.fallback_counts()


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("compute", [None, "bfloat16"])
def test_op_frozen_weight_and_no_bias(pd, device, compute):
    """LoRA's base layer: the weight is frozen, so it gets no gradient (and costs no dW)."""
    import anychip.ops as ops
    from ops_helpers import host, tensor

    rng = np.random.default_rng(4)
    x = tensor(rng.standard_normal((6, 10)), device, "float32", grad=True)
    w = tensor(rng.standard_normal((3, 10)), device, "float32")
    rounded = bf16_rounded if compute else (lambda a: a)
    y = ops.linear(x, w, compute_dtype=compute)
    y.sum().backward()
    assert w.grad is None and x.grad.dtype == x.dtype
    np.testing.assert_allclose(host(x.grad), np.tile(rounded(host(w)).sum(0), (6, 1)), rtol=1e-5)
    with pd.no_grad():
        np.testing.assert_allclose(host(ops.linear(x, w, compute_dtype=compute)),
                                   rounded(host(x)) @ rounded(host(w)).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,compute", [("bfloat16", None), ("float32", "bfloat16")])
def test_op_matches_its_reference(pd, dtype, compute):
    import anychip.ops as ops
    from anychip.ops.linear import _Linear
    from ops_helpers import host, tensor

    rng = np.random.default_rng(5)
    x, w, b = (tensor(rng.standard_normal(s), "cpu", dtype) for s in [(4, 3, 16), (8, 16), (8,)])
    want = _Linear(("cpu", 0), True, compute or dtype).reference(x, w, b)
    assert want.dtype == x.dtype
    tol = 1e-2 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(host(ops.linear(x, w, b, compute_dtype=compute)), host(want), rtol=tol, atol=tol)


@pytest.mark.parametrize("make,message", [
    (lambda t: (t((3, 8)), t((4, 7)), None), "weight must have shape [4, 8] ([N, K] with K = 8, x's last dim)"),
    (lambda t: (t((3, 8)), t((8,)), None), "weight must be 2-D [N, K]"),
    (lambda t: (t((3, 8)), t((4, 8), "bfloat16"), None), "weight has dtype bfloat16 but x has float32"),
    (lambda t: (t((3, 8)), t((4, 8)), t((3,))), "bias must have shape [4]"),
    (lambda t: (t((3, 8)), t((4, 8)), t((4,), "float16")), "bias has dtype float16 but x has float32"),
    (lambda t: (t((3, 8), "int32"), t((4, 8)), None), "x has dtype int32, expected one of float32"),
    (lambda t: (t(None), t((4, 8)), None), "x must be [..., K], got a scalar"),
    (lambda t: (t((3, 8)), np.ones((4, 8), np.float32), None), "weight must be a paddle.Tensor"),
    (lambda t: (t((3, 8)), t((4, 8), device="npu"), None), "weight on npu:0"),
    (lambda t: (t((3, 8)), t((4, 8)), None, "float16"),
     "compute_dtype must be None or 'float32' or 'bfloat16' for float32 tensors, got 'float16'"),
    (lambda t: (t((3, 8), "bfloat16"), t((4, 8), "bfloat16"), None, "float32"),
     "compute_dtype must be None or 'bfloat16' for bfloat16 tensors, got 'float32'"),
    (lambda t: (t((3, 8), "float16"), t((4, 8), "float16"), None, "bfloat16"),
     "compute_dtype must be None or 'float16' for float16 tensors, got 'bfloat16'"),
])
def test_op_names_bad_arguments(pd, make, message):
    import anychip.ops as ops
    from ops_helpers import tensor

    def t(shape, dtype="float32", device="cpu"):
        if shape is None:
            return pd.zeros([], dtype)
        return tensor(np.zeros(shape, np.float32), device, dtype)

    args = make(t)
    with pytest.raises(ops.OpArgumentError) as info:
        ops.linear(*args[:3], compute_dtype=args[3] if len(args) > 3 else None)
    assert message in str(info.value)
