"""matmul (batched, transposes, broadcast batch dims) and its grad (a base op of its own)."""

from __future__ import annotations

import numpy as np

from ...conformance.case import base_case, values
from ...dtypes import FLOATS
from ..base import SUM_TOL, broadcast_shape
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
matmul:          x[..., M, K] ([..., K, M] with transpose_x), y[..., K, N] ([..., N, K] with
                 transpose_y) -> out[..., M, N]; attrs: transpose_x, transpose_y. x and y
                 have out's batch rank and shape, stride 0 on the batch dims they broadcast.
matmul_grad:     x, y (as matmul), dout[..., M, N] -> dx, dy; attrs: transpose_x,
                 transpose_y. dx and dy are dense with x's and y's own (un-broadcast) shapes,
                 of any batch rank up to out's, right-aligned: out batches that map onto one
                 dx (dy) batch are summed.
"""


def _matmul_dims(x, y, tx, ty):
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"x and y must be at least 2-D, got {list(x)} and {list(y)}")
    m, k = (x[-1], x[-2]) if tx else (x[-2], x[-1])
    k2, n = (y[-1], y[-2]) if ty else (y[-2], y[-1])
    if k != k2:
        raise ValueError(f"x {list(x)} and y {list(y)} (transpose_x={bool(tx)}, transpose_y={bool(ty)}) have "
                         f"contraction sizes {k} and {k2}")
    return broadcast_shape(x[:-2], y[:-2]), m, n


def _matmul_shape(shapes, attrs, out_shape):
    batch, m, n = _matmul_dims(shapes[0], shapes[1], attrs[0], attrs[1])
    return [batch + (m, n)]


def _matmul_grad_shape(shapes, attrs, out_shape):
    x, y, dout = shapes
    want = _matmul_shape([x, y], attrs, None)[0]
    if tuple(dout) != want:
        raise ValueError(f"dout must have the output's shape {list(want)}, got {list(dout)}")
    return [x, y]


def _operands(x, y, tx, ty):
    a = np.swapaxes(x, -1, -2) if tx else x
    b = np.swapaxes(y, -1, -2) if ty else y
    return a.astype(np.float64), b.astype(np.float64)


def _matmul(x, a, out_dtype, out_shape):
    xa, yb = _operands(x[0], x[1], a[0], a[1])
    return [np.matmul(xa, yb).astype(x[0].dtype)]


def _unbroadcast(grad, shape):
    """``grad`` summed over the dims that broadcasting added to or stretched in ``shape``."""
    lead = grad.ndim - len(shape)
    g = grad.sum(axis=tuple(range(lead))) if lead else grad
    stretched = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    return g.sum(axis=stretched, keepdims=True) if stretched else g


def _matmul_grad(x, a, out_dtype, out_shape):
    xv, yv, dout = x
    tx, ty = bool(a[0]), bool(a[1])
    xa, yb = _operands(xv, yv, tx, ty)
    d = dout.astype(np.float64)
    da = np.matmul(d, np.swapaxes(yb, -1, -2))
    db = np.matmul(np.swapaxes(xa, -1, -2), d)
    dx = np.swapaxes(da, -1, -2) if tx else da
    dy = np.swapaxes(db, -1, -2) if ty else db
    return [_unbroadcast(dx, xv.shape).astype(xv.dtype), _unbroadcast(dy, yv.shape).astype(yv.dtype)]


_SHAPES = [((5, 7), (7, 3), 0, 0), ((2, 3, 9, 6), (9, 4), 1, 0), ((4, 9, 6), (1, 10, 9), 1, 1)]


def _cases(op, dtype, rng):
    if op.name == "matmul":
        return [base_case(op, f"{list(a)} @ {list(b)}, transpose {tx}/{ty}",
                          {"x": values(rng, a, dtype), "y": values(rng, b, dtype)}, [tx, ty])
                for a, b, tx, ty in _SHAPES]
    out = []
    for a, b, tx, ty in _SHAPES:
        shape = _matmul_shape([a, b], [tx, ty], None)[0]
        out.append(base_case(op, f"{list(a)} @ {list(b)}, transpose {tx}/{ty}",
                             {"x": values(rng, a, dtype), "y": values(rng, b, dtype),
                              "dout": values(rng, shape, dtype)}, [tx, ty]))
    return out


_TOL = SUM_TOL
DEFINITIONS = [
    OpDef("matmul", "matmul", "batched x @ y with transposes and broadcast batch dims", ("x", "y"), ("out",), FLOATS,
          _TOL, _cases, attrs=(Attr("transpose_x", "x is [..., K, M]"), Attr("transpose_y", "y is [..., N, K]")),
          grad="matmul_grad", reference_fn=_matmul, shape=_matmul_shape, paddle=("matmul",)),
    OpDef("matmul_grad", "matmul", "dx, dy of matmul, summed over the batch dims x and y broadcast along",
          ("x", "y", "dout"), ("dx", "dy"), FLOATS, _TOL, _cases,
          attrs=(Attr("transpose_x", "as matmul"), Attr("transpose_y", "as matmul")), reference_fn=_matmul_grad,
          shape=_matmul_grad_shape, paddle=("matmul_grad",)),
]
