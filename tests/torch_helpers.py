"""Shared by the PyTorch front-end tests: SmolLM2 as a Hugging Face folder (exported once per
session), and running a script in a fresh process (PyTorch has one PrivateUse1 backend, bound to
one chip per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def smollm2_folder(root: Path) -> Path:
    """SmolLM2-135M exported by anychip (float32 safetensors, config.json, tokenizer.json)."""
    from anychip_models.export import write_hf_folder
    from anychip_models.hub import resolve
    from anychip_models.loader import load_checkpoint

    folder = root / "smollm2-hf"
    if not (folder / "config.json").exists():
        ckpt = load_checkpoint(resolve("smollm2"), weights="float")
        write_hf_folder(str(folder), ckpt.config, ckpt.tensors, ckpt.tokenizer)
    return folder


def run_script(code: str, chip: str, timeout: float = 600, strict: bool = False) -> dict:
    """Runs ``code`` with PyTorch's anychip device bound to ``chip``; the script prints one JSON
    line last, returned parsed."""
    env = dict(os.environ, ANYCHIP_TORCH_CHIP=chip, ANYCHIP_STRICT="1" if strict else "0")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"script failed on {chip} (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
