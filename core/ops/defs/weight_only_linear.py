"""weight_only_linear: x @ dequant(W)^T for int8/int4 weights (+ group offsets), grad wrt x."""

from __future__ import annotations

import functools

from ...conformance.case import CPU, Case, normal, quantized_arrays
from ...dtypes import FLOATS
from ..definition import Attr, OpDef
from ..quant import _WeightOnly, weight_only_linear


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
