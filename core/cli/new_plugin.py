"""``anychip new-plugin NAME``: writes a pip-installable device plugin package for a new chip."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from ..plugin_template import check_name, render

DESCRIPTION = """\
Write a device plugin package for a new chip into DIR (default ./anychip-NAME). As written it
already works: pip-install it and `anychip devices` lists NAME, Paddle runs on it, and the
conformance kit passes. It holds:

  anychip_NAME/runtime.c   the whole device runtime contract (anychip/device.h) over host
                           memory; the device is listed as simulated until you port it
  anychip_NAME/runtime_book.c
                           compiles in anychip's runtime book (anychip/runtime_book.h): the
                           contract's bookkeeping, which runtime.c calls around each SDK call
  anychip_NAME/kernels.c   one hand-written kernel, swiglu for float32 (anychip/kernel.h)
  anychip_NAME/codegen_target.py
                           the CodeGen target NAME-c: how anychip_codegen renders, compiles
                           and loads generated kernels for NAME
  anychip_NAME/__init__.py the entry point: registers the device, the CodeGen target, swiglu,
                           and rms_norm (fwd+bwd, float32/float16/bfloat16) generated at
                           registration (built once, then cached)
  tests/                   the runtime, the kernels on numpy arrays, and the conformance kit
  README.md                which functions to replace with your SDK's calls, in what order

NAME is what users type (--device NAME): a lowercase letter, then lowercase letters, digits
or _, without cpu, gpu, xpu, npu, dcu, ipu, mlu or cuda in it (Paddle treats those specially)."""


def add_parser(sub, common):
    p = sub.add_parser("new-plugin", parents=[common], help="write a plugin package for a new chip",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", metavar="NAME", help="the device name, e.g. mychip")
    p.add_argument("--dest", metavar="DIR", type=Path,
                   help="folder to write the package into; must be new or empty (default: ./anychip-NAME)")


def _bad_argument(argument: str, message: str) -> int:
    print(f"anychip new-plugin: error: argument {argument}: {message}", file=sys.stderr)
    return 2


def _taken_by(name: str) -> str | None:
    """The installed plugin that already provides device ``name``, if any: a second one would
    be ignored as a conflict."""
    from ..plugins import registry

    return registry().device_plugin.get(name)


def _path_for_shell(path: Path) -> str:
    # pip reads a bare `anychip-x` as a package name on PyPI, `./anychip-x` as a folder
    text = str(path) if path.is_absolute() or str(path).startswith(".") else os.path.join(".", str(path))
    return shlex.quote(text)


def next_steps(dest: Path, name: str) -> str:
    folder = _path_for_shell(dest)
    return f"""\
wrote the plugin package for device {name!r} to {dest}/ (simulated until you port its runtime)

next:
  pip install --no-build-isolation {folder}
      builds lib{name}_runtime.so and lib{name}_kernels.so against anychip's headers
  anychip devices
      lists {name} as simulated (the first run also generates and builds its rms_norm
      kernels, cached afterwards)
  anychip conformance --device {name}
      checks the runtime contract, every op and a tiny Llama on {name}: swiglu float32
      (hand-written) and rms_norm (generated) pass, the other ops are "not declared"
      (they run their reference)
  python -m pytest {_path_for_shell(dest / "tests")}
      its own tests (run them from outside the package folder)

then read {dest / "README.md"}: which functions to replace with your SDK's calls."""


def run(args) -> int:
    name = args.name
    try:
        check_name(name)
    except ValueError as exc:
        return _bad_argument("NAME", str(exc))
    owner = _taken_by(name)
    if owner is not None:
        return _bad_argument("NAME", f"device {name!r} is already provided by the installed plugin "
                                     f"{owner!r}; pick another name (or uninstall that plugin first)")
    dest = args.dest if args.dest is not None else Path(f"anychip-{name}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        return _bad_argument("--dest", f"{str(dest)!r} exists and is not an empty folder; "
                                       "pick a new or empty one")
    try:
        render(dest, name)
    except OSError as exc:
        print(f"anychip new-plugin: error: cannot write {dest}: {exc}", file=sys.stderr)
        return 1
    print(next_steps(dest, name))
    return 0
