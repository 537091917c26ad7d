"""Expressions of the description as C/C++/CUDA source text (shared by the c and cuda
backends): each input used is loaded once into a local (``v<i>``), math maps onto the
prelude's helpers, reductions already computed become their scalar's name."""

from __future__ import annotations

import math
from typing import Callable

from .. import ir

_STORAGE = {"float32": "float", "float64": "double", "bfloat16": "acg::bf16", "float16": "acg::fp16",
            "int8": "int8_t", "int32": "int32_t", "int64": "int64_t", "bool": "acg::b8"}

# Float math through the C library's float functions, the same names in C++ and CUDA device
# code (only float dtypes reach them: compute is float32), except e^x: ACG_EXP, which
# vectorises on the host (the prelude says how) and is expf on CUDA.
_UNARY = {"exp": "ACG_EXP({})", "log": "logf({})", "sqrt": "sqrtf({})", "rsqrt": "acg::rsqrt({})",
          "sigmoid": "acg::sigmoid({})", "tanh": "tanhf({})", "silu": "acg::silu({})",
          "abs": "fabsf({})", "neg": "(-{})", "sin": "sinf({})", "cos": "cosf({})"}
_BINARY = {"add": "({} + {})", "sub": "({} - {})", "mul": "({} * {})", "div": "({} / {})",
           "max": "acg::vmax({}, {})", "min": "acg::vmin({}, {})", "pow": "powf({}, {})",
           "eq": "({} == {})", "ne": "({} != {})", "lt": "({} < {})", "le": "({} <= {})",
           "gt": "({} > {})", "ge": "({} >= {})"}


def storage_type(dtype: str) -> str:
    if dtype not in _STORAGE:
        raise ValueError(f"dtype {dtype!r} has no storage type; expected one of {sorted(_STORAGE)}")
    return _STORAGE[dtype]


def float_literal(value: float) -> str:
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    return f"{float(value)!r}f"


class CExpr:
    """Renders expressions. ``load(i)`` is the source of input i at the current element,
    ``reduced`` maps reductions already computed to their variables, ``row_at(i, pos)`` the
    source of row input i at position ``pos``."""

    def __init__(self, load: Callable[[int], str], reduced: dict | None = None,
                 row_at: Callable[[int, str], str] | None = None,
                 position: str = "c", prefix: str = "v"):
        self.position = position
        self.prefix = prefix  # of the loaded inputs' locals: two renderers can share a loop
        self.load_of = load
        self.reduced = reduced or {}
        self.row_at = row_at

    @staticmethod
    def attr_name(index: int, exact: bool) -> str:
        return f"a{index}{'d' if exact else ''}"

    def _inputs(self, e, seen: list) -> None:
        if e in self.reduced:
            return
        if isinstance(e, ir.Input) and e.index not in seen:
            seen.append(e.index)
        for c in ir.children(e):
            self._inputs(c, seen)

    def preload(self, exprs, indent: str) -> list[str]:
        seen: list[int] = []
        for e in exprs:
            self._inputs(e, seen)
        return [f"{indent}const auto {self.prefix}{i} = {self.load_of(i)};" for i in sorted(seen)]

    def render(self, e) -> str:
        r = self.render
        if e in self.reduced:
            return self.reduced[e]
        if isinstance(e, ir.Input):
            return f"{self.prefix}{e.index}"
        if isinstance(e, ir.Const):
            return float_literal(e.value)
        if isinstance(e, ir.Attr):
            return self.attr_name(e.index, e.exact)
        if isinstance(e, ir.Unary):
            return _UNARY[e.op].format(r(e.x))
        if isinstance(e, ir.Binary):
            return _BINARY[e.op].format(r(e.a), r(e.b))
        if isinstance(e, ir.Where):
            return f"({r(e.cond)} ? {r(e.a)} : {r(e.b)})"
        if isinstance(e, ir.Cast):
            target = "T" if e.dtype == "T" else storage_type(e.dtype)
            return f"acg::round_to<{target}>({r(e.x)})"
        if isinstance(e, ir.RowLen):
            return "row_len"
        if isinstance(e, ir.Position):
            return self.position
        if isinstance(e, ir.RowAt):
            if self.row_at is None:
                raise ValueError("RowAt outside a row kernel")
            return self.row_at(e.index, f"static_cast<int64_t>({r(e.pos)})")
        if isinstance(e, ir.Reduce):
            raise ValueError("a reduction was not computed before its use (row kernels only)")
        raise TypeError(f"cannot render {type(e).__name__}")
