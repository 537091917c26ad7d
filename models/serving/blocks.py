"""Which blocks of the engine's paged KV cache hold what (vLLM's block manager, in small).

A block is free, held by one or more running requests (counted references), or cached: it holds
the keys and values of a run of a prompt's tokens, found by the tokens before it and its own
(so equal blocks behind different prefixes never meet), and stays while memory allows after its
requests leave, least recently released first out.

A new request shares, by reference, the cached whole blocks of the longest run of its prompt's
whole blocks; they are full before anyone reads them and nobody writes them again. Where its
prompt then goes on to agree with part of a cached block (a whole one, or the last, partial
block of an earlier prompt), that block is copied into the request's own first block, which it
goes on writing (copy on write): prefix sharing to the token, as a shared system prompt rarely
ends on a block boundary.

The pool grows its cache as blocks are asked for (doubling), up to ``limit`` blocks, before it
reclaims cached ones; the engine admits requests only while their worst case fits the limit, so
asking never fails.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ..kv_cache import PagedKVCache


@dataclass
class Match:
    """What the cache holds of a prompt: ``shared`` whole blocks (now also held by the caller),
    then, optionally, ``source``'s first ``copied`` slots to copy into the caller's next block
    (``source`` is held by the caller until :meth:`BlockPool.copied`)."""

    shared: list[int]
    source: int | None = None
    copied: int = 0


class BlockPool:
    def __init__(self, cache: PagedKVCache, limit: int):
        if limit < cache.blocks:
            raise ValueError(f"limit {limit} is below the cache's {cache.blocks} blocks")
        self.cache, self.limit, self.size = cache, limit, cache.block_size
        self._free = list(range(cache.blocks - 1, -1, -1))  # popped from the end: lowest first
        self._refs: dict[int, int] = {}
        self._whole: dict[tuple, int] = {}  # the prompt tokens up to a whole block's end -> the block
        # every cached block under the prompt tokens before it and its own first token: {block: its tokens}
        self._children: dict[tuple, dict[int, dict[int, tuple]]] = {}
        self._key: dict[int, tuple[tuple, tuple]] = {}  # block -> (the tokens before it, its tokens)
        self._idle: OrderedDict[int, None] = OrderedDict()  # cached blocks no request holds, oldest first

    @property
    def in_use(self) -> int:
        """Blocks some running request holds."""
        return len(self._refs)

    @property
    def cached_idle(self) -> int:
        """Cached blocks no request holds (reclaimed as needed)."""
        return len(self._idle)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.size)

    def allocate(self) -> int:
        """A block for one request alone: a free one, else one of a grown pool (cached blocks
        stay while the limit allows), else the least recently released cached one, forgotten."""
        if not self._free and self.cache.blocks < self.limit:
            old = self.cache.blocks
            self.cache.reserve(min(self.limit, 2 * old))
            self._free = list(range(self.cache.blocks - 1, old - 1, -1))
        if not self._free:
            if not self._idle:
                raise RuntimeError(f"the KV cache's {self.limit} blocks are all held (admission should prevent this)")
            block, _ = self._idle.popitem(last=False)
            self._forget(block)
            self._free.append(block)
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def _hold(self, block: int) -> None:
        self._idle.pop(block, None)
        self._refs[block] = self._refs.get(block, 0) + 1

    def match(self, prompt: list[int]) -> Match:
        """What the cache holds of ``prompt``, leaving at least its last token to prefill (for
        the logits)."""
        size, shared = self.size, []
        for end in range(size, len(prompt), size):  # a block ending at the prompt's end is not shared whole
            block = self._whole.get(tuple(prompt[:end]))
            if block is None:
                break
            shared.append(block)
        for block in shared:
            self._hold(block)
        before = len(shared) * size
        rest = prompt[before:before + size]
        best, best_n = None, 0
        if len(prompt) - before > 1:
            candidates = self._children.get(tuple(prompt[:before]), {}).get(rest[0], {})
            for block, tokens in candidates.items():
                n = 0
                for a, b in zip(tokens, rest):
                    if a != b:
                        break
                    n += 1
                if n > best_n:
                    best, best_n = block, n
        if best is None:
            return Match(shared)
        self._hold(best)
        return Match(shared, best, min(best_n, len(prompt) - before - 1))

    def copied(self, match: Match) -> None:
        """The caller has copied ``match.source``: it no longer holds it."""
        if match.source is not None:
            self.release([match.source])

    def register(self, prompt: list[int], table: list[int]) -> None:
        """Offers ``table``'s blocks of ``prompt``'s tokens (whole ones for sharing, the last,
        partial one for copying) to later requests; the caller fills them before any such
        request reads them."""
        for j, block in enumerate(table[:self.blocks_for(len(prompt))]):
            before, tokens = tuple(prompt[:j * self.size]), tuple(prompt[j * self.size:(j + 1) * self.size])
            if block in self._key or (len(tokens) == self.size and before + tokens in self._whole):
                continue
            if len(tokens) == self.size:
                self._whole[before + tokens] = block
            self._children.setdefault(before, {}).setdefault(tokens[0], {})[block] = tokens
            self._key[block] = (before, tokens)

    def _forget(self, block: int) -> None:
        before, tokens = self._key.pop(block)
        if self._whole.get(before + tokens) == block:
            del self._whole[before + tokens]
        siblings = self._children[before]
        del siblings[tokens[0]][block]
        if not siblings[tokens[0]]:
            del siblings[tokens[0]]
            if not siblings:
                del self._children[before]

    def release(self, table: list[int], keep: bool = True) -> None:
        """The caller no longer holds ``table``'s blocks. Cached ones stay findable (``keep``;
        the deepest are reclaimed first), unless ``keep`` is False (their contents are not to be
        trusted: a prefill that failed)."""
        for block in reversed(table):
            self._refs[block] -= 1
            if not keep and block in self._key:
                self._forget(block)
            if self._refs[block]:
                continue
            del self._refs[block]
            if block in self._key:
                self._idle[block] = None
            else:
                self._free.append(block)
