"""Perplexity of a model on a text: exp of the mean negative log-likelihood of each token given
the ones before it, in windows of the model's context."""

from __future__ import annotations

import numpy as np

from .llama import LlamaForCausalLM, paddle
from anychip.ops.dispatch import place


def _nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Summed negative log-likelihood of targets [T] under logits [T, V]."""
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    logz = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
    return float((logz - logits[np.arange(len(targets)), targets]).sum())


def _windows(ids: list[int], window: int) -> list[np.ndarray]:
    """Consecutive windows of ``window`` scored tokens (each a fresh context), every window with
    the token before its first scored one."""
    if len(ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, got {len(ids)}")
    chunks = [np.asarray(ids[start:start + window + 1], dtype=np.int64) for start in range(0, len(ids) - 1, window)]
    return [c for c in chunks if len(c) >= 2]


def _windowed(ids: list[int], window: int, logits_of, progress=None) -> float:
    """exp of the mean NLL over consecutive windows of ``window`` tokens (each a fresh context);
    ``logits_of(chunk)`` gives the logits [T - 1, V] predicting chunk[1:] from chunk [T]."""
    nll, count = 0.0, 0
    with paddle.no_grad():
        for chunk in _windows(ids, window):
            nll += _nll(logits_of(chunk), chunk[1:])
            count += len(chunk) - 1
            if progress is not None:
                progress(len(chunk) - 1)
    return float(np.exp(nll / count))


def perplexity(model: LlamaForCausalLM, ids: list[int], window: int = 512) -> float:
    """Perplexity of ``ids`` (at least 2 tokens), scored in consecutive windows of ``window``
    tokens (each window starts a fresh context), each window in one forward pass."""
    dev = place(model.device)

    def logits_of(chunk):
        inputs = chunk[:-1]
        return model(paddle.to_tensor(inputs[None], place=dev),
                     paddle.to_tensor(np.arange(len(inputs), dtype=np.int64)[None], place=dev)).numpy()[0]

    return _windowed(ids, window, logits_of)


def decode_perplexity(model: LlamaForCausalLM, ids: list[int], window: int = 512, progress=None,
                      batch: int = 1) -> float:
    """Perplexity as generation computes it: each window's first token prefilled, then every
    next token's logits from one decode step through the KV cache (the fused decoder_step where
    the device has it), fed the text's own tokens. ``batch`` windows decode side by side, one
    step for all of them, as a server's running requests do (a model with ``batch_int8`` then
    takes its int8 path). ``progress(n)`` is told of each n tokens."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    dev = place(model.device)
    chunks = _windows(ids, window)
    nll, count = 0.0, 0
    with paddle.no_grad():
        for g in range(0, len(chunks), batch):
            group = chunks[g:g + batch]
            cache = model.new_cache(len(group), max(len(c) for c in group))
            first = model(paddle.to_tensor(np.stack([c[:1] for c in group]), place=dev),
                          paddle.to_tensor(np.zeros((len(group), 1), np.int64), place=dev), cache).numpy()[:, -1]
            logits = [[first[b]] for b in range(len(group))]
            for pos in range(1, max(len(c) for c in group) - 1):
                live = [b for b, c in enumerate(group) if pos < len(c) - 1]
                step = model.decode(paddle.to_tensor(np.array([group[b][pos] for b in live]), place=dev),
                                    paddle.to_tensor(np.full(len(live), pos, np.int64), place=dev), cache,
                                    cache_rows=live).numpy()
                for j, b in enumerate(live):
                    logits[b].append(step[j])
            for b, c in enumerate(group):
                nll += _nll(np.stack(logits[b]), c[1:])
                count += len(c) - 1
                if progress is not None:
                    progress(len(c) - 1)
    return float(np.exp(nll / count))


def choice_logliks(model: LlamaForCausalLM, tokenizer, context: str, choices: list[str],
                   delimiter: str = " ") -> list[float]:
    """log p(delimiter + choice | context) for each choice, summed over the choice's tokens, as
    lm-evaluation-harness scores a multiple-choice item: the context's trailing spaces move to
    the continuation, the pair is tokenized whole and the continuation is the tokens after the
    context's own."""
    dev = place(model.device)
    out = []
    for choice in choices:
        continuation = delimiter + choice
        stripped = context.rstrip(" ")
        continuation = context[len(stripped):] + continuation
        context_ids = tokenizer.encode(stripped, add_bos=tokenizer.add_bos) if stripped else (
            [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else [])
        whole = tokenizer.encode(stripped + continuation, add_bos=tokenizer.add_bos)
        start = len(context_ids)
        if start < 1 or start >= len(whole):
            raise ValueError(f"cannot score {choice!r} after {context[:40]!r}: the context must be at least one token "
                             "and the choice add at least one")
        inputs = np.asarray(whole[:-1], dtype=np.int64)
        with paddle.no_grad():
            logits = model(paddle.to_tensor(inputs[None], place=dev),
                           paddle.to_tensor(np.arange(len(inputs), dtype=np.int64)[None], place=dev)).numpy()[0]
        targets = np.asarray(whole[start:], dtype=np.int64)
        out.append(-_nll(logits[start - 1:], targets))
    return out


def multiple_choice(model: LlamaForCausalLM, tokenizer, items: list[dict], progress=None) -> dict:
    """Accuracy over ``items`` ({"context", "choices", "answer"}): an item is right when its answer
    has the highest log-likelihood. Returns the accuracy and each item's log-likelihoods."""
    scored = []
    for item in items:
        scored.append(choice_logliks(model, tokenizer, item["context"], item["choices"]))
        if progress is not None:
            progress(1)
    right = [int(np.argmax(s)) == item["answer"] for s, item in zip(scored, items)]
    return {"accuracy": float(np.mean(right)), "items": len(items), "correct": int(sum(right)), "logliks": scored}
