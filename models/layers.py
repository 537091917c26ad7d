"""The weights of a Llama-family model on a device: linear layers in float, anychip's
weight-only format or int8 x int8 (A8W8), the token embedding, and the per-layer bundle. They
hold Paddle tensors and call anychip.ops, so they run on whatever device the tensors are on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import anychip.ops as ops
from anychip.ops.dispatch import place
from anychip.frontends.paddle import import_paddle

from .checkpoint import QuantWeight, W8A8Weight

paddle = import_paddle()


def to_device(array: np.ndarray, device: tuple[str, int]):
    tensor = paddle.to_tensor(np.ascontiguousarray(array), place=place(device))
    tensor.stop_gradient = True
    return tensor


def assign(tensor, array: np.ndarray) -> None:
    """Overwrites ``tensor`` with ``array`` where the tensor lives (``Tensor.set_value`` would
    move a device tensor to the CPU)."""
    with paddle.no_grad():
        paddle.assign(paddle.to_tensor(np.ascontiguousarray(array, dtype=np.float32), place=tensor.place), tensor)


def concat_rows(parts: list) -> np.ndarray | QuantWeight:
    """Stacks weights [N_i, K] along N: q, k, v into one qkv projection, gate and up into one.
    Quantized parts of one format stay quantized (rows are independent, so this is exact): all
    W8A8 parts stay W8A8 (per-channel scales, per-token activations: each row's product is the
    same in the stack); W8A8 parts mixed with weight-only ones join them as the weight-only int8
    per-channel weights they are stored as."""
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts, axis=0)
    if all(isinstance(p, W8A8Weight) for p in parts):
        return W8A8Weight(np.concatenate([p.qweight for p in parts]), np.concatenate([p.scales for p in parts]))
    parts = [QuantWeight(p.qweight, p.scales, 8, -1) if isinstance(p, W8A8Weight) else p for p in parts]
    first = parts[0]
    same = all(isinstance(p, QuantWeight) and p.bits == first.bits and p.group_size == first.group_size
               and (p.offsets is None) == (first.offsets is None) for p in parts)
    if not same:  # mixed formats: float is the one format every part converts to exactly
        return np.concatenate([p.dequantize() if isinstance(p, QuantWeight) else p for p in parts], axis=0)
    return QuantWeight(
        qweight=np.concatenate([p.qweight for p in parts]), scales=np.concatenate([p.scales for p in parts]),
        bits=first.bits, group_size=first.group_size,
        offsets=None if first.offsets is None else np.concatenate([p.offsets for p in parts]))


def matmul(x, weight, bias=None, compute_dtype: str = "float32"):
    """``x W^T (+ bias)`` for float32 x and W through the ``linear`` op; ``compute_dtype``
    bfloat16 rounds both to bfloat16 for the products (AMX where the CPU has it), summing and
    returning float32, as mixed-precision training does."""
    return ops.linear(x, weight, bias, compute_dtype=None if compute_dtype == "float32" else compute_dtype)


class Linear:
    """``y = x W^T (+ bias)`` for W [N, K] held as float32, in anychip's weight-only format, or as
    A8W8 (:class:`W8A8Weight`: int8 weights, x quantized to int8 per token, ``ops.w8a8_linear``;
    ``a8w8`` is then True). ``compute_dtype``: the dtype of a float or weight-only weight's product
    (see :func:`matmul`); A8W8 products are int8 whatever it says."""

    compute_dtype = "float32"

    def __init__(self, weight: np.ndarray | QuantWeight, device, bias: np.ndarray | None = None):
        self.bias = None if bias is None else to_device(bias.astype(np.float32), device)
        self.a8w8 = isinstance(weight, W8A8Weight)
        if isinstance(weight, QuantWeight):
            self.bits, self.group_size = weight.bits, weight.group_size
            self.weight = to_device(weight.qweight, device)
            self.scales = to_device(weight.scales.astype(np.float32), device)
            self.offsets = None if weight.offsets is None else to_device(weight.offsets.astype(np.float32), device)
        else:
            self.bits, self.group_size, self.scales, self.offsets = 0, -1, None, None
            self.weight = to_device(weight.astype(np.float32), device)
        self._bound = None

    @property
    def in_features(self) -> int:
        return self.weight.shape[1] * (2 if self.bits == 4 else 1)

    def __call__(self, x):
        if self.a8w8:
            if paddle.is_grad_enabled() and not x.stop_gradient:
                raise ValueError("an A8W8 linear is inference-only (w8a8_linear has no gradient); train on the float "
                                 "or a weight-only model, or run under paddle.no_grad()")
            return ops.w8a8_linear(x, self.weight, self.scales, self.bias)
        if self.bits == 0:
            return matmul(x, self.weight, self.bias, self.compute_dtype)
        if self.compute_dtype != "float32" and (x.stop_gradient or not paddle.is_grad_enabled()):
            return self._weight_only()(x, compute_dtype=self.compute_dtype)
        if self.compute_dtype != "float32":  # training: gradients through the bfloat16 product
            bias = None if self.bias is None else self.bias.astype(self.compute_dtype)
            return ops.weight_only_linear(x.astype(self.compute_dtype), self.weight, self.scales, bias, bits=self.bits,
                                          group_size=self.group_size, offsets=self.offsets).astype("float32")
        return self._weight_only()(x)

    def _weight_only(self) -> ops.WeightOnlyLinear:
        """The weight-only weights bound for launching (checked and described once), bound again
        when one of them was replaced: quantize_linear turns a float Linear into an int8/int4
        one in place."""
        bound, parts = self._bound, (self.weight, self.scales, self.offsets, self.bias)
        if (bound is None or bound.bits != self.bits or bound.group_size != self.group_size
                or any(a is not b for a, b in zip(parts, (bound.qweight, bound.scales, bound.offsets, bound.bias)))):
            bound = self._bound = ops.WeightOnlyLinear(self.weight, self.scales, self.bias, bits=self.bits,
                                                       group_size=self.group_size, offsets=self.offsets)
        return bound

    def fused(self) -> ops.Linear:
        """This weight as a LIN of the fused decoder_step op. An A8W8 weight goes in as what it is
        stored as, weight-only int8 with one group per row (group_size -1); the model's decode
        then runs the step with x_int8 (see LlamaForCausalLM.decode) so that its activations are
        int8 too."""
        return ops.Linear(self.weight, self.scales, self.offsets, bits=self.bits, group_size=self.group_size)


class Embedding:
    """Token embedding lookup from a float32 table or a quantized one (rows dequantized as they
    are looked up, so a Q8_0 table stays 1 byte per weight in memory)."""

    def __init__(self, table: np.ndarray | QuantWeight, device):
        self.bits = table.bits if isinstance(table, QuantWeight) else 0
        if self.bits == 0:
            self.table = to_device(table.astype(np.float32), device)
            self.dim = table.shape[1]
        else:
            self.group_size = table.group_size
            self.table = to_device(table.qweight, device)
            self.scales = to_device(table.scales.astype(np.float32), device)
            self.offsets = None if table.offsets is None else to_device(table.offsets.astype(np.float32), device)
            self.dim = table.qweight.shape[1] * (1 if table.bits == 8 else 2)

    def __call__(self, ids):
        flat = ids.reshape([-1])
        if self.bits == 0:
            rows = paddle.gather(self.table, flat)
        else:
            offsets = None if self.offsets is None else paddle.gather(self.offsets, flat)
            rows = ops.dequantize(paddle.gather(self.table, flat), paddle.gather(self.scales, flat), self.bits,
                                  self.group_size, self.dim, offsets=offsets)
        return rows.reshape(list(ids.shape) + [self.dim])


@dataclass
class DecoderLayer:
    attn_norm: object
    qkv: Linear
    o: Linear
    ffn_norm: object
    gate_up: Linear
    down: Linear
