"""weight_quantize: symmetric int8/int4 weight packing, per channel or per group."""

from __future__ import annotations

import functools

import numpy as np

from ...conformance.case import CPU, Case, normal
from ...dtypes import FLOATS
from ..definition import Attr, OpDef
from ..quant import _Quantize, weight_quantize

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
weight_quantize: w[K, N] float -> qweight, scales f32[N, G]; attrs: bits, group_size.
                 group_size -1 means one group per output channel (G = 1), else
                 G = K / group_size. Symmetric: scale = absmax(group) / qmax with
                 qmax = 127 (8 bits) or 7 (4 bits), q = clamp(round(w / scale), -qmax, qmax)
                 (a zero group gets scale 0 and q 0).
                 bits 8: qweight int8[N, K], qweight[n, k] = q.
                 bits 4: qweight uint8[N, K/2], K a multiple of 64; each row is a run of
                 32-byte blocks, block b holding k = 64b .. 64b+63: byte i has q(64b+i)+8
                 in its low nibble and q(64b+32+i)+8 in its high nibble.
"""


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
