"""Paddle kernels for anychip devices: generated PD_REGISTER_PLUGIN_KERNEL wrappers.

For each bridged device, the base-op kernels its plugin registered (``add``, ``exp``,
``matmul``, ... in anychip's KernelRegistry, see kernel.h's base-op ABI) become Paddle kernels
of the device's Paddle type, so that ``paddle.add(x, y)`` on an ``npu`` tensor runs the npu
plugin's C kernel instead of Paddle's CPU kernel with copies. Vendors never see Paddle: the
wrappers (``src/paddle_kernels/wrappers.h``) turn Paddle's DenseTensors into AnychipTensor
descriptors, and ``glue.h`` launches the plugin's kernel as anychip.ops does.

Per device, this module writes one C++ source (the kernel table and one
PD_REGISTER_PLUGIN_KERNEL per Paddle kernel whose base ops the plugin covers, for the dtypes
they all declare), compiles it against the installed Paddle's headers, and caches the library
by the hash of everything that went into it under ``$ANYCHIP_CACHE_DIR/paddle_kernels``.
paddle_frontend puts it next to the device's bridge in $CUSTOM_DEVICE_ROOT, where
``import paddle`` loads it. A failed build only costs the device its Paddle kernels (its ops fall
back to the CPU, counted as before); the reason goes to stderr and to ``problems``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .kernels import NativeKernel

_HERE = Path(__file__).resolve().parent
_SOURCES = _HERE / "src" / "paddle_kernels"
_INCLUDE = _HERE / "include"

# C++ type of each anychip dtype in a PD_REGISTER_PLUGIN_KERNEL dtype list.
CPP_TYPES = {
    "float32": "float", "float16": "phi::dtype::float16", "bfloat16": "phi::dtype::bfloat16",
    "float64": "double", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t",
    "int32": "int32_t", "int64": "int64_t", "bool": "bool",
}
_PHI_DTYPES = {
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

# device name -> why its Paddle kernels are missing (for `anychip devices` and the tests)
problems: dict[str, str] = {}


def _native(registry, op: str, device: str, dtype: str) -> NativeKernel | None:
    kernel = registry.find(op, device, dtype)
    return kernel.forward if kernel is not None and isinstance(kernel.forward, NativeKernel) else None


def plan(registry, device: str) -> tuple[dict[tuple[str, str], NativeKernel], dict[str, list[str]]]:
    """What the device's library holds: {(base op, dtype): kernel} and {Paddle kernel: dtypes}.
    Only C-ABI kernels (NativeKernel) count; Python kernels have no place in a C++ library.
    The table holds every base-op kernel of the device, not only those of the served dtypes: a
    wrapper may need one of another dtype (e.g. ``cast`` of an int32 index to int64)."""
    from .ops.base import BASE_OPS  # here: anychip.ops imports paddle_frontend, which imports this module

    served: dict[str, list[str]] = {}
    for pk in PADDLE_KERNELS:
        if any(_native(registry, op, device, d) is None for op, d in pk.fixed):
            continue
        dtypes = [d for d in CPP_TYPES
                  if all(_native(registry, op, device, d) is not None for op in pk.base_ops)]
        if dtypes:
            served[pk.name] = dtypes
    used = {(op, d): k for op in BASE_OPS for d in CPP_TYPES
            if (k := _native(registry, op, device, d)) is not None} if served else {}
    return used, served


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def generate(device: str, paddle_type: str, used, served) -> str:
    """The C++ source of ``device``'s Paddle kernel library."""
    by_name = {pk.name: pk for pk in PADDLE_KERNELS}
    lines = [
        f"// Generated by anychip.paddle_kernels for device {device} (Paddle type {paddle_type}).",
        '#include "wrappers.h"', "",
        "namespace anychip_pk {",
        f"const char kDeviceName[] = {_c_string(device)};",
        "const KernelEntry kKernels[] = {",
    ]
    for (op, dtype), k in sorted(used.items()):
        lines.append(f"    {{{_c_string(op)}, phi::DataType::{_PHI_DTYPES[dtype]}, {_c_string(k.library)}, "
                     f"{_c_string(k.symbol)}, {'true' if k.host_code else 'false'}}},")
    lines += ["};", f"const size_t kNumKernels = {len(used)};", "}  // namespace anychip_pk", ""]
    for name, dtypes in served.items():
        pk = by_name[name]
        types = ", ".join(CPP_TYPES[d] for d in dtypes)
        lines.append(f"PD_REGISTER_PLUGIN_KERNEL({name}, {paddle_type}, ALL_LAYOUT, anychip_pk::{pk.wrapper}, "
                     f"{types}) {{ {pk.body} }}")
    return "\n".join(lines) + "\n"


