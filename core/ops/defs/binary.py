"""The binary base ops: x, y -> out, same dtype, broadcast by the caller (kernel.h, "binary")."""

from __future__ import annotations

import numpy as np

from ...conformance.case import elementwise_cases
from ...dtypes import FLOATS, INTS
from ..base import ELEMENTWISE_TOL, binary_reference, broadcast
from ..definition import OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
binary:          x, y -> out (same dtype, float): add, subtract, multiply, divide, maximum,
                 minimum (NaN propagates), elementwise_pow; add, subtract, multiply, maximum and
                 minimum also take int32/int64 (exact, wrapping on overflow)
"""

# the ops with an integer form too (exact, wrapping): index arithmetic, and Paddle's own
# cross_entropy multiplies its int64 labels by a mask
_INTEGER = ("add", "subtract", "multiply", "maximum", "minimum")


def _cases(op, dtype, rng):
    return elementwise_cases(op, dtype, rng, low=0.5 if op.name in ("elementwise_pow", "divide") else -2.0)


def _binary(name, summary, fn):
    dtypes = FLOATS + INTS if name in _INTEGER else FLOATS
    return OpDef(name, "binary", summary, ("x", "y"), ("out",), dtypes,
                 ELEMENTWISE_TOL, _cases, reference_fn=binary_reference(fn),
                 shape=broadcast, paddle=(name,))


DEFINITIONS = [
    _binary("add", "x + y", np.add),
    _binary("subtract", "x - y", np.subtract),
    _binary("multiply", "x * y", np.multiply),
    _binary("divide", "x / y", np.divide),
    _binary("maximum", "max(x, y) (NaN propagates)", np.maximum),
    _binary("minimum", "min(x, y) (NaN propagates)", np.minimum),
    _binary("elementwise_pow", "x^y", np.power),
]
