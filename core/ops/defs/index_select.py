"""index_select: x's slices at an int64 index along an axis (also Paddle's gather)."""

from __future__ import annotations

import numpy as np

from ...conformance.case import base_case, values
from ...dtypes import FLOATS, INTS
from ..base import axis_of
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
index_select:    x (float, int or int8), index int64[n] -> out (x's shape, n along axis); attrs:
                 axis. Also serves gather. An index outside [0, x.shape[axis]) is an error.
"""

INDEXED = FLOATS + INTS + ("int8",)  # what index_select gathers


def _index_select_shape(shapes, attrs, out_shape):
    x, index = shapes
    if len(index) != 1:
        raise ValueError(f"index must be 1-D, got {list(index)}")
    axis = axis_of(attrs, len(x))
    return [tuple(x[:axis]) + (index[0],) + tuple(x[axis + 1:])]


def _index_select(x, a, out_dtype, out_shape):
    v, index = x
    return [np.take(v, index, axis=axis_of(a, v.ndim))]


def _cases(op, dtype, rng):
    return [base_case(op, f"axis {a}", {"x": values(rng, (4, 5, 6), dtype), "index": np.array(i, np.int64)}, [a])
            for a, i in [(0, [3, 0, 3]), (2, [5, 1])]]


DEFINITIONS = [OpDef("index_select", "index", "x's slices at index along axis (also gather)", ("x", "index"),
                     ("out",), INDEXED, {d: (0.0, 0.0) for d in INDEXED}, _cases,
                     attrs=(Attr("axis", "the indexed axis"),), reference_fn=_index_select, shape=_index_select_shape,
                     input_dtypes=("=", "int64"), paddle=("gather", "index_select"))]
