"""weight_only_linear: x @ dequant(W)^T for int8/int4 weights (+ group offsets), grad wrt x."""

from __future__ import annotations

import functools

from ...conformance.case import CPU, Case, normal, quantized_arrays
from ...dtypes import FLOATS
from ..definition import Attr, OpDef
from ..quant import _WeightOnly, weight_only_linear

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
weight_only_linear: x[..., K] float, qweight, scales f32[N, G], offsets f32[N, G]?,
                 bias[N]? (float) -> y[..., N] float; attrs: bits, group_size, has_offsets
                 (absent: 0; input 3 is offsets only when it is 1).  y = x W^T + bias with
                 W[n, k] = q[n, k] * scales[n, g] + offsets[n, g], g = k / group_size.
                 Offsets make a group asymmetric (GGUF Q4_1: scale d, offset m + 8 d);
                 weight_quantize never writes them. Group sizes: any divisor of K (the
                 GGUF formats use 32).
                 Optional 4th attr x_int8 (absent: 0), an approximation for decoding as
                 llama.cpp's quantized dot products make: with 1, each row of x is first
                 quantized per run of R elements, R = 32 for bits 8 and, for bits 4, the
                 largest of 128, 64 and 32 that divides the group size (K for group_size
                 -1) (K and group_size multiples of 32, or group_size -1, so that each run
                 lies in one group): sx = absmax / 127,
                 xq = clamp(round_half_away(x / sx), -127, 127) (sx 0: xq 0), and
                 y[n] = sum over runs r of scales[n, g(r)] * sx[r] * sum_{k in r} q[n, k] xq[k]
                        + sum_g offsets[n, g] * (sum of x over group g) + bias[n]
                 (the integer sums exact, the float sums in any order). Forward only; relative
                 error against the exact product ~5e-3 (R 32) to ~7e-3 (R 128) for Gaussian x.
                 Optional 5th attr bf16_products (absent: 0; excludes x_int8): with 1, float32
                 x is rounded to bfloat16 (to nearest even) for the products, as if x were
                 bfloat16, and y stays float32 (where the products run on bfloat16 hardware,
                 W's values are rounded to bfloat16 too; the sums are float32). Forward only.
weight_only_linear_grad: dy[..., N], qweight, scales, offsets? -> dx[..., K];
                 attrs: bits, group_size, has_offsets
"""


def _cases(op, dtype, rng):
    out = []
    for label, lead, k, n, bits, group_size, offsets, bias, x_int8 in [
        ("int8 per channel, one row (GEMV), bias", (1,), 64, 37, 8, -1, False, True, False),
        ("int8 groups of 64, 3-d x", (2, 3), 128, 19, 8, 64, False, False, False),
        ("int4 per channel", (5,), 64, 7, 4, -1, False, False, False),
        ("int4 groups of 128, bias", (3,), 256, 33, 4, 128, False, True, False),
        ("int4 groups of 32 with offsets (GGUF Q4_1), bias", (4,), 128, 13, 4, 32, True, True, False),
        ("int4 groups of 64, 70 rows (a GEMM, not a GEMV)", (70,), 256, 65, 4, 64, False, False, False),
        ("x_int8 (inference only): int8 groups of 32", (3,), 96, 11, 8, 32, False, False, True),
        ("x_int8 (inference only): int4 groups of 64 with offsets, bias", (2,), 128, 9, 4, 64, True, True, True),
    ]:
        inputs = {"x": normal(rng, *lead, k), **quantized_arrays(rng, k, n, bits, group_size, offsets)}
        if bias:
            inputs["bias"] = normal(rng, n)
        grads = () if x_int8 else ("x",) + (("bias",) if bias else ())
        attrs = {"bits": bits, "group_size": group_size} | ({"x_int8": True} if x_int8 else {})
        impl = _WeightOnly(bits, group_size, CPU, bias, offsets, x_int8)
        out.append(Case(label, inputs, functools.partial(weight_only_linear, **attrs), impl.reference, ("y",),
                        attrs, grads, (normal(rng, *lead, n),) if grads else (),
                        float32_inputs=("scales", "offsets")))
    return out


FORMAT = (Attr("bits", "8 or 4"), Attr("group_size", "K's group size; -1: one group per channel"),
          Attr("has_offsets", "1: input 3 is offsets", default=0.0))
DEFINITIONS = [OpDef(
    "weight_only_linear", "fused", "x @ dequant(W)^T, int8/int4 weights (+ group offsets), grad wrt x",
    ("x", "qweight", "scales", "offsets?", "bias?"), ("y",), FLOATS,
    {"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 5e-2), "float16": (4e-3, 4e-3)}, _cases,
    attrs=FORMAT + (Attr("x_int8", "1: x quantized to int8 per run for the products (inference only)", default=0.0),
                    Attr("bf16_products", "1: float32 x rounded to bfloat16 for the products", default=0.0)),
    grad="weight_only_linear_grad", grad_attrs=FORMAT)]
