"""fill: -> out (any dtype), every element the value attr."""

from __future__ import annotations

import math

import numpy as np

from ...conformance.case import base_case
from ...dtypes import BASE
from ..base import given, np_dtype
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
fill:            -> out (any dtype); attrs: value (cast to out's dtype as cast does)
"""


def _fill(x, a, out_dtype, out_shape):
    target = np_dtype(out_dtype)
    value = a[0]
    if target.kind == "b":
        value = value != 0
    elif target.kind in "iu":
        value = math.trunc(value)
    return [np.full(tuple(out_shape), value, dtype=target)]


def _cases(op, dtype, rng):
    n = 17
    like = np.zeros(n, dtype) if dtype in ("int32", "int64", "bool") else np.zeros(n)
    return [base_case(op, f"{n} elements", {"like": like}, [2.5])]


DEFINITIONS = [OpDef("fill", "fill", "every element = value (full, full_like, zeros, ones)", (), ("out",), BASE,
                     {d: (0.0, 0.0) for d in BASE}, _cases, attrs=(Attr("value", "cast to the output's dtype"),),
                     reference_fn=_fill, shape=given, output_dtypes=("given",), paddle=("full", "full_like", "fill"))]
