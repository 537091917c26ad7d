"""The float linear layer ``y = x @ weight^T + bias``, forward and backward, for training.

weight is [N, K] (out_features, in_features), the layout of the kernels (anychip/kernel.h,
linear) and of torch; Paddle's ``nn.Linear`` stores the transpose, [K, N].

Mixed precision (float32 tensors, ``compute_dtype="bfloat16"``) happens inside the kernels: they
round x, dy and weight to bfloat16 as they pack them for the products, with no cast passes over
memory, and write float32 results.
"""

from __future__ import annotations

from . import checks
from ..dtypes import DTYPE_BITS
from .dispatch import OpImpl, attrs, dtype_name, empty, launch, paddle, run

OP = "linear"
# compute dtypes other than the tensors' own, by tensor dtype
MIXED = {"float32": ("bfloat16",)}


class _Linear(OpImpl):
    """Its tensors: x, weight, then bias where the call has one; ``compute`` the products' dtype."""

    name = OP

    def __init__(self, device, has_bias: bool, compute: str):
        self.device, self.has_bias, self.compute = device, has_bias, compute
        self.needs = (True, True, has_bias)

    def forward(self, kernel, x, weight, bias=None):
        # Which inputs want gradients is known here, not in backward: a frozen weight (LoRA) must
        # not cost its dW product, the largest of the three.
        self.needs = (not x.stop_gradient, not weight.stop_gradient, bias is not None and not bias.stop_gradient)
        y = empty(list(x.shape[:-1]) + [weight.shape[0]], dtype_name(x), self.device)
        launch(kernel, OP, self.device, [x, weight] + ([bias] if bias is not None else []), [y],
               attrs(OP, compute=DTYPE_BITS[self.compute]))
        return y, (x, weight), []

    def backward(self, kernel, saved, grads):
        x, weight = saved
        dy = grads[0].contiguous()
        dtype = dtype_name(x)
        need_dx, need_dw, need_db = self.needs
        # kernel.h: an output whose flag is 0 is not written, so it may have no elements
        dx = empty(x.shape if need_dx else [0], dtype, self.device)
        dw = empty(weight.shape if need_dw else [0], dtype, self.device)
        outputs = [dx, dw] + ([empty([weight.shape[0]], dtype, self.device)] if need_db else [])
        launch(kernel, OP + "_grad", self.device, [dy, x, weight], outputs,
               attrs(OP, grad=True, needs_dx=need_dx, needs_dweight=need_dw, compute=DTYPE_BITS[self.compute]))
        result = (dx if need_dx else None, dw if need_dw else None)
        return result + ((outputs[2] if need_db else None,) if self.has_bias else ())

    def reference(self, x, weight, bias=None):
        """In float32 whatever the dtype (Paddle's CPU wheel has no bfloat16 matmul), on x and
        weight rounded to the compute dtype."""
        dtype = x.dtype
        if self.compute != dtype_name(x):
            x, weight = x.astype(self.compute), weight.astype(self.compute)
        y = paddle().matmul(x.astype("float32"), weight.astype("float32"), transpose_y=True)
        if bias is not None:
            y = y + bias.astype("float32")
        return y.astype(dtype)


def linear(x, weight, bias=None, compute_dtype=None):
    """``x @ weight^T + bias``: x [..., K], weight [N, K] (out_features, in_features), bias [N] or
    None, all of one float dtype -> [..., N]. Differentiable with respect to all three; the backward
    computes only the gradients that are needed (a frozen weight costs no dW). Sums in float32.

    ``compute_dtype``: the dtype of the products. None or the tensors' dtype: that dtype;
    "bfloat16" with float32 tensors: mixed precision, x, weight and (backward) dy rounded to
    bfloat16 for the products (AMX where the CPU has it), y, dx, dweight and dbias float32."""
    x = checks.tensor(OP, "x", x)
    weight = checks.tensor(OP, "weight", weight)
    bias = checks.tensor(OP, "bias", bias, optional=True)
    checks.dtype(OP, "x", x, checks.FLOAT_DTYPES)
    if len(x.shape) == 0:
        raise checks.OpArgumentError(f"{OP}: x must be [..., K], got a scalar")
    checks.rank(OP, "weight", weight, 2, "[N, K] (out_features, in_features)")
    checks.same_dtype(OP, "x", x, weight=weight, bias=bias)
    dtype = dtype_name(x)
    compute = dtype if compute_dtype is None else compute_dtype
    if compute != dtype and compute not in MIXED.get(dtype, ()):
        allowed = " or ".join(repr(c) for c in (None, dtype) + MIXED.get(dtype, ()))
        raise checks.OpArgumentError(f"{OP}: compute_dtype must be {allowed} for {dtype} tensors, "
                                     f"got {compute_dtype!r}")
    k, n = x.shape[-1], weight.shape[0]
    checks.shape(OP, "weight", weight, [n, k], f"[N, K] with K = {k}, x's last dim")
    if bias is not None:
        checks.shape(OP, "bias", bias, [n], "[N], one per output feature")
    device = checks.same_device(OP, x=x, weight=weight, bias=bias)
    x, weight = checks.contiguous(OP, "x", x, device), checks.contiguous(OP, "weight", weight, device)
    bias = checks.contiguous(OP, "bias", bias, device)
    tensors = (x, weight) + ((bias,) if bias is not None else ())
    return run(_Linear(device, bias is not None, compute), device, dtype, *tensors)
