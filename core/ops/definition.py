"""What an op is, written once: :class:`OpDef`. Each op of anychip's contract has one, in
``anychip/ops/defs/<op>.py`` (a plugin adds its own through ``anychip_register_ops``), and
everything else reads it: the conformance kit (its sample cases and tolerances), ``anychip
ops`` (the support table), the host kernels' registration, CodeGen's attribute indices, the
Paddle kernel bridge (the Paddle kernels it backs) and the generated C header
``anychip/ops.h``, which names every attribute's index for the kernels.

Two kinds of op share the type:

- **fused** ops (``category="fused"``): the LLM kernels (rms_norm, attention, ...). Their
  Python function ``anychip.ops.<name>`` validates arguments and runs the kernel or its Paddle
  reference (``OpImpl``); a backward is a second kernel, ``grad``, with its own attrs.
- **base** ops (any other category): the operator set Paddle's own ops are made of. They are
  called generically (``anychip.ops.base_call``, the Paddle bridge) from this definition alone:
  its shape rule, dtypes and numpy reference; a grad is a base op of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

CATEGORIES = ("fused", "unary", "binary", "compare", "where", "cast", "fill", "copy", "reduction", "softmax", "loss",
              "embedding", "index", "arange", "matmul")
ELEMENTWISE = ("unary", "binary", "compare", "where", "cast", "fill", "copy")


@dataclass(frozen=True)
class Attr:
    """One attribute: a double in the kernel call's ``attrs`` at its place in the definition.
    An attribute with a ``default``, or ``optional`` (its absence means what ``doc`` says), may
    be left off the end of the list with every one after it; any other the caller always
    passes. ``variadic``: the last one, repeated (a count given by an earlier attribute)."""

    name: str
    doc: str
    default: float | None = None
    optional: bool = False
    variadic: bool = False

    @property
    def required(self) -> bool:
        return self.default is None and not (self.optional or self.variadic)


@dataclass(frozen=True)
class OpDef:
    """One op. ``inputs``/``outputs``: names in call order (a trailing input named with a "?"
    is optional). ``attrs``: :class:`Attr` in order. ``dtypes``: those a kernel may be
    registered for; ``tolerance``: dtype -> (rtol, atol) of a kernel against the reference.
    ``cases(op, dtype, rng)``: the conformance kit's sample calls (``anychip.conformance.case``).
    ``grad``: the kernel computing the input gradients (fused: a kernel registered as the op's
    backward, with ``grad_attrs``; base: another base op). ``paddle``: the Paddle kernels this op
    serves one to one through the Paddle bridge. ``contract``: the kernel contract in words (the
    tensors' shapes and dtypes, the math), as anychip/ops.h prints it.

    Base ops only: ``input_dtypes`` per input, "=" (the kernel's dtype), a dtype name or "any"
    (cast); ``output_dtypes`` per output, "=", a dtype name or "given" (the caller chooses);
    ``dtype_of``: the tensor whose dtype keys the kernel; ``shape`` and ``reference_fn``: the shape
    rule and the numpy reference (float math in float64, cast to the output dtype)."""

    name: str
    category: str
    summary: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dtypes: tuple[str, ...]
    tolerance: dict
    cases: Callable = field(repr=False)
    attrs: tuple[Attr, ...] = ()
    grad: str | None = None
    grad_attrs: tuple[Attr, ...] = ()
    paddle: tuple[str, ...] = ()
    contract: str = ""
    input_dtypes: tuple[str, ...] = ()
    output_dtypes: tuple[str, ...] = ()
    dtype_of: str = ""
    shape: Callable | None = field(default=None, repr=False)
    reference_fn: Callable | None = field(default=None, repr=False)

    def __post_init__(self):
        where = f"op {self.name!r}"
        if not self.name.isidentifier() or self.name != self.name.lower():
            raise ValueError(f"{where}: name must be a lower-case identifier")
        if self.category not in CATEGORIES:
            raise ValueError(f"{where}: category must be one of {CATEGORIES}, got {self.category!r}")
        if not callable(self.cases):
            raise ValueError(f"{where}: cases must be a function (op, dtype, rng) -> sample cases")
        missing = [d for d in self.dtypes if d not in self.tolerance]
        if missing:
            raise ValueError(f"{where}: tolerance must give (rtol, atol) for every dtype, missing {missing}")
        names = [a.name for a in self.attrs]
        if len(set(names)) != len(names) or any(not n.isidentifier() for n in names):
            raise ValueError(f"{where}: attrs must have distinct identifier names, got {names}")
        if any(a.variadic for a in self.attrs[:-1]):
            raise ValueError(f"{where}: only the last attr may be variadic")
        if self.category == "fused":
            return
        if self.shape is None or self.reference_fn is None:
            raise ValueError(f"{where}: a base op needs its shape rule and numpy reference")
        if not self.input_dtypes:
            object.__setattr__(self, "input_dtypes", ("=",) * len(self.inputs))
        if not self.output_dtypes:
            object.__setattr__(self, "output_dtypes", ("=",) * len(self.outputs))
        if not self.dtype_of:
            keyed = [n for n, d in zip(self.inputs, self.input_dtypes) if d in ("=", "any")]
            object.__setattr__(self, "dtype_of", keyed[0] if keyed else self.outputs[0])

    # ---- what every op has ----

    @property
    def fused(self) -> bool:
        return self.category == "fused"

    @property
    def backward(self) -> bool:
        """Whether a backward kernel is registered with the op's forward (fused ops)."""
        return self.fused and self.grad is not None

    @property
    def elementwise(self) -> bool:
        return self.category in ELEMENTWISE

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)

    def attr_index(self, name: str, grad: bool = False) -> int:
        """The place of attr ``name`` in the call's attrs (``grad``: the grad kernel's)."""
        attrs = self.grad_attrs if grad else self.attrs
        for i, a in enumerate(attrs):
            if a.name == name:
                return i
        raise ValueError(f"{self.grad if grad else self.name} has no attr {name!r} "
                         f"(its attrs: {', '.join(a.name for a in attrs) or 'none'})")

    def attr_values(self, grad: bool = False, **values) -> list[float]:
        """The attrs list of a call, from ``values`` by name: in the definition's order, a value
        left out taking its default, and trailing defaults left off (a kernel reads an absent
        attr as its default). A variadic attr takes a sequence. ``grad``: the grad kernel's."""
        attrs, kernel = (self.grad_attrs, self.grad) if grad else (self.attrs, self.name)
        unknown = set(values) - {a.name for a in attrs}
        if unknown:
            raise ValueError(f"{kernel}: unknown attr(s) {sorted(unknown)} (its attrs: "
                             f"{', '.join(a.name for a in attrs) or 'none'})")
        out: list[float] = []
        last_given = max((i for i, a in enumerate(attrs) if a.name in values), default=-1)
        for i, a in enumerate(attrs):
            if a.name in values:
                value = values[a.name]
                out.extend(float(v) for v in value) if a.variadic else out.append(float(value))
            elif a.required:
                raise ValueError(f"{kernel}: attr {a.name!r} is required")
            elif i < last_given:
                if a.default is None:
                    raise ValueError(f"{kernel}: attr {a.name!r} has no default, so it must be given to give "
                                     f"{attrs[last_given].name!r}")
                out.append(float(a.default))
        return out

    # ---- base ops: called from the definition alone ----

    def output_shapes(self, input_shapes, attrs=(), out_shape=None) -> list[tuple[int, ...]]:
        """The outputs' shapes for inputs of ``input_shapes`` (un-broadcast, as the user holds them)
        and ``attrs``; ``out_shape`` is required by the ops without inputs (fill, arange)."""
        if len(input_shapes) != len(self.inputs):
            raise ValueError(f"{self.name}: expected {len(self.inputs)} input shape(s) "
                             f"({', '.join(self.inputs)}), got {len(input_shapes)}")
        return [tuple(int(d) for d in s) for s in self.shape([tuple(s) for s in input_shapes], list(attrs),
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
        if self.reference_fn is None:
            raise ValueError(f"{self.name} is a fused op: its reference is anychip.ops.{self.name}'s Paddle one")
        return list(self.reference_fn([np.asarray(a) for a in inputs], [float(a) for a in attrs], out_dtype,
                                      out_shape))
