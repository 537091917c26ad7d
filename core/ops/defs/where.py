"""where: condition bool, x, y (any dtype) -> condition ? x : y, broadcast by the caller."""

from __future__ import annotations

import numpy as np

from ...conformance.case import base_case, values
from ...dtypes import BASE
from ..base import broadcast
from ..definition import OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
where:           condition bool, x, y (any dtype) -> out = condition ? x : y
"""


def _where(x, a, out_dtype, out_shape):
    return [np.where(x[0].astype(bool), x[1], x[2]).astype(x[1].dtype)]


def _cases(op, dtype, rng):
    return [base_case(op, "broadcast condition", {"condition": rng.random((4, 1)) < 0.5,
                                                  "x": values(rng, (1, 5), dtype), "y": values(rng, (4, 5), dtype)})]


DEFINITIONS = [OpDef("where", "where", "x where condition else y", ("condition", "x", "y"), ("out",), BASE,
                     {d: (0.0, 0.0) for d in BASE}, _cases, reference_fn=_where, shape=broadcast,
                     input_dtypes=("bool", "=", "="), paddle=("where",))]
