"""The Paddle kernels the bridge library holds, and the base ops the composed ones are made of.

One row per Paddle kernel: its name in Paddle's registry, the C++ wrapper in
``csrc/kernels/wrappers.h`` that implements it over base-op kernels and what its
PD_REGISTER_PLUGIN_KERNEL body sets. A row serving one op's kernel one to one names no base ops:
the op's definition (``anychip/ops/defs``, its ``paddle`` field) says which Paddle kernels it
serves. A row composing several base ops names them (a device gets the Paddle kernel for the
dtypes its plugin has all of them in). The ``SLOTS`` rows hold wrappers without an op of their
own: the device's config names the Paddle kernel and the op (one a plugin defines) of each.
``anychip.frontends.paddle.kernels`` plans and builds from this table; this module imports
nothing of anychip's, so that a build step can read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

# C++ type of each anychip dtype in a PD_REGISTER_PLUGIN_KERNEL dtype list.
CPP_TYPES = {
    "float32": "float", "float16": "phi::dtype::float16", "bfloat16": "phi::dtype::bfloat16",
    "float64": "double", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t",
    "int32": "int32_t", "int64": "int64_t", "bool": "bool",
}

_BOOL_OUTPUT = "kernel->OutputAt(0).SetDataType(phi::DataType::BOOL);"
_ANY_OUTPUT = "kernel->OutputAt(0).SetDataType(phi::DataType::UNDEFINED);"


@dataclass(frozen=True)
class PaddleKernel:
    """Paddle kernel ``name`` served by wrapper ``wrapper`` (in wrappers.h) from base ops
    ``base_ops``: registered for the dtypes every one of them has on the device."""

    name: str
    wrapper: str
    base_ops: tuple[str, ...] = ()  # () : served one to one by the op whose definition names it
    body: str = ""  # the PD_REGISTER_PLUGIN_KERNEL body (e.g. the output dtype of a comparison)
    fixed: tuple[tuple[str, str], ...] = ()  # (base op, dtype) also needed, whatever the served dtype


def _kernels() -> tuple[PaddleKernel, ...]:
    binary = [("add", "Add"), ("subtract", "Subtract"), ("multiply", "Multiply"), ("divide", "Divide"),
              ("maximum", "Maximum"), ("minimum", "Minimum"), ("elementwise_pow", "ElementwisePow")]
    compare = [("equal", "Equal"), ("not_equal", "NotEqual"), ("less_than", "LessThan"),
               ("less_equal", "LessEqual"), ("greater_than", "GreaterThan"), ("greater_equal", "GreaterEqual")]
    unary = [("exp", "Exp"), ("log", "Log"), ("sqrt", "Sqrt"), ("rsqrt", "Rsqrt"), ("silu", "Silu"),
             ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("abs", "Abs"), ("sin", "Sin"), ("cos", "Cos")]
    table = [PaddleKernel(op, f"{cls}Kernel") for op, cls in binary + unary]
    table += [PaddleKernel(op, f"{cls}Kernel", body=_BOOL_OUTPUT) for op, cls in compare]
    table += [
        PaddleKernel("scale", "ScaleKernel"),
        PaddleKernel("pow", "PowKernel"),
        PaddleKernel("cast", "CastKernel", body=_ANY_OUTPUT),
        PaddleKernel("where", "WhereKernel"),
        PaddleKernel("full", "FullKernel"),
        # x only gives the shape: Paddle must not copy it to the device first
        PaddleKernel("full_like", "FullLikeKernel", body="kernel->InputAt(0).SetBackend(phi::Backend::ALL_BACKEND);"),
        PaddleKernel("sum", "SumKernel", body=_ANY_OUTPUT),
        PaddleKernel("mean", "MeanKernel"),
        PaddleKernel("max", "MaxKernel"),
        PaddleKernel("softmax", "SoftmaxKernel"),
        PaddleKernel("softmax_grad", "SoftmaxGradKernel"),
        PaddleKernel("matmul", "MatmulKernel"),
        PaddleKernel("matmul_grad", "MatmulGradKernel"),
        PaddleKernel("add_grad", "AddGradKernel", ("sum", "copy")),
        PaddleKernel("subtract_grad", "SubtractGradKernel", ("sum", "copy", "scale")),
        PaddleKernel("multiply_grad", "MultiplyGradKernel", ("multiply", "sum", "copy")),
        PaddleKernel("divide_grad", "DivideGradKernel", ("divide", "multiply", "scale", "sum", "copy")),
        PaddleKernel("div_scale", "DivScaleKernel", ("fill", "divide")),
        PaddleKernel("sum_grad", "SumGradKernel", ("copy",)),
        PaddleKernel("split", "SplitKernel", ("copy",)),
        PaddleKernel("split_with_num", "SplitWithNumKernel", ("copy",)),
        PaddleKernel("concat", "ConcatKernel", ("copy",)),
        PaddleKernel("concat_grad", "ConcatGradKernel", ("copy",)),
        PaddleKernel("expand", "ExpandKernel", ("copy",)),
        PaddleKernel("transpose", "TransposeKernel", ("copy",)),
        PaddleKernel("transpose_grad", "TransposeGradKernel", ("copy",)),
        PaddleKernel("slice", "SliceKernel", ("copy",)),
        PaddleKernel("unsqueeze", "UnsqueezeKernel", ("copy",)),
        PaddleKernel("set_value_with_tensor", "SetTensorValueKernel", ("copy",)),
        PaddleKernel("gather", "GatherKernel"),
        PaddleKernel("gather_grad", "GatherGradKernel"),
        PaddleKernel("index_select", "IndexSelectKernel"),
        PaddleKernel("index_select_grad", "IndexSelectGradKernel"),
        PaddleKernel("embedding", "EmbeddingKernel"),
        PaddleKernel("embedding_grad", "EmbeddingGradKernel"),
        # offsets in int64, then a lookup of x's elements
        PaddleKernel("take_along_axis", "TakeAlongAxisKernel", ("embedding",),
                     fixed=tuple((op, "int64") for op in ("fill", "arange", "multiply", "add"))),
        PaddleKernel("cross_entropy_with_softmax", "CrossEntropyWithSoftmaxKernel"),
        PaddleKernel("cross_entropy_with_softmax_grad", "CrossEntropyWithSoftmaxGradKernel"),
    ]
    table += _issue37_kernels()
    table += [PaddleKernel(slot_row(kind, i), f"{kind.capitalize()}Slot{i}Kernel") for kind in SLOT_KINDS
              for i in range(SLOTS)]
    return tuple(table)


# Wrappers for ops the plugins define: per kind, SLOTS Paddle kernels of the shape of Paddle's
# attribute-free elementwise kernels (unary: x -> out, binary: x, y -> out, broadcast), whose
# Paddle name and op each device's config gives (wrappers.h: ANYCHIP_PK_SLOT).
SLOT_KINDS = ("unary", "binary")
SLOTS = 8


def slot_row(kind: str, index: int) -> str:
    return f"anychip_{kind}_slot_{index}"


def _i64(*ops: str) -> tuple[tuple[str, str], ...]:
    return tuple((op, "int64") for op in ops)


def _f32(*ops: str) -> tuple[tuple[str, str], ...]:
    return tuple((op, "float32") for op in ops)


_ALL_INPUTS = "kernel->InputAt({}).SetBackend(phi::Backend::ALL_BACKEND);"
_TRIANGLE = _i64("arange", "subtract", "less_equal", "greater_equal", "fill")
_POSITIONS = _f32("arange", "fill", "where", "scale", "max", "equal", "cast")
_OFFSETS = _i64("fill", "arange", "multiply", "add")
_RANDOM = _f32("scale", "cast")


def _issue37_kernels() -> list[PaddleKernel]:
    """Issue 37's kernels: what PaddleNLP's model families and their training reach, each a
    composition of base ops (see wrappers.h for each one's formula)."""
    copies = [("squeeze", "Squeeze"), ("squeeze_grad", "SqueezeGrad"), ("unsqueeze_grad", "UnsqueezeGrad"),
              ("reshape", "Reshape"), ("reshape_grad", "ReshapeGrad"), ("flatten", "Flatten"),
              ("flatten_grad", "FlattenGrad"), ("assign", "Assign"), ("contiguous", "Contiguous"),
              ("strided_copy", "StridedCopy"), ("tile", "Tile"), ("flip", "Flip"), ("roll", "Roll"),
              ("roll_grad", "RollGrad"), ("stack", "Stack"), ("stack_grad", "StackGrad"), ("expand_as", "ExpandAs")]
    table = [PaddleKernel(op, f"{cls}Kernel", ("copy",)) for op, cls in copies]
    table += [
        PaddleKernel("fill", "FillKernel"),
        PaddleKernel("slice_grad", "SliceGradKernel", ("fill", "copy")),
        PaddleKernel("strided_slice", "StridedSliceKernel", ("copy",)),
        PaddleKernel("strided_slice_grad", "StridedSliceGradKernel", ("fill", "copy")),
        PaddleKernel("tile_grad", "TileGradKernel", ("sum", "copy")),
        PaddleKernel("expand_grad", "ExpandGradKernel", ("sum", "copy")),
        PaddleKernel("expand_as_grad", "ExpandAsGradKernel", ("sum", "copy")),
        *(PaddleKernel(op, f"{cls}Kernel", ("where", "fill"), fixed=_TRIANGLE)
          for op, cls in [("tril", "Tril"), ("triu", "Triu"), ("tril_grad", "TrilGrad"), ("triu_grad", "TriuGrad"),
                          ("eye", "Eye")]),
        PaddleKernel("one_hot", "OneHotKernel", ("cast",), "kernel->OutputAt(0).SetDataType(phi::DataType::FLOAT32);",
                     fixed=_i64("arange", "equal") + (("cast", "bool"),)),
        # start, end and step are read on the host: Paddle must not move them first
        PaddleKernel("arange_tensor", "ArangeTensorKernel", ("arange",),
                     " ".join(_ALL_INPUTS.format(i) for i in range(3))),
        PaddleKernel("isnan", "IsnanKernel", ("not_equal",), _BOOL_OUTPUT),
        PaddleKernel("isinf", "IsinfKernel", ("abs", "equal", "fill"), _BOOL_OUTPUT),
        PaddleKernel("isfinite", "IsfiniteKernel", ("subtract", "equal", "fill"), _BOOL_OUTPUT),
        *(PaddleKernel(op, f"{cls}Kernel", ("cast",), _BOOL_OUTPUT, fixed=(("where", "bool"), ("fill", "bool")))
          for op, cls in [("logical_and", "LogicalAnd"), ("logical_or", "LogicalOr"), ("logical_xor", "LogicalXor"),
                          ("logical_not", "LogicalNot")]),
        PaddleKernel("exp_grad", "ExpGradKernel", ("multiply",)),
        PaddleKernel("tanh_grad", "TanhGradKernel", ("multiply", "scale")),
        PaddleKernel("sigmoid_grad", "SigmoidGradKernel", ("multiply", "scale")),
        PaddleKernel("sqrt_grad", "SqrtGradKernel", ("scale", "divide")),
        PaddleKernel("rsqrt_grad", "RsqrtGradKernel", ("scale", "multiply")),
        PaddleKernel("log_grad", "LogGradKernel", ("fill", "divide", "multiply")),
        PaddleKernel("abs_grad", "AbsGradKernel", ("fill", "scale", "less_than", "greater_than", "where")),
        PaddleKernel("silu_grad", "SiluGradKernel", ("sigmoid", "scale", "multiply")),
        PaddleKernel("pow_grad", "PowGradKernel", ("scale", "pow", "multiply")),
        PaddleKernel("square", "SquareKernel", ("multiply",)),
        PaddleKernel("square_grad", "SquareGradKernel", ("scale", "multiply")),
        PaddleKernel("reciprocal", "ReciprocalKernel", ("fill", "divide")),
        PaddleKernel("reciprocal_grad", "ReciprocalGradKernel", ("scale", "multiply")),
        PaddleKernel("sign", "SignKernel", ("fill", "less_than", "greater_than", "where")),
        PaddleKernel("relu", "ReluKernel", ("fill", "greater_than", "where")),
        PaddleKernel("relu_grad", "ReluGradKernel", ("fill", "greater_than", "where")),
        PaddleKernel("leaky_relu", "LeakyReluKernel", ("fill", "greater_than", "scale", "where")),
        PaddleKernel("leaky_relu_grad", "LeakyReluGradKernel", ("fill", "greater_than", "scale", "where")),
        *(PaddleKernel(op, f"{cls}Kernel", ("abs", "scale", "fill", "divide", "multiply", "subtract", "exp", "less_than",
                                            "where", "add", "tanh"))
          for op, cls in [("gelu", "Gelu"), ("gelu_grad", "GeluGrad")]),
        *(PaddleKernel(op, f"{cls}Kernel", ("fill", "scale", "equal", "greater_than", "less_than", "where", "sum",
                                            "copy"))
          for op, cls in [("maximum_grad", "MaximumGrad"), ("minimum_grad", "MinimumGrad")]),
        PaddleKernel("where_grad", "WhereGradKernel", ("fill", "where", "sum", "copy")),
        PaddleKernel("clip", "ClipKernel", ("fill", "maximum", "minimum")),
        PaddleKernel("clip_grad", "ClipGradKernel", ("fill", "greater_equal", "less_equal", "where")),
        PaddleKernel("mean_all", "MeanAllKernel"),
        PaddleKernel("mean_all_grad", "MeanAllGradKernel", ("fill", "divide", "copy")),
        PaddleKernel("mean_grad", "MeanGradKernel", ("fill", "divide", "copy")),
        PaddleKernel("min", "MinKernel", ("scale", "max")),
        PaddleKernel("logsumexp", "LogsumexpKernel", ("max", "subtract", "exp", "sum", "log", "add")),
        *(PaddleKernel(op, f"{cls}Kernel", ("cast",), _BOOL_OUTPUT,
                       fixed=_f32("fill", "not_equal", "max", "scale", "cast") + (("cast", "bool"),))
          for op, cls in [("any", "Any"), ("all", "All")]),
        PaddleKernel("log_softmax", "LogSoftmaxKernel", ("fill", "max", "subtract", "exp", "sum", "log")),
        PaddleKernel("log_softmax_grad", "LogSoftmaxGradKernel", ("fill", "sum", "exp", "multiply", "subtract")),
        # mean and variance are float32 (Paddle's LayerNormParamType for 16-bit x) or x's dtype
        PaddleKernel("layer_norm", "LayerNormKernel",
                     ("copy", "mean", "subtract", "multiply", "scale", "rsqrt", "fill", "add", "cast")),
        PaddleKernel("layer_norm_grad", "LayerNormGradKernel",
                     ("copy", "cast", "scale", "rsqrt", "subtract", "multiply", "sum", "mean", "fill"),
                     fixed=_f32("cast")),
        PaddleKernel("uniform", "UniformKernel", ("cast",), fixed=_RANDOM),
        PaddleKernel("gaussian", "GaussianKernel", ("cast",), fixed=_RANDOM),
        PaddleKernel("randint", "RandintKernel", ("copy",), fixed=(("copy", "int64"), ("copy", "int32"))),
        PaddleKernel("dropout", "DropoutRawKernel", ("fill", "copy", "multiply", "divide", "where"),
                     fixed=(("copy", "bool"),)),
        PaddleKernel("dropout_grad", "DropoutGradRawKernel", ("fill", "copy", "multiply", "divide", "where")),
        *(PaddleKernel(op, f"{cls}Kernel", ("copy", "scale", "max", "equal", "where"), fixed=_POSITIONS)
          for op, cls in [("topk", "Topk"), ("argsort", "Argsort"), ("argmax", "ArgMax"), ("argmin", "ArgMin")]),
        *(PaddleKernel(op, f"{cls}Kernel", ("embedding_grad", "copy", "fill"), fixed=_OFFSETS + (("cast", "int32"),))
          for op, cls in [("take_along_axis_grad", "TakeAlongAxisGrad"), ("topk_grad", "TopkGrad"),
                          ("argsort_grad", "ArgsortGrad")]),
        *(PaddleKernel(op, f"{cls}Kernel", ("copy", "where", "fill", "matmul"), fixed=_TRIANGLE)
          for op, cls in [("cumsum", "Cumsum"), ("cumsum_grad", "CumsumGrad")]),
        # the learning rate and the beta powers are read on the host, where Paddle may keep them
        PaddleKernel("adamw", "AdamwDenseKernel", ("cast",),
                     " ".join(_ALL_INPUTS.format(i) for i in (2, 6, 7, 9)),
                     fixed=_f32("cast", "copy", "scale", "add", "multiply", "sqrt", "divide", "subtract", "fill")),
        PaddleKernel("sgd", "SGDDenseKernel", ("cast",), _ALL_INPUTS.format(1),
                     fixed=_f32("cast", "copy", "scale", "subtract")),
        PaddleKernel("adam", "AdamDenseKernel", ("cast",),
                     " ".join(_ALL_INPUTS.format(i) for i in (2, 6, 7, 9)),
                     fixed=_f32("cast", "copy", "scale", "add", "multiply", "sqrt", "divide", "subtract", "fill")),
        *(PaddleKernel(op, f"Reduce{cls}GradKernel", ("equal", "fill", "where", "sum", "copy", "multiply", "divide"))
          for op, cls in [("max_grad", "Max"), ("min_grad", "Min")]),
        # index [..., k] rows of x's first k dimensions, as int64 row offsets
        PaddleKernel("gather_nd", "GatherNdKernel", ("copy", "embedding"), fixed=_i64("fill", "multiply", "add")),
        PaddleKernel("gather_nd_grad", "GatherNdGradKernel", ("copy", "embedding_grad"),
                     fixed=_i64("fill", "multiply", "add")),
        PaddleKernel("scatter_nd_add", "ScatterNdAddKernel", ("copy", "embedding_grad", "add"),
                     fixed=_i64("fill", "multiply", "add")),
        PaddleKernel("index_add", "IndexAddKernel", ("copy", "embedding_grad", "add")),
    ]
    return table


PADDLE_KERNELS = _kernels()


# --- C++ registration table of libanychip_paddle_kernels.so (generated at build time) ---------

def _cxx_part(index: int, rows: list[PaddleKernel]) -> str:
    lines = [f"// Generated from core/frontends/paddle/kernel_table.py (part {index}): do not edit.",
             '#include "table.h"', "", "namespace anychip_pk {", "namespace {"]
    for i, pk in enumerate(rows):
        if pk.body:
            lines.append(f"void define_{i}(const phi::KernelKey&, phi::Kernel* kernel) {{ {pk.body} }}")
    lines += ["}  // namespace", "", f"void table_part_{index}(const RowSink& sink) {{"]
    for i, pk in enumerate(rows):
        define = f"define_{i}" if pk.body else "define_nothing"
        instances = ", ".join(f"ANYCHIP_PK_INSTANCE({pk.wrapper}, {cpp})" for cpp in CPP_TYPES.values())
        lines.append(f'  sink(Row{{"{pk.name}", {define}, {{{instances}}}}});')
    lines += ["}", "", "}  // namespace anychip_pk", ""]
    return "\n".join(lines)


def cxx_sources(parts: int) -> dict[str, str]:
    """{file name: C++ source} of the table: ``parts`` files holding the rows (compiled in
    parallel: each instantiates its wrappers for every dtype) and ``table.cc``, which visits
    them all."""
    chunks = [list(PADDLE_KERNELS[i::parts]) for i in range(parts)]
    files = {f"table_{i}.cc": _cxx_part(i, rows) for i, rows in enumerate(chunks)}
    index = ["// Generated from core/frontends/paddle/kernel_table.py: do not edit.", '#include "table.h"', "",
             "namespace anychip_pk {"]
    index += [f"void table_part_{i}(const RowSink& sink);" for i in range(parts)]
    index += ["", "void for_each_row(const RowSink& sink) {"]
    index += [f"  table_part_{i}(sink);" for i in range(parts)]
    index += ["}", "", "}  // namespace anychip_pk", ""]
    files["table.cc"] = "\n".join(index)
    return files


def _main(argv: list[str]) -> None:
    """``python kernel_table.py --cxx DIR --parts N``: writes the table's C++ sources
    into DIR (each only when its text changed, so that an unchanged table recompiles nothing)."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=_main.__doc__)
    parser.add_argument("--cxx", required=True, type=Path, help="folder for the generated sources")
    parser.add_argument("--parts", type=int, default=4, help="files the rows are split into")
    args = parser.parse_args(argv)
    args.cxx.mkdir(parents=True, exist_ok=True)
    for name, text in cxx_sources(args.parts).items():
        path = args.cxx / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
