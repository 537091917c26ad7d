"""The kernel description: what a generated kernel computes, independent of any backend.

A kernel is a named function of tensors. Each output is an expression over the inputs:

    x, y = Input(0), Input(1)
    Elementwise("add", inputs=(T, T), outputs=(Out(T, x + y),), dtypes=FLOATS)

Expressions are built from ``Input`` loads, ``Const``, ``Attr`` (the call's attrs by index),
math (``exp(x)``, ``x * y``, ``maximum(x, y)``, ``where(c, x, y)``, comparisons, ``cast``) and,
in row kernels, row reductions (``row_sum``, ``row_max``) and the row length ``ROW_LEN``.

Five kinds of kernel:

- :class:`Elementwise`: every output element from the inputs' elements at the same index, by
  the kernel ABI's broadcasting rule (input descriptors have the output's shape, stride 0 on
  broadcast dims), so one kernel serves every broadcast pattern and every strided view.
- :class:`Rows`: the tensors are cut into rows (the last axis, an axis from an attr, or a set of
  axes from attrs) and each row is computed on its own: reductions over the row first, then
  the outputs. A tensor's ``role`` says how it is indexed: ``"row"`` (the same shape as the
  first input with role "row", element by element), ``"col"`` (a vector indexed by position in the row, e.g.
  RMSNorm's weight), ``"per_row"`` (one element per row, rows in row-major order, e.g. inv_rms),
  ``"col_sum"`` (an output vector, the expression summed over all rows, e.g. dweight).
- :class:`Gather`: out = the table input's slices picked along an axis by an int64 index input
  (embedding, index_select); the output expression sees the picked element and the index.
- :class:`ScatterAdd`: the other way round: each index's source slice added onto the output's
  row it names (embedding's gradient), in index order.
- :class:`Contraction`: each output a :class:`Product` of two inputs' matrices (their last two
  dims), batched over the leading dims with broadcasting (matmul and its gradient).

Dtypes: a tensor's ``dtype`` is ``"T"`` (the dtype the kernel is instantiated for), a dtype
name, or ``"*"`` (an output whose dtype the kernel reads from its descriptor: ``cast``).
Arithmetic runs in float32 for float dtypes, in the dtype itself for integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# CASTABLE: what cast converts between, and so what a "*" output may hold
from anychip.dtypes import CASTABLE, FLOATS

UNARY = ("exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "silu", "abs", "neg", "sin", "cos")
BINARY = ("add", "sub", "mul", "div", "max", "min", "pow")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
REDUCTIONS = ("sum", "max")


class Expr:
    """An expression node. Python operators build expressions."""

    def _bin(self, op, other, swap=False):
        other = other if isinstance(other, Expr) else Const(float(other))
        return Binary(op, other, self) if swap else Binary(op, self, other)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __pow__(self, o): return self._bin("pow", o)
    def __neg__(self): return Unary("neg", self)
    def __lt__(self, o): return self._bin("lt", o)
    def __le__(self, o): return self._bin("le", o)
    def __gt__(self, o): return self._bin("gt", o)
    def __ge__(self, o): return self._bin("ge", o)
    def eq(self, o): return self._bin("eq", o)
    def ne(self, o): return self._bin("ne", o)


@dataclass(frozen=True, eq=True)
class Input(Expr):
    """Input ``index`` at the current element (row kernels: as its role says)."""
    index: int


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: float


@dataclass(frozen=True, eq=True)
class Attr(Expr):
    """``call->attrs[index]`` (``default`` when absent). ``exact``: kept as a double (fill's
    value for int64 outputs), else converted to the compute type."""
    index: int
    default: float = 0.0
    exact: bool = False


@dataclass(frozen=True, eq=True)
class Unary(Expr):
    op: str
    x: Expr

    def __post_init__(self):
        if self.op not in UNARY:
            raise ValueError(f"Unary op {self.op!r}: expected one of {UNARY}")


@dataclass(frozen=True, eq=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    def __post_init__(self):
        if self.op not in BINARY + COMPARE:
            raise ValueError(f"Binary op {self.op!r}: expected one of {BINARY + COMPARE}")


@dataclass(frozen=True, eq=True)
class Where(Expr):
    cond: Expr
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=True)
class Cast(Expr):
    """``x`` rounded to ``dtype`` ("T" or a name) and back: what storing and reloading gives
    (e.g. RMSNorm's h = x + residual, which is stored and later read back)."""
    x: Expr
    dtype: str


@dataclass(frozen=True, eq=True)
class Reduce(Expr):
    """A row reduction (row kernels only): ``op`` of ``x`` over the row, in float32."""
    op: str
    x: Expr

    def __post_init__(self):
        if self.op not in REDUCTIONS:
            raise ValueError(f"Reduce op {self.op!r}: expected one of {REDUCTIONS}")


@dataclass(frozen=True, eq=True)
class RowLen(Expr):
    """The number of elements in a row, as a float (row kernels only)."""


@dataclass(frozen=True, eq=True)
class Position(Expr):
    """The current element's position in its row (row kernels), or its linear index in the
    output (elementwise kernels): an int64."""


@dataclass(frozen=True, eq=True)
class RowAt(Expr):
    """Row input ``index`` at position ``pos`` (an integer expression) of the current row
    (row kernels only; e.g. the logit of a row's label)."""
    index: int
    pos: Expr


@dataclass(frozen=True, eq=True)
class Flag:
    """A switch fixed at launch: on when ``attrs[attr] != 0`` (``attr`` None: never), the other
    way round when ``invert``. ``~flag`` inverts."""
    attr: int | None = None
    invert: bool = False

    def __invert__(self) -> "Flag":
        return replace(self, invert=not self.invert)


@dataclass(frozen=True, eq=True)
class Product(Expr):
    """(Contraction kernels only) ``op(a) @ op(b)`` for inputs ``a`` and ``b``, where op views a
    tensor's last two dims as a matrix, transposed when the operand's flag is on. The output
    receives it through op of its own last two dims (``tout``): with ``tout`` on, the output
    holds the product's transpose."""
    a: int
    b: int
    ta: Flag = Flag()
    tb: Flag = Flag()
    tout: Flag = Flag()


ROW_LEN = RowLen()
POSITION = Position()


def unary(op):
    return lambda x: Unary(op, x)


exp, log, sqrt, rsqrt, sigmoid, tanh, silu, absolute, negative, sin, cos = (unary(op) for op in UNARY)


def maximum(a, b): return Binary("max", a, b)
def minimum(a, b): return Binary("min", a, b)
def where(c, a, b): return Where(c, a, b)
def cast(x, dtype): return Cast(x, dtype)
def row_sum(x): return Reduce("sum", x)
def row_max(x): return Reduce("max", x)


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Unary):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Where):
        return (e.cond, e.a, e.b)
    if isinstance(e, (Cast, Reduce)):
        return (e.x,)
    if isinstance(e, RowAt):
        return (e.pos,)
    return ()


