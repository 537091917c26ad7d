"""w8a8_linear: int8 weights times activations quantized to int8 per token on the fly."""

from __future__ import annotations

from ...conformance.case import CPU, Case, normal, quantized_arrays
from ...dtypes import FLOATS
from ..definition import OpDef
from ..quant import _W8A8, w8a8_linear

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
w8a8_linear:     x[..., K] float, qweight int8[N, K], scales f32[N, 1], bias[N]?
                 -> y[..., N] float.  Each row of x is quantized to int8 on the fly with
                 its own scale absmax(row) / 127, the products summed in int32.
"""


def _cases(op, dtype, rng):
    out = []
    for label, lead, k, n, bias in [
        ("1 x 1", (1,), 1, 1, False),
        ("prime K, bias", (5,), 131, 37, True),
        ("3-d x", (2, 3), 64, 64, False),
    ]:
        inputs = {"x": normal(rng, *lead, k), **quantized_arrays(rng, k, n, 8, -1, False)}
        if bias:
            inputs["bias"] = normal(rng, n)
        out.append(Case(label, inputs, w8a8_linear, _W8A8(CPU).reference, ("y",), float32_inputs=("scales",)))
    return out


DEFINITIONS = [OpDef(
    "w8a8_linear", "fused", "int8 weights x dynamic per-token int8 activations",
    ("x", "qweight", "scales", "bias?"), ("y",), FLOATS,
    {"float32": (1e-5, 1e-4), "bfloat16": (2e-2, 5e-2), "float16": (4e-3, 4e-3)}, _cases)]
