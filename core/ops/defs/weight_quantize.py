"""weight_quantize: symmetric int8/int4 weight packing, per channel or per group."""

from __future__ import annotations

import functools

import numpy as np

from ...conformance.case import CPU, Case, normal
from ...dtypes import FLOATS
from ..definition import Attr, OpDef
from ..quant import _Quantize, weight_quantize


def _unpack_nibbles(outputs):
    """4-bit qweight [N, K/2] -> its codes [N, K] (anychip/kernel.h's layout), so that a
    difference reads as a difference of codes."""
    packed, *rest = outputs
    n, half = packed.shape
    blocks = packed.astype(np.int16).reshape(n, half // 32, 32)
    codes = np.concatenate([blocks & 15, blocks >> 4], axis=-1).reshape(n, 2 * half) - 8
    return [codes, *rest]


def _cases(op, dtype, rng):
    out = []
    for label, (k, n), bits, group_size in [
        ("int8 per channel, a zero column", (64, 37), 8, -1),
        ("int8 groups of 64", (128, 5), 8, 64),
        ("int8 groups of 128", (256, 3), 8, 128),
        ("int4 per channel, one column", (64, 1), 4, -1),
        ("int4 groups of 64", (192, 13), 4, 64),
        ("int4 groups of 128", (256, 7), 4, 128),
    ]:
        w = normal(rng, k, n, scale=0.1)
        if label.endswith("a zero column"):
            w[:, 0] = 0.0  # its scale is 0: the kernel must not divide by it
        out.append(Case(label, {"w": w}, functools.partial(weight_quantize, bits=bits, group_size=group_size),
                        _Quantize(bits, group_size, CPU).reference, ("qweight", "scales"),
                        {"bits": bits, "group_size": group_size},
                        host_outputs=_unpack_nibbles if bits == 4 else None))
    return out


DEFINITIONS = [OpDef(
    "weight_quantize", "fused", "symmetric int8/int4 weight packing, per channel or group", ("w",),
    ("qweight", "scales"), FLOATS, {"float32": (1e-4, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)},
    _cases, attrs=(Attr("bits", "8 or 4"), Attr("group_size", "K's group size; -1: one group per channel")))]
