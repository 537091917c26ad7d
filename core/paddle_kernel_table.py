"""The Paddle kernels anychip serves on a device, and the base ops each one is made of.

One row per Paddle kernel: its name in Paddle's registry, the C++ wrapper in
``src/paddle_kernels/wrappers.h`` that implements it over base-op kernels, the base ops it
launches (a device gets the Paddle kernel for the dtypes its plugin has all of them in), and
what its PD_REGISTER_PLUGIN_KERNEL body sets. ``anychip.paddle_kernels`` plans and builds from
this table; this module imports nothing of anychip's, so that a build step can read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

# C++ type of each anychip dtype in a PD_REGISTER_PLUGIN_KERNEL dtype list.
CPP_TYPES = {
    "float32": "float", "float16": "phi::dtype::float16", "bfloat16": "phi::dtype::bfloat16",
    "float64": "double", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t",
    "int32": "int32_t", "int64": "int64_t", "bool": "bool",
}
PHI_DTYPES = {
    "float32": "FLOAT32", "float16": "FLOAT16", "bfloat16": "BFLOAT16", "float64": "FLOAT64",
    "int8": "INT8", "uint8": "UINT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "bool": "BOOL",
}

_BOOL_OUTPUT = "kernel->OutputAt(0).SetDataType(phi::DataType::BOOL);"
_ANY_OUTPUT = "kernel->OutputAt(0).SetDataType(phi::DataType::UNDEFINED);"


@dataclass(frozen=True)
class PaddleKernel:
    """Paddle kernel ``name`` served by wrapper ``wrapper`` (in wrappers.h) from base ops
    ``base_ops``: registered for the dtypes every one of them has on the device."""

    name: str
    wrapper: str
    base_ops: tuple[str, ...]
    body: str = ""  # the PD_REGISTER_PLUGIN_KERNEL body (e.g. the output dtype of a comparison)
    fixed: tuple[tuple[str, str], ...] = ()  # (base op, dtype) also needed, whatever the served dtype


def _kernels() -> tuple[PaddleKernel, ...]:
    binary = [("add", "Add"), ("subtract", "Subtract"), ("multiply", "Multiply"), ("divide", "Divide"),
              ("maximum", "Maximum"), ("minimum", "Minimum"), ("elementwise_pow", "ElementwisePow")]
    compare = [("equal", "Equal"), ("not_equal", "NotEqual"), ("less_than", "LessThan"),
               ("less_equal", "LessEqual"), ("greater_than", "GreaterThan"), ("greater_equal", "GreaterEqual")]
    unary = [("exp", "Exp"), ("log", "Log"), ("sqrt", "Sqrt"), ("rsqrt", "Rsqrt"), ("silu", "Silu"),
             ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("abs", "Abs")]
    table = [PaddleKernel(op, f"{cls}Kernel", (op,)) for op, cls in binary + unary]
    table += [PaddleKernel(op, f"{cls}Kernel", (op,), _BOOL_OUTPUT) for op, cls in compare]
    table += [
        PaddleKernel("scale", "ScaleKernel", ("scale",)),
        PaddleKernel("pow", "PowKernel", ("pow",)),
        PaddleKernel("cast", "CastKernel", ("cast",), _ANY_OUTPUT),
        PaddleKernel("where", "WhereKernel", ("where",)),
        PaddleKernel("full", "FullKernel", ("fill",)),
        # x only gives the shape: Paddle must not copy it to the device first
        PaddleKernel("full_like", "FullLikeKernel", ("fill",), "kernel->InputAt(0).SetBackend(phi::Backend::ALL_BACKEND);"),
        PaddleKernel("sum", "SumKernel", ("sum",), _ANY_OUTPUT),
        PaddleKernel("mean", "MeanKernel", ("mean",)),
        PaddleKernel("max", "MaxKernel", ("max",)),
        PaddleKernel("softmax", "SoftmaxKernel", ("softmax",)),
        PaddleKernel("softmax_grad", "SoftmaxGradKernel", ("softmax_grad",)),
        PaddleKernel("matmul", "MatmulKernel", ("matmul",)),
        PaddleKernel("matmul_grad", "MatmulGradKernel", ("matmul_grad",)),
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
        PaddleKernel("gather", "GatherKernel", ("index_select",)),
        PaddleKernel("gather_grad", "GatherGradKernel", ("embedding_grad",)),
        PaddleKernel("index_select", "IndexSelectKernel", ("index_select",)),
        PaddleKernel("index_select_grad", "IndexSelectGradKernel", ("embedding_grad",)),
        PaddleKernel("embedding", "EmbeddingKernel", ("embedding",)),
        PaddleKernel("embedding_grad", "EmbeddingGradKernel", ("embedding_grad",)),
        # offsets in int64, then a lookup of x's elements
        PaddleKernel("take_along_axis", "TakeAlongAxisKernel", ("embedding",),
                     fixed=tuple((op, "int64") for op in ("fill", "arange", "multiply", "add"))),
        PaddleKernel("cross_entropy_with_softmax", "CrossEntropyWithSoftmaxKernel", ("cross_entropy_with_softmax",)),
        PaddleKernel("cross_entropy_with_softmax_grad", "CrossEntropyWithSoftmaxGradKernel",
                     ("cross_entropy_with_softmax_grad",)),
    ]
    return tuple(table)


PADDLE_KERNELS = _kernels()


# --- C++ registration table of libanychip_paddle_kernels.so (generated at build time) ---------

def _cxx_part(index: int, rows: list[PaddleKernel]) -> str:
    lines = [f"// Generated from core/paddle_kernel_table.py (part {index}): do not edit.",
             '#include "table.h"', "", "namespace anychip_pk {", "namespace {"]
    for i, pk in enumerate(rows):
        if pk.body:
            lines.append(f"void define_{i}(const phi::KernelKey&, phi::Kernel* kernel) {{ {pk.body} }}")
    lines += ["}  // namespace", "", f"void table_part_{index}(const RowSink& sink) {{"]
    for i, pk in enumerate(rows):
        define = f"define_{i}" if pk.body else "define_nothing"
        lines.append(f'  sink(Row{{"{pk.name}", {define}, {{ANYCHIP_PK_ALL_DTYPES({pk.wrapper})}}}});')
    lines += ["}", "", "}  // namespace anychip_pk", ""]
    return "\n".join(lines)


def cxx_sources(parts: int) -> dict[str, str]:
    """{file name: C++ source} of the table: ``parts`` files holding the rows (compiled in
    parallel: each instantiates its wrappers for every dtype) and ``table.cc``, which visits
    them all."""
    chunks = [list(PADDLE_KERNELS[i::parts]) for i in range(parts)]
    files = {f"table_{i}.cc": _cxx_part(i, rows) for i, rows in enumerate(chunks)}
    index = ["// Generated from core/paddle_kernel_table.py: do not edit.", '#include "table.h"', "",
             "namespace anychip_pk {"]
    index += [f"void table_part_{i}(const RowSink& sink);" for i in range(parts)]
    index += ["", "void for_each_row(const RowSink& sink) {"]
    index += [f"  table_part_{i}(sink);" for i in range(parts)]
    index += ["}", "", "}  // namespace anychip_pk", ""]
    files["table.cc"] = "\n".join(index)
    return files


def _main(argv: list[str]) -> None:
    """``python paddle_kernel_table.py --cxx DIR --parts N``: writes the table's C++ sources
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
