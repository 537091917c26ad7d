"""cast: x -> out, between any two of the castable dtypes; registered under the INPUT's dtype."""

from __future__ import annotations

import numpy as np

from ...conformance.case import base_case, values
from ...dtypes import CASTABLE
from ..base import np_dtype, same
from ..definition import OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
cast:            x -> out, any pair of float32/bfloat16/float16/int32/int64/int8/bool; float -> int
                 truncates toward zero (NaN -> 0, saturating), -> bool is x != 0
"""


def _cast(x, a, out_dtype, out_shape):
    src = x[0]
    target = np_dtype(out_dtype)
    if target.kind in "iu" and src.dtype.kind == "f":  # toward zero, saturating, NaN -> 0 (kernel.h)
        info = np.iinfo(target)
        with np.errstate(all="ignore"):
            t = np.clip(np.nan_to_num(np.trunc(src.astype(np.float64)), nan=0.0), info.min, info.max)
            return [t.astype(target)]
    if target.kind == "b":
        return [src != 0]
    return [src.astype(target)]


def _cases(op, dtype, rng):
    x = values(rng, (3, 17), dtype, -40.0, 40.0)
    return [base_case(op, f"to {target}", {"x": x}, out_dtype=target) for target in op.dtypes]


DEFINITIONS = [OpDef("cast", "cast", "x converted to the output's dtype (float -> int truncates toward zero)",
                     ("x",), ("out",), CASTABLE,
                     # keyed by the INPUT's dtype, while the error is the output's rounding (bfloat16: 2^-9)
                     {d: (4e-3, 0.0) for d in CASTABLE}, _cases, reference_fn=_cast, shape=same,
                     input_dtypes=("any",), output_dtypes=("given",), paddle=("cast",))]
