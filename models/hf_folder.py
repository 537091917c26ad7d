"""Hugging Face model folders -> Checkpoint: config.json, model.safetensors (or shards listed in
model.safetensors.index.json) in float32, float16 or bfloat16, and the tokenizer files.

The safetensors files are read directly (an 8-byte header length, a JSON header, then the raw
tensors) and memory-mapped, because the safetensors package's numpy API cannot return bfloat16.
Every header entry is checked when a file is opened (dtype, shape, data_offsets within the data
and not overlapping), and every config.json value the model needs against the type it must have,
so that a corrupt or hostile folder fails with a CheckpointError naming the file and the field.
"""

from __future__ import annotations

import json
import math
import re
import struct
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from .checkpoint import (Checkpoint, CheckpointError, ModelConfig, is_int, positive_int, positive_number, shown,
                         tensor_shapes)
from .tokenizer import Tokenizer

ARCHS = ("llama", "qwen2")  # config.json model_type
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # bfloat16 read as its bits
# Bytes per element of the safetensors dtypes of whole bytes: an entry's data must take exactly
# its element count times this. (Others, sub-byte ones, are only rejected if loaded.)
ITEM_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
              "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
MAX_HEADER = 100_000_000  # bytes: the safetensors library's own limit
LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.")

GLOBAL_NAMES = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}
LAYER_NAMES = {"attn_norm": "input_layernorm.weight", "q_proj": "self_attn.q_proj.weight",
               "k_proj": "self_attn.k_proj.weight", "v_proj": "self_attn.v_proj.weight",
               "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
               "o_proj": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
               "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight",
               "down_proj": "mlp.down_proj.weight"}
JSON_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}


def hf_name(canonical: str) -> str:
    if canonical.startswith("layers."):
        _, layer, key = canonical.split(".", 2)
        return f"model.layers.{layer}.{LAYER_NAMES[key]}"
    return GLOBAL_NAMES[canonical]


def read_json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {JSON_KINDS.get(type(value), 'something else')}")
    return value


def read_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: config.json is missing (not a Hugging Face model folder)")
    return read_config_file(path, folder.resolve().name)


def read_config_file(path: Path, name: str) -> ModelConfig:
    """A Hugging Face ``config.json`` (Llama, Qwen2, ...) as a ModelConfig named ``name``."""
    return config_from_json(read_json_object(path), path, name)


