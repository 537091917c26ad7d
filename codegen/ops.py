"""The base operator set (and the fused RMSNorm) as descriptions: what a chip gets from CodeGen.

Each kernel follows the op's ABI in anychip/kernel.h (base ops: the broadcasting rule, attrs
as doubles). What an op is comes from its definition (``anychip.ops.defs``): its dtypes and
its attrs' places, by name. ``library(dtypes)`` restricts every op to the dtypes a chip supports.
"""

from __future__ import annotations

from anychip.ops.defs import BUILTIN

from .ir import (Arg, Attr, Cast, Const, Contraction, Elementwise, Flag, Gather, Input, Out,
                 Position, Product, RowAt, Rows, RowsOf, ROW_LEN, ScatterAdd, Variants, Unary, Binary, row_max,
                 row_sum, rsqrt, where, exp, log)

X, Y, Z = Input(0), Input(1), Input(2)
T = Arg("T")


def attr(op: str, name: str, default: float | None = None, exact: bool = False) -> Attr:
    """Attr ``name`` of ``op`` where its definition puts it; ``default`` (else the definition's,
    else 0) when a call leaves it off."""
    d = BUILTIN[op]
    index = d.attr_index(name)
    fallback = d.attrs[index].default if default is None else default
    return Attr(index, 0.0 if fallback is None else fallback, exact)


def dtypes(op: str) -> tuple[str, ...]:
    return BUILTIN[op].dtypes


def category(name: str) -> list[str]:
    return [op.name for op in BUILTIN.values() if op.category == name]

UNARY_OPS = {name: Unary(name, X) for name in ("exp", "log", "sqrt", "rsqrt", "silu", "sigmoid", "tanh", "abs",
                                                          "sin", "cos")}
UNARY_OPS["neg"] = -X
UNARY_OPS["scale"] = where(attr("scale", "bias_after_scale").ne(0.0),
                           attr("scale", "scale", 1.0) * X + attr("scale", "bias"),
                           attr("scale", "scale", 1.0) * (X + attr("scale", "bias")))
UNARY_OPS["pow"] = X ** attr("pow", "factor", 1.0)

BINARY_OPS = {"add": X + Y, "subtract": X - Y, "multiply": X * Y, "divide": X / Y,
              "maximum": Binary("max", X, Y), "minimum": Binary("min", X, Y), "elementwise_pow": X ** Y}

COMPARE_OPS = {"equal": X.eq(Y), "not_equal": X.ne(Y), "less_than": X < Y, "less_equal": X <= Y,
               "greater_than": X > Y, "greater_equal": X >= Y}


def elementwise_kernels() -> list:
    """Every unary, binary and compare op CodeGen has an expression for, and the rest of the
    elementwise set."""
    for group, ops in (("unary", UNARY_OPS), ("binary", BINARY_OPS), ("compare", COMPARE_OPS)):
        if set(ops) != set(category(group)):
            raise ValueError(f"codegen's {group} ops {sorted(ops)} differ from the definitions' "
                             f"{sorted(category(group))}: give each defined op its expression here")
    kernels = [Elementwise(n, (T,), (Out("T", e),), dtypes(n)) for n, e in UNARY_OPS.items()]
    kernels += [Elementwise(n, (T, T), (Out("T", e),), dtypes(n)) for n, e in BINARY_OPS.items()]
    kernels += [Elementwise(n, (T, T), (Out("bool", e),), dtypes(n)) for n, e in COMPARE_OPS.items()]
    kernels += [
        Elementwise("where", (Arg("bool"), T, T), (Out("T", where(X, Y, Z)),), dtypes("where")),
        # cast: registered under the input's dtype, writes whatever dtype the output has
        Elementwise("cast", (T,), (Out("*", X),), dtypes("cast")),
        Elementwise("fill", (), (Out("T", attr("fill", "value", exact=True)),), dtypes("fill")),
        Elementwise("copy", (T,), (Out("T", X),), dtypes("copy")),
        # out[i] = start + i * step (in double: exact for int64)
        Elementwise("arange", (), (Out("T", attr("arange", "start", exact=True)
                                       + Position() * attr("arange", "step", exact=True)),), dtypes("arange")),
    ]
    return kernels


def reduction_kernels() -> list:
    # the reduced axes (n, then the axes) make the row; out holds one value per row
    axes = RowsOf("attr_axes", BUILTIN["sum"].attr_index("n"))
    return [Rows("sum", (T,), (Out("T", row_sum(X), "per_row"),), dtypes("sum"), rows=axes),
            Rows("mean", (T,), (Out("T", row_sum(X) / ROW_LEN, "per_row"),), dtypes("mean"), rows=axes),
            Rows("max", (T,), (Out("T", row_max(X), "per_row"),), dtypes("max"), rows=axes)]


def softmax_kernels() -> list:
    axis = RowsOf("attr_axis", BUILTIN["softmax"].attr_index("axis"))
    e = exp(X - row_max(X))
    softmax = Rows("softmax", (T,), (Out("T", e / row_sum(e)),), dtypes("softmax"), rows=axis)
    # softmax_grad (out, dout -> dx): dx = out * (dout - sum(dout * out))
    grad = Rows("softmax_grad", (T, T), (Out("T", X * (Y - row_sum(X * Y))),), dtypes("softmax_grad"),
                rows=RowsOf("attr_axis", BUILTIN["softmax_grad"].attr_index("axis")))
    return [softmax, grad]


