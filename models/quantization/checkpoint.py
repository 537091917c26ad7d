"""anychip's quantized model folder ("anychip-quant/1"): a Hugging Face-style folder whose linear
weights stay quantized on disk, loaded by :func:`anychip_models.loader.load_checkpoint`.

    config.json, tokenizer.json, tokenizer_config.json, generation_config.json   as export writes them
    model.safetensors    float tensors (float32) under their Hugging Face names, as export writes them;
                         a quantized tensor as ``<hf name>.qweight`` (int8 [N, K], or uint8 [N, K/2]
                         for 4 bits), ``<hf name>.scales`` (float32 [N, G]) and, for asymmetric groups,
                         ``<hf name>.offsets`` (float32 [N, G]): anychip's weight-only layout
                         (:class:`~anychip_models.checkpoint.QuantWeight`, anychip/kernel.h)
    quantization.json    {"format": "anychip-quant/1", "quant_type": "wint8" | "wint4" | "a8w8",
                          "method": {...free-form: how it was made, e.g. {"gptq": true, "group_size": 128,
                                     "calibration": {...}}},
                          "tensors": {"layers.0.q_proj": {"scheme": "weight_only", "bits": 4,
                                                          "group_size": 128, "offsets": false},
                                      "layers.0.o_proj": {"scheme": "a8w8"}, ...}}

``tensors`` lists every quantized tensor by its canonical name
(:func:`anychip_models.checkpoint.tensor_shapes`); every other tensor of the config is float.
Scheme ``weight_only``: W = q * scales[n, k // group_size] (+ offsets), activations float.
Scheme ``a8w8``: int8 weights with one scale per output channel (scales [N, 1]) whose activations
are quantized to int8 per token at run time (:class:`~anychip_models.checkpoint.W8A8Weight`,
``ops.w8a8_linear``). ``quant_type`` names the recipe of the linears; the embedding and the head
may be in another scheme (or float), as their entries say.

    write_quantized("out/model-wint4", ckpt.config, tensors, ckpt.tokenizer, "wint4", {"gptq": True})
    ckpt = load_checkpoint("out/model-wint4", weights="native")   # QuantWeight / W8A8Weight values
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save as st_save

from ..checkpoint import Checkpoint, CheckpointError, ModelConfig, QuantWeight, W8A8Weight, tensor_shape, tensor_shapes
from ..export import hf_metadata_files, write_model_folder
from ..hf_folder import hf_name, listed_config, load_tensor, read_config, safetensors_files
from ..tokenizer import Tokenizer

FORMAT = "anychip-quant/1"
QUANT_FILE = "quantization.json"
WEIGHTS_FILE = "model.safetensors"
QUANT_TYPES = ("wint8", "wint4", "a8w8")
SCHEMES = ("weight_only", "a8w8")
PARTS = ("qweight", "scales", "offsets")
_RAW_DTYPES = {"I8": np.int8, "U8": np.uint8, "F32": np.float32}


def is_quantized(folder) -> bool:
    """Whether ``folder`` is a quantized folder (holds quantization.json)."""
    return (Path(folder) / QUANT_FILE).is_file()


# ---- writing -------------------------------------------------------------------------------------

def tensor_entry(value: QuantWeight) -> dict:
    """The quantization.json entry of a quantized tensor."""
    if isinstance(value, W8A8Weight):
        return {"scheme": "a8w8"}
    return {"scheme": "weight_only", "bits": value.bits, "group_size": value.group_size,
            "offsets": value.offsets is not None}


def _check_quantized(name: str, value: QuantWeight, shape: tuple[int, ...]) -> None:
    if len(shape) != 2:
        raise ValueError(f"tensor {name!r} is {len(shape)}-D {list(shape)}: only [N, K] weights can be quantized")
    n, k = shape
    if value.bits not in (4, 8):
        raise ValueError(f"tensor {name!r}: bits must be 4 or 8, got {value.bits}")
    if value.group_size != -1 and (value.group_size <= 0 or k % value.group_size):
        raise ValueError(f"tensor {name!r}: group_size must be -1 or divide K={k}, got {value.group_size}")
    if value.bits == 4 and k % 64:
        raise ValueError(f"tensor {name!r}: 4-bit weights need K to be a multiple of 64, got K={k}")
    groups = 1 if value.group_size == -1 else k // value.group_size
    want = {"qweight": ((n, k if value.bits == 8 else k // 2), np.int8 if value.bits == 8 else np.uint8),
            "scales": ((n, groups), None), "offsets": ((n, groups), None)}
    for part, (part_shape, dtype) in want.items():
        array = getattr(value, part)
        if array is None:
            continue
        if tuple(array.shape) != part_shape:
            raise ValueError(f"tensor {name!r}: {part} has shape {list(array.shape)}, {value.bits}-bit weights "
                             f"[{n}, {k}] with group_size {value.group_size} make it {list(part_shape)}")
        if dtype is not None and array.dtype != dtype:
            raise ValueError(f"tensor {name!r}: {part} must be {np.dtype(dtype).name}, got {array.dtype}")


def quantized_files(config: ModelConfig, tensors: dict, tokenizer: Tokenizer, quant_type: str,
                    method: dict) -> dict[str, bytes]:
    """File name -> contents of the quantized folder (see the module doc). ``tensors``: every
    tensor of ``config`` under its canonical name, as numpy (written float32), QuantWeight
    (weight-only) or W8A8Weight (a8w8)."""
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type must be one of {', '.join(QUANT_TYPES)}, got {quant_type!r}")
    if not isinstance(method, dict):
        raise ValueError(f"method must be a dict (how the model was quantized), got {type(method).__name__}")
    shapes = tensor_shapes(config)
    missing, unknown = shapes.keys() - tensors.keys(), tensors.keys() - shapes.keys()
    if missing or unknown:
        raise ValueError(f"tensors do not match the config: missing {sorted(missing)}, unexpected {sorted(unknown)}")
    named, entries = {}, {}
    for name, shape in shapes.items():
        value, file_name = tensors[name], hf_name(name)
        if isinstance(value, QuantWeight):
            _check_quantized(name, value, shape)
            entries[name] = tensor_entry(value)
            for part in PARTS:
                array = getattr(value, part)
                if array is not None:
                    dtype = np.float32 if part != "qweight" else array.dtype
                    named[f"{file_name}.{part}"] = np.ascontiguousarray(array, dtype=dtype)
            continue
        value = np.asarray(value)
        if value.shape != shape:
            raise ValueError(f"tensor {name!r} has shape {list(value.shape)}, the config makes it {list(shape)}")
        named[file_name] = np.ascontiguousarray(value, dtype=np.float32)
    try:
        quant = {"format": FORMAT, "quant_type": quant_type, "method": method, "tensors": entries}
        quant_json = (json.dumps(quant, indent=2) + "\n").encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"method is not JSON-serializable: {exc}") from exc
    weights = st_save(named, metadata={"format": "pt", "anychip": FORMAT})
    return {**hf_metadata_files(config, tokenizer), WEIGHTS_FILE: weights, QUANT_FILE: quant_json}


def write_quantized(folder, config: ModelConfig, tensors: dict, tokenizer: Tokenizer, quant_type: str,
                    method: dict) -> Path:
    """Writes the quantized folder atomically (:func:`anychip_models.export.write_model_folder`);
    everything is validated and serialized before the disk is touched."""
    return write_model_folder(folder, quantized_files(config, tensors, tokenizer, quant_type, method))


# ---- reading -------------------------------------------------------------------------------------

def read_quantization(folder) -> dict:
    """quantization.json of ``folder``, checked: format, quant_type, method and every tensor
    entry (a canonical [N, K] tensor of config.json, a known scheme, a valid format)."""
    folder = Path(folder)
    path = folder / QUANT_FILE
    try:
        quant = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{folder}: {QUANT_FILE} is missing (not a quantized folder)") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(quant, dict) or quant.get("format") != FORMAT:
        found = quant.get("format") if isinstance(quant, dict) else type(quant).__name__
        raise CheckpointError(f"{path}: not an anychip quantization file (format {FORMAT!r} expected, got {found!r})")
    if quant.get("quant_type") not in QUANT_TYPES:
        raise CheckpointError(f"{path}: quant_type must be one of {', '.join(QUANT_TYPES)}, "
                              f"got {quant.get('quant_type')!r}")
    if not isinstance(quant.get("method", {}), dict):
        raise CheckpointError(f"{path}: method must be an object")
    entries = quant.get("tensors")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path}: tensors must be an object (canonical name -> scheme)")
    config = read_config(folder)
    for name, entry in entries.items():
        where = f"{path}: tensor {name!r}"
        shape = tensor_shape(config, name)
        if shape is None:
            raise CheckpointError(f"{where} is not a tensor of this model (config.json)")
        if len(shape) != 2:
            raise CheckpointError(f"{where} is {list(shape)}: only [N, K] weights can be quantized")
        if not isinstance(entry, dict) or entry.get("scheme") not in SCHEMES:
            scheme = entry.get("scheme") if isinstance(entry, dict) else entry
            raise CheckpointError(f"{where} has unknown scheme {scheme!r} (known: {', '.join(SCHEMES)})")
        if entry["scheme"] == "weight_only":
            k = shape[1]
            bits, group_size, offsets = entry.get("bits"), entry.get("group_size", -1), entry.get("offsets", False)
            if bits not in (4, 8):
                raise CheckpointError(f"{where}: bits must be 4 or 8, got {bits!r}")
            if not isinstance(group_size, int) or (group_size != -1 and (group_size <= 0 or k % group_size)):
                raise CheckpointError(f"{where}: group_size must be -1 or divide K={k}, got {group_size!r}")
            if bits == 4 and k % 64:
                raise CheckpointError(f"{where}: 4-bit weights need K to be a multiple of 64, got K={k}")
            if not isinstance(offsets, bool):
                raise CheckpointError(f"{where}: offsets must be true or false, got {offsets!r}")
    quant.setdefault("method", {})
    return quant


def _read_raw(file, name: str, canonical: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Tensor ``name`` of a SafetensorsFile, checked to be ``dtype`` ``shape``, read as is."""
    info = file.header[name]
    want = next(key for key, value in _RAW_DTYPES.items() if value == dtype)
    if info.get("dtype") != want:
        raise CheckpointError(f"{file.path}: tensor {name!r} ({canonical}) has dtype {info.get('dtype')}, "
                              f"expected {want}")
    found = tuple(int(d) for d in info["shape"])
    if found != shape:
        raise CheckpointError(f"{file.path}: tensor {name!r} ({canonical}) has shape {list(found)}, "
                              f"quantization.json and config.json make it {list(shape)}")
    begin, end = (file.data_start + int(o) for o in info["data_offsets"])
    count = int(np.prod(shape))
    if end - begin != count * np.dtype(dtype).itemsize or end > file.path.stat().st_size:
        raise CheckpointError(f"{file.path}: tensor {name!r} ({canonical}) has data at bytes {begin}..{end} that "
                              f"does not fit its shape {list(shape)} or the file; the file may be truncated")
    return np.fromfile(file.path, dtype=dtype, count=count, offset=begin).reshape(shape)


