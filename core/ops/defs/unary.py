"""The unary base ops: x -> out, same float dtype (kernel.h, "unary")."""

from __future__ import annotations

import numpy as np

from ...conformance.case import elementwise_cases
from ...dtypes import FLOATS
from ..base import ELEMENTWISE_TOL, same, unary_reference
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
unary:           x -> out (same dtype, float): exp, log, sqrt, rsqrt, silu, sigmoid, tanh, abs,
                 neg, sin, cos (radians); scale (attrs: scale, bias, bias_after_scale: out = scale*x + bias, or
                 scale*(x + bias) when bias_after_scale is 0); pow (attrs: factor: out = x^factor)
"""


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _scale(v, a):
    scale, bias, after = a[0], a[1], a[2] if len(a) > 2 else 1.0
    return scale * v + bias if after else scale * (v + bias)


def _cases(op, dtype, rng):
    attrs = {"scale": [1.5, -0.25, 1.0], "pow": [2.5]}.get(op.name, [])
    return elementwise_cases(op, dtype, rng, low=0.1 if op.name in ("log", "sqrt", "rsqrt", "pow") else -3.0,
                             attrs=attrs)


def _unary(name, summary, fn, attrs=(), paddle=True):
    return OpDef(name, "unary", summary, ("x",), ("out",), FLOATS, ELEMENTWISE_TOL, _cases, attrs=attrs,
                 reference_fn=unary_reference(fn), shape=same, paddle=(name,) if paddle else ())


DEFINITIONS = [
    _unary("exp", "e^x", lambda v, a: np.exp(v)),
    _unary("log", "natural log", lambda v, a: np.log(v)),
    _unary("sqrt", "square root", lambda v, a: np.sqrt(v)),
    _unary("rsqrt", "1 / sqrt(x)", lambda v, a: 1.0 / np.sqrt(v)),
    _unary("silu", "x * sigmoid(x)", lambda v, a: v * _sigmoid(v)),
    _unary("sigmoid", "1 / (1 + e^-x)", lambda v, a: _sigmoid(v)),
    _unary("tanh", "hyperbolic tangent", lambda v, a: np.tanh(v)),
    _unary("abs", "|x|", lambda v, a: np.abs(v)),
    _unary("neg", "-x", lambda v, a: -v, paddle=False),  # Paddle negates with scale
    _unary("sin", "sine (radians)", lambda v, a: np.sin(v)),
    _unary("cos", "cosine (radians)", lambda v, a: np.cos(v)),
    _unary("scale", "scale*x + bias (bias_after_scale) or scale*(x + bias)", _scale,
           (Attr("scale", "the factor"), Attr("bias", "the offset"),
            Attr("bias_after_scale", "1: scale*x + bias, 0: scale*(x + bias)", default=1.0))),
    _unary("pow", "x^factor", lambda v, a: np.power(v, a[0]), (Attr("factor", "the exponent"),)),
]
