"""Paddle kernels for anychip devices: the base-op kernels a plugin registered, as Paddle kernels.

For each bridged device, the base-op kernels its plugin registered (``add``, ``exp``,
``matmul``, ... in anychip's KernelRegistry, see kernel.h's base-op ABI) become Paddle kernels
of the device's Paddle type, so that ``paddle.add(x, y)`` on an ``npu`` tensor runs the npu
plugin's C kernel instead of Paddle's CPU kernel with copies. Vendors never see Paddle: the
wrappers (``csrc/kernels/wrappers.h``) turn Paddle's DenseTensors into AnychipTensor
descriptors, and ``glue.h`` launches the plugin's kernel as anychip.ops does.

The wrappers are compiled once, at install: ``libanychip_paddle_kernels.so`` holds every
Paddle kernel of the table (``kernel_table``) for every dtype. Per device, this module
plans which of them the plugin's kernels cover (``plan``) and writes the config that a copy of
the library, beside the device's bridge in the CustomDevice folder (``root``), reads
when Paddle loads it (``csrc/kernels/loader.cc``): the Paddle kernels and dtypes to
register, and the plugin kernel behind each (base op, dtype). Nothing is compiled at run time.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ...kernels import NativeKernel
from ...native import library_path
from .kernel_table import CPP_TYPES, PADDLE_KERNELS, SLOT_KINDS, SLOTS, slot_row


# device name -> why its Paddle kernels are missing (for `anychip devices` and the tests)
problems: dict[str, str] = {}


def _native(registry, op: str, device: str, dtype: str) -> NativeKernel | None:
    kernel = registry.find(op, device, dtype)
    return kernel.forward if kernel is not None and isinstance(kernel.forward, NativeKernel) else None


def rows() -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, str]]]:
    """The Paddle kernels the bridge can serve, from the op definitions and the library's table:
    {Paddle kernel: the base ops it launches} and {slot row: (Paddle kernel, op)} for the Paddle
    kernels that ops the plugins define name without a row of their own: each takes a slot of
    its op's kind (an attribute-free unary or binary op), in the order of the Paddle names. An op
    that names a Paddle kernel no row or slot can serve is listed by :func:`unserved`."""
    from ...ops.defs import definitions  # here: anychip.ops imports anychip.frontends.paddle, which imports this module

    named = {pk: op for op in definitions().values() for pk in op.paddle}
    launches = {}
    for pk in PADDLE_KERNELS:
        if pk.base_ops:
            launches[pk.name] = pk.base_ops
        elif pk.name in named:
            launches[pk.name] = (named[pk.name].name,)
    slots, free = {}, {kind: [slot_row(kind, i) for i in range(SLOTS)] for kind in SLOT_KINDS}
    for name, op in sorted(named.items()):
        if name in launches or op.category not in SLOT_KINDS or op.attrs or not free[op.category]:
            continue
        slots[free[op.category].pop(0)] = (name, op.name)
        launches[name] = (op.name,)
    return launches, slots


def unserved() -> dict[str, str]:
    """{Paddle kernel: why}: the Paddle kernels that op definitions name and the bridge cannot serve."""
    from ...ops.defs import definitions

    def why(op) -> str:
        if op.category not in SLOT_KINDS:
            return f"the bridge's table has no wrapper for it, and slots take only {' or '.join(SLOT_KINDS)} ops"
        if op.attrs:
            return f"{op.name} has attrs, and the slot wrappers pass none"
        return f"every {op.category} slot is taken"

    launches, _slots = rows()
    return {pk: why(op) for op in definitions().values() for pk in op.paddle if pk not in launches}


def plan(registry, device: str) -> tuple[dict[tuple[str, str], NativeKernel], dict[str, list[str]]]:
    """What the device's library holds: {(base op, dtype): kernel} and {Paddle kernel: dtypes}.
    Only C-ABI kernels (NativeKernel) count; Python kernels have no place in a C++ library.
    The table holds every base-op kernel of the device, not only those of the served dtypes: a
    wrapper may need one of another dtype (e.g. ``cast`` of an int32 index to int64)."""
    from ...ops.defs import definitions

    launches, _slots = rows()
    fixed = {pk.name: pk.fixed for pk in PADDLE_KERNELS}
    served: dict[str, list[str]] = {}
    for name, ops in launches.items():
        if any(_native(registry, op, device, d) is None for op, d in fixed.get(name, ())):
            continue
        dtypes = [d for d in CPP_TYPES if all(_native(registry, op, device, d) is not None for op in ops)]
        if dtypes:
            served[name] = dtypes
    base = [op.name for op in definitions().values() if not op.fused]
    used = {(op, d): k for op in base for d in CPP_TYPES
            if (k := _native(registry, op, device, d)) is not None} if served else {}
    return used, served


def library() -> Path:
    """The Paddle kernel library built at install (absent when anychip was built without Paddle)."""
    return library_path("anychip_paddle_kernels")


def config(device: str, paddle_type: str, used, served) -> str:
    """The config of ``device``'s copy of the library (the format loader.cc reads)."""
    lines = [f"device={device}", f"paddle_type={paddle_type}"]
    lines += [f"slot={row} {name} {op}" for row, (name, op) in rows()[1].items() if name in served]
    lines += [f"serve={name} {' '.join(dtypes)}" for name, dtypes in served.items()]
    for (op, dtype), k in sorted(used.items()):
        if any(c.isspace() for c in k.symbol) or "\n" in k.library:
            raise ValueError(f"kernel {op}/{dtype}: symbol {k.symbol!r} or library {k.library!r} "
                             "cannot be written to a kernel config")
        lines.append(f"kernel={op} {dtype} {int(k.host_code)} {k.symbol} {k.library}")
    return "\n".join(lines) + "\n"


def configs(kernel_registry, devices: dict[str, dict]) -> dict[str, str]:
    """{device: its kernel library config} for the bridged ``devices`` (``root``'s configs)
    whose plugins registered base-op kernels. Never raises: a device left out has the reason on
    stderr and in ``problems`` (its Paddle ops fall back to the CPU, counted)."""
    out = {}
    missing = None if library().exists() else (
        f"{library()} is missing: anychip was built without Paddle's headers; install paddlepaddle "
        "first, then reinstall anychip")
    for device, conf in devices.items():
        used, served = plan(kernel_registry, device)
        if not served:
            continue
        try:
            if missing:
                raise RuntimeError(missing)
            out[device] = config(device, conf["paddle_type"], used, served)
            problems.pop(device, None)
        except Exception as exc:  # noqa: BLE001 -- any failure must leave Paddle importable
            problems[device] = f"Paddle kernels not available: {exc}"
            print(f"anychip: {device}: {problems[device]}\nanychip: {device}'s Paddle ops fall back to "
                  "the CPU", file=sys.stderr)
    return out
