"""swiglu: silu(gate) * up."""

from __future__ import annotations

import functools

from ...conformance.case import CPU, Case, normal
from ...dtypes import FLOATS
from ..definition import OpDef
from ..dispatch import paddle
from ..swiglu import _Swiglu, swiglu

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
swiglu:          gate[...], up[...] -> y = silu(gate) * up
swiglu_grad:     dy, gate, up -> dgate, dup
"""


def _swiglu_packed_reference(impl, gate):
    return impl.reference(*paddle().split(gate, 2, axis=-1))


def _cases(op, dtype, rng):
    impl = _Swiglu(CPU)
    out = [Case(label, {"gate": normal(rng, *shape, scale=3), "up": normal(rng, *shape)}, swiglu,
                impl.reference, ("y",), grads=("gate", "up"), output_grads=(normal(rng, *shape),))
           for label, shape in [("one element", (1, 1)), ("prime width", (3, 257)), ("3-d input", (2, 3, 64))]]
    out.append(Case("gate and up packed in one tensor (up=None)", {"gate": normal(rng, 4, 90, scale=3)}, swiglu,
                    functools.partial(_swiglu_packed_reference, impl), ("y",), grads=("gate",),
                    output_grads=(normal(rng, 4, 45),)))
    return out


DEFINITIONS = [OpDef(
    "swiglu", "fused", "silu(gate) * up", ("gate", "up"), ("y",), FLOATS,
    {"float32": (1e-4, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)}, _cases, grad="swiglu_grad")]
