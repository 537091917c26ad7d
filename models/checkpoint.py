"""A loaded checkpoint, whatever file it came from: the config of a Llama-family model, its tensors
under canonical names (Hugging Face layout, linear weights [out N, in K]) and its tokenizer.

    ckpt = load_checkpoint("SmolLM2-135M-Instruct.Q4_1.gguf", weights="native")
    ckpt.tensors["layers.0.q_proj"]   # QuantWeight, rows already in RoPE half-rotation order

``weights="float"`` gives every tensor as float32 numpy; ``"native"`` keeps GGUF Q8_0, Q4_0 and
Q4_1 linear weights quantized, in anychip's weight-only layout (anychip/kernel.h), and a quantized
folder's tensors as written (weight-only QuantWeight, or W8A8Weight for int8 x int8 linears).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

WEIGHT_MODES = ("float", "native")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and, where relevant, the tensor."""


def shown(value) -> str:
    """A value read from a model file, for an error message: its repr, cut short (a hostile one
    may be a list of millions)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_int(value) -> bool:
    """An integer, not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(found, what: str) -> int:
    """``found``, a value read from a model file (``what`` names the file and key), checked to
    be a positive integer."""
    if not is_int(found) or found <= 0:
        raise CheckpointError(f"{what} is {shown(found)}, expected a positive integer")
    return found


def positive_number(found, what: str):
    """``found`` (as ``positive_int``) checked to be a finite positive number."""
    if not (is_int(found) or isinstance(found, float)) or not math.isfinite(found) or found <= 0:
        raise CheckpointError(f"{what} is {shown(found)}, expected a positive number")
    return found


@dataclass
class ModelConfig:
    """A Llama-family decoder (Llama 2/3, Qwen2, SmolLM2): pre-norm RMSNorm, RoPE, grouped-query
    attention, SwiGLU MLP."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_position: int
    tie_embeddings: bool
    qkv_bias: bool
    name: str = ""


@dataclass
class QuantWeight:
    """A linear weight [N, K] in anychip's weight-only layout: W[n, k] = q[n, k] * scales[n, g]
    (+ offsets[n, g]), g = k // group_size.

    bits 8: qweight int8 [N, K] holds q. bits 4: qweight uint8 [N, K/2], each row a run of 32-byte
    blocks, block b covering k = 64b .. 64b+63: byte i holds q(64b+i)+8 in its low nibble and
    q(64b+32+i)+8 in its high nibble.
    """

    qweight: np.ndarray
    scales: np.ndarray
    bits: int
    group_size: int
    offsets: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        n, packed = self.qweight.shape
        return n, packed * 8 // self.bits

    def dequantize(self) -> np.ndarray:
        """W as float32 [N, K]."""
        n, k = self.shape
        if self.bits == 8:
            q = self.qweight.astype(np.float32)
        else:
            blocks = self.qweight.reshape(n, k // 64, 1, 32)
            nibbles = np.concatenate([blocks & 0x0F, blocks >> 4], axis=2)  # [n, k/64, 2, 32]
            q = nibbles.reshape(n, k).astype(np.float32) - np.float32(8)
        groups = self.scales.shape[1]
        w = q.reshape(n, groups, -1) * self.scales[:, :, None]
        if self.offsets is not None:
            w = w + self.offsets[:, :, None]
        return w.reshape(n, k)

    def take_rows(self, rows: np.ndarray) -> QuantWeight:
        """The weight with its output rows reordered (rows[i] becomes row i)."""
        return QuantWeight(self.qweight[rows], self.scales[rows], self.bits, self.group_size,
                           None if self.offsets is None else self.offsets[rows])


@dataclass
class W8A8Weight(QuantWeight):
    """A linear weight [N, K] for int8 x int8 products (A8W8, SmoothQuant-style): ``qweight``
    int8 [N, K] and one float32 scale per output channel, ``scales`` [N, 1] (w8a8_linear's shape;
    [N] is accepted and reshaped), W[n, k] = q[n, k] * scales[n]. The activations are quantized to
    int8 per token at run time (ops.w8a8_linear), so no activation scale is stored.

    The storage is exactly a weight-only int8 per-channel QuantWeight (bits 8, group_size -1), which
    is why this is a subclass: code that only reads or dequantizes weights (export, LoRA merge, the
    embedding lookup) treats it as one; :class:`anychip_models.layers.Linear` tells them apart and
    runs this one through w8a8_linear."""

    bits: int = 8
    group_size: int = -1

    def __post_init__(self):
        if self.bits != 8 or self.group_size != -1 or self.offsets is not None:
            raise ValueError(f"W8A8Weight is int8 per output channel (bits 8, group_size -1, no offsets), got bits "
                             f"{self.bits}, group_size {self.group_size}, offsets {self.offsets is not None}")
        if self.qweight.ndim != 2 or self.qweight.dtype != np.int8:
            raise ValueError(f"W8A8Weight.qweight must be int8 [N, K], got {self.qweight.dtype} "
                             f"{list(self.qweight.shape)}")
        n = self.qweight.shape[0]
        if self.scales.shape not in ((n,), (n, 1)):
            raise ValueError(f"W8A8Weight.scales must be [N] or [N, 1] with N = {n}, got {list(self.scales.shape)}")
        self.scales = np.asarray(self.scales, dtype=np.float32).reshape(n, 1)

    def take_rows(self, rows: np.ndarray) -> W8A8Weight:
        return W8A8Weight(self.qweight[rows], self.scales[rows])


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: dict[str, np.ndarray | QuantWeight]  # W8A8Weight is a QuantWeight
    tokenizer: Tokenizer
    source: Path
    # Prefix Tuning's trained keys and values, float32 [L, 2, P, Hk, D] (anychip_models.prefix),
    # which every sequence of a model built from this checkpoint attends to first
    prefix: np.ndarray | None = None


def _layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    c, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    layer = {"attn_norm": (c,), "q_proj": (q, c), "k_proj": (kv, c), "v_proj": (kv, c), "o_proj": (c, q),
             "ffn_norm": (c,), "gate_proj": (f, c), "up_proj": (f, c), "down_proj": (c, f)}
    if config.qkv_bias:
        layer.update(q_bias=(q,), k_bias=(kv,), v_bias=(kv,))
    return layer


def _model_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    c = config.hidden_size
    shapes = {"embed_tokens": (config.vocab_size, c), "norm": (c,)}
    if not config.tie_embeddings:
        shapes["lm_head"] = (config.vocab_size, c)
    return shapes


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``config`` holds: canonical name -> shape."""
    layer = _layer_shapes(config)
    shapes = {"embed_tokens": (config.vocab_size, config.hidden_size)}
    for i in range(config.num_layers):
        shapes.update({f"layers.{i}.{key}": shape for key, shape in layer.items()})
    return shapes | _model_shapes(config)


def tensor_shape(config: ModelConfig, name: str) -> tuple[int, ...] | None:
    """The shape of canonical tensor ``name`` in a checkpoint of ``config``, None if it holds no
    such tensor; without listing them all, which a config claiming billions of layers would
    make endless (tensor_shapes is for configs whose tensors were read from a file)."""
    kind, _, rest = name.partition(".")
    index, _, key = rest.partition(".")
    if kind == "layers":
        if not index.isdigit() or str(int(index)) != index or int(index) >= config.num_layers:
            return None
        return _layer_shapes(config).get(key)
    return _model_shapes(config).get(name)
