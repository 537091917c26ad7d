"""What every op declares and the support table that the README shows, generated from the
kernel registry.

An op's signature, shape rules and argument checks live in its function (``anychip.ops.<name>``,
its docstring states the rules), its reference implementation in its ``OpImpl.reference``, its
kernel contract in anychip/kernel.h; the spec below adds the dtypes, whether it has a backward,
and the tolerance its kernels are tested to.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from ..devices import describe
from ..dtypes import FLOATS as _FLOATS
from ..plugins import registry


@dataclass(frozen=True)
class OpSpec:
    name: str
    summary: str
    dtypes: tuple[str, ...]
    backward: bool
    tolerance: dict  # dtype -> (rtol, atol) of a kernel against the float32 reference

    @property
    def function(self):
        return getattr(importlib.import_module(__package__), self.name)

    @property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.function)


_TOL = {"float32": (1e-4, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)}
_ATTN_TOL = {"float32": (2e-4, 2e-5), "bfloat16": (3e-2, 3e-2), "float16": (4e-3, 4e-3)}

OPS = {s.name: s for s in (
    OpSpec("rms_norm", "RMSNorm, optionally fused with the residual add", _FLOATS, True, _TOL),
    OpSpec("rotary_embedding", "RoPE, half-rotation layout, per-token positions", _FLOATS, True, _TOL),
    OpSpec("swiglu", "silu(gate) * up", _FLOATS, True, _TOL),
    OpSpec("attention", "flash attention, GQA, causal/bool mask, returns LSE", _FLOATS, True, _ATTN_TOL),
    OpSpec("flashmask_attention", "FlashMask column-sparse masked attention", _FLOATS, True, _ATTN_TOL),
    OpSpec("linear", "float linear y = x W^T + b, fwd+bwd", _FLOATS, True,
           {"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 5e-2), "float16": (4e-3, 4e-3)}),
    OpSpec("weight_quantize", "symmetric int8/int4 weight packing, per channel or group", _FLOATS, False, _TOL),
    OpSpec("weight_only_linear", "x @ dequant(W)^T, int8/int4 weights (+ group offsets), grad wrt x", _FLOATS, True,
           {"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 5e-2), "float16": (4e-3, 4e-3)}),
    OpSpec("w8a8_linear", "int8 weights x dynamic per-token int8 activations", _FLOATS, False,
           {"float32": (1e-5, 1e-4), "bfloat16": (2e-2, 5e-2), "float16": (4e-3, 4e-3)}),
    OpSpec("adamw_step", "fused AdamW over a list of parameters (in place)", ("float32", "bfloat16"), False,
           {"float32": (1e-6, 1e-7), "bfloat16": (1e-2, 1e-2)}),
    OpSpec("decoder_step", "a Llama-family decode step in one launch, KV cache in place (dtype: the cache's)",
           _FLOATS, False, {"float32": (1e-4, 1e-4), "bfloat16": (1e-2, 1e-2), "float16": (2e-3, 2e-3)}),
)}

_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _cell(op: OpSpec, device: str) -> str:
    kernels = registry().kernels
    have = [d for d in op.dtypes if kernels.find(op.name, device, d) is not None]
    if not have:
        return "ref"
    text = " ".join(_SHORT[d] for d in have)
    if op.backward:
        grads = [d for d in have if kernels.find(op.name, device, d).backward is not None]
        text += " · fwd+bwd" if len(grads) == len(have) else " · fwd"
    return text


def support_table(devices: list[str] | None = None) -> str:
    """Markdown: one row per op, one column per device; each cell lists the dtypes with a device
    kernel (and whether the backward has one too). "ref" means the op runs its Paddle reference
    there, counted as a fallback."""
    reg = registry()
    for name in devices or ():
        reg.spec(name)  # unknown names raise with the list of known devices
    devices = devices or sorted(reg.devices, key=lambda d: (d != "cpu", d))
    labels = [f"{d} (simulated)" if describe(d).status == "simulated" else d for d in devices]
    lines = ["| op | " + " | ".join(labels) + " |", "|---|" + "---|" * len(devices)]
    for op in OPS.values():
        lines.append(f"| `{op.name}` | " + " | ".join(_cell(op, d) for d in devices) + " |")
    return "\n".join(lines)
