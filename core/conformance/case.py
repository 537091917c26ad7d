"""One sample call of an op, as the conformance kit runs it (in the spirit of PyTorch's OpInfo
``sample_inputs``), and the helpers op definitions build their cases with. An op's definition
(``anychip/ops/defs/<op>.py``) lists its cases; :mod:`anychip.conformance.cases` hands them out.

This module imports nothing of anychip.ops at import time: the definitions import it while
anychip.ops is still loading."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

CPU = ("cpu", 0)  # where the references run


@dataclass(frozen=True)
class Case:
    """One call of an op.

    ``inputs``: numpy arrays by argument name; float ones are cast to the dtype under test (and
    the reference gets the same dtype-rounded values in float32), except ``float32_inputs``,
    which stay float32 whatever the dtype (quantization scales); integer and bool arrays pass
    as they are. ``call(**tensors)`` runs the op on the tensors' device, ``reference(**tensors)``
    its oracle; both return the outputs named by ``outputs`` (an op that works in place returns
    the tensors it updated). ``grads``: the inputs whose gradients are compared (the "bwd"
    direction), of ``sum(output_i * output_grads[i])`` (None: that output is not differentiated).
    ``host_outputs`` maps the outputs' host copies before comparing (4-bit codes are unpacked)."""

    label: str
    inputs: dict[str, np.ndarray]
    call: Callable
    reference: Callable
    outputs: tuple[str, ...]
    attrs: dict = field(default_factory=dict)
    grads: tuple[str, ...] = ()
    output_grads: tuple = ()
    float32_inputs: tuple[str, ...] = ()
    host_outputs: Callable | None = None
    summary: str = ""  # replaces the list of input shapes where that would be too long

    def describe(self) -> str:
        """The inputs' shapes (and dtypes when not float) and the op's other arguments."""
        if self.summary:
            shapes = self.summary
        else:
            shapes = ", ".join(f"{n}{list(a.shape)}" + ("" if a.dtype.kind == "f" else f" {a.dtype}")
                               for n, a in self.inputs.items())
        attrs = ", ".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{shapes}; {attrs}" if attrs else shapes


def normal(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


# ---- base ops, through anychip.ops.base_call --------------------------------------------------
# Each base op (its grad ops included) is a forward-only check: the device's kernel, called with
# the broadcast descriptors base_call builds, against the definition's numpy reference. Ops
# without inputs (fill, arange) take a `like` tensor for their device, shape and dtype.

def _names(op) -> tuple[str, ...]:
    return op.inputs or ("like",)


def _base_call(op, attrs, out_dtype, out_shape, **tensors):
    from ..ops import base_call
    from ..ops.dispatch import device_of, dtype_name

    names = _names(op)
    if names == ("like",):
        like = tensors["like"]
        return tuple(base_call.run(op.name, [], attrs, out_dtype=dtype_name(like), out_shape=list(like.shape),
                                   device=device_of(like)))
    return tuple(base_call.run(op.name, [tensors[n] for n in names], attrs, out_dtype=out_dtype,
                               out_shape=out_shape))


def _base_reference(op, attrs, out_dtype, out_shape, **tensors):
    from ..ops.base_call import device_tensor, host_array
    from ..ops.dispatch import dtype_name

    names = _names(op)
    if names == ("like",):
        like = tensors["like"]
        out_dtype, out_shape, arrays = dtype_name(like), list(like.shape), []
    else:
        arrays = [host_array(tensors[n]) for n in names]
    results = op.reference(arrays, attrs, out_dtype=out_dtype, out_shape=out_shape)
    key = out_dtype if op.dtype_of not in op.inputs else dtype_name(tensors[op.dtype_of])
    dtypes = op.resolve_output_dtypes(key, out_dtype)
    return tuple(device_tensor(np.asarray(r), d if d != "bfloat16" else "float32", CPU) for r, d in zip(results, dtypes))


def base_case(op, label, inputs, attrs=(), out_dtype=None, out_shape=None) -> Case:
    """A case of base op ``op`` (its OpDef): ``inputs`` by name (``like`` for fill and arange),
    ``attrs`` as the kernel takes them."""
    attrs = [float(a) for a in attrs]
    extra = {"out_dtype": out_dtype} if out_dtype else {}
    if out_shape:
        extra["out_shape"] = list(out_shape)
    return Case(label, inputs, functools.partial(_base_call, op, attrs, out_dtype, out_shape),
                functools.partial(_base_reference, op, attrs, out_dtype, out_shape), op.outputs,
                dict({"attrs": attrs} if attrs else {}, **extra))


def values(rng, shape, dtype, low=-3.0, high=3.0):
    """Random values of ``dtype`` (floats as float64, to be rounded by the kit)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int32", "int64"):
        return rng.integers(int(low), int(high) + 1, shape).astype(dtype)
    return rng.uniform(low, high, shape)


def elementwise_cases(op, dtype, rng, low=-3.0, attrs=()) -> list[Case]:
    """A unary or binary op's cases: a scalar and a 2-d input (unary); broadcasting, rank 0 and
    same shapes (binary, compare)."""
    if len(op.inputs) == 1:
        return [base_case(op, f"shape {list(s)}", {op.inputs[0]: values(rng, s, dtype, low)}, attrs)
                for s in [(), (3, 257)]]
    return [base_case(op, f"{list(a)} with {list(b)} (broadcast)",
                      {op.inputs[0]: values(rng, a, dtype, low, 2.0), op.inputs[1]: values(rng, b, dtype, low, 2.0)},
                      attrs)
            for a, b in [((3, 1, 5), (4, 5)), ((), (2, 3)), ((7,), (7,))]]


def quantized_arrays(rng, k, n, bits, group_size, offsets):
    """qweight and float32 scales (and offsets: W = q * scale + offset, as GGUF's Q4_1 loads)."""
    from ..ops.quant import quantize_numpy

    qweight, scales = quantize_numpy(normal(rng, k, n, scale=0.1), bits, group_size)
    arrays = {"qweight": qweight, "scales": scales.astype(np.float32)}
    if offsets:
        arrays["offsets"] = (rng.uniform(-0.1, 0.05, scales.shape) + 8 * scales).astype(np.float32)
    return arrays
