"""The op support table that ``anychip ops`` and the README show, generated from the op
definitions (``anychip.ops.defs``) and the kernel registry.

``OPS`` maps each of anychip's fused ops to its :class:`~anychip.ops.definition.OpDef`: the op's
function ``anychip.ops.<name>`` validates its arguments and runs the kernel or its reference.
"""

from __future__ import annotations

from ..devices import describe
from ..plugins import registry
from .definition import OpDef
from .defs import BUILTIN, definitions

OPS: dict[str, OpDef] = {name: op for name, op in BUILTIN.items() if op.fused}

_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _cell(op: OpDef, device: str) -> str:
    kernels = registry().kernels
    have = [d for d in op.dtypes if kernels.find(op.name, device, d) is not None]
    if not have:
        return "ref"
    text = " ".join(_SHORT.get(d, d) for d in have)
    if op.backward:
        grads = [d for d in have if kernels.find(op.name, device, d).backward is not None]
        text += " · fwd+bwd" if len(grads) == len(have) else " · fwd"
    return text


def support_table(devices: list[str] | None = None) -> str:
    """Markdown: one row per fused op (and per op a plugin defines), one column per device; each
    cell lists the dtypes with a device kernel (and whether the backward has one too). "ref"
    means the op runs its reference there, counted as a fallback."""
    reg = registry()
    for name in devices or ():
        reg.spec(name)  # unknown names raise with the list of known devices
    devices = devices or sorted(reg.devices, key=lambda d: (d != "cpu", d))
    labels = [f"{d} (simulated)" if describe(d).status == "simulated" else d for d in devices]
    lines = ["| op | " + " | ".join(labels) + " |", "|---|" + "---|" * len(devices)]
    plugin_ops = [op for name, op in definitions().items() if name not in BUILTIN]
    for op in [*OPS.values(), *plugin_ops]:
        lines.append(f"| `{op.name}` | " + " | ".join(_cell(op, d) for d in devices) + " |")
    return "\n".join(lines)
