"""Hugging Face model folders -> Checkpoint: config.json, model.safetensors (or shards listed in
model.safetensors.index.json) in float32, float16 or bfloat16, and the tokenizer files.

The safetensors files are read directly (an 8-byte header length, a JSON header, then the raw
tensors) and memory-mapped, because the safetensors package's numpy API cannot return bfloat16.
"""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, CheckpointError, ModelConfig, tensor_shapes
from .tokenizer import Tokenizer

ARCHS = ("llama", "qwen2")  # config.json model_type
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # bfloat16 read as its bits

GLOBAL_NAMES = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}
LAYER_NAMES = {"attn_norm": "input_layernorm.weight", "q_proj": "self_attn.q_proj.weight",
               "k_proj": "self_attn.k_proj.weight", "v_proj": "self_attn.v_proj.weight",
               "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
               "o_proj": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
               "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight",
               "down_proj": "mlp.down_proj.weight"}


def hf_name(canonical: str) -> str:
    if canonical.startswith("layers."):
        _, layer, key = canonical.split(".", 2)
        return f"model.layers.{layer}.{LAYER_NAMES[key]}"
    return GLOBAL_NAMES[canonical]


def read_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: config.json is missing (not a Hugging Face model folder)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    arch = cfg.get("model_type")
    if arch not in ARCHS:
        raise CheckpointError(f"{path}: unsupported model_type {arch!r} (supported: {', '.join(ARCHS)})")
    if cfg.get("mlp_bias"):
        raise CheckpointError(f"{path}: MLP biases (mlp_bias) are not supported")
    if cfg.get("rope_scaling"):
        warnings.warn(f"{path}: RoPE scaling {cfg['rope_scaling']} is not applied: positions use plain RoPE "
                      "with rope_theta", stacklevel=3)

    def key(name: str, default=None):
        value = cfg.get(name, default)
        if value is None:
            raise CheckpointError(f"{path}: {name} is missing")
        return value

    hidden, heads = int(key("hidden_size")), int(key("num_attention_heads"))
    return ModelConfig(
        arch=arch,
        vocab_size=int(key("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(key("intermediate_size")),
        num_layers=int(key("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(key("num_key_value_heads", heads)),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rope_theta=float(key("rope_theta", 10000.0)),
        rms_eps=float(key("rms_norm_eps")),
        max_position=int(key("max_position_embeddings")),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases; Llama has them when attention_bias says so.
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        name=folder.resolve().name,
    )


class SafetensorsFile:
    """One .safetensors file: its header, and its tensors as float32 numpy on demand."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else size
            if 8 + length > size:
                raise CheckpointError(f"{path}: not a safetensors file, or truncated (header of {length} bytes)")
            try:
                header = json.loads(f.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise CheckpointError(f"{path}: not a safetensors file (unreadable header: {exc})") from exc
        header.pop("__metadata__", None)
        self.header = header
        self.data_start = 8 + length
        self._data = np.memmap(path, dtype=np.uint8, mode="r")

    def names(self) -> list[str]:
        return list(self.header)

    def load(self, name: str) -> np.ndarray:
        info = self.header[name]
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {info['dtype']}, which is not supported "
                                  f"(supported: {', '.join(DTYPES)})")
        begin, end = (self.data_start + int(o) for o in info["data_offsets"])
        shape = tuple(int(d) for d in info["shape"])
        if end > len(self._data) or end - begin != np.dtype(dtype).itemsize * int(np.prod(shape)):
            raise CheckpointError(f"{self.path}: tensor {name!r} has data at bytes {begin}..{end} that does not "
                                  f"fit its shape {list(shape)} or the file ({len(self._data)} bytes); "
                                  "the file may be truncated")
        raw = self._data[begin:end].view(dtype).reshape(shape)
        if info["dtype"] == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)


def safetensors_files(folder: Path) -> dict[str, SafetensorsFile]:
    """Tensor name -> the file holding it, for a single file or the shards of an index."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({exc})") from exc
        opened = {}
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise CheckpointError(f"{index}: shard {shard} is missing")
            opened[shard] = SafetensorsFile(folder / shard)
        return {name: opened[shard] for name, shard in weight_map.items()}
    paths = sorted(folder.glob("*.safetensors"))
    if not paths:
        raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    return {name: file for file in map(SafetensorsFile, paths) for name in file.names()}


def load_tensor(files: dict, name: str, shape: tuple, where) -> np.ndarray:
    """The tensor of canonical ``name`` from the folder's safetensors ``files``, checked against
    ``shape``; ``where`` names the folder (or index) in the error for a missing tensor."""
    file_name = hf_name(name)
    file = files.get(file_name)
    if file is None:
        raise CheckpointError(f"{where}: tensor {file_name!r} ({name}) is missing")
    value = file.load(file_name)
    if value.shape != shape:
        raise CheckpointError(f"{file.path}: tensor {file_name!r} ({name}) has shape {list(value.shape)}, "
                              f"config.json makes it {list(shape)}")
    return value


def load_hf_folder(folder: Path) -> Checkpoint:
    """Every tensor as float32 (the folder's weights are float already)."""
    config = read_config(folder)
    files = safetensors_files(folder)
    tensors = {name: load_tensor(files, name, shape, folder) for name, shape in tensor_shapes(config).items()}
    return Checkpoint(config=config, tensors=tensors, tokenizer=Tokenizer.from_hf_folder(folder), source=folder)
