"""Calling a device's base-op kernels from Python, without Paddle's op dispatch: what tests and the
conformance kit use to exercise them (Paddle itself reaches them through the kernel bridge).

    from anychip.ops import base_call
    (out,) = base_call.run("add", [x, y], [])                 # broadcasts like numpy
    (s,) = base_call.run("sum", [x], base.reduction_attrs((0, 2), x.ndim, keepdim=False))
    (z,) = base_call.run("fill", [], [0.0], out_dtype="bfloat16", out_shape=[4, 8], device="xpu:0")

``run`` checks the inputs against the op's declaration (its definition, :mod:`anychip.ops.defs`), computes the
output shapes with its shape rule, allocates the outputs on the inputs' device, describes the
inputs (stride 0 on broadcast dims for elementwise ops) and launches the registered kernel. A
device without one runs the numpy reference on the host instead: a counted fallback (an error
in strict mode, ANYCHIP_STRICT=1).
"""

from __future__ import annotations

import numpy as np

from .. import fallback
from ..frontends.paddle import place as _place
from ..plugins import registry
from ..dtypes import DTYPE_BITS
from . import checks
from .definition import OpDef
from .defs import base_op
from .checks import OpArgumentError
from .dispatch import device_label, dtype_name, empty, launch, paddle


def broadcast_descriptor(t, shape, index: int) -> tuple:
    """The launcher descriptor of ``t`` viewed with ``shape`` (numpy's right-aligned rule): the
    dims it lacks or has as 1 where ``shape`` does not get stride 0."""
    lead = len(shape) - len(t.shape)
    strides = [0] * lead + [0 if d == 1 and s != 1 else st
                            for d, s, st in zip(t.shape, shape[lead:], t.strides)]
    return (t.data_ptr(), DTYPE_BITS[dtype_name(t)], tuple(shape), tuple(strides), index)


def _device(op: str, inputs, device) -> tuple[str, int]:
    if inputs:
        return checks.same_device(op, **{f"inputs[{i}]": t for i, t in enumerate(inputs)})
    if device is None:
        raise OpArgumentError(f"{op}: device is required (the op has no input to take it from)")
    if isinstance(device, str):
        name, _, index = device.partition(":")
        return name, int(index or 0)
    return tuple(device)


def _kernel_dtype(decl: OpDef, inputs, out_dtype) -> str:
    if decl.dtype_of in decl.inputs:
        return dtype_name(inputs[decl.inputs.index(decl.dtype_of)])
    if out_dtype is None:
        raise OpArgumentError(f"{decl.name}: out_dtype is required (the output's dtype is the caller's choice)")
    return out_dtype


def _check(decl: OpDef, inputs, attrs, out_dtype, out_shape):
    """(device, kernel dtype, output shapes, output dtypes), or OpArgumentError naming the problem."""
    op = decl.name
    if len(inputs) != len(decl.inputs):
        raise OpArgumentError(f"{op}: expected {len(decl.inputs)} input(s) ({', '.join(decl.inputs) or 'none'}), "
                              f"got {len(inputs)}")
    for name, t in zip(decl.inputs, inputs):
        checks.tensor(op, name, t)
    dtype = _kernel_dtype(decl, inputs, out_dtype)
    if dtype not in decl.dtypes:
        raise OpArgumentError(f"{op}: {decl.dtype_of} has dtype {dtype}, expected one of {', '.join(decl.dtypes)}")
    for name, t, want in zip(decl.inputs, inputs, decl.input_dtypes):
        expected = dtype if want == "=" else want
        if want != "any" and dtype_name(t) != expected:
            raise OpArgumentError(f"{op}: {name} has dtype {dtype_name(t)}, expected {expected}")
    try:
        shapes = decl.output_shapes([list(t.shape) for t in inputs], attrs, out_shape)
        dtypes = decl.resolve_output_dtypes(dtype, out_dtype)
    except ValueError as exc:
        raise OpArgumentError(f"{op}: {exc}") from None
    for d in dtypes:
        if d not in DTYPE_BITS:
            raise OpArgumentError(f"{op}: out_dtype must be an anychip dtype, got {d!r}")
    return dtype, shapes, dtypes


