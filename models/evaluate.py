"""Perplexity of a model on a text: exp of the mean negative log-likelihood of each token given
the ones before it, in windows of the model's context."""

from __future__ import annotations

import numpy as np

from .llama import LlamaForCausalLM, paddle
from anychip.ops.dispatch import place


def perplexity(model: LlamaForCausalLM, ids: list[int], window: int = 512) -> float:
    """Perplexity of ``ids`` (at least 2 tokens), scored in consecutive windows of ``window``
    tokens (each window starts a fresh context)."""
    if len(ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, got {len(ids)}")
    dev = place(model.device)
    nll, count = 0.0, 0
    with paddle.no_grad():
        for start in range(0, len(ids) - 1, window):
            chunk = np.asarray(ids[start:start + window + 1], dtype=np.int64)
            if len(chunk) < 2:
                break
            inputs, targets = chunk[:-1], chunk[1:]
            logits = model(paddle.to_tensor(inputs[None], place=dev),
                           paddle.to_tensor(np.arange(len(inputs), dtype=np.int64)[None], place=dev)).numpy()[0]
            logits = logits.astype(np.float64)
            top = logits.max(-1, keepdims=True)
            logz = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
            nll += float((logz - logits[np.arange(len(targets)), targets]).sum())
            count += len(targets)
    return float(np.exp(nll / count))
