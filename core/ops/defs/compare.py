"""The comparisons: x, y (float or int) -> a bool, broadcast by the caller (kernel.h, "compare")."""

from __future__ import annotations

import numpy as np

from ...conformance.case import elementwise_cases
from ...dtypes import FLOATS, INTS
from ..base import EXACT, binary_reference, broadcast
from ..definition import OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
compare:         x, y (float or int) -> out bool: equal, not_equal, less_than, less_equal,
                 greater_than, greater_equal
"""


def _cases(op, dtype, rng):
    return elementwise_cases(op, dtype, rng, low=-2.0)


def _compare(name, fn):
    dtypes = FLOATS + INTS
    return OpDef(name, "compare", f"x {name.replace('_', ' ')} y, a bool", ("x", "y"), ("out",), dtypes,
                 dict(EXACT, **{d: (0.0, 0.0) for d in FLOATS}), _cases, reference_fn=binary_reference(fn, np.bool_),
                 shape=broadcast, output_dtypes=("bool",), paddle=(name,))


DEFINITIONS = [_compare(n, f) for n, f in [
    ("equal", np.equal), ("not_equal", np.not_equal), ("less_than", np.less), ("less_equal", np.less_equal),
    ("greater_than", np.greater), ("greater_equal", np.greater_equal)]]
