"""Prefix Tuning (Li & Liang, 2021), as PaddleNLP's ``PrefixModelForCausalLM`` does it: P trained
keys and values per layer (``past_key_values``) stand before every sequence's own, and the
frozen model attends to them as to an earlier context. A prefix encoder makes them: an
embedding of P rows of ``L * 2 * Hk * D`` values, or (``projection``) an embedding of P hidden
vectors through ``Linear -> tanh -> Linear``, the reparametrisation the paper trains with.

Real tokens sit after the prefix: at RoPE positions ``P, P+1, ...`` and KV-cache slots from P
on, so a decode step reads the prefix from the cache like any earlier token (the fused
``decoder_step`` needs no change). Here: the adapter config and folder format, the prefix
keys and values an encoder gives, and loading an adapter folder with its base model.

An adapter folder holds ``prefix_config.json`` and ``model.safetensors`` (the encoder's tensors,
named in ``encoder_shapes``); ``anychip generate --model FOLDER`` (and chat, serve, eval) loads
its base model and the prefix.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .adapter_files import read_config, read_weights
from .checkpoint import Checkpoint, CheckpointError, ModelConfig

FORMAT = "anychip-prefix/1"
CONFIG_FILE = "prefix_config.json"
WEIGHTS_FILE = "model.safetensors"
EMBEDDING = "prefix_encoder.embedding"
MLP = ("prefix_encoder.mlp.0.weight", "prefix_encoder.mlp.0.bias",
       "prefix_encoder.mlp.2.weight", "prefix_encoder.mlp.2.bias")


@dataclass
class PrefixConfig:
    """``num_prefix_tokens``: P. ``projection``: the encoder is an embedding of P hidden vectors
    through an MLP of ``projection_hidden`` units (else P rows of keys and values directly).
    ``base_model``: the model name or path the prefix was trained on."""

    num_prefix_tokens: int = 64
    projection: bool = False
    projection_hidden: int = 512
    base_model: str = ""
    seed: int = field(default=0, compare=False)

    config_file = CONFIG_FILE

    def __post_init__(self):
        if isinstance(self.num_prefix_tokens, bool) or not isinstance(self.num_prefix_tokens, int) \
                or self.num_prefix_tokens < 1:
            raise ValueError(f"num_prefix_tokens must be a positive integer, got {self.num_prefix_tokens!r}")
        if isinstance(self.projection_hidden, bool) or not isinstance(self.projection_hidden, int) \
                or self.projection_hidden < 1:
            raise ValueError(f"projection_hidden must be a positive integer, got {self.projection_hidden!r}")

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def from_file(cls, path: Path) -> PrefixConfig:
        data = read_config(path, FORMAT, "prefix")
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: {exc}") from exc


def kv_width(model: ModelConfig) -> int:
    """Values per prefix token: keys and values of every layer, ``L * 2 * Hk * D``."""
    return model.num_layers * 2 * model.num_kv_heads * model.head_dim


def encoder_shapes(model: ModelConfig, config: PrefixConfig) -> dict[str, tuple[int, ...]]:
    """Every encoder tensor for a prefix on ``model``: name -> shape (linear weights [out, in])."""
    p, width = config.num_prefix_tokens, kv_width(model)
    if not config.projection:
        return {EMBEDDING: (p, width)}
    h, m = model.hidden_size, config.projection_hidden
    return {EMBEDDING: (p, h), MLP[0]: (m, h), MLP[1]: (m,), MLP[2]: (width, m), MLP[3]: (width,)}


def split_layers(past, model: ModelConfig):
    """The encoder's output [P, L*2*Hk*D] (numpy or Paddle) as [L, 2, P, Hk, D]: index [i, 0] is
    layer i's keys, [i, 1] its values (PaddleNLP's ``past_key_values`` layout, per layer)."""
    p = past.shape[0]
    past = past.reshape([p, model.num_layers, 2, model.num_kv_heads, model.head_dim])
    return past.transpose([1, 2, 0, 3, 4])


def prefix_kv(model: ModelConfig, config: PrefixConfig, tensors: dict[str, np.ndarray]) -> np.ndarray:
    """The prefix keys and values the encoder ``tensors`` (checked by ``check_tensors``) give,
    float32 [L, 2, P, Hk, D]."""
    past = tensors[EMBEDDING].astype(np.float64)
    if config.projection:
        past = np.tanh(past @ tensors[MLP[0]].T.astype(np.float64) + tensors[MLP[1]])
        past = past @ tensors[MLP[2]].T.astype(np.float64) + tensors[MLP[3]]
    return np.ascontiguousarray(split_layers(past.astype(np.float32), model))


def check_tensors(model: ModelConfig, config: PrefixConfig, tensors: dict[str, np.ndarray], where: str = "") -> None:
    expected = encoder_shapes(model, config)
    where = f"{where}: " if where else ""
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{where}prefix tensor {name} is missing")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{where}prefix tensor {name} has shape {list(tensors[name].shape)}, expected "
                                  f"{list(shape)} for this base model and {config.num_prefix_tokens} prefix tokens")
        if not np.all(np.isfinite(tensors[name])):
            raise CheckpointError(f"{where}prefix tensor {name} holds NaN or infinite values")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{where}unexpected tensor {extra[0]} in a prefix adapter "
                              f"({'with' if config.projection else 'without'} projection)")


def read_adapter(folder: Path) -> tuple[PrefixConfig, dict[str, np.ndarray]]:
    return PrefixConfig.from_file(folder / CONFIG_FILE), read_weights(folder / WEIGHTS_FILE, "the prefix encoder's weights")


def is_adapter(folder: Path) -> bool:
    return (folder / CONFIG_FILE).is_file()


def with_prefix(base: Checkpoint, config: PrefixConfig, tensors: dict[str, np.ndarray], where: str = "") -> Checkpoint:
    """``base`` carrying the prefix keys and values of the encoder ``tensors``."""
    if base.prefix is not None:
        raise CheckpointError(f"{where or 'the base model'}: its base model has a prefix already")
    check_tensors(base.config, config, tensors, where)
    kv = prefix_kv(base.config, config, tensors)
    if config.num_prefix_tokens >= base.config.max_position:
        raise CheckpointError(f"{where}: {config.num_prefix_tokens} prefix tokens leave no room in the model's "
                              f"context of {base.config.max_position}")
    return Checkpoint(config=base.config, tensors=base.tensors, tokenizer=base.tokenizer, source=base.source, prefix=kv)
