"""The base operator set: the kernels a chip provides so that Paddle models run on it with no
CPU fallback. This is the vendor's contract, written down: a plugin registers a C kernel
(``anychip/kernel.h``, section "Base ops") under each op's name for the dtypes it supports, and
anychip's callers (the Paddle kernel bridge, ``anychip.ops.base_call``, the conformance kit)
launch it with the inputs, outputs and attrs declared here.

Rules shared by every op (kernel.h states them too):

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
- The dtype a kernel is registered for is that of the tensor named by ``BaseOp.dtype_of``: an input
  for most ops (the first float one), the output for ``fill`` and ``arange``, the INPUT for ``cast``.
- Results must not depend on the number of threads.

Each declaration gives the op's signature, attrs, dtypes, grad op (a separate kernel name), the
shape rule (:meth:`BaseOp.output_shapes`), the numpy reference (float math in float64, then cast to
the output dtype) and the tolerance a kernel is held to per dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..dtypes import BASE as ALL, CASTABLE, FLOATS, INTS
INDEXED = FLOATS + INTS + ("int8",)  # what index_select gathers

CATEGORIES = ("unary", "binary", "compare", "where", "cast", "fill", "copy", "reduction", "softmax", "loss",
              "embedding", "index", "arange", "matmul")
ELEMENTWISE = ("unary", "binary", "compare", "where", "cast", "fill", "copy")

# (rtol, atol) of a kernel against the float64 reference, per storage dtype: one rounding of the
# output for elementwise math; float32 sums in a different order for reductions and products.
_EXACT = {d: (0.0, 0.0) for d in INTS + ("bool",)}
_ELEMENTWISE_TOL = {"float32": (1e-5, 1e-6), "bfloat16": (1e-2, 1e-2), "float16": (1e-3, 1e-3)} | _EXACT
_SUM_TOL = {"float32": (1e-4, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)} | _EXACT


@dataclass(frozen=True)
class BaseOp:
    """One base op. ``inputs``/``outputs`` are names in call order; ``input_dtypes`` says per input
    what dtype it must have: "=" (the kernel's dtype), a dtype name, or "any" (cast); ``output_dtypes``
    per output: "=" , a dtype name, or "given" (the caller chooses: cast's target, fill, arange).
    ``attrs``: (name, meaning) in order. ``dtype_of``: the tensor whose dtype keys the kernel."""

    name: str
    category: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, str], ...]
    dtypes: tuple[str, ...]
    summary: str
    _reference: Callable = field(repr=False)
    _shape: Callable = field(repr=False)
    tolerance: dict = field(default_factory=lambda: dict(_ELEMENTWISE_TOL))
    grad: str | None = None  # the name of the op computing this op's input gradients
    input_dtypes: tuple[str, ...] = ()
    output_dtypes: tuple[str, ...] = ()
    dtype_of: str = ""

    def __post_init__(self):
        if self.category not in CATEGORIES:
            raise ValueError(f"{self.name}: category must be one of {CATEGORIES}, got {self.category!r}")
        if not self.input_dtypes:
            object.__setattr__(self, "input_dtypes", ("=",) * len(self.inputs))
        if not self.output_dtypes:
            object.__setattr__(self, "output_dtypes", ("=",) * len(self.outputs))
        if not self.dtype_of:
            keyed = [n for n, d in zip(self.inputs, self.input_dtypes) if d in ("=", "any")]
            object.__setattr__(self, "dtype_of", keyed[0] if keyed else self.outputs[0])

    @property
    def elementwise(self) -> bool:
        return self.category in ELEMENTWISE

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.attrs)

    def output_shapes(self, input_shapes, attrs=(), out_shape=None) -> list[tuple[int, ...]]:
        """The outputs' shapes for inputs of ``input_shapes`` (un-broadcast, as the user holds them)
        and ``attrs``; ``out_shape`` is required by the ops without inputs (fill, arange)."""
        if len(input_shapes) != len(self.inputs):
            raise ValueError(f"{self.name}: expected {len(self.inputs)} input shape(s) "
                             f"({', '.join(self.inputs)}), got {len(input_shapes)}")
        return [tuple(int(d) for d in s) for s in self._shape([tuple(s) for s in input_shapes], list(attrs),
                                                                out_shape)]

    def resolve_output_dtypes(self, dtype: str, out_dtype: str | None = None) -> list[str]:
        """The outputs' dtypes for a call whose kernel dtype is ``dtype``."""
        out = []
        for spec in self.output_dtypes:
            if spec == "given":
                if out_dtype is None:
                    raise ValueError(f"{self.name}: out_dtype is required (the output's dtype is the caller's choice)")
                out.append(out_dtype)
            else:
                out.append(dtype if spec == "=" else spec)
        return out

    def reference(self, inputs, attrs=(), out_dtype=None, out_shape=None) -> list[np.ndarray]:
        """The op on numpy arrays (bfloat16 values held as float32): float math in float64, results
        cast to the output dtype (float32 for bfloat16). ``out_dtype``/``out_shape``: as for
        :meth:`output_shapes` and :meth:`resolve_output_dtypes`, for cast, fill and arange."""
        return list(self._reference([np.asarray(a) for a in inputs], [float(a) for a in attrs], out_dtype,
                                    out_shape))


# ---- shape rules --------------------------------------------------------------------------------

def broadcast_shape(*shapes) -> tuple[int, ...]:
    """numpy's (and Paddle's, axis=-1) broadcasting rule; ValueError naming the shapes otherwise."""
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ValueError(f"shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast") from None


def _broadcast(shapes, attrs, out_shape):
    return [broadcast_shape(*shapes)]


def _same(shapes, attrs, out_shape):
    return [shapes[0]]


def _given(shapes, attrs, out_shape):
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


def _reduction_shape(shapes, attrs, out_shape):
    shape = shapes[0]
    axes = reduction_axes(attrs, len(shape))
    keepdim = bool(attrs[0])
    return [tuple(1 if i in axes else d for i, d in enumerate(shape)) if keepdim
            else tuple(d for i, d in enumerate(shape) if i not in axes)]


def _axis(attrs, rank: int) -> int:
    axis = int(attrs[0])
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _softmax_shape(shapes, attrs, out_shape):
    _axis(attrs, len(shapes[0]))
    return [shapes[0]]


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


def _index_select_shape(shapes, attrs, out_shape):
    x, index = shapes
    if len(index) != 1:
        raise ValueError(f"index must be 1-D, got {list(index)}")
    axis = _axis(attrs, len(x))
    return [tuple(x[:axis]) + (index[0],) + tuple(x[axis + 1:])]


def _matmul_dims(x, y, tx, ty):
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"x and y must be at least 2-D, got {list(x)} and {list(y)}")
    m, k = (x[-1], x[-2]) if tx else (x[-2], x[-1])
    k2, n = (y[-1], y[-2]) if ty else (y[-2], y[-1])
    if k != k2:
        raise ValueError(f"x {list(x)} and y {list(y)} (transpose_x={bool(tx)}, transpose_y={bool(ty)}) have "
                         f"contraction sizes {k} and {k2}")
    return broadcast_shape(x[:-2], y[:-2]), m, n


def _matmul_shape(shapes, attrs, out_shape):
    batch, m, n = _matmul_dims(shapes[0], shapes[1], attrs[0], attrs[1])
    return [batch + (m, n)]


def _matmul_grad_shape(shapes, attrs, out_shape):
    x, y, dout = shapes
    want = _matmul_shape([x, y], attrs, None)[0]
    if tuple(dout) != want:
        raise ValueError(f"dout must have the output's shape {list(want)}, got {list(dout)}")
    return [x, y]


# ---- references ---------------------------------------------------------------------------------

def _np_dtype(dtype: str):
    """The numpy dtype holding ``dtype``'s values (bfloat16 as float32)."""
    return np.dtype("float32" if dtype == "bfloat16" else dtype)


def _float_out(like: np.ndarray):
    return like.dtype if like.dtype.kind == "f" else np.dtype("float64")


def _unary(fn):
    def ref(x, a, out_dtype, out_shape):
        with np.errstate(all="ignore"):
            return [np.asarray(fn(x[0].astype(np.float64), a)).astype(x[0].dtype)]
    return ref


def _binary(fn, out=None):
    def ref(x, a, out_dtype, out_shape):
        with np.errstate(all="ignore"):
            cast = (lambda v: v.astype(np.float64)) if x[0].dtype.kind == "f" else (lambda v: v)
            r = np.asarray(fn(cast(x[0]), cast(x[1])))
        return [r.astype(out or x[0].dtype)]
    return ref


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _scale(v, a):
    scale, bias, after = a[0], a[1], a[2] if len(a) > 2 else 1.0
    return scale * v + bias if after else scale * (v + bias)


def _where(x, a, out_dtype, out_shape):
    return [np.where(x[0].astype(bool), x[1], x[2]).astype(x[1].dtype)]


def _cast(x, a, out_dtype, out_shape):
    src = x[0]
    target = _np_dtype(out_dtype)
    if target.kind in "iu" and src.dtype.kind == "f":  # toward zero, saturating, NaN -> 0 (kernel.h)
        info = np.iinfo(target)
        with np.errstate(all="ignore"):
            t = np.clip(np.nan_to_num(np.trunc(src.astype(np.float64)), nan=0.0), info.min, info.max)
            return [t.astype(target)]
    if target.kind == "b":
        return [src != 0]
    return [src.astype(target)]


def _fill(x, a, out_dtype, out_shape):
    target = _np_dtype(out_dtype)
    value = a[0]
    if target.kind == "b":
        value = value != 0
    elif target.kind in "iu":
        value = math.trunc(value)
    return [np.full(tuple(out_shape), value, dtype=target)]


def _copy(x, a, out_dtype, out_shape):
    return [x[0].copy()]


def _reduce(kind):
    def ref(x, a, out_dtype, out_shape):
        v = x[0]
        axes = reduction_axes(a, v.ndim)
        keepdim = bool(a[0])
        w = v.astype(np.float64)
        with np.errstate(all="ignore"):
            if kind == "max":
                r = w.max(axis=axes, keepdims=keepdim, initial=-np.inf)
            else:
                r = w.sum(axis=axes, keepdims=keepdim)
                if kind == "mean":  # 0 / 0: NaN for an empty reduction
                    r = r / np.float64(math.prod(v.shape[i] for i in axes))
        return [np.asarray(r).astype(v.dtype)]
    return ref


def _softmax64(v, axis):
    w = v.astype(np.float64)
    e = np.exp(w - w.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _softmax(x, a, out_dtype, out_shape):
    v = x[0]
    if v.size == 0:
        return [v.copy()]
    return [_softmax64(v, _axis(a, v.ndim)).astype(v.dtype)]


def _softmax_grad(x, a, out_dtype, out_shape):
    out, dout = (t.astype(np.float64) for t in x)
    axis = _axis(a, x[0].ndim)
    return [(out * (dout - (dout * out).sum(axis=axis, keepdims=True))).astype(x[0].dtype)]


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


def _index_select(x, a, out_dtype, out_shape):
    v, index = x
    return [np.take(v, index, axis=_axis(a, v.ndim))]


def _arange(x, a, out_dtype, out_shape):
    (n,) = out_shape
    values = a[0] + np.arange(n, dtype=np.float64) * a[1]
    target = _np_dtype(out_dtype)
    return [np.trunc(values).astype(target) if target.kind in "iu" else values.astype(target)]


def _operands(x, y, tx, ty):
    a = np.swapaxes(x, -1, -2) if tx else x
    b = np.swapaxes(y, -1, -2) if ty else y
    return a.astype(np.float64), b.astype(np.float64)


def _matmul(x, a, out_dtype, out_shape):
    xa, yb = _operands(x[0], x[1], a[0], a[1])
    return [np.matmul(xa, yb).astype(x[0].dtype)]


def _unbroadcast(grad, shape):
    """``grad`` summed over the dims that broadcasting added to or stretched in ``shape``."""
    lead = grad.ndim - len(shape)
    g = grad.sum(axis=tuple(range(lead))) if lead else grad
    stretched = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    return g.sum(axis=stretched, keepdims=True) if stretched else g


def _matmul_grad(x, a, out_dtype, out_shape):
    xv, yv, dout = x
    tx, ty = bool(a[0]), bool(a[1])
    xa, yb = _operands(xv, yv, tx, ty)
    d = dout.astype(np.float64)
    da = np.matmul(d, np.swapaxes(yb, -1, -2))
    db = np.matmul(np.swapaxes(xa, -1, -2), d)
    dx = np.swapaxes(da, -1, -2) if tx else da
    dy = np.swapaxes(db, -1, -2) if ty else db
    return [_unbroadcast(dx, xv.shape).astype(xv.dtype), _unbroadcast(dy, yv.shape).astype(yv.dtype)]


# ---- the declarations ---------------------------------------------------------------------------

def _op(name, category, inputs, outputs, summary, reference, shape, dtypes=FLOATS, attrs=(), **kw):
    return BaseOp(name, category, tuple(inputs), tuple(outputs), tuple(attrs), tuple(dtypes), summary,
                  reference, shape, **kw)


_UNARY = {
    "exp": ("e^x", lambda v, a: np.exp(v)),
    "log": ("natural log", lambda v, a: np.log(v)),
    "sqrt": ("square root", lambda v, a: np.sqrt(v)),
    "rsqrt": ("1 / sqrt(x)", lambda v, a: 1.0 / np.sqrt(v)),
    "silu": ("x * sigmoid(x)", lambda v, a: v * _sigmoid(v)),
    "sigmoid": ("1 / (1 + e^-x)", lambda v, a: _sigmoid(v)),
    "tanh": ("hyperbolic tangent", lambda v, a: np.tanh(v)),
    "abs": ("|x|", lambda v, a: np.abs(v)),
    "neg": ("-x", lambda v, a: -v),
    "sin": ("sine (radians)", lambda v, a: np.sin(v)),
    "cos": ("cosine (radians)", lambda v, a: np.cos(v)),
    "scale": ("scale*x + bias (bias_after_scale) or scale*(x + bias)", _scale),
    "pow": ("x^factor", lambda v, a: np.power(v, a[0])),
}
_UNARY_ATTRS = {
    "scale": (("scale", "the factor"), ("bias", "the offset"),
              ("bias_after_scale", "1: scale*x + bias, 0: scale*(x + bias)")),
    "pow": (("factor", "the exponent"),),
}
_BINARY = {
    "add": ("x + y", np.add), "subtract": ("x - y", np.subtract), "multiply": ("x * y", np.multiply),
    "divide": ("x / y", np.divide), "maximum": ("max(x, y) (NaN propagates)", np.maximum),
    "minimum": ("min(x, y) (NaN propagates)", np.minimum), "elementwise_pow": ("x^y", np.power),
}
# binary ops with an integer form too (exact, wrapping): index arithmetic, and Paddle's own
# cross_entropy multiplies its int64 labels by a mask
_INTEGER_BINARY = ("add", "subtract", "multiply", "maximum", "minimum")
_COMPARE = {
    "equal": np.equal, "not_equal": np.not_equal, "less_than": np.less, "less_equal": np.less_equal,
    "greater_than": np.greater, "greater_equal": np.greater_equal,
}
_REDUCTION_ATTRS = (("keepdim", "1: reduced dims kept with size 1"), ("n", "the number of axes; 0: all axes"),
                    ("axis_i", "n axes, >= 0, sorted and distinct"))

_DECLARATIONS = [
    *(_op(n, "unary", ["x"], ["out"], s, _unary(f), _same, attrs=_UNARY_ATTRS.get(n, ()))
      for n, (s, f) in _UNARY.items()),
    *(_op(n, "binary", ["x", "y"], ["out"], s, _binary(f), _broadcast,
          FLOATS + INTS if n in _INTEGER_BINARY else FLOATS) for n, (s, f) in _BINARY.items()),
    *(_op(n, "compare", ["x", "y"], ["out"], f"x {n.replace('_', ' ')} y, a bool", _binary(f, np.bool_), _broadcast,
          FLOATS + INTS, output_dtypes=("bool",), tolerance=dict(_EXACT, **{d: (0.0, 0.0) for d in FLOATS}))
      for n, f in _COMPARE.items()),
    _op("where", "where", ["condition", "x", "y"], ["out"], "x where condition else y", _where, _broadcast, ALL,
        input_dtypes=("bool", "=", "="), tolerance={d: (0.0, 0.0) for d in ALL}),
    _op("cast", "cast", ["x"], ["out"], "x converted to the output's dtype (float -> int truncates toward zero)",
        _cast, _same, CASTABLE, input_dtypes=("any",), output_dtypes=("given",),
        # keyed by the INPUT's dtype, while the error is the output's rounding (bfloat16: 2^-9)
        tolerance={d: (4e-3, 0.0) for d in CASTABLE}),
    _op("fill", "fill", [], ["out"], "every element = value (full, full_like, zeros, ones)", _fill, _given, ALL,
        attrs=(("value", "cast to the output's dtype"),), output_dtypes=("given",),
        tolerance={d: (0.0, 0.0) for d in ALL}),
    _op("copy", "copy", ["x"], ["out"], "out = x, both any strides (contiguous, transpose, slice, concat, split)",
        _copy, _same, ALL, tolerance={d: (0.0, 0.0) for d in ALL}),
    *(_op(n, "reduction", ["x"], ["out"], f"{n} over axes", _reduce(n), _reduction_shape, attrs=_REDUCTION_ATTRS,
          tolerance=_SUM_TOL if n != "max" else {d: (0.0, 0.0) for d in FLOATS})
      for n in ("sum", "mean", "max")),
    _op("softmax", "softmax", ["x"], ["out"], "softmax along an axis", _softmax, _softmax_shape,
        attrs=(("axis", "the softmax axis (negative counts from the end)"),), grad="softmax_grad", tolerance=_SUM_TOL),
    _op("softmax_grad", "softmax", ["out", "dout"], ["dx"], "dx = out * (dout - sum(dout * out, axis))",
        _softmax_grad, _softmax_shape, attrs=(("axis", "as softmax"),), tolerance=_SUM_TOL),
    _op("cross_entropy_with_softmax", "loss", ["logits", "label"], ["softmax", "loss"],
        "softmax of logits over the last axis and loss = logsumexp - logits[label] (0 at ignore_index)",
        _ce, _ce_shape, attrs=(("ignore_index", "a label value whose rows get loss 0"),),
        input_dtypes=("=", "int64"), grad="cross_entropy_with_softmax_grad", tolerance=_SUM_TOL),
    _op("cross_entropy_with_softmax_grad", "loss", ["label", "softmax", "dloss"], ["dlogits"],
        "dlogits = (softmax - onehot(label)) * dloss, 0 rows at ignore_index", _ce_grad, _ce_grad_shape,
        attrs=(("ignore_index", "as the forward"),), input_dtypes=("int64", "=", "="), tolerance=_SUM_TOL),
    _op("embedding", "embedding", ["ids", "weight"], ["out"], "rows of weight by id; padding_idx rows are 0",
        _embedding, _embedding_shape, attrs=(("padding_idx", "an id whose rows are zero; -1: none"),),
        input_dtypes=("int64", "="), grad="embedding_grad"),
    _op("embedding_grad", "embedding", ["ids", "dout"], ["dweight"],
        "scatter-add of dout's rows by id (zeros where no id; none for padding_idx); out_shape = weight's",
        _embedding_grad, _embedding_grad_shape, attrs=(("padding_idx", "as the forward"),),
        input_dtypes=("int64", "="), tolerance=_SUM_TOL),
    _op("index_select", "index", ["x", "index"], ["out"], "x's slices at index along axis (also gather)",
        _index_select, _index_select_shape, INDEXED, attrs=(("axis", "the indexed axis"),),
        input_dtypes=("=", "int64"), tolerance={d: (0.0, 0.0) for d in INDEXED}),
    _op("arange", "arange", [], ["out"], "out[i] = start + i * step; out_shape = [n]", _arange, _given,
        FLOATS + ("int64",), attrs=(("start", "the first value"), ("step", "the increment")),
        output_dtypes=("given",), tolerance=_ELEMENTWISE_TOL),
    _op("matmul", "matmul", ["x", "y"], ["out"], "batched x @ y with transposes and broadcast batch dims", _matmul,
        _matmul_shape, attrs=(("transpose_x", "x is [..., K, M]"), ("transpose_y", "y is [..., N, K]")),
        grad="matmul_grad", tolerance=_SUM_TOL),
    _op("matmul_grad", "matmul", ["x", "y", "dout"], ["dx", "dy"],
        "dx, dy of matmul, summed over the batch dims x and y broadcast along", _matmul_grad, _matmul_grad_shape,
        attrs=(("transpose_x", "as matmul"), ("transpose_y", "as matmul")), tolerance=_SUM_TOL),
]

BASE_OPS: dict[str, BaseOp] = {op.name: op for op in _DECLARATIONS}

GRAD_OPS = frozenset(op.grad for op in BASE_OPS.values() if op.grad)


def base_op(name: str) -> BaseOp:
    """The declaration of ``name``; ValueError listing the base ops otherwise."""
    try:
        return BASE_OPS[name]
    except KeyError:
        raise ValueError(f"op must be a base op ({', '.join(BASE_OPS)}), got {name!r}") from None
