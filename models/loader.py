"""Loading a model from any of its formats: the dispatch from a path to the reader of its format
(GGUF, Hugging Face folder, quantized folder, LoRA or prefix adapter). The reader modules build
on :mod:`.checkpoint`'s types; this module sits above them, so that none of them imports it."""

from __future__ import annotations

from pathlib import Path

from . import lora, prefix
from .checkpoint import WEIGHT_MODES, Checkpoint, CheckpointError
from .gguf_file import load_gguf
from .hf_folder import load_hf_folder
from .hub import resolve
from .quantization.checkpoint import is_quantized, load_quantized


def load_checkpoint(path: str | Path, weights: str = "float") -> Checkpoint:
    """A .gguf file, a Hugging Face folder (config.json, *.safetensors, tokenizer.json), an anychip
    quantized folder (the same plus quantization.json, see anychip_models.quantization.checkpoint),
    a LoRA adapter folder (merged into its base model) or a prefix adapter folder (its base model
    carrying the prefix, ``Checkpoint.prefix``). A plain folder's weights are float
    already, so both modes give float32 for it; a quantized folder's stay quantized with
    ``weights="native"`` (QuantWeight / W8A8Weight, as written) and are dequantized to float32 with
    ``"float"`` (W = q * scale exactly; A8W8's activation quantization is then not applied)."""
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_MODES)}, got {weights!r}")
    path = Path(path)
    if path.is_dir():
        if lora.is_adapter(path):  # merged into its base model
            config, adapters = lora.read_adapter(path)
            base = _base(path / lora.CONFIG_FILE, config.base_model, "; merge with `anychip lora merge --model BASE`")
            return lora.merge(load_checkpoint(base, weights), config, adapters)
        if prefix.is_adapter(path):  # its base model, carrying the prefix
            config, tensors = prefix.read_adapter(path)
            base = load_checkpoint(_base(path / prefix.CONFIG_FILE, config.base_model), weights)
            return prefix.with_prefix(base, config, tensors, str(path))
        if is_quantized(path):
            return load_quantized(path, dequantize=weights == "float")
        return load_hf_folder(path)
    if path.is_file():
        return load_gguf(path, weights)
    raise CheckpointError(f"{path}: no such file or folder (expected a .gguf file or a Hugging Face model folder)")


def _base(config_file: Path, base_model: str, hint: str = "") -> Path:
    """The base model an adapter names (a known name or a path)."""
    if not base_model:
        raise CheckpointError(f"{config_file}: base_model is empty{hint}")
    return resolve(base_model)
