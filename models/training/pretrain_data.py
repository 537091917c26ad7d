"""Pretraining data: raw text tokenized once into a memory-mapped token stream, cut into
``max_length`` windows across document boundaries.

    stream, bad = tokenize_corpus("corpus/", tokenizer)       # cached; a progress bar on big corpora
    train = TokenSequences(stream, max_length=256)             # document mask on
    batch = train.batches([0, 1], args)[0]                     # a packing.Batch

A corpus is a ``.txt`` or ``.md`` file (one document), a ``.jsonl`` file (one document per line,
in its ``text`` field, as PaddleNLP's pretraining data), or a folder of them, read in sorted
order. Each document is followed by the tokenizer's end-of-document token (EOS) in the stream.
With the document mask a window's documents never see each other (a FlashMask causal-document
mask, positions restarting at each document), and the EOS that ends a document predicts
nothing, so a document's per-token losses are those it has alone.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from anychip.ops.masks import causal_document

from .data import LISTED_BAD, BadRecord, DataError
from .packing import IGNORE, PAD_ID, Batch

TEXT_SUFFIXES = (".txt", ".md", ".jsonl")
# A corpus with more documents than this shows a progress bar while it is tokenized.
PROGRESS_DOCUMENTS = 2000
# Bump when the token file's layout changes: older cached files are then ignored.
_FORMAT = 1


def corpus_files(path: str | Path, split: str | None = None) -> list[Path]:
    """The text files of ``path`` (a file, or a folder searched recursively), sorted. In a folder,
    ``split="dev"`` takes the files named ``dev.*`` or under a ``dev/`` folder, ``"train"`` the
    others, None all of them."""
    path = Path(path)
    if path.is_file():
        if path.suffix not in TEXT_SUFFIXES:
            raise DataError(f"{path}: expected a {', '.join(TEXT_SUFFIXES)} file or a folder of them")
        return [path]
    if not path.is_dir():
        raise DataError(f"{path}: no such file or folder")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    if split is not None:
        files = [p for p in files if _is_dev(p.relative_to(path)) == (split == "dev")]
    return files


def has_dev_split(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and bool(corpus_files(path, "dev"))


def _is_dev(relative: Path) -> bool:
    return relative.stem == "dev" or "dev" in relative.parts[:-1]


def documents(path: Path):
    """``(line, text)`` of each document of one file; a jsonl line that is not an object with a
    non-empty string ``text`` is yielded as a BadRecord instead."""
    if path.suffix != ".jsonl":
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            yield 1, text
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for line, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, RecursionError) as exc:
                yield line, BadRecord(line, f"not valid JSON ({exc})")
                continue
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                yield line, BadRecord(line, "expected an object with a \"text\" string"
                                      if not isinstance(record, dict) or "text" not in record
                                      else f"\"text\" is {type(text).__name__}, expected a string")
            elif not text.strip():
                yield line, BadRecord(line, "\"text\" is empty")
            else:
                yield line, text


@dataclass
class TokenStream:
    """Every document's tokens, each followed by EOS: ``tokens`` (uint32, memory-mapped) and
    ``starts`` (int64: where each document begins; a document ends where the next begins)."""

    tokens: np.ndarray
    starts: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_documents(self) -> int:
        return len(self.starts)

    def document(self, i: int) -> np.ndarray:
        end = self.starts[i + 1] if i + 1 < len(self.starts) else len(self.tokens)
        return self.tokens[self.starts[i]:end]


def tokenize_corpus(path: str | Path, tokenizer, split: str | None = None, cache_dir: str | Path | None = None,
                    on_bad: str = "skip", progress: bool = True) -> tuple[TokenStream, list[tuple[Path, BadRecord]]]:
    """The corpus at ``path`` (see ``corpus_files``) as a TokenStream, tokenized once: the token
    file is cached under ``cache_dir`` (default anychip's cache) by the files' contents and the
    tokenizer, and later calls map it. Bad jsonl records are skipped (``on_bad="skip"``, returned
    with their file) or raise DataError naming file and line (``"fail"``)."""
    if on_bad not in ("skip", "fail"):
        raise ValueError(f"on_bad must be 'skip' or 'fail', got {on_bad!r}")
    if tokenizer.eos_id is None:
        raise DataError("the tokenizer has no end-of-document (EOS) token to put between documents")
    files = corpus_files(path, split)
    if not files:
        raise DataError(f"{path}: no {'/'.join(TEXT_SUFFIXES)} files{f' for the {split} split' if split else ''}")
    key = _cache_key(files, tokenizer)
    folder = Path(cache_dir) if cache_dir is not None else _default_cache()
    tokens_file, meta_file = folder / f"{key}.tokens", folder / f"{key}.json"
    if meta_file.is_file() and tokens_file.is_file():
        meta = json.loads(meta_file.read_text())
        bad = [(Path(f), BadRecord(line, reason)) for f, line, reason in meta["bad"]]
        if bad and on_bad == "fail":
            raise DataError(_bad_message(bad))
        return _open(tokens_file, meta, str(path)), bad

    texts, bad = [], []
    for f in files:
        for line, item in documents(f):
            if isinstance(item, BadRecord):
                bad.append((f, item))
            else:
                texts.append(item)
    if bad and on_bad == "fail":
        raise DataError(_bad_message(bad))
    if not texts:
        raise DataError(f"{path}: no documents with text")
    starts, chunks, at = [], [], 0
    for text in tqdm(texts, desc="tokenize", unit="doc", disable=not progress or len(texts) <= PROGRESS_DOCUMENTS):
        ids = tokenizer.encode(text) + [tokenizer.eos_id]
        starts.append(at)
        chunks.append(np.asarray(ids, dtype=np.uint32))
        at += len(ids)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = tokens_file.with_name(f".tmp-{tokens_file.name}-{os.getpid()}")
    np.concatenate(chunks).tofile(tmp)
    os.replace(tmp, tokens_file)
    meta = {"format": _FORMAT, "tokens": at, "starts": starts,
            "bad": [[str(f), b.line, b.reason] for f, b in bad]}
    tmp = meta_file.with_name(f".tmp-{meta_file.name}-{os.getpid()}")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, meta_file)  # last: the pair is complete once it exists
    return _open(tokens_file, meta, str(path)), bad


def format_bad_documents(bad: list[tuple[Path, BadRecord]]) -> str:
    return _bad_message(bad, prefix="skipped")


def _bad_message(bad, prefix: str = "bad records") -> str:
    lines = [f"{prefix}: {len(bad)} record(s)"]
    lines += [f"  {f}:{b.line}: {b.reason}" for f, b in bad[:LISTED_BAD]]
    if len(bad) > LISTED_BAD:
        lines.append(f"  ... and {len(bad) - LISTED_BAD} more")
    return "\n".join(lines)


def _default_cache() -> Path:
    from anychip.native import cache_dir

    return cache_dir() / "pretrain_tokens"


def _cache_key(files: list[Path], tokenizer) -> str:
    h = hashlib.sha256(f"anychip pretrain tokens {_FORMAT}\n".encode())
    for name, data in sorted(tokenizer.to_files().items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    for f in files:
        h.update(str(f.resolve()).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:24]


def _open(tokens_file: Path, meta: dict, source: str) -> TokenStream:
    tokens = np.memmap(tokens_file, dtype=np.uint32, mode="r", shape=(meta["tokens"],))
    return TokenStream(tokens, np.asarray(meta["starts"], dtype=np.int64), source)


class TokenSequences:
    """A TokenStream cut into windows of ``max_length`` tokens (the last one shorter), each
    predicting the ``max_length`` tokens that follow its start. As the Trainer draws data:
    ``len()`` windows, ``batches(order, args)``."""

    def __init__(self, stream: TokenStream, max_length: int, document_mask: bool = True):
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        if len(stream) < 2:
            raise DataError(f"{stream.source}: {len(stream)} token(s); pretraining needs at least 2")
        self.stream, self.max_length, self.document_mask = stream, max_length, document_mask
        # every token but the last is an input: its label is the token after it
        self.windows = -(-(len(stream) - 1) // max_length)
        # _ends[t]: token t ends a document (its EOS); with the document mask it predicts nothing
        self._ends = np.zeros(len(stream), dtype=bool)
        self._ends[stream.starts[1:] - 1] = True
        self._ends[-1] = True

    def __len__(self) -> int:
        return self.windows

    def window(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """(input ids, labels, position ids, document lengths) of window ``i``."""
        start = i * self.max_length
        end = min(start + self.max_length, len(self.stream) - 1)
        ids = np.asarray(self.stream.tokens[start:end], dtype=np.int64)
        labels = np.asarray(self.stream.tokens[start + 1:end + 1], dtype=np.int64)
        n = end - start
        if not self.document_mask:
            return ids, labels, np.arange(n, dtype=np.int64), [n]
        labels = np.where(self._ends[start:end], IGNORE, labels)
        # documents begin at the window start and after each end-of-document token in it
        cuts = np.flatnonzero(self._ends[start:end - 1]) + 1
        bounds = [0, *cuts.tolist(), n]
        lens = [b - a for a, b in zip(bounds, bounds[1:])]
        positions = np.concatenate([np.arange(k, dtype=np.int64) for k in lens])
        return ids, labels, positions, lens

    def batches(self, order, args) -> list[Batch]:
        """``args.batch_size`` windows a batch, in ``order``; a short window is padded (id 0,
        label -100; its own document in the mask, and after every real token, so plain causal
        attention never lets one see it either)."""
        order = list(order)
        L = self.max_length
        out = []
        for first in range(0, len(order), args.batch_size):
            rows = order[first:first + args.batch_size]
            b = len(rows)
            input_ids = np.full((b, L), PAD_ID, dtype=np.int64)
            labels = np.full((b, L), IGNORE, dtype=np.int64)
            positions = np.zeros((b, L), dtype=np.int64)
            startend = np.empty((b, 1, L, 1), dtype=np.int32) if self.document_mask else None
            real = 0
            for r, w in enumerate(rows):
                ids, lab, pos, lens = self.window(w)
                n = len(ids)
                input_ids[r, :n], labels[r, :n], positions[r, :n] = ids, lab, pos
                positions[r, n:] = np.arange(L - n)
                real += n
                if startend is not None:
                    startend[r] = causal_document(lens + ([L - n] if n < L else []))[0]
            out.append(Batch(input_ids, labels, positions, startend, real, rows))
        return out
