"""embedding (rows of a table by id) and its grad, the scatter-add (a base op of its own)."""

from __future__ import annotations

import numpy as np

from ...conformance.case import base_case, values
from ...dtypes import FLOATS
from ..base import ELEMENTWISE_TOL, SUM_TOL
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
embedding:       ids int64[...], weight[V, C] -> out[..., C]; attrs: padding_idx (-1: none);
                 rows of padding_idx are 0; an id outside [0, V) is an error.
embedding_grad:  ids int64[...], dout[..., C] -> dweight[V, C]: the scatter-add of dout's
                 rows by id, 0 where no id, nothing for padding_idx; attrs: padding_idx
"""


def _embedding_shape(shapes, attrs, out_shape):
    ids, weight = shapes
    if len(weight) != 2:
        raise ValueError(f"weight must be 2-D [V, C], got {list(weight)}")
    return [tuple(ids) + (weight[1],)]


def _embedding_grad_shape(shapes, attrs, out_shape):
    ids, dout = shapes
    if out_shape is None or len(out_shape) != 2:
        raise ValueError("out_shape must be the weight's shape [V, C]")
    if tuple(dout) != tuple(ids) + (out_shape[1],):
        raise ValueError(f"dout must have shape {list(ids) + [out_shape[1]]}, got {list(dout)}")
    return [tuple(out_shape)]


def _embedding(x, a, out_dtype, out_shape):
    ids, weight = x
    pad = int(a[0])
    out = weight[ids].astype(weight.dtype)
    if pad >= 0:
        out[ids == pad] = 0
    return [out]


def _embedding_grad(x, a, out_dtype, out_shape):
    ids, dout = x
    pad = int(a[0])
    dweight = np.zeros(tuple(out_shape), np.float64)
    flat_ids = ids.reshape(-1)
    rows = dout.reshape(len(flat_ids), -1).astype(np.float64)
    keep = flat_ids != pad
    np.add.at(dweight, flat_ids[keep], rows[keep])
    return [dweight.astype(dout.dtype)]


def _cases(op, dtype, rng):
    ids = rng.integers(0, 11, (3, 7)).astype(np.int64)
    if op.name == "embedding":
        return [base_case(op, f"padding_idx {p}", {"ids": ids, "weight": values(rng, (11, 19), dtype)}, [p])
                for p in (-1, 2)]
    return [base_case(op, "repeated ids", {"ids": ids, "dout": values(rng, (3, 7, 19), dtype)}, [2],
                      out_shape=[11, 19])]


DEFINITIONS = [
    OpDef("embedding", "embedding", "rows of weight by id; padding_idx rows are 0", ("ids", "weight"), ("out",),
          FLOATS, ELEMENTWISE_TOL, _cases,
          attrs=(Attr("padding_idx", "an id whose rows are zero; -1: none"),), grad="embedding_grad",
          reference_fn=_embedding, shape=_embedding_shape, input_dtypes=("int64", "="), paddle=("embedding",)),
    OpDef("embedding_grad", "embedding",
          "scatter-add of dout's rows by id (zeros where no id; none for padding_idx); out_shape = weight's",
          ("ids", "dout"), ("dweight",), FLOATS, SUM_TOL, _cases,
          attrs=(Attr("padding_idx", "as the forward"),), reference_fn=_embedding_grad, shape=_embedding_grad_shape,
          input_dtypes=("int64", "="), paddle=("embedding_grad", "gather_grad", "index_select_grad")),
]
