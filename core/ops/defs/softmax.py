"""softmax along an axis, and its grad (a base op of its own)."""

from __future__ import annotations

import numpy as np

from ...conformance.case import base_case, values
from ...dtypes import FLOATS
from ..base import SUM_TOL, axis_of
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
softmax:         x -> out; attrs: axis (negative counts from the end)
softmax_grad:    out, dout -> dx = out * (dout - sum(dout * out, axis)); attrs: axis
"""


def _softmax_shape(shapes, attrs, out_shape):
    axis_of(attrs, len(shapes[0]))
    return [shapes[0]]


def _softmax64(v, axis):
    w = v.astype(np.float64)
    e = np.exp(w - w.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _softmax(x, a, out_dtype, out_shape):
    v = x[0]
    if v.size == 0:
        return [v.copy()]
    return [_softmax64(v, axis_of(a, v.ndim)).astype(v.dtype)]


def _softmax_grad(x, a, out_dtype, out_shape):
    out, dout = (t.astype(np.float64) for t in x)
    axis = axis_of(a, x[0].ndim)
    return [(out * (dout - (dout * out).sum(axis=axis, keepdims=True))).astype(x[0].dtype)]


def _cases(op, dtype, rng):
    if op.name == "softmax":
        return [base_case(op, f"axis {a}", {"x": values(rng, (3, 4, 33), dtype)}, [a]) for a in (-1, 1)]
    out = np.exp(rng.standard_normal((3, 33)))
    return [base_case(op, "axis -1", {"out": out / out.sum(-1, keepdims=True), "dout": values(rng, (3, 33), dtype)},
                      [-1])]


_TOL = SUM_TOL
DEFINITIONS = [
    OpDef("softmax", "softmax", "softmax along an axis", ("x",), ("out",), FLOATS, _TOL, _cases,
          attrs=(Attr("axis", "the softmax axis (negative counts from the end)"),), grad="softmax_grad",
          reference_fn=_softmax, shape=_softmax_shape, paddle=("softmax",)),
    OpDef("softmax_grad", "softmax", "dx = out * (dout - sum(dout * out, axis))", ("out", "dout"), ("dx",), FLOATS,
          _TOL, _cases, attrs=(Attr("axis", "as softmax"),), reference_fn=_softmax_grad, shape=_softmax_shape,
          paddle=("softmax_grad",)),
]
