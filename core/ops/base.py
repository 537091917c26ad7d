"""The base operator set's shared rules: the shape rules, numpy references and tolerances its
definitions (``anychip/ops/defs/``: unary, binary, ..., matmul) are made of.

The base ops are the kernels a chip provides so that Paddle models run on it with no CPU
fallback: a plugin registers a C kernel (``anychip/kernel.h``, section "Base ops") under each
op's name for the dtypes it supports, and anychip's callers (the Paddle kernel bridge,
``anychip.ops.base_call``, the conformance kit) launch it with the inputs, outputs and attrs its
definition declares. Rules shared by every base op (kernel.h states them too):

- "float" is float32, bfloat16 or float16; kernels compute in float32 whatever the storage.
- attrs are doubles; flags are 0.0 or 1.0.
- Elementwise ops (categories unary, binary, compare, where, cast, fill, copy): the caller
  broadcasts. Every input descriptor has the OUTPUT's rank and shape, with stride 0 on the
  dimensions it broadcasts along, and any other strides (inputs may be strided views). Rank 0 is
  allowed, and so are empty tensors. Outputs are dense, except ``copy``'s, which may be a strided
  view into a larger tensor (only the addressed elements are written).
- Other ops take dense (row-major) inputs, except ``sum``/``mean``/``max`` (any strides) and
  ``matmul``/``matmul_grad`` (any strides; x's and y's batch dims carry the output's batch rank with
  stride 0 where they broadcast).
- The dtype a kernel is registered for is that of the tensor named by ``OpDef.dtype_of``: an input
  for most ops (the first float one), the output for ``fill`` and ``arange``, the INPUT for ``cast``.
- Results must not depend on the number of threads.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import INTS

# (rtol, atol) of a kernel against the float64 reference, per storage dtype: one rounding of the
# output for elementwise math; float32 sums in a different order for reductions and products.
EXACT = {d: (0.0, 0.0) for d in INTS + ("bool",)}
ELEMENTWISE_TOL = {"float32": (1e-5, 1e-6), "bfloat16": (1e-2, 1e-2), "float16": (1e-3, 1e-3)} | EXACT
SUM_TOL = {"float32": (1e-4, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)} | EXACT


# ---- shape rules --------------------------------------------------------------------------------

def broadcast_shape(*shapes) -> tuple[int, ...]:
    """numpy's (and Paddle's, axis=-1) broadcasting rule; ValueError naming the shapes otherwise."""
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ValueError(f"shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast") from None


def broadcast(shapes, attrs, out_shape):
    """Shape rule: the inputs' broadcast shape."""
    return [broadcast_shape(*shapes)]


def same(shapes, attrs, out_shape):
    """Shape rule: the first input's shape."""
    return [shapes[0]]


def given(shapes, attrs, out_shape):
    """Shape rule: the caller's ``out_shape`` (ops without inputs)."""
    if out_shape is None:
        raise ValueError("out_shape is required (the op has no input to take it from)")
    return [tuple(out_shape)]


def reduction_axes(attrs, rank: int) -> tuple[int, ...]:
    """The reduced axes of a sum/mean/max call, from attrs [keepdim, n, axis_0 .. axis_{n-1}]."""
    n = int(attrs[1]) if len(attrs) > 1 else 0
    if len(attrs) != 2 + n:
        raise ValueError(f"attrs must be [keepdim, n, n axes], got {list(attrs)}")
    axes = tuple(int(a) for a in attrs[2:])
    if not axes:
        return tuple(range(rank))
    if list(axes) != sorted(set(axes)) or any(a < 0 or a >= rank for a in axes):
        raise ValueError(f"axes must be sorted, distinct and in [0, {rank}), got {list(axes)}")
    return axes


def reduction_attrs(axes, rank: int, keepdim: bool) -> list[float]:
    """attrs for sum/mean/max over ``axes`` (ints, negative allowed; None or () for all)."""
    if axes is None or (not isinstance(axes, int) and len(axes) == 0):
        normalised = []
    else:
        listed = [axes] if isinstance(axes, int) else list(axes)
        bad = [a for a in listed if not -max(rank, 1) <= a < max(rank, 1)]
        if bad:
            raise ValueError(f"axis {bad[0]} is out of range for rank {rank}")
        normalised = sorted({a % rank for a in listed}) if rank else []
    return [float(keepdim), float(len(normalised)), *map(float, normalised)]


def axis_of(attrs, rank: int) -> int:
    """attrs[0] as an axis of a rank-``rank`` tensor, negative counting from the end."""
    axis = int(attrs[0])
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


# ---- references ---------------------------------------------------------------------------------

def np_dtype(dtype: str):
    """The numpy dtype holding ``dtype``'s values (bfloat16 as float32)."""
    return np.dtype("float32" if dtype == "bfloat16" else dtype)


def unary_reference(fn):
    """The reference of a float op ``fn(x, attrs)``, computed in float64."""
    def ref(x, a, out_dtype, out_shape):
        with np.errstate(all="ignore"):
            return [np.asarray(fn(x[0].astype(np.float64), a)).astype(x[0].dtype)]
    return ref


def binary_reference(fn, out=None):
    """The reference of ``fn(x, y)``: float64 for floats, exact for integers; the result in x's
    dtype, or ``out``."""
    def ref(x, a, out_dtype, out_shape):
        with np.errstate(all="ignore"):
            cast = (lambda v: v.astype(np.float64)) if x[0].dtype.kind == "f" else (lambda v: v)
            r = np.asarray(fn(cast(x[0]), cast(x[1])))
        return [r.astype(out or x[0].dtype)]
    return ref


