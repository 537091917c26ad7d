"""arange: out[i] = start + i * step, computed in double."""

from __future__ import annotations

import numpy as np

from ...conformance.case import base_case
from ...dtypes import FLOATS
from ..base import ELEMENTWISE_TOL, given, np_dtype
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
arange:          -> out[n] (float or int64); attrs: start, step. out[i] = start + i*step
                 (computed in double, then converted as cast does)
"""

_DTYPES = FLOATS + ("int64",)


def _arange(x, a, out_dtype, out_shape):
    (n,) = out_shape
    values = a[0] + np.arange(n, dtype=np.float64) * a[1]
    target = np_dtype(out_dtype)
    return [np.trunc(values).astype(target) if target.kind in "iu" else values.astype(target)]


def _cases(op, dtype, rng):
    n = 17
    like = np.zeros(n, dtype) if dtype == "int64" else np.zeros(n)
    return [base_case(op, f"{n} elements", {"like": like}, [-3.0, 2.0])]


DEFINITIONS = [OpDef("arange", "arange", "out[i] = start + i * step; out_shape = [n]", (), ("out",), _DTYPES,
                     ELEMENTWISE_TOL, _cases,
                     attrs=(Attr("start", "the first value"), Attr("step", "the increment")), reference_fn=_arange,
                     shape=given, output_dtypes=("given",))]
