"""LoRA adapters (Hu et al., 2021): a frozen linear W gains ``scaling * B A`` with A [r, K] and
B [N, r], ``scaling = alpha / r``. Here: the adapter config and file format, the adapted
linear used in training, and merging an adapter into its base checkpoint.

An adapter folder holds ``lora_config.json`` and ``model.safetensors`` (tensors
``layers.<i>.<target>.lora_A`` / ``.lora_B``); ``anychip generate --model FOLDER`` loads its base
model and merges the adapter on load.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .adapter_files import read_config, read_weights
from .checkpoint import Checkpoint, CheckpointError

FORMAT = "anychip-lora/1"
CONFIG_FILE = "lora_config.json"
WEIGHTS_FILE = "model.safetensors"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BASE_WEIGHTS = ("float", "int8", "int4")


@dataclass
class LoraConfig:
    """``targets``: which projections of every layer get an adapter. ``base_weights``: the
    frozen base as trained, float32 or weight-only int8/int4 (QLoRA). ``base_model``: the
    model name or path the adapter was trained on."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS
    base_model: str = ""
    base_weights: str = "float"
    seed: int = field(default=0, compare=False)

    config_file = CONFIG_FILE

    def __post_init__(self):
        self.targets = tuple(self.targets)
        if self.rank < 1:
            raise ValueError(f"lora rank must be >= 1, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ValueError(f"lora targets must be a non-empty subset of {', '.join(TARGETS)}, got "
                             f"{', '.join(self.targets) or 'none'}")
        if self.base_weights not in BASE_WEIGHTS:
            raise ValueError(f"lora base weights must be one of {', '.join(BASE_WEIGHTS)}, got {self.base_weights!r}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def from_file(cls, path: Path) -> LoraConfig:
        data = read_config(path, FORMAT, "LoRA")
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: {exc}") from exc


def adapter_shapes(checkpoint: Checkpoint, config: LoraConfig) -> dict[str, tuple[int, int]]:
    """Every adapter tensor for ``checkpoint``'s model: name -> shape."""
    shapes = {}
    for i in range(checkpoint.config.num_layers):
        for target in config.targets:
            n, k = checkpoint.tensors[f"layers.{i}.{target}"].shape
            shapes[f"layers.{i}.{target}.lora_A"] = (config.rank, k)
            shapes[f"layers.{i}.{target}.lora_B"] = (n, config.rank)
    return shapes


def merge(base: Checkpoint, config: LoraConfig, adapters: dict[str, np.ndarray]) -> Checkpoint:
    """``base`` with ``W + scaling * B A`` folded into every target (float32 weights; a
    quantized base weight is dequantized first)."""
    expected = adapter_shapes(base, config)
    for name, shape in expected.items():
        if name not in adapters:
            raise CheckpointError(f"LoRA adapter tensor {name} is missing")
        if tuple(adapters[name].shape) != shape:
            raise CheckpointError(f"LoRA adapter tensor {name} has shape {list(adapters[name].shape)}, "
                                  f"expected {list(shape)} for this base model")
    tensors = dict(base.tensors)
    for i in range(base.config.num_layers):
        for target in config.targets:
            key = f"layers.{i}.{target}"
            w = tensors[key]
            w = w.dequantize() if hasattr(w, "dequantize") else np.asarray(w, dtype=np.float32)
            delta = adapters[key + ".lora_B"].astype(np.float64) @ adapters[key + ".lora_A"].astype(np.float64)
            tensors[key] = (w + config.scaling * delta).astype(np.float32)
    return Checkpoint(config=base.config, tensors=tensors, tokenizer=base.tokenizer, source=base.source)


def read_adapter(folder: Path) -> tuple[LoraConfig, dict[str, np.ndarray]]:
    return LoraConfig.from_file(folder / CONFIG_FILE), read_weights(folder / WEIGHTS_FILE, "the adapter's weights")


def is_adapter(folder: Path) -> bool:
    return (folder / CONFIG_FILE).is_file()
