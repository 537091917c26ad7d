"""A loaded checkpoint, whatever file it came from: the config of a Llama-family model, its tensors
under canonical names (Hugging Face layout, linear weights [out N, in K]) and its tokenizer.

    ckpt = load_checkpoint("SmolLM2-135M-Instruct.Q4_1.gguf", weights="native")
    ckpt.tensors["layers.0.q_proj"]   # QuantWeight, rows already in RoPE half-rotation order

``weights="float"`` gives every tensor as float32 numpy; ``"native"`` keeps GGUF Q8_0, Q4_0 and
Q4_1 linear weights quantized, in anychip's weight-only layout (anychip/kernel.h).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

WEIGHT_MODES = ("float", "native")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and, where relevant, the tensor."""


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
class Checkpoint:
    config: ModelConfig
    tensors: dict[str, np.ndarray | QuantWeight]
    tokenizer: Tokenizer
    source: Path


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``config`` holds: canonical name -> shape."""
    c, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    layer = {"attn_norm": (c,), "q_proj": (q, c), "k_proj": (kv, c), "v_proj": (kv, c), "o_proj": (c, q),
             "ffn_norm": (c,), "gate_proj": (f, c), "up_proj": (f, c), "down_proj": (c, f)}
    if config.qkv_bias:
        layer.update(q_bias=(q,), k_bias=(kv,), v_bias=(kv,))
    shapes = {"embed_tokens": (config.vocab_size, c)}
    for i in range(config.num_layers):
        shapes.update({f"layers.{i}.{key}": shape for key, shape in layer.items()})
    shapes["norm"] = (c,)
    if not config.tie_embeddings:
        shapes["lm_head"] = (config.vocab_size, c)
    return shapes


def load_checkpoint(path: str | Path, weights: str = "float") -> Checkpoint:
    """A .gguf file, a Hugging Face folder (config.json, *.safetensors, tokenizer.json) or a LoRA
    adapter folder (merged into its base model); a folder's weights are float already, so both
    modes give float32 for it."""
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_MODES)}, got {weights!r}")
    path = Path(path)
    if path.is_dir():
        from .hf_folder import load_hf_folder
        from .lora import is_adapter, load_merged

        if is_adapter(path):
            return load_merged(path, weights)
        return load_hf_folder(path)
    if path.is_file():
        from .gguf_file import load_gguf

        return load_gguf(path, weights)
    raise CheckpointError(f"{path}: no such file or folder (expected a .gguf file or a Hugging Face model folder)")
