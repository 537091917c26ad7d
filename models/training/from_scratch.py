"""A new model for pretraining: a Hugging Face ``config.json`` and a tokenizer, weights drawn from
a seed as Hugging Face's Llama initialises them (normal with ``initializer_range`` std, 0.02 by
default; RMSNorm weights one; biases zero).

    base = new_checkpoint("models/training/configs/llama-tiny.json", tokenizer, seed=42)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError, ModelConfig, tensor_shapes
from ..hf_folder import config_from_json, read_json_object


def new_checkpoint(config_path: str | Path, tokenizer, seed: int) -> Checkpoint:
    config_path = Path(config_path)
    if not config_path.is_file():
        raise CheckpointError(f"--config {config_path}: no such file (expected a Hugging Face config.json)")
    raw = read_json_object(config_path)
    config = config_from_json(raw, config_path, config_path.stem)
    if config.vocab_size < tokenizer.vocab_size:
        raise CheckpointError(f"{config_path}: vocab_size {config.vocab_size} is smaller than the tokenizer's "
                              f"{tokenizer.vocab_size} tokens")
    std = raw.get("initializer_range", 0.02)
    if not isinstance(std, (int, float)) or isinstance(std, bool) or not 0 < std < 1:
        raise CheckpointError(f"{config_path}: initializer_range is {std!r}, expected a number in (0, 1)")
    return Checkpoint(config=config, tensors=init_tensors(config, float(std), seed), tokenizer=tokenizer,
                      source=config_path)


def init_tensors(config: ModelConfig, std: float, seed: int) -> dict[str, np.ndarray]:
    """Every tensor of ``config``, in a fixed order from one generator: the same seed gives the
    same model on every machine."""
    rng = np.random.default_rng([seed, 0x5EED])
    out = {}
    for name, shape in tensor_shapes(config).items():
        key = name.rsplit(".", 1)[-1]
        if key.endswith("norm"):
            out[name] = np.ones(shape, np.float32)
        elif key.endswith("bias"):
            out[name] = np.zeros(shape, np.float32)
        else:
            out[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))
    return out
