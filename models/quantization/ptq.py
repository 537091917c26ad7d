"""Post-training quantization of a Llama-family checkpoint, PaddleNLP's PTQ flow:

1. Calibration: the float model runs on calibration token sequences on the chosen device, and
   the input of every projection is recorded on the host: its Hessian ``X^T X`` (for GPTQ) and
   its per-channel absolute maximum (for SmoothQuant).
2. WINT8 / WINT4: every projection becomes weight-only int8 / int4 (symmetric, per channel or
   per group), by round-to-nearest or by GPTQ with the Hessian of its input.
3. A8W8: with ``smooth``, activation outliers migrate into the weights first (SmoothQuant):
   qkv and gate/up take the scales through the RMSNorm before them, down_proj through up_proj's
   rows (``silu(gate) * up`` is linear in up); o_proj is left unsmoothed, since its input channels
   are attention outputs of grouped heads that no single preceding weight scales alone. Then
   every projection becomes int8 per output channel, with activations quantized per token at
   run time.

The embedding and the output head stay as the checkpoint holds them (float), as PaddleNLP's
PTQ leaves them. Hessians come from the float model in one pass (not layer by layer through the
already-quantized layers, as the GPTQ paper does): simpler, and measured in the README table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from anychip.ops.dispatch import place

from ..checkpoint import Checkpoint, W8A8Weight
from ..llama import LlamaForCausalLM, paddle
from .algorithms import Hessian, gptq, rtn, smooth_scales, w8a8

QUANT_TYPES = ("wint8", "wint4", "a8w8")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# which recorded input feeds each projection (the model fuses q/k/v and gate/up)
INPUT_OF = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o", "gate_proj": "gate_up",
            "up_proj": "gate_up", "down_proj": "down"}


@dataclass
class InputStats:
    hessian: Hessian
    absmax: np.ndarray


# How many times the first token of each calibration sequence counts in the Hessians. It is the
# attention sink: most heads put much of their weight on it, so the error of its value vector
# reaches nearly every later token, while as one row in 512 GPTQ all but ignores it. Measured on
# SmolLM2 (WINT4 g64 GPTQ, perplexity on models/eval_data/english.txt, float 29.24): weight 1
# 42.3 (no better than rounding's 42.1), 64 33.3 (32.2 with act order), 256 32.7 with act order.
SINK_WEIGHT = 64


class _Recorder:
    """Stands in for one of a layer's linears: records its input, then runs it."""

    def __init__(self, linear, stats: InputStats):
        self.linear, self.stats = linear, stats

    def __call__(self, x):
        rows = x.numpy().reshape(-1, x.shape[-1]).astype(np.float64)
        self.stats.hessian.add(rows)
        self.stats.hessian.add(np.repeat(rows[:1], SINK_WEIGHT - 1, axis=0))
        np.maximum(self.stats.absmax, np.abs(rows).max(axis=0), out=self.stats.absmax)
        return self.linear(x)


def calibrate(checkpoint: Checkpoint, device: tuple[str, int], sequences: list[list[int]],
              progress: bool = True) -> dict[str, InputStats]:
    """Input statistics of every layer's projections ("layers.<i>.qkv", ".o", ".gate_up",
    ".down") over ``sequences`` run one at a time (so row 0 is each sequence's first token)
    through the float model on ``device``."""
    model = LlamaForCausalLM(checkpoint, device)
    stats = {}
    for i, layer in enumerate(model.blocks):
        for name in ("qkv", "o", "gate_up", "down"):
            linear = getattr(layer, name)
            k = linear.weight.shape[1] * (2 if linear.bits == 4 else 1)
            stats[f"layers.{i}.{name}"] = s = InputStats(Hessian(k), np.zeros(k))
            setattr(layer, name, _Recorder(linear, s))
    dev = place(device)
    with paddle.no_grad():
        for ids in tqdm(sequences, desc="calibrate", unit="seq", disable=not progress):
            tokens = paddle.to_tensor(np.asarray([ids], dtype=np.int64), place=dev)
            positions = paddle.to_tensor(np.arange(len(ids), dtype=np.int64)[None], place=dev)
            model(tokens, positions, last_index=paddle.to_tensor(np.array([len(ids) - 1]), place=dev))
    return stats