def _paddle_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("paddle")  # not imported: Paddle must load after the root is written
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("paddle is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def compile_command(source: Path, output: Path) -> list[str]:
    paddle = _paddle_dir()
    return [os.environ.get("CXX", "c++"), "-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
            "-DPADDLE_WITH_CUSTOM_DEVICE", "-DPADDLE_WITH_CUSTOM_KERNEL",
            f"-I{_SOURCES}", f"-I{_INCLUDE}", f"-I{paddle / 'include'}",
            f"-I{paddle / 'include' / 'third_party'}",
            str(source), "-o", str(output),
            # the kernel registry and DenseTensor live in libpaddle, which Python has loaded already
            f"-L{paddle / 'base'}", "-l:libpaddle.so", f"-Wl,-rpath,{paddle / 'base'}", "-ldl"]


def cache_root() -> Path:
    base = os.environ.get("ANYCHIP_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "anychip") / "paddle_kernels"


def _digest(source: str, command: list[str]) -> str:
    h = hashlib.sha256(source.encode())
    h.update(repr(command).encode())
    for header in sorted(_SOURCES.glob("*.h")) + sorted((_INCLUDE / "anychip").glob("*.h")):
        h.update(header.read_bytes())
    h.update((_paddle_dir() / "include" / "paddle" / "phi" / "core" / "kernel_registry.h").read_bytes())
    return h.hexdigest()[:16]


def build(device: str, source: str) -> Path:
    """The compiled library of ``source``, from the cache or compiled now (seconds: Paddle's
    headers are heavy). A failure is cached too (same inputs, same failure) and raised."""
    name = f"libanychip_{device}_kernels.so"
    folder = cache_root() / _digest(source, compile_command(Path("src.cc"), Path(name)))
    if not folder.exists():
        _compile(source, name, folder)
    if (folder / "error.txt").exists():
        raise RuntimeError((folder / "error.txt").read_text())
    return folder / name


def _compile(source: str, name: str, folder: Path) -> None:
    """Compiles ``source`` into ``folder/name`` (or writes ``folder/error.txt``), atomically."""
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "src.cc").write_text(source)
    command = compile_command(tmp / "src.cc", tmp / name)
    (tmp / "command.txt").write_text(shlex.join(command) + "\n")
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True)
    (tmp / "build.log").write_text(f"{time.monotonic() - start:.1f} s\n{result.stdout}{result.stderr}")
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        (tmp / "error.txt").write_text(f"compiling {name} failed (exit {result.returncode}):\n{tail}")
        (tmp / name).unlink(missing_ok=True)
    try:
        tmp.rename(folder)  # atomic: a concurrent build sees all of it or none
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
        if not folder.exists():
            raise


def libraries(kernel_registry, configs: dict[str, dict]) -> dict[str, Path]:
    """{device: its Paddle kernel library} for the bridged devices ``configs`` (paddle_frontend's)
    whose plugins registered base-op kernels. Never raises: a device whose library cannot be
    built is left out, with the reason on stderr and in ``problems``."""
    out = {}
    for device, config in configs.items():
        used, served = plan(kernel_registry, device)
        if not served:
            continue
        try:
            out[device] = build(device, generate(device, config["paddle_type"], used, served))
            problems.pop(device, None)
        except Exception as exc:  # noqa: BLE001 -- any failure must leave Paddle importable
            problems[device] = f"Paddle kernels not built: {exc}"
            print(f"anychip: {device}: {problems[device]}\nanychip: {device}'s Paddle ops fall back to "
                  "the CPU", file=sys.stderr)
    return out