def config_from_json(cfg: dict, path: Path, name: str) -> ModelConfig:
    """``cfg``, the object of the config.json at ``path`` (named in errors), as a ModelConfig."""
    arch = cfg.get("model_type")
    if not isinstance(arch, str) or arch not in ARCHS:
        raise CheckpointError(f"{path}: unsupported model_type {shown(arch)} (supported: {', '.join(ARCHS)})")
    if cfg.get("mlp_bias"):
        raise CheckpointError(f"{path}: MLP biases (mlp_bias) are not supported")
    if cfg.get("rope_scaling"):
        warnings.warn(f"{path}: RoPE scaling {shown(cfg['rope_scaling'])} is not applied: positions use plain RoPE "
                      "with rope_theta", stacklevel=3)

    def value(name: str, default=None):
        found = cfg.get(name)
        found = default if found is None else found
        if found is None:
            raise CheckpointError(f"{path}: {name} is missing")
        return found

    def count(name: str, default=None) -> int:
        return positive_int(value(name, default), f"{path}: {name}")

    def number(name: str, default=None) -> float:
        return float(positive_number(value(name, default), f"{path}: {name}"))

    def flag(name: str) -> bool:
        found = value(name, False)
        if not isinstance(found, bool):
            raise CheckpointError(f"{path}: {name} is {shown(found)}, expected true or false")
        return found

    hidden, heads = count("hidden_size"), count("num_attention_heads")
    kv_heads = count("num_key_value_heads", heads)
    if heads % kv_heads:
        raise CheckpointError(f"{path}: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}")
    if cfg.get("head_dim") is None and hidden % heads:
        raise CheckpointError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}, "
                              "and head_dim is missing")
    head_dim = count("head_dim", hidden // heads)
    if head_dim % 2:
        raise CheckpointError(f"{path}: head_dim is {head_dim}; RoPE needs it even")
    return ModelConfig(
        arch=arch,
        vocab_size=count("vocab_size"),
        hidden_size=hidden,
        intermediate_size=count("intermediate_size"),
        num_layers=count("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=number("rope_theta", 10000.0),
        rms_eps=number("rms_norm_eps"),
        max_position=count("max_position_embeddings"),
        tie_embeddings=flag("tie_word_embeddings"),
        # Qwen2 always has q/k/v biases; Llama has them when attention_bias says so.
        qkv_bias=arch == "qwen2" or flag("attention_bias"),
        name=name,
    )


class SafetensorsFile:
    """One .safetensors file: its header, checked entry by entry, and its tensors as float32 numpy on demand."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else size
            if 8 + length > size or length > MAX_HEADER:
                raise CheckpointError(f"{path}: not a safetensors file, or truncated (header of {length} bytes)")
            try:
                header = json.loads(f.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                raise CheckpointError(f"{path}: not a safetensors file (unreadable header: {exc})") from exc
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: the header is {JSON_KINDS.get(type(header), 'something else')}, "
                                  "expected a JSON object")
        header.pop("__metadata__", None)
        self.header = header
        self.data_start = 8 + length
        self._check_entries(size - self.data_start)
        self._data = np.memmap(path, dtype=np.uint8, mode="r")

    def _check_entries(self, data_size: int) -> None:
        """Each entry a dtype, a shape and data_offsets [begin, end] into the data after the header
        that fit it, and no two entries' data overlapping: a hostile offset (negative, past the
        data, or another tensor's) would read the header or other weights as this tensor."""
        spans = []
        for name, info in self.header.items():
            where = f"{self.path}: tensor {name!r}"
            if not isinstance(info, dict):
                raise CheckpointError(f"{where} is {shown(info)}, expected an object (dtype, shape, data_offsets)")
            dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
            if not isinstance(dtype, str):
                raise CheckpointError(f"{where} has no dtype" if dtype is None else
                                      f"{where} has dtype {shown(dtype)}, expected a name such as F32")
            if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
                raise CheckpointError(f"{where} has shape {shown(shape)}, expected a list of non-negative integers")
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets)
                    and 0 <= offsets[0] <= offsets[1]):
                raise CheckpointError(f"{where} has data_offsets {shown(offsets)}, expected two integers "
                                      "0 <= begin <= end")
            begin, end = offsets
            if end > data_size:
                raise CheckpointError(f"{where} has data_offsets {offsets}, beyond the end of the data "
                                      f"({data_size} bytes); the file may be truncated")
            if dtype in ITEM_SIZES and end - begin != math.prod(shape) * ITEM_SIZES[dtype]:
                raise CheckpointError(f"{where} has {end - begin} bytes of data, but {dtype} {shape} takes "
                                      f"{math.prod(shape) * ITEM_SIZES[dtype]}")
            spans.append((begin, end, name))
        spans.sort()
        for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
            if begin < end:
                raise CheckpointError(f"{self.path}: the data of tensors {first!r} and {second!r} overlap")

    def names(self) -> list[str]:
        return list(self.header)

    def load(self, name: str) -> np.ndarray:
        info = self.header[name]
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {info['dtype']}, which is not supported "
                                  f"(supported: {', '.join(DTYPES)})")
        begin, end = (self.data_start + o for o in info["data_offsets"])  # checked against the shape on opening
        raw = self._data[begin:end].view(dtype).reshape(info["shape"])
        if info["dtype"] == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)


def safetensors_files(folder: Path) -> dict[str, SafetensorsFile]:
    """Tensor name -> the file holding it, for a single file or the shards of an index."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
            raise CheckpointError(f"{index}: weight_map must map tensor names to shard file names, "
                                  f"got {shown(weight_map)}")
        opened = {}
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard:  # e.g. '../../x.safetensors': nothing outside the folder is read
                raise CheckpointError(f"{index}: shard {shard!r} is not a file name in the folder")
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


def listed_config(config: ModelConfig, files: dict, folder: Path) -> ModelConfig:
    """``config`` with as many layers as its tensors are worth listing: up to one past those the
    safetensors ``files`` hold (a larger count fails at that layer's first tensor all the same,
    without a hostile count, 2^32, listing billions of names first). Layers the files hold beyond
    the config's count are an error: the config would drop them silently."""
    present = {int(m.group(1)) for name in files if (m := LAYER_TENSOR.match(name))}
    beyond = max((i for i in present if i >= config.num_layers), default=None)
    if beyond is not None:
        raise CheckpointError(f"{folder / 'config.json'}: num_hidden_layers is {config.num_layers}, but the "
                              f"safetensors files hold tensors of layer {beyond} (model.layers.{beyond}.*)")
    return replace(config, num_layers=min(config.num_layers, len(present) + 1))


def load_hf_folder(folder: Path) -> Checkpoint:
    """Every tensor as float32 (the folder's weights are float already)."""
    config = read_config(folder)
    files = safetensors_files(folder)
    tensors = {name: load_tensor(files, name, shape, folder)
               for name, shape in tensor_shapes(listed_config(config, files, folder)).items()}
    return Checkpoint(config=config, tensors=tensors, tokenizer=Tokenizer.from_hf_folder(folder), source=folder)
