"""Reading an adapter folder's two files, shared by LoRA (``lora.py``) and Prefix Tuning
(``prefix.py``): its JSON config, checked for the adapter's format tag, and its safetensors
weights. Errors name the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .checkpoint import CheckpointError


def read_config(path: Path, fmt: str, kind: str) -> dict:
    """The fields of the ``kind`` adapter config at ``path`` (its ``format`` tag, which must be
    ``fmt``, removed)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable {kind} config ({exc})") from exc
    if not isinstance(data, dict) or data.pop("format", None) != fmt:
        raise CheckpointError(f"{path}: not an anychip {kind} config (format {fmt!r} expected)")
    return data


def read_weights(path: Path, what: str) -> dict[str, np.ndarray]:
    """The tensors of the safetensors file at ``path`` (``what``: whose weights, for the error)."""
    from safetensors.numpy import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: missing ({what})")
    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc
