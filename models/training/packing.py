"""Batches of fine-tuning Examples: greedy zero padding (several examples packed into each
``max_length`` sequence, as PaddleNLP's ``greedy_zero_padding`` packs them, kept apart by a
FlashMask causal-document mask and restarting position ids) or plain right padding.

    batches = packed_batches(examples, max_length=512, batch_size=4)
    batch.input_ids, batch.labels, batch.position_ids      # int64 [B, L]
    batch.startend_row_indices                             # int32 [B, 1, L, 1], for flashmask_attention

Labels are next-token targets: ``labels[t]`` is the token at ``t + 1`` of the same example when
that token is a target (``Example.target_mask``), else -100; the last token of each example gets
-100, so nothing is ever predicted across two packed examples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from anychip.ops.masks import causal_document

from .data import DataError, Example

IGNORE = -100  # label of a position with no loss
PAD_ID = 0


@dataclass
class Batch:
    input_ids: np.ndarray                    # int64 [B, L]
    labels: np.ndarray                       # int64 [B, L], IGNORE where no loss
    position_ids: np.ndarray                 # int64 [B, L], from 0 in each example
    startend_row_indices: np.ndarray | None  # int32 [B, 1, L, 1] (packed), None (plain padding: causal)
    real_tokens: int                         # tokens of examples, padding excluded
    examples: list[int]                      # indices into the examples given, row by row

    @property
    def shape(self) -> tuple[int, int]:
        return self.input_ids.shape

    @property
    def loss_tokens(self) -> int:
        return int((self.labels != IGNORE).sum())


def greedy_pack(lengths: list[int], max_length: int, buffer_size: int = 500) -> list[list[int]]:
    """Indices of ``lengths`` grouped into packs of at most ``max_length`` tokens, PaddleNLP's
    greedy zero padding: over each buffer of ``buffer_size`` consecutive examples, in order,
    each example goes into the open pack with the most room left (the first opened of equals)
    if it fits there, else into a new pack. Packs come out buffer by buffer, in the order they
    were opened, each listing its examples in data order."""
    if max_length < 1 or buffer_size < 1:
        raise ValueError(f"max_length and buffer_size must be positive, not {max_length} and {buffer_size}")
    for i, n in enumerate(lengths):
        if not 1 <= n <= max_length:
            raise DataError(f"example {i} has {n} tokens, which does not fit max_length {max_length} "
                            "(truncate examples when tokenizing them)")
    packs: list[list[int]] = []
    for start in range(0, len(lengths), buffer_size):
        opened: list[list[int]] = []
        room: list[int] = []
        for i in range(start, min(start + buffer_size, len(lengths))):
            best = max(range(len(room)), key=room.__getitem__, default=None)  # first of the largest
            if best is None or room[best] < lengths[i]:
                opened.append([])
                room.append(max_length)
                best = len(room) - 1
            opened[best].append(i)
            room[best] -= lengths[i]
        packs += opened
    return packs


def _labels(example: Example) -> np.ndarray:
    ids = np.asarray(example.input_ids, dtype=np.int64)
    mask = np.asarray(example.target_mask, dtype=bool)
    labels = np.full(len(ids), IGNORE, dtype=np.int64)
    labels[:-1] = np.where(mask[1:], ids[1:], IGNORE)
    return labels


def _check(examples: list[Example]) -> None:
    for i, e in enumerate(examples):
        if len(e.input_ids) != len(e.target_mask) or not e.input_ids:
            raise DataError(f"example {i} (line {e.line}): {len(e.input_ids)} input ids and "
                            f"{len(e.target_mask)} mask values")


def packed_batches(examples: list[Example], max_length: int, batch_size: int,
                   buffer_size: int = 500) -> list[Batch]:
    """Rows of exactly ``max_length`` tokens, each some examples packed by ``greedy_pack`` then
    padding (id 0, label -100, its own trailing document in the mask); ``batch_size`` rows a
    batch (the last may have fewer)."""
    _check(examples)
    packs = greedy_pack([len(e.input_ids) for e in examples], max_length, buffer_size)
    batches = []
    for first in range(0, len(packs), batch_size):
        rows = packs[first:first + batch_size]
        b = len(rows)
        input_ids = np.full((b, max_length), PAD_ID, dtype=np.int64)
        labels = np.full((b, max_length), IGNORE, dtype=np.int64)
        position_ids = np.zeros((b, max_length), dtype=np.int64)
        startend = np.empty((b, 1, max_length, 1), dtype=np.int32)
        real = 0
        for r, pack in enumerate(rows):
            doc_lens, at = [], 0
            for i in pack:
                e = examples[i]
                n = len(e.input_ids)
                input_ids[r, at:at + n] = e.input_ids
                labels[r, at:at + n] = _labels(e)
                position_ids[r, at:at + n] = np.arange(n)
                doc_lens.append(n)
                at += n
            real += at
            if at < max_length:  # the padding: one more document, seen by nothing else
                position_ids[r, at:] = np.arange(max_length - at)
                doc_lens.append(max_length - at)
            startend[r] = causal_document(doc_lens)[0]
        batches.append(Batch(input_ids, labels, position_ids, startend, real,
                             [i for pack in rows for i in pack]))
    return batches


def padded_batches(examples: list[Example], batch_size: int) -> list[Batch]:
    """One example a row, in data order, right-padded (id 0, label -100) to the longest of its
    batch; plain causal attention (``startend_row_indices`` None)."""
    _check(examples)
    batches = []
    for first in range(0, len(examples), batch_size):
        index = list(range(first, min(first + batch_size, len(examples))))
        length = max(len(examples[i].input_ids) for i in index)
        b = len(index)
        input_ids = np.full((b, length), PAD_ID, dtype=np.int64)
        labels = np.full((b, length), IGNORE, dtype=np.int64)
        for r, i in enumerate(index):
            e = examples[i]
            input_ids[r, :len(e.input_ids)] = e.input_ids
            labels[r, :len(e.input_ids)] = _labels(e)
        position_ids = np.broadcast_to(np.arange(length, dtype=np.int64), (b, length)).copy()
        real = sum(len(examples[i].input_ids) for i in index)
        batches.append(Batch(input_ids, labels, position_ids, None, real, index))
    return batches


class ExampleData:
    """Fine-tuning examples as the Trainer draws them: ``batches(order, args)`` packs (zero
    padding) or pads the examples at ``order``, in that order."""

    def __init__(self, examples: list[Example]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def batches(self, order, args) -> list[Batch]:
        examples = [self.examples[i] for i in order]
        if args.zero_padding:
            return packed_batches(examples, args.max_length, args.batch_size, args.buffer_size)
        return padded_batches(examples, args.batch_size)


def padding_efficiency(examples: list[Example], max_length: int, batch_size: int,
                       buffer_size: int = 500) -> dict:
    """The share of real tokens among all the tokens computed, under zero padding (packs of
    ``max_length``) and under plain padding to the longest example of each batch of
    ``batch_size``; with the number of sequences (rows) each makes."""
    lengths = [len(e.input_ids) for e in examples]
    real = sum(lengths)
    packs = greedy_pack(lengths, max_length, buffer_size)
    padded = sum(len(lengths[i:i + batch_size]) * max(lengths[i:i + batch_size])
                 for i in range(0, len(lengths), batch_size))
    return {"zero_padding": real / (len(packs) * max_length) if packs else 0.0,
            "padding": real / padded if padded else 0.0,
            "sequences_packed": len(packs), "sequences_padded": len(lengths)}
