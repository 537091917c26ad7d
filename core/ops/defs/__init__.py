"""The op definitions: one :class:`~anychip.ops.definition.OpDef` per op, in one module per op
(or per family of base ops sharing a reference: unary, binary, compare, reduction). Each module
holds its ops in ``DEFINITIONS`` and their kernel contract in words in ``CONTRACT`` (what
anychip/ops.h prints above their attributes); this package finds the modules itself, so adding
an op to anychip is adding a module here (and its kernels). A plugin adds ops of its own through its
``anychip_register_ops`` hook; :func:`definitions` lists both.

Fused ops come first, then the base ops, each in the modules' alphabetical order.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace

from ..definition import OpDef


def _load() -> dict[str, OpDef]:
    found: list[OpDef] = []
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        defined = importlib.import_module(f"{__name__}.{module}")
        found += [replace(op, contract=defined.CONTRACT) for op in defined.DEFINITIONS]
    ordered = sorted(found, key=lambda op: not op.fused)  # stable: the modules' order within each kind
    ops: dict[str, OpDef] = {}
    for op in ordered:
        if op.name in ops:
            raise ImportError(f"op {op.name!r} is defined twice in anychip.ops.defs")
        ops[op.name] = op
    return ops


BUILTIN: dict[str, OpDef] = _load()
BASE_OPS: dict[str, OpDef] = {name: op for name, op in BUILTIN.items() if not op.fused}  # anychip's base ops


def definitions() -> dict[str, OpDef]:
    """Every op: anychip's own, then those the loaded plugins define (``anychip_register_ops``)."""
    from ...plugins import registry

    return {**BUILTIN, **registry().ops}


def definition(name: str) -> OpDef:
    """The definition of op ``name``; ValueError listing the known ops otherwise."""
    ops = definitions()
    if name not in ops:
        raise ValueError(f"op must be one of {', '.join(ops)}, got {name!r}")
    return ops[name]


def base_op(name: str) -> OpDef:
    """The definition of base op ``name`` (anychip's or a plugin's); ValueError listing the base
    ops otherwise."""
    ops = {n: op for n, op in definitions().items() if not op.fused}
    if name not in ops:
        raise ValueError(f"op must be a base op ({', '.join(ops)}), got {name!r}")
    return ops[name]