def cross_entropy_kernels() -> list:
    """cross_entropy_with_softmax over the last axis: logits, label int64[..., 1] -> softmax,
    loss[..., 1]; and its grad (label, softmax, dloss -> dlogits)."""
    label = Input(1)
    ignored = label.eq(attr("cross_entropy_with_softmax", "ignore_index", -100.0))
    m = row_max(X)
    s = row_sum(exp(X - m))
    forward = Rows("cross_entropy_with_softmax", (T, Arg("int64", "per_row")),
                   (Out("T", exp(X - m) / s), Out("T", where(ignored, Const(0.0), m + log(s) - RowAt(0, label)), "per_row")),
                   dtypes("cross_entropy_with_softmax"))
    label_g, softmax_g, dloss = Input(0), Input(1), Input(2)
    onehot = where(Position().eq(label_g), Const(1.0), Const(0.0))
    grad = Rows("cross_entropy_with_softmax_grad",
                (Arg("int64", "per_row"), T, Arg("T", "per_row")),
                (Out("T", where(label_g.eq(attr("cross_entropy_with_softmax_grad", "ignore_index", -100.0)),
                                Const(0.0), (softmax_g - onehot) * dloss)),),
                dtypes("cross_entropy_with_softmax_grad"))
    return [forward, grad]


def rms_norm_kernels() -> list:
    """rms_norm and rms_norm_grad as anychip/kernel.h fixes them, with and without the optional
    input (residual; dh_extra)."""
    eps = attr("rms_norm", "eps", 1e-6)
    FLOATS = dtypes("rms_norm")
    w = Input(1)
    col, per_row = Arg("T", "col"), Arg("float32", "per_row")

    def forward(h):
        inv = rsqrt(row_sum(h * h) / ROW_LEN + eps)
        return Out("T", h * inv * w), Out("float32", inv, "per_row")

    plain = Rows("rms_norm", (T, col), forward(X), FLOATS)
    h = Cast(X + Input(2), "T")  # stored as h, then read back: the rounded value
    residual = Rows("rms_norm", (T, col, T), (*forward(h), Out("T", X + Input(2))), FLOATS)

    # grad: dy, h, weight, inv_rms f32[R], dh_extra? -> dh, dweight
    dy, hh, wg, inv = Input(0), Input(1), Input(2), Input(3)
    k = inv * inv * inv * row_sum(dy * wg * hh) / ROW_LEN
    dh = inv * dy * wg - k * hh

    def grad(extra):
        ins = (T, T, col, per_row) + ((T,) if extra else ())
        return Rows("rms_norm_grad", ins, (Out("T", dh + Input(4) if extra else dh),
                                           Out("T", dy * hh * inv, "col_sum")), FLOATS)

    return [Variants("rms_norm", ((2, plain), (3, residual))),
            Variants("rms_norm_grad", ((4, grad(False)), (5, grad(True))))]


def index_kernels() -> list:
    """embedding (ids, weight -> rows of weight; padding_idx rows 0), its grad (the scatter-add of
    dout's rows by id, nothing for padding_idx) and index_select (along its axis attr)."""
    ids = Arg("int64")

    def padding(op):
        return Input(0).eq(attr(op, "padding_idx", -1.0, exact=True))

    return [Gather("embedding", (ids, T), (Out("T", where(padding("embedding"), Const(0.0), Input(1))),),
                   dtypes("embedding"), table=1, index=0),
            ScatterAdd("embedding_grad", (ids, T), (Out("T", where(padding("embedding_grad"), Const(0.0), Input(1))),),
                       dtypes("embedding_grad"), index=0, source=1),
            Gather("index_select", (T, ids), (Out("T", Input(0)),), dtypes("index_select"), table=0, index=1,
                   axis_attr=BUILTIN["index_select"].attr_index("axis"))]


def matmul_kernels() -> list:
    """matmul (flags transpose_x, transpose_y) and matmul_grad: with A = op(x), B = op(y),
    dA = dout B^T and dB = A^T dout, each written transposed when its operand is stored so."""
    mm = BUILTIN["matmul"]
    tx, ty, plain = Flag(mm.attr_index("transpose_x")), Flag(mm.attr_index("transpose_y")), Flag()
    forward = Contraction("matmul", (T, T), (Out("T", Product(0, 1, tx, ty)),), dtypes("matmul"))
    grad = Contraction("matmul_grad", (T, T, T),
                       (Out("T", Product(2, 1, plain, ~ty, tout=tx)), Out("T", Product(0, 2, ~tx, plain, tout=ty))),
                       dtypes("matmul_grad"), batch=2)
    return [forward, grad]


def all_kernels() -> list:
    return (elementwise_kernels() + reduction_kernels() + softmax_kernels() + cross_entropy_kernels()
            + rms_norm_kernels() + index_kernels() + matmul_kernels())


def restrict(kernel, dtypes):
    """``kernel`` for the dtypes among ``dtypes`` only (None when it keeps none)."""
    from dataclasses import replace

    keep = tuple(d for d in kernel.dtypes if d in dtypes)
    if not keep:
        return None
    if isinstance(kernel, Variants):
        return replace(kernel, by_inputs=tuple((n, replace(k, dtypes=keep)) for n, k in kernel.by_inputs))
    return replace(kernel, dtypes=keep)


def library(dtypes) -> list:
    """Every generated kernel, restricted to ``dtypes`` (a chip's supported dtypes)."""
    return [k for k in (restrict(k, dtypes) for k in all_kernels()) if k is not None]
