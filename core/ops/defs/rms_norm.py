"""rms_norm: RMSNorm over the last dim, optionally fused with the residual add before it."""

from __future__ import annotations

import functools

from ...conformance.case import CPU, Case, normal
from ...dtypes import FLOATS
from ..definition import Attr, OpDef
from ..norm import _RmsNorm, rms_norm

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
rms_norm:        x[..., C], weight[C], residual[..., C]? -> y[..., C], inv_rms f32[R],
                 h[..., C] (only with residual; h = x + residual, the normalised input);
                 attrs: eps.  y = h * inv_rms * weight, inv_rms = 1/sqrt(mean(h^2) + eps)
rms_norm_grad:   dy[..., C], h[..., C], weight[C], inv_rms f32[R], dh_extra[..., C]?
                 -> dh[..., C], dweight[C] (weight's dtype); dh includes dh_extra
"""


def _cases(op, dtype, rng):
    out = []
    for label, shape, residual, eps in [
        ("one element", (1, 1), False, 1e-6),
        ("prime width, residual", (3, 17), True, 1e-5),
        ("width 257 (not a multiple of a vector)", (5, 257), False, 1e-5),
        ("3-d input, residual", (2, 3, 100), True, 1e-6),
        ("wide rows", (2, 4099), False, 1e-5),
    ]:
        inputs = {"x": normal(rng, *shape), "weight": rng.uniform(0.5, 1.5, shape[-1])}
        seeds = [normal(rng, *shape)]
        if residual:
            inputs["residual"] = normal(rng, *shape)
            seeds.append(normal(rng, *shape))
        out.append(Case(label, inputs, functools.partial(rms_norm, eps=eps),
                        _RmsNorm(eps, CPU, residual).reference, ("y", "h") if residual else ("y",),
                        {"eps": eps}, tuple(inputs), tuple(seeds)))
    return out


DEFINITIONS = [OpDef(
    "rms_norm", "fused", "RMSNorm, optionally fused with the residual add",
    ("x", "weight", "residual?"), ("y", "inv_rms", "h?"), FLOATS,
    {"float32": (1e-4, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)}, _cases,
    attrs=(Attr("eps", "added to mean(h^2) before the square root"),), grad="rms_norm_grad")]