def check_scheme(config, quant_type: str, group_size: int) -> None:
    """Refuses, before any work, a scheme the model's projection sizes cannot take."""
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant type must be one of {', '.join(QUANT_TYPES)}, got {quant_type!r}")
    inputs = {"hidden size": config.hidden_size, "intermediate size": config.intermediate_size,
              "attention width": config.num_heads * config.head_dim}
    for what, k in inputs.items():
        if quant_type != "a8w8" and group_size != -1 and k % group_size:
            raise ValueError(f"group size {group_size} does not divide the {what} {k} of this model "
                             f"(input of some projections); choose one that does, or -1 (per channel)")
        if quant_type == "wint4" and k % 64:
            raise ValueError(f"wint4 needs every projection's input size to be a multiple of 64; the {what} is {k}")


def _float(t) -> np.ndarray:
    return t.dequantize() if hasattr(t, "dequantize") else np.asarray(t, dtype=np.float32)


def quantize(checkpoint: Checkpoint, quant_type: str, stats: dict[str, InputStats] | None = None,
             group_size: int = -1, use_gptq: bool = False, smooth: bool = False, alpha: float = 0.5,
             act_order: bool = False, progress: bool = True) -> dict:
    """The checkpoint's tensors with every projection quantized as ``quant_type`` asks."""
    check_scheme(checkpoint.config, quant_type, group_size)
    if (use_gptq or smooth) and stats is None:
        raise ValueError("GPTQ and SmoothQuant need calibration statistics")
    if use_gptq and quant_type == "a8w8":
        raise ValueError("GPTQ applies to the weight-only types (wint8, wint4), not a8w8")
    if act_order and not use_gptq:
        raise ValueError("act_order is a GPTQ option")
    if smooth and quant_type != "a8w8":
        raise ValueError("smoothing applies to a8w8 (it moves activation outliers into int8 weights)")
    tensors = {name: (_float(t) if name.split(".")[-1] in PROJECTIONS or name.endswith("norm") else t)
               for name, t in checkpoint.tensors.items()}
    layers = checkpoint.config.num_layers
    if smooth:
        for i in range(layers):
            _smooth_layer(tensors, stats, i, alpha)
    bits = {"wint8": 8, "wint4": 4}.get(quant_type)
    for i in tqdm(range(layers), desc=f"quantize {quant_type}", unit="layer", disable=not progress):
        for proj in PROJECTIONS:
            key = f"layers.{i}.{proj}"
            w = tensors[key]
            if quant_type == "a8w8":
                tensors[key] = W8A8Weight(*w8a8(w))
            elif use_gptq:
                tensors[key] = gptq(w, stats[f"layers.{i}.{INPUT_OF[proj]}"].hessian.matrix, bits, group_size,
                                    act_order=act_order)
            else:
                tensors[key] = rtn(w, bits, group_size)
    return tensors


def _smooth_layer(tensors: dict, stats: dict[str, InputStats], i: int, alpha: float) -> None:
    p = f"layers.{i}."
    for norm, projs, name in (("attn_norm", ("q_proj", "k_proj", "v_proj"), "qkv"),
                              ("ffn_norm", ("gate_proj", "up_proj"), "gate_up")):
        s = smooth_scales(stats[p + name].absmax, [tensors[p + q] for q in projs], alpha)
        tensors[p + norm] = (tensors[p + norm] / s).astype(np.float32)
        for q in projs:
            tensors[p + q] = (tensors[p + q] * s[None, :]).astype(np.float32)
    s = smooth_scales(stats[p + "down"].absmax, [tensors[p + "down_proj"]], alpha)
    tensors[p + "up_proj"] = (tensors[p + "up_proj"] / s[:, None]).astype(np.float32)
    tensors[p + "down_proj"] = (tensors[p + "down_proj"] * s[None, :]).astype(np.float32)
