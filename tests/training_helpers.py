"""A tiny chat model folder and a small learnable SFT data set for the training tests (seconds,
no downloads), and running ``anychip`` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from loader_helpers import random_weights, tiny_config, train_tokenizer, write_hf_folder

# Replies that follow from the question, so a few steps of training visibly lower the loss
PAIRS = [("What is the capital of France?", "The capital of France is Paris."),
         ("Say hello.", "Hello world!"),
         ("Count from one.", "1234567890"),
         ("What jumps?", "the quick brown fox jumps over"),
         ("How is the weather?", "what is the weather like today?"),
         ("Name a word with accents.", "Café déjà vu, naïve façade")]


def chat_model(folder: Path, tie: bool = False, seed: int = 0) -> Path:
    tok = train_tokenizer()
    config = tiny_config(tok, tie_embeddings=tie)
    # norm weights at 1, as trained models have them; small random projections
    weights = {k: np.ones_like(v) if k.endswith("norm") else v * 0.2 for k, v in random_weights(config, seed).items()}
    return write_hf_folder(folder, config, weights, tok)


def sft_records(n: int = 24) -> list[dict]:
    records = []
    for i in range(n):
        src, tgt = PAIRS[i % len(PAIRS)]
        if i % 5 == 4:  # some multi-turn chats
            src2, tgt2 = PAIRS[(i + 1) % len(PAIRS)]
            records.append({"src": [src, src2], "tgt": [tgt, tgt2]})
        else:
            records.append({"src": src, "tgt": tgt})
    return records


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def anychip(*args, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "anychip.cli.main", *map(str, args)], capture_output=True,
                          text=True, env=full_env, timeout=timeout)


def losses(output: Path) -> list[float]:
    lines = (output / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r["loss"] for r in records if "loss" in r]


def as_array(records: list[float]) -> np.ndarray:
    return np.asarray(records, dtype=np.float64)


def strict_on_chip_then_resume_on_cpu(common: list, tmp_path: Path, device: str) -> subprocess.CompletedProcess:
    """Runs the training command ``common`` (4 steps, saving at 2) straight through on cpu, then
    on ``device`` under ANYCHIP_STRICT=1, asserting equal losses; deletes that run's last
    checkpoint and resumes it on cpu, asserting the same losses again. Returns the chip's run."""
    from anychip_models.training import checkpoints

    straight = anychip(*common, "--output", tmp_path / "cpu")
    assert straight.returncode == 0, straight.stderr
    moved = tmp_path / device
    first = anychip("--device", device, *common, "--output", moved, env={"ANYCHIP_STRICT": "1"})
    assert first.returncode == 0, first.stderr
    np.testing.assert_allclose(losses(moved), losses(tmp_path / "cpu"), rtol=1e-4)
    checkpoints.remove_tree(moved / "checkpoint-4")
    resumed = anychip(*common, "--output", moved, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    np.testing.assert_allclose(losses(moved), losses(tmp_path / "cpu"), rtol=1e-4)
    return first


def sft_folder(folder: Path) -> Path:
    """``folder`` with train.jsonl (24 records) and dev.jsonl (6) of the learnable SFT set."""
    write_jsonl(folder / "train.jsonl", sft_records())
    write_jsonl(folder / "dev.jsonl", sft_records(6))
    return folder


def finetune_tiny(model_dir, data, output, *extra, env: dict | None = None) -> subprocess.CompletedProcess:
    """4 steps of ``anychip finetune`` on ``data`` (batches of 2, zero padding), evaluating and
    saving at steps 2 and 4: the run the multi-rank tests compare."""
    return anychip("finetune", "--model", model_dir, "--data", data, "--max-length", 64, "--batch-size", 2,
                   "--max-steps", 4, "--zero-padding", "--lr", "5e-3", "--eval-steps", 2, "--save-steps", 2,
                   "--output", output, *extra, env=env)