def _dense(t):
    """``t`` as a dense tensor: itself, or a copy made by the device's own copy kernel."""
    if t.is_contiguous():
        return t
    (dense,) = run("copy", [t], [])
    return dense


def run(op: str, inputs, attrs=(), out_dtype: str | None = None, out_shape=None, device=None):
    """Runs base op ``op`` on ``inputs`` (paddle Tensors on one device) with ``attrs`` (floats, in the
    declared order) and returns its outputs, as a list. ``out_dtype``: the output dtype of cast,
    fill and arange; ``out_shape``: the output shape of fill and arange and the weight shape of
    embedding_grad; ``device`` ("xpu:0" or ("xpu", 0)): where fill and arange run."""
    decl = base_op(op)
    inputs = list(inputs)
    attrs = [float(a) for a in attrs]
    dtype, shapes, dtypes = _check(decl, inputs, attrs, out_dtype, out_shape)
    where = _device(op, inputs, device)
    kernel = registry().kernels.find(op, where[0], dtype)
    if kernel is None:
        fallback.record_op_fallback(where[0], op, dtype, f"no kernel is registered for {where[0]}/{dtype}")
        return _reference(decl, inputs, attrs, dtypes, shapes, out_dtype, out_shape, where)
    outs = [empty(s, d, where) for s, d in zip(shapes, dtypes)]
    if not (decl.elementwise or decl.category in ("reduction", "matmul")):
        inputs = [_dense(t) for t in inputs]  # the other ops take dense inputs
    launch(kernel.forward, op, where, inputs, outs, attrs, described=_descriptors(decl, inputs, shapes, where[1]))
    return outs


def _descriptors(decl: OpDef, inputs, shapes, index: int) -> list[tuple]:
    """The inputs as the kernel takes them: elementwise inputs and matmul's x and y broadcast to
    the output's (batch) shape with stride 0, the rest as they are."""
    if decl.elementwise:
        return [broadcast_descriptor(t, shapes[0], index) for t in inputs]
    if decl.category == "matmul":
        batch = list(shapes[0][:-2]) if decl.name == "matmul" else list(inputs[2].shape[:-2])
        return [broadcast_descriptor(t, batch + list(t.shape[-2:]), index) for t in inputs[:2]] + \
            [broadcast_descriptor(t, list(t.shape), index) for t in inputs[2:]]
    return [broadcast_descriptor(t, list(t.shape), index) for t in inputs]


def host_array(t) -> np.ndarray:
    """A numpy copy of a tensor on any device (bfloat16 as float32)."""
    pd = paddle()
    if not t.place.is_cpu_place():
        t = t._copy_to(pd.CPUPlace(), True)
    if dtype_name(t) == "bfloat16":
        t = t.astype("float32")
    return t.numpy()


def device_tensor(array: np.ndarray, dtype: str, device: tuple[str, int]):
    """``array`` as a ``dtype`` tensor on ``device`` (converted on the host, then copied)."""
    pd = paddle()
    t = pd.to_tensor(np.ascontiguousarray(array), place=pd.CPUPlace())
    if list(t.shape) != list(array.shape):  # to_tensor makes a 0-d array 1-d
        t = t.reshape(list(array.shape))
    if dtype_name(t) != dtype:
        t = t.astype(dtype)
    return t if device[0] == "cpu" else t._copy_to(_place(*device), True)


def _reference(decl, inputs, attrs, dtypes, shapes, out_dtype, out_shape, where):
    arrays = [host_array(t) for t in inputs]
    try:
        results = decl.reference(arrays, attrs, out_dtype=out_dtype, out_shape=out_shape)
    except (ValueError, IndexError) as exc:
        raise OpArgumentError(f"{decl.name} on {device_label(where)}: {exc}") from None
    return [device_tensor(np.asarray(r).reshape(s), d, where) for r, s, d in zip(results, shapes, dtypes)]


__all__ = ["broadcast_descriptor", "device_tensor", "host_array", "run"]
