"""copy: x -> out, same dtype, both any strides: what views, concatenations and splits are made of."""

from __future__ import annotations

from ...conformance.case import base_case, values
from ...dtypes import BASE
from ..base import same
from ..definition import OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
copy:            x -> out (same dtype, any): out = x, both any strides
"""


def _copy(x, a, out_dtype, out_shape):
    return [x[0].copy()]


def _cases(op, dtype, rng):
    return [base_case(op, "3-d", {"x": values(rng, (3, 4, 5), dtype)})]


DEFINITIONS = [OpDef("copy", "copy", "out = x, both any strides (contiguous, transpose, slice, concat, split)",
                     ("x",), ("out",), BASE, {d: (0.0, 0.0) for d in BASE}, _cases, reference_fn=_copy, shape=same)]
