"""A model as a Hugging Face folder: config.json, model.safetensors (float32), tokenizer.json,
tokenizer_config.json and generation_config.json, which :func:`anychip_models.loader.load_checkpoint`
(and transformers) load back.

    write_hf_folder("out/model", ckpt.config, ckpt.tensors, ckpt.tokenizer)

``tensors`` use the canonical names of :func:`anychip_models.checkpoint.tensor_shapes` (HF layout
already: q/k rows in half-rotation order); anychip weight-only tensors are dequantized to float32.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save as st_save

from .checkpoint import ModelConfig, QuantWeight, tensor_shapes
from .hf_folder import hf_name
from .tokenizer import Tokenizer
from .training.checkpoints import fsync_dir, make_dirs, publish, remove_tree, write_file

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# Files a loader reads in preference to the ones written here: removed when exporting in place.
_SHADOWING = re.compile(r"model\.safetensors\.index\.json|chat_template\.jinja|model-\d+-of-\d+\.safetensors|"
                        r"quantization\.json")


def hf_config(config: ModelConfig, tokenizer: Tokenizer | None = None) -> dict:
    """config.json of ``config``."""
    if config.arch not in ARCHITECTURES:
        raise ValueError(f"arch {config.arch!r} has no Hugging Face model type (supported: {', '.join(ARCHITECTURES)})")
    if config.arch == "qwen2" and not config.qkv_bias:
        raise ValueError("a qwen2 model without q/k/v biases has no Hugging Face config (Qwen2 always has them)")
    cfg = {"architectures": [ARCHITECTURES[config.arch]], "model_type": config.arch,
           "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
           "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
           "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
           "head_dim": config.head_dim, "hidden_act": "silu", "rope_theta": config.rope_theta,
           "rms_norm_eps": config.rms_eps, "max_position_embeddings": config.max_position,
           "tie_word_embeddings": config.tie_embeddings, "mlp_bias": False, "torch_dtype": "float32"}
    if config.arch == "llama":
        cfg["attention_bias"] = config.qkv_bias
    if tokenizer is not None:
        ids = {"bos_token_id": tokenizer.bos_id,
               "eos_token_id": tokenizer.token_to_id(tokenizer.eos_token) if tokenizer.eos_token else None,
               "pad_token_id": tokenizer.pad_id}
        cfg.update({key: value for key, value in ids.items() if value is not None})
    return cfg


def hf_tensors(config: ModelConfig, tensors: dict) -> dict[str, np.ndarray]:
    """The tensors under their Hugging Face names, float32 and contiguous; every tensor of
    ``config`` must be there with its shape, and nothing else."""
    shapes = tensor_shapes(config)
    missing, unknown = shapes.keys() - tensors.keys(), tensors.keys() - shapes.keys()
    if missing or unknown:
        raise ValueError(f"tensors do not match the config: missing {sorted(missing)}, unexpected {sorted(unknown)}")
    named = {}
    for name, shape in shapes.items():
        value = tensors[name]
        value = value.dequantize() if isinstance(value, QuantWeight) else np.asarray(value)
        if value.shape != shape:
            raise ValueError(f"tensor {name!r} has shape {list(value.shape)}, the config makes it {list(shape)}")
        named[hf_name(name)] = np.ascontiguousarray(value, dtype=np.float32)
    return named


def hf_metadata_files(config: ModelConfig, tokenizer: Tokenizer) -> dict[str, bytes]:
    """Every file of the folder but the weights: config.json and the tokenizer files (for a
    training checkpoint that is also a model folder: its weights are the checkpoint's own)."""
    config_json = (json.dumps(hf_config(config, tokenizer), indent=2) + "\n").encode("utf-8")
    return {"config.json": config_json, **tokenizer.to_files()}


def hf_folder_files(config: ModelConfig, tensors: dict, tokenizer: Tokenizer) -> dict[str, bytes]:
    """File name -> contents of the Hugging Face folder of this model."""
    weights = st_save(hf_tensors(config, tensors), metadata={"format": "pt"})
    return {**hf_metadata_files(config, tokenizer), "model.safetensors": weights}


def write_hf_folder(folder, config: ModelConfig, tensors: dict, tokenizer: Tokenizer) -> Path:
    """Writes the Hugging Face folder of this model atomically (see :func:`write_model_folder`)."""
    return write_model_folder(folder, hf_folder_files(config, tensors, tokenizer))


def write_model_folder(folder, files: dict[str, bytes]) -> Path:
    """Writes a model folder's ``files`` atomically: written and fsynced in a temporary folder
    that then takes its name (swapping out an earlier model in one step).

    A folder that already holds other things (e.g. training checkpoints) is kept: the files are
    staged inside it, then renamed in one by one, config.json last, after removing the files that
    would shadow them (an index, shards, chat_template.jinja, a quantization.json). Each file is
    then atomic, the set is not: an interrupted write leaves no config.json, so the folder fails
    to load rather than mixing old and new files."""
    folder = Path(folder)
    make_dirs(folder.parent)
    for stale in folder.parent.glob(f".tmp-{folder.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if folder.is_dir() and any(entry.name not in files for entry in folder.iterdir()):
        _write_in_place(folder, files)
        return folder
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        _write_all(tmp, files)
        old = publish(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        remove_tree(old)
    return folder


def _write_all(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        write_file(folder / name, data)
    fsync_dir(folder)


def _write_in_place(folder: Path, files: dict[str, bytes]) -> None:
    for stale in folder.glob(".tmp-export-*"):
        shutil.rmtree(stale, ignore_errors=True)
    stage = folder / f".tmp-export-{os.getpid()}"
    stage.mkdir()
    try:
        _write_all(stage, files)
        (folder / "config.json").unlink(missing_ok=True)
        for entry in folder.iterdir():
            if _SHADOWING.fullmatch(entry.name) and entry.name not in files:
                entry.unlink()
        fsync_dir(folder)
        for name in sorted(files, key=lambda n: n == "config.json"):
            os.replace(stage / name, folder / name)
        fsync_dir(folder)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
