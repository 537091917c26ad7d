"""Sample inputs for every op: what the conformance kit feeds a device's kernels (in the spirit
of PyTorch's OpInfo ``sample_inputs``).

Each op's definition (``anychip/ops/defs/<op>.py``, or a plugin's ``anychip_register_ops``)
holds its cases: a short list of :class:`~anychip.conformance.case.Case` covering normal and odd
shapes (size 1, primes, widths that are not multiples of a vector, grouped-query heads, causal
and not, residual and not, 8 and 4 bits, per-channel and grouped scales, the FlashMask mask
families), the gradients compared, and how to call the op and its reference. Every case is
small: a whole device runs in seconds. An op cannot be defined without them.
"""

from __future__ import annotations

import numpy as np

from ..ops.defs import definition
from .case import Case

__all__ = ["Case", "cases"]


def cases(op: str, dtype: str, seed: int = 0) -> list[Case]:
    """The sample cases of ``op`` (fused or base, anychip's or a plugin's) for ``dtype``; the
    same ``seed`` gives the same arrays."""
    d = definition(op)
    if dtype not in d.dtypes:
        raise ValueError(f"{op} declares dtypes {', '.join(d.dtypes)}, got {dtype!r}")
    return d.cases(d, dtype, np.random.default_rng(seed))