def walk(e: Expr):
    """Every node of ``e``, children before parents."""
    for c in children(e):
        yield from walk(c)
    yield e


# ---- tensors and kernels ------------------------------------------------------------------


@dataclass(frozen=True)
class Arg:
    """An input tensor: its dtype rule and (row kernels) its role."""
    dtype: str = "T"
    role: str = "row"


@dataclass(frozen=True)
class Out:
    """An output tensor and the expression that computes it."""
    dtype: str
    expr: Expr
    role: str = "row"


ROLES = ("row", "col", "per_row", "col_sum")


@dataclass(frozen=True)
class RowsOf:
    """Which axes make a row: ``"last"``, ``"attr_axis"`` (one axis, attrs[attr], negative
    counts from the end) or ``"attr_axes"`` (attrs[attr] is the count n, attrs[attr+1 ..
    attr+n] the axes; n = 0 means every axis)."""
    kind: str = "last"
    attr: int = 0


@dataclass(frozen=True)
class Kernel:
    """Common to both kinds: ``name`` (the op), ``inputs``, ``outputs``, the dtypes it is
    instantiated for, and the schedule (backend-specific knobs the tuner may set)."""
    name: str
    inputs: tuple[Arg, ...]
    outputs: tuple[Out, ...]
    dtypes: tuple[str, ...]
    schedule: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        for i, out in enumerate(self.outputs):
            for node in walk(out.expr):
                read = ((node.index,) if isinstance(node, (Input, RowAt)) else
                        (node.a, node.b) if isinstance(node, Product) else ())
                for index in read:
                    if not 0 <= index < len(self.inputs):
                        raise ValueError(f"kernel {self.name!r} output {i} reads input {index}, "
                                         f"but the kernel has {len(self.inputs)} inputs")
        for dtype in (*(a.dtype for a in self.inputs), *(o.dtype for o in self.outputs)):
            if dtype not in ("T", "*") + CASTABLE + ("float64",):
                raise ValueError(f"kernel {self.name!r}: dtype {dtype!r} is not 'T', '*' or a dtype name")

    def with_schedule(self, **knobs) -> "Kernel":
        return replace(self, schedule=tuple(sorted(knobs.items())))

    def knob(self, name: str, default: int) -> int:
        return dict(self.schedule).get(name, default)


