"""sum, mean, max over a set of axes (x read with any strides)."""

from __future__ import annotations

import math

import numpy as np

from ...conformance.case import base_case, values
from ...dtypes import FLOATS
from ..base import SUM_TOL, reduction_attrs, reduction_axes
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
sum, mean, max:  x float (any strides) -> out; attrs: keepdim, n, axis_0 .. axis_{n-1}
                 (axes >= 0, sorted, distinct; n = 0: all axes). out has x's shape without
                 the reduced dims (keepdim 0) or with them as 1 (keepdim 1). Sums accumulate
                 in at least float32; mean of nothing is NaN, max of nothing -inf.
"""

_ATTRS = (Attr("keepdim", "1: reduced dims kept with size 1"), Attr("n", "the number of axes; 0: all axes"),
          Attr("axes", "n axes, >= 0, sorted and distinct", variadic=True))


def _reduction_shape(shapes, attrs, out_shape):
    shape = shapes[0]
    axes = reduction_axes(attrs, len(shape))
    keepdim = bool(attrs[0])
    return [tuple(1 if i in axes else d for i, d in enumerate(shape)) if keepdim
            else tuple(d for i, d in enumerate(shape) if i not in axes)]


def _reduce(kind):
    def ref(x, a, out_dtype, out_shape):
        v = x[0]
        axes = reduction_axes(a, v.ndim)
        keepdim = bool(a[0])
        w = v.astype(np.float64)
        with np.errstate(all="ignore"):
            if kind == "max":
                r = w.max(axis=axes, keepdims=keepdim, initial=-np.inf)
            else:
                r = w.sum(axis=axes, keepdims=keepdim)
                if kind == "mean":  # 0 / 0: NaN for an empty reduction
                    r = r / np.float64(math.prod(v.shape[i] for i in axes))
        return [np.asarray(r).astype(v.dtype)]
    return ref


def _cases(op, dtype, rng):
    x = values(rng, (3, 5, 7), dtype)
    return [base_case(op, f"axes {axes}, keepdim {keep}", {"x": x}, reduction_attrs(axes, 3, keep))
            for axes, keep in [(None, False), ((1,), True), ((0, 2), False)]]


DEFINITIONS = [OpDef(n, "reduction", f"{n} over axes", ("x",), ("out",), FLOATS,
                     {d: SUM_TOL[d] if n != "max" else (0.0, 0.0) for d in FLOATS}, _cases, attrs=_ATTRS,
                     reference_fn=_reduce(n), shape=_reduction_shape, paddle=paddle)
               for n, paddle in [("sum", ("sum",)), ("mean", ("mean", "mean_all")), ("max", ("max",))]]
