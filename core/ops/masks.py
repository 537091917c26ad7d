"""FlashMask ``startend_row_indices`` for the usual mask families, as int32 numpy arrays of
shape [batch, 1, seq, E] (pass to ``paddle.to_tensor``). Rows hidden from each key column are
described in anychip/kernel.h; ``attention.flashmask_dense_mask`` expands them."""

from __future__ import annotations

import numpy as np


def _stack(*columns) -> np.ndarray:
    return np.stack(columns, axis=-1).astype(np.int32)[None, None]


def causal(seq: int) -> np.ndarray:
    """Plain causal (use with causal=True): nothing hidden beyond the triangle."""
    return _stack(np.full(seq, seq))


def sliding_window(seq: int, window: int) -> np.ndarray:
    """Causal, each query sees itself and the ``window - 1`` keys before it (causal=True)."""
    return _stack(np.minimum(np.arange(seq) + window, seq))


def causal_document(doc_lens) -> np.ndarray:
    """Packed documents, causal within each, none across (causal=True)."""
    ends = np.repeat(np.cumsum(doc_lens), doc_lens)
    return _stack(ends)


def prefix_lm(doc_lens, prefix_lens) -> np.ndarray:
    """Packed documents whose first ``prefix_lens[i]`` tokens attend bidirectionally, the rest
    causally (causal=False; E=2: [LTS, UTE])."""
    starts = np.concatenate([[0], np.cumsum(doc_lens)[:-1]])
    lts, ute = [], []
    for start, length, prefix in zip(starts, doc_lens, prefix_lens):
        for j in range(start, start + length):
            lts.append(start + length)                       # below the document: hidden
            ute.append(start if j < start + prefix else j)   # above: prefix columns open to the doc
    return _stack(np.array(lts), np.array(ute))


def share_question(question_len: int, answer_lens) -> np.ndarray:
    """One question followed by several answers, each answer seeing the question and itself but
    not the other answers (causal=True; E=2: [LTS, LTE])."""
    return packed_share_question([(question_len, answer_lens)], question_len + int(sum(answer_lens)))


def packed_share_question(groups, seq: int) -> np.ndarray:
    """Groups of (question_len, answer_lens) packed one after another into ``seq`` tokens, each
    a ``share_question`` that nothing outside it sees; the tokens after the last group (padding)
    are one more document (causal=True; E=2: [LTS, LTE])."""
    lts = np.full(seq, seq)
    lte = np.full(seq, seq)
    start = 0
    for question_len, answer_lens in groups:
        end = start + question_len + int(sum(answer_lens))
        lts[start:start + question_len] = end  # the question: seen by its own answers only
        start += question_len
        for length in answer_lens:
            lts[start:start + length] = start + length  # later answers don't see this answer
            start += length
    if start > seq:
        raise ValueError(f"the groups hold {start} tokens, more than seq {seq}")
    return _stack(lts, lte)