@dataclass(frozen=True)
class Elementwise(Kernel):
    def __post_init__(self):
        super().__post_init__()
        for out in self.outputs:
            _refuse(self, out.expr, (Reduce, RowLen, RowAt, Product), "elementwise")


def _refuse(kernel, expr, kinds, what) -> None:
    for node in walk(expr):
        if isinstance(node, kinds):
            raise ValueError(f"{what} kernel {kernel.name!r} uses {type(node).__name__}, which {what} kernels "
                             "do not have")


def _check_indexed(kernel, what) -> None:
    """A gather's or scatter's rules: an int64 index; an expression of elements only."""
    if kernel.inputs[kernel.index].dtype != "int64":
        raise ValueError(f"{what} kernel {kernel.name!r}: its index input must be int64")
    for out in kernel.outputs:
        _refuse(kernel, out.expr, (Reduce, RowLen, RowAt, Product, Position), what)


@dataclass(frozen=True)
class Gather(Kernel):
    """out[pre, i, post] from table[pre, index[i], post]: ``table`` (an input) is cut at its
    axis (attrs[``axis_attr``], negative counts from the end; None: axis 0) and ``index`` (an
    int64 input of any shape, all of it used) picks slices along it; the output has the table's
    shape with the index's dims in place of the axis. In the output expression ``Input(table)``
    is the picked element and ``Input(index)`` the index value. Every index must lie inside
    the axis; a kernel checks them all before it writes anything."""
    table: int = 1
    index: int = 0
    axis_attr: int | None = None

    def __post_init__(self):
        super().__post_init__()
        _check_indexed(self, "gather")


@dataclass(frozen=True)
class ScatterAdd(Kernel):
    """out[index[i], post] += expr for every i, in order of i, over a zeroed output: ``source``
    (an input) has the index's shape followed by the output's dims after the first; in the
    expression ``Input(source)`` is its element and ``Input(index)`` the index value. Each
    element is summed in index order whatever the thread count."""
    index: int = 0
    source: int = 1

    def __post_init__(self):
        super().__post_init__()
        _check_indexed(self, "scatter")


@dataclass(frozen=True)
class Contraction(Kernel):
    """Outputs that are each one :class:`Product`. The batch is the leading dims (all but the
    last two) of the tensor ``batch`` names (an input's index, or -1: the first output);
    other tensors' batch dims are right-aligned with them, and a dim of size 1 or missing is
    broadcast. An output with fewer batch dims receives the sum over the batches that land on
    it, in batch order. Every element is summed in a fixed order, whatever the thread count."""
    batch: int = -1

    def __post_init__(self):
        super().__post_init__()
        for out in self.outputs:
            if not isinstance(out.expr, Product):
                raise ValueError(f"contraction kernel {self.name!r}: every output must be one Product")
            if out.dtype not in FLOATS + ("T",):
                raise ValueError(f"contraction kernel {self.name!r}: outputs are float")


@dataclass(frozen=True)
class Rows(Kernel):
    rows: RowsOf = field(default_factory=RowsOf)

    def __post_init__(self):
        super().__post_init__()
        if not any(a.role == "row" for a in self.inputs):
            raise ValueError(f"row kernel {self.name!r}: needs an input with role 'row' (the first fixes the rows)")
        for t in (*self.inputs, *self.outputs):
            if t.role not in ROLES:
                raise ValueError(f"row kernel {self.name!r}: role {t.role!r} is not one of {ROLES}")
        for out in self.outputs:
            _refuse(self, out.expr, (Product,), "row")


@dataclass(frozen=True)
class Variants:
    """One op whose kernel depends on how many inputs the call has (optional inputs): e.g.
    rms_norm with and without a residual. ``by_inputs`` maps num_inputs to a kernel."""
    name: str
    by_inputs: tuple[tuple[int, Kernel], ...]

    @property
    def dtypes(self) -> tuple[str, ...]:
        return self.by_inputs[0][1].dtypes

    @property
    def schedule(self):
        return self.by_inputs[0][1].schedule

    def with_schedule(self, **knobs) -> "Variants":
        return replace(self, by_inputs=tuple((n, k.with_schedule(**knobs)) for n, k in self.by_inputs))

    def knob(self, name: str, default: int) -> int:
        return self.by_inputs[0][1].knob(name, default)


def resolve(dtype_rule: str, dtype: str) -> str:
    """A tensor's dtype in the instance of a kernel for ``dtype``."""
    return dtype if dtype_rule == "T" else dtype_rule
