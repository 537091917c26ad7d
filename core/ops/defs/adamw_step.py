"""adamw_step: fused AdamW over a list of parameters, in place."""

from __future__ import annotations

import functools

import numpy as np

from ...conformance.case import Case, normal
from ..definition import Attr, OpDef
from ..optim import _reference as _adamw_reference, adamw_step

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
adamw_step:      grads g_0..g_{n-1} -> params p_0..p_{n-1}, m_0..m_{n-1}, v_0..v_{n-1}
                 updated in place (m, v float32; p and g share a float dtype);
                 attrs: lr, beta1, beta2, eps, weight_decay, step (1-based).
                 p -= lr * weight_decay * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
                 p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
"""


def _adamw_call(update, count, hyper, **t):
    """Runs ``update`` (the op or its reference) on the ``count`` parameters in ``t``; returns
    the updated parameters, then the first and second moments."""
    params, grads, m1, m2 = ([t[f"{kind}{i}"] for i in range(count)] for kind in ("param", "grad", "m1_", "m2_"))
    update(params, grads, m1, m2, **hyper)
    return (*params, *m1, *m2)


def _cases(op, dtype, rng):
    out = []
    for label, shapes, step, weight_decay in [
        ("one element, first step", [(1,)], 1, 0.1),
        ("three odd-sized parameters, step 3", [(33, 7), (1000,), (5,)], 3, 0.1),
        ("no weight decay, step 100", [(257,)], 100, 0.0),
    ]:
        inputs = {}
        for i, shape in enumerate(shapes):
            inputs[f"param{i}"] = normal(rng, *shape)
            inputs[f"grad{i}"] = normal(rng, *shape)
            inputs[f"m1_{i}"] = normal(rng, *shape, scale=0.1).astype(np.float32)
            inputs[f"m2_{i}"] = rng.uniform(0.0, 0.05, shape).astype(np.float32)
        hyper = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=weight_decay, step=step)
        count = len(shapes)
        names = tuple(f"{kind}{i}" for kind in ("param", "moment1_", "moment2_") for i in range(count))
        out.append(Case(label, inputs, functools.partial(_adamw_call, adamw_step, count, hyper),
                        functools.partial(_adamw_call, _adamw_reference, count, hyper), names, hyper,
                        float32_inputs=tuple(n for n in inputs if n.startswith("m"))))
    return out


DEFINITIONS = [OpDef(
    "adamw_step", "fused", "fused AdamW over a list of parameters (in place)", ("grads...",),
    ("params...", "moments1...", "moments2..."), ("float32", "bfloat16"),
    {"float32": (1e-6, 1e-7), "bfloat16": (1e-2, 1e-2)}, _cases,
    attrs=(Attr("lr", "the learning rate"), Attr("beta1", "the first moment's decay"),
           Attr("beta2", "the second moment's decay"), Attr("eps", "added to the denominator"),
           Attr("weight_decay", "decoupled, times lr"), Attr("step", "1-based, for the bias corrections")))]
