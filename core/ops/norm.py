"""RMSNorm, optionally fused with the residual add that precedes it in a transformer block."""

from __future__ import annotations

import math

from . import checks
from .dispatch import OpImpl, attrs, dtype_name, empty, launch, paddle, run

OP = "rms_norm"


class _RmsNorm(OpImpl):
    name = OP

    def __init__(self, eps: float, device, has_residual: bool):
        self.eps, self.device, self.has_residual = eps, device, has_residual

    def forward(self, kernel, x, weight, residual=None):
        y = empty(x.shape, dtype_name(x), self.device)
        inv_rms = empty([math.prod(x.shape[:-1])], "float32", self.device)
        inputs, outputs = [x, weight], [y, inv_rms]
        if residual is not None:
            h = empty(x.shape, dtype_name(x), self.device)
            inputs.append(residual)
            outputs.append(h)
        launch(kernel, OP, self.device, inputs, outputs, attrs(OP, eps=self.eps))
        if residual is None:
            return y, (x, weight, inv_rms), []
        return (y, h), (h, weight, inv_rms), []

    def backward(self, kernel, saved, grads):
        h, weight, inv_rms = saved
        dy = grads[0]
        dh_extra = grads[1] if self.has_residual else None
        if dy is None:
            dy = paddle().zeros_like(h)
        dh = empty(h.shape, dtype_name(h), self.device)
        dweight = empty(weight.shape, dtype_name(weight), self.device)
        inputs = [dy.contiguous(), h, weight, inv_rms] + ([dh_extra.contiguous()] if dh_extra is not None else [])
        launch(kernel, OP + "_grad", self.device, inputs, [dh, dweight])
        if self.has_residual:
            return dh, dweight, dh
        return dh, dweight

    def reference(self, x, weight, residual=None):
        pd = paddle()
        h = x if residual is None else x + residual
        hf = h.astype("float32")
        inv = pd.rsqrt((hf * hf).mean(axis=-1, keepdim=True) + self.eps)
        y = (hf * inv * weight.astype("float32")).astype(x.dtype)
        return y if residual is None else (y, h)


def rms_norm(x, weight, eps: float = 1e-6, residual=None):
    """RMSNorm over the last dim: ``x / sqrt(mean(x^2) + eps) * weight``.

    With ``residual``, first adds it (the residual stream of a transformer block) and returns
    ``(y, h)`` where ``h = x + residual`` is the new residual stream; one pass over memory.
    Float32, bfloat16 or float16; statistics in float32.
    """
    x = checks.tensor(OP, "x", x)
    weight = checks.tensor(OP, "weight", weight)
    residual = checks.tensor(OP, "residual", residual, optional=True)
    checks.dtype(OP, "x", x, checks.FLOAT_DTYPES)
    checks.same_dtype(OP, "x", x, weight=weight, residual=residual)
    if len(x.shape) == 0:
        raise checks.OpArgumentError(f"{OP}: x must have at least 1 dim, got a scalar")
    checks.shape(OP, "weight", weight, [x.shape[-1]], "x's last dim")
    if residual is not None:
        checks.shape(OP, "residual", residual, x.shape, "x's shape")
    if not eps > 0:
        raise checks.OpArgumentError(f"{OP}: eps must be > 0, got {eps}")
    device = checks.same_device(OP, x=x, weight=weight, residual=residual)
    x, weight, residual = (checks.contiguous(OP, n, t, device) for n, t in
                           (("x", x), ("weight", weight), ("residual", residual)))
    tensors = (x, weight) if residual is None else (x, weight, residual)
    out = run(_RmsNorm(float(eps), device, residual is not None), device, dtype_name(x), *tensors)
    return out if residual is None else (out[0], out[1])
