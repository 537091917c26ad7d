"""Preference data for DPO: PaddleNLP's format, one JSON object per line,

    {"src": "question" | [turn, ...], "tgt": [earlier answer, ...], "response": [chosen, rejected]}

(``tgt`` holds one answer fewer than ``src`` has turns: the last turn's answer is the response
pair), tokenized through a chat format as SFT records are, and batched two ways:

- unpacked: each pair as two rows, prompt + chosen and prompt + rejected, right-padded;
- shared-prompt packing (``zero_padding``): prompt, chosen, rejected once each in one row, several
  pairs to a ``max_length`` row, under a FlashMask of the shared-question family: each response
  sees the prompt and itself, never the other response, and nothing sees another pair. The
  prompt is computed once instead of twice.

Either way a batch lists, for every response token, the row position whose logits predict it
(``rows``, flattened over the batch: in a packed row both responses' first tokens are predicted
from the prompt's last position) and which response it belongs to, so ``sequence_logps`` sums
the log-probabilities of each response.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from anychip.ops.masks import packed_share_question

from .data import ChatFormat, DataError, load_records
from .packing import PAD_ID, greedy_pack


@dataclass
class PreferencePair:
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    line: int

    def __len__(self) -> int:  # the packed length
        return len(self.prompt) + len(self.chosen) + len(self.rejected)


@dataclass
class PreferenceBatch:
    input_ids: np.ndarray                    # int64 [B, L]
    position_ids: np.ndarray                 # int64 [B, L]
    startend_row_indices: np.ndarray | None  # int32 [B, 1, L, E], None: plain causal (unpacked)
    rows: np.ndarray                         # int64 [R]: flat position (b * L + t) predicting each response token
    labels: np.ndarray                       # int64 [R]: the token it predicts
    response: np.ndarray                     # int64 [R]: 2 p + 0 (chosen) or 2 p + 1 (rejected) of pair p
    pairs: list[int]                         # the pairs' indices into the data, in batch order
    real_tokens: int                         # tokens computed, padding excluded

    @property
    def num_pairs(self) -> int:
        return len(self.pairs)

    def selectors(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 [pairs, R] matrices summing the rows of each pair's chosen, then rejected response."""
        out = []
        for side in (0, 1):
            m = np.zeros((self.num_pairs, len(self.rows)), np.float32)
            mine = self.response % 2 == side
            m[self.response[mine] // 2, np.flatnonzero(mine)] = 1.0
            out.append(m)
        return out[0], out[1]


# ---- records -------------------------------------------------------------------------------------

def _texts(record) -> tuple[list[str], list[str], str, str]:
    if not isinstance(record, dict):
        raise DataError(f"not a JSON object (a {type(record).__name__})")
    if "response" not in record:
        raise DataError("missing key 'response' (expected [chosen, rejected])")
    response = record["response"]
    if not isinstance(response, list) or len(response) != 2 or not all(isinstance(r, str) for r in response):
        got = (f"a list of {len(response)}" if isinstance(response, list) else f"a {type(response).__name__}")
        raise DataError(f"'response' must be [chosen, rejected], two strings; got {got}")
    for name, text in zip(("chosen", "rejected"), response):
        if not text.strip():
            raise DataError(f"empty {name} response")
    if "src" not in record:
        raise DataError("missing key 'src'")
    src = record["src"]
    src = [src] if isinstance(src, str) else src
    tgt = record.get("tgt", [])
    tgt = [tgt] if isinstance(tgt, str) else tgt
    for key, value in (("src", src), ("tgt", tgt)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DataError(f"'{key}' must be a string or a list of strings")
    if not src or not all(s.strip() for s in src):
        raise DataError("empty 'src'")
    if len(tgt) != len(src) - 1:
        raise DataError(f"'src' has {len(src)} turns, so 'tgt' needs {len(src) - 1} earlier answers, not {len(tgt)}")
    return src, tgt, response[0], response[1]


def tokenize_pair(fmt: ChatFormat, record, max_length: int, line: int) -> PreferencePair:
    """One record as a PreferencePair whose prompt and two responses fit ``max_length`` together
    (the responses are cut, evenly, when they do not)."""
    src, tgt, chosen_text, rejected_text = _texts(record)
    sides = []
    for answer in (chosen_text, rejected_text):
        system, turns = fmt.segments(src, tgt + [answer])
        prompt = list(system)
        for user, bot in turns[:-1]:
            prompt += user + bot
        prompt += turns[-1][0]
        sides.append((prompt, turns[-1][1]))
    (prompt, chosen), (other, rejected) = sides
    if prompt != other:
        raise DataError("the chat template writes the prompt differently for the two responses")
    room = max_length - len(prompt)
    if room < 2:
        raise DataError(f"the prompt is {len(prompt)} tokens, which leaves no room for two responses in "
                        f"max_length {max_length}")
    if len(chosen) + len(rejected) > room:
        keep_c = max(room // 2, room - len(rejected))
        chosen, rejected = chosen[:keep_c], rejected[:room - min(keep_c, len(chosen))]
    return PreferencePair(prompt, chosen, rejected, line)


def load_preference_data(path, fmt: ChatFormat, max_length: int, on_bad: str = "skip", split: str = "train"):
    """The PreferencePairs of a jsonl file or a data folder's ``{split}.jsonl``, with the bad
    records (a missing or malformed ``response``, empty texts, turn counts that do not match)
    by line number, as load_sft_data reports them."""
    if max_length < 3:
        raise ValueError(f"max_length must be at least 3, not {max_length}")
    return load_records(path, lambda record, line: tokenize_pair(fmt, record, max_length, line), on_bad, split)


# ---- batches --------------------------------------------------------------------------------------

def packed_pair_batches(pairs: list[PreferencePair], order, max_length: int, batch_size: int,
                        buffer_size: int = 500) -> list[PreferenceBatch]:
    """Shared-prompt packing: rows of ``max_length``, each some pairs packed greedily (as SFT's
    zero padding packs examples) as prompt, chosen, rejected."""
    order = list(order)
    packs = greedy_pack([len(pairs[i]) for i in order], max_length, buffer_size)
    out = []
    for first in range(0, len(packs), batch_size):
        rows_of_batch = packs[first:first + batch_size]
        b, L = len(rows_of_batch), max_length
        ids = np.full((b, L), PAD_ID, np.int64)
        positions = np.zeros((b, L), np.int64)
        startend = np.empty((b, 1, L, 2), np.int32)
        rows, labels, response, batch_pairs, real = [], [], [], [], 0
        for r, pack in enumerate(rows_of_batch):
            at, groups = 0, []
            for j in pack:
                pair = pairs[order[j]]
                p, c, n = len(pair.prompt), len(pair.chosen), len(pair.rejected)
                ids[r, at:at + p + c + n] = pair.prompt + pair.chosen + pair.rejected
                positions[r, at:at + p] = np.arange(p)
                positions[r, at + p:at + p + c] = p + np.arange(c)
                positions[r, at + p + c:at + p + c + n] = p + np.arange(n)
                k = len(batch_pairs)
                last_prompt = r * L + at + p - 1
                # chosen[0] from the prompt's end, chosen[t] from chosen[t - 1]; rejected likewise
                rows += [last_prompt, *range(last_prompt + 1, last_prompt + c)]
                rows += [last_prompt, *range(last_prompt + c + 1, last_prompt + c + n)]
                labels += pair.chosen + pair.rejected
                response += [2 * k] * c + [2 * k + 1] * n
                batch_pairs.append(order[j])
                groups.append((p, [c, n]))
                at += p + c + n
            positions[r, at:] = np.arange(L - at)
            startend[r] = packed_share_question(groups, L)[0]
            real += at
        out.append(PreferenceBatch(ids, positions, startend, np.asarray(rows, np.int64), np.asarray(labels, np.int64),
                                   np.asarray(response, np.int64), batch_pairs, real))
    return out


def unpacked_pair_batches(pairs: list[PreferencePair], order, batch_size: int) -> list[PreferenceBatch]:
    """``batch_size`` pairs a batch, each as two rows (prompt + chosen, prompt + rejected), padded
    to the longest row of the batch; plain causal attention."""
    order = list(order)
    out = []
    for first in range(0, len(order), batch_size):
        chunk = order[first:first + batch_size]
        seqs = [(pairs[i].prompt, side) for i in chunk for side in (pairs[i].chosen, pairs[i].rejected)]
        L = max(len(p) + len(s) for p, s in seqs)
        ids = np.full((len(seqs), L), PAD_ID, np.int64)
        rows, labels, response, real = [], [], [], 0
        for r, (prompt, side) in enumerate(seqs):
            n = len(prompt) + len(side)
            ids[r, :n] = prompt + side
            start = r * L + len(prompt) - 1
            rows += range(start, start + len(side))
            labels += side
            response += [r] * len(side)  # row r is pair r // 2, chosen when even
            real += n
        positions = np.broadcast_to(np.arange(L, dtype=np.int64), (len(seqs), L)).copy()
        out.append(PreferenceBatch(ids, positions, None, np.asarray(rows, np.int64), np.asarray(labels, np.int64),
                                   np.asarray(response, np.int64), list(chunk), real))
    return out


class PreferenceData:
    """Preference pairs as the Trainer draws them: ``batches(order, args)``, shared-prompt packed
    with ``args.zero_padding``, else unpacked."""

    def __init__(self, pairs: list[PreferencePair]):
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def batches(self, order, args) -> list[PreferenceBatch]:
        if args.zero_padding:
            return packed_pair_batches(self.pairs, order, args.max_length, args.batch_size, args.buffer_size)
        return unpacked_pair_batches(self.pairs, order, args.batch_size)