def load_quantized(folder, dequantize: bool = False) -> Checkpoint:
    """The quantized folder as a Checkpoint: its quantized tensors as QuantWeight (weight_only) or
    W8A8Weight (a8w8), the others float32; with ``dequantize`` every tensor as float32 (W = q *
    scale (+ offset), exact). Errors name the file and the tensor."""
    folder = Path(folder)
    config = read_config(folder)
    entries = read_quantization(folder)["tensors"]
    files = safetensors_files(folder)
    index = folder / "model.safetensors.index.json"
    where = index if index.is_file() else ", ".join(sorted({str(f.path) for f in files.values()})) or folder
    tensors = {}
    for name, shape in tensor_shapes(listed_config(config, files, folder)).items():
        file_name, entry = hf_name(name), entries.get(name)
        if entry is None:
            tensors[name] = load_tensor(files, name, shape, where)
            continue
        n, k = shape
        if entry["scheme"] == "a8w8":
            bits, group_size, has_offsets = 8, -1, False
        else:
            bits, group_size, has_offsets = entry["bits"], entry.get("group_size", -1), entry.get("offsets", False)
        groups = 1 if group_size == -1 else k // group_size
        want = {"qweight": (np.int8 if bits == 8 else np.uint8, (n, k if bits == 8 else k // 2)),
                "scales": (np.float32, (n, groups))}
        if has_offsets:
            want["offsets"] = (np.float32, (n, groups))
        parts = {}
        for part, (dtype, part_shape) in want.items():
            part_name = f"{file_name}.{part}"
            file = files.get(part_name)
            if file is None:
                raise CheckpointError(f"{where}: tensor {part_name!r} ({name}, {entry['scheme']}) is missing "
                                      f"(quantization.json lists {name} as {entry['scheme']})")
            parts[part] = _read_raw(file, part_name, name, dtype, part_shape)
        if entry["scheme"] == "a8w8":
            value = W8A8Weight(parts["qweight"], parts["scales"])
        else:
            value = QuantWeight(parts["qweight"], parts["scales"], bits, group_size, parts.get("offsets"))
        tensors[name] = value.dequantize().astype(np.float32) if dequantize else value
    return Checkpoint(config=config, tensors=tensors, tokenizer=Tokenizer.from_hf_folder(folder), source=folder)


def folder_size(folder) -> int:
    """Bytes of the model's files in ``folder`` (the sum of their sizes, what ``du -b`` counts),
    leaving out leftovers of interrupted writes (``.tmp-*`` / ``.old-*``)."""
    total = 0
    for path in Path(folder).rglob("*"):
        if any(part.startswith((".tmp-", ".old-")) for part in path.relative_to(folder).parts):
            continue
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total
