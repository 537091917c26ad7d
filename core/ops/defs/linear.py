"""linear: float y = x W^T + b, with dx/dW/dbias kernels and optional bfloat16 products."""

from __future__ import annotations

import functools

import numpy as np

from ...conformance.case import CPU, Case, normal
from ...dtypes import FLOATS
from ..definition import Attr, OpDef
from ..linear import _Linear, linear

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
linear:          x[..., K], weight[N, K], bias[N]? -> y[..., N]; attrs: compute.
                 y = x W^T + bias. compute (an AnychipDtype; absent: the tensors' dtype) is
                 the dtype of the products: the tensors' dtype, or bfloat16 for float32
                 tensors (mixed precision: x, weight and dy are rounded to bfloat16, nearest
                 even, for the products only; sums and every output stay float32).
linear_grad:     dy[..., N], x[..., K], weight[N, K] -> dx[..., K], dweight[N, K], dbias[N]?
                 (dbias only where bias needs a gradient); attrs: needs_dx, needs_dweight
                 (absent: 1), compute (as linear). dx = dy W, dweight = dy^T x and dbias =
                 the sum of dy (unrounded), both over all rows. An output whose flag is 0 is
                 not written: the caller may pass a tensor with no elements in its place.
"""


def _cases(op, dtype, rng):
    out = []
    shapes = [
        ("1 x 1", (1,), 1, 1, False, ("x", "weight"), None),
        ("3-d x, prime sizes, bias", (2, 7), 45, 19, True, ("x", "weight", "bias"), None),
        ("K=129, N=67, bias", (5,), 129, 67, True, ("x", "weight", "bias"), None),
        ("130 x 97 x 300: past a block in every dim", (130,), 300, 97, True, ("x", "weight", "bias"), None),
        ("frozen weight and bias (LoRA base): only dx", (4,), 64, 33, True, ("x",), None),
    ]
    if dtype == "float32":
        # forward only: the kernel also rounds dy to bfloat16 for its products, the reference's
        # autograd does not, so the gradients differ by design
        shapes.append(("mixed precision, products in bfloat16", (3,), 80, 24, True, (), "bfloat16"))
    for label, lead, k, n, bias, grads, compute in shapes:
        inputs = {"x": normal(rng, *lead, k), "weight": normal(rng, n, k, scale=1 / np.sqrt(k))}
        if bias:
            inputs["bias"] = normal(rng, n)
        attrs = {"compute_dtype": compute} if compute else {}
        out.append(Case(label, inputs, functools.partial(linear, compute_dtype=compute),
                        _Linear(CPU, bias, compute or "float32").reference, ("y",), attrs, grads,
                        (normal(rng, *lead, n),) if grads else ()))
    return out


_COMPUTE = Attr("compute", "the products' dtype (an AnychipDtype); absent: the tensors' dtype", optional=True)
DEFINITIONS = [OpDef(
    "linear", "fused", "float linear y = x W^T + b, fwd+bwd", ("x", "weight", "bias?"), ("y",), FLOATS,
    {"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 5e-2), "float16": (4e-3, 4e-3)}, _cases, attrs=(_COMPUTE,),
    grad="linear_grad",
    grad_attrs=(Attr("needs_dx", "0: dx is not written", default=1.0),
                Attr("needs_dweight", "0: dweight is not written", default=1.0), _COMPUTE))]
