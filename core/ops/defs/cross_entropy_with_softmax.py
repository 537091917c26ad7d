"""cross_entropy_with_softmax over the last axis, and its grad (a base op of its own)."""

from __future__ import annotations

import numpy as np

from ...conformance.case import base_case, values
from ...dtypes import FLOATS
from ..base import SUM_TOL
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
cross_entropy_with_softmax: logits[..., V], label int64[..., 1] -> softmax[..., V],
                 loss[..., 1]; attrs: ignore_index. loss = logsumexp(logits) - logits[label],
                 0 where label == ignore_index; any other label outside [0, V) is an error.
cross_entropy_with_softmax_grad: label int64[..., 1], softmax[..., V], dloss[..., 1]
                 -> dlogits = (softmax - onehot(label)) * dloss (0 rows at ignore_index)
"""


def _ce_shape(shapes, attrs, out_shape):
    logits, label = shapes
    if len(logits) < 1 or tuple(label) != tuple(logits[:-1]) + (1,):
        raise ValueError(f"label must have shape {list(logits[:-1]) + [1]} for logits {list(logits)}, got {list(label)}")
    return [logits, tuple(logits[:-1]) + (1,)]


def _ce_grad_shape(shapes, attrs, out_shape):
    label, softmax, dloss = shapes
    if tuple(label) != tuple(softmax[:-1]) + (1,) or tuple(dloss) != tuple(label):
        raise ValueError(f"label and dloss must have shape {list(softmax[:-1]) + [1]}, got {list(label)} and "
                         f"{list(dloss)}")
    return [softmax]


def _ce(x, a, out_dtype, out_shape):
    logits, label = x
    ignore = int(a[0])
    w = logits.astype(np.float64)
    mx = w.max(axis=-1, keepdims=True)
    lse = mx + np.log(np.exp(w - mx).sum(axis=-1, keepdims=True))
    valid = label != ignore
    picked = np.take_along_axis(w, np.where(valid, label, 0), axis=-1)
    loss = np.where(valid, lse - picked, 0.0)
    return [np.exp(w - lse).astype(logits.dtype), loss.astype(logits.dtype)]


def _ce_grad(x, a, out_dtype, out_shape):
    label, softmax, dloss = x
    ignore = int(a[0])
    valid = label != ignore
    onehot = np.zeros(softmax.shape)
    np.put_along_axis(onehot, np.where(valid, label, 0), 1.0, axis=-1)
    d = (softmax.astype(np.float64) - onehot) * dloss.astype(np.float64)
    return [np.where(valid, d, 0.0).astype(softmax.dtype)]


def _cases(op, dtype, rng):
    label = rng.integers(0, 29, (2, 3, 1)).astype(np.int64)
    label[0, 0, 0] = -100
    if op.name == "cross_entropy_with_softmax":
        return [base_case(op, "V 29, an ignored row", {"logits": values(rng, (2, 3, 29), dtype), "label": label},
                          [-100])]
    sm = np.exp(rng.standard_normal((2, 3, 29)))
    return [base_case(op, "V 29, an ignored row", {"label": label, "softmax": sm / sm.sum(-1, keepdims=True),
                                                   "dloss": values(rng, (2, 3, 1), dtype)}, [-100])]


_TOL = SUM_TOL
DEFINITIONS = [
    OpDef("cross_entropy_with_softmax", "loss",
          "softmax of logits over the last axis and loss = logsumexp - logits[label] (0 at ignore_index)",
          ("logits", "label"), ("softmax", "loss"), FLOATS, _TOL, _cases,
          attrs=(Attr("ignore_index", "a label value whose rows get loss 0"),),
          grad="cross_entropy_with_softmax_grad", reference_fn=_ce, shape=_ce_shape, input_dtypes=("=", "int64"),
          paddle=("cross_entropy_with_softmax",)),
    OpDef("cross_entropy_with_softmax_grad", "loss", "dlogits = (softmax - onehot(label)) * dloss, 0 rows at "
          "ignore_index", ("label", "softmax", "dloss"), ("dlogits",), FLOATS, _TOL, _cases,
          attrs=(Attr("ignore_index", "as the forward"),), reference_fn=_ce_grad, shape=_ce_grad_shape,
          input_dtypes=("int64", "=", "="), paddle=("cross_entropy_with_softmax_grad",)),
]
