"""Which blocks of the engine's paged KV cache hold what (vLLM's block manager, in small).

A block is free, held by one or more running requests (counted references), or cached: it holds
the keys and values of a prompt's whole block of tokens, found by every token up to its end (so
equal blocks behind different prefixes never meet), and stays while memory allows after its
requests leave, least recently released first out. A request takes the cached blocks of the
longest run of its prompt's whole blocks, shares them with whoever else holds them, and prefills
only the rest. Only whole prompt blocks are shared: they are full before anyone reads them, and
nobody writes them again (a request writes its later tokens into blocks of its own).

The pool grows its cache as blocks are asked for (doubling), up to ``limit`` blocks, before it
reclaims cached ones; the engine admits requests only while their worst case fits the limit, so
asking never fails.
"""

from __future__ import annotations

from collections import OrderedDict

from ..kv_cache import PagedKVCache


class BlockPool:
    def __init__(self, cache: PagedKVCache, limit: int):
        if limit < cache.blocks:
            raise ValueError(f"limit {limit} is below the cache's {cache.blocks} blocks")
        self.cache, self.limit, self.size = cache, limit, cache.block_size
        self._free = list(range(cache.blocks - 1, -1, -1))  # popped from the end: lowest first
        self._refs: dict[int, int] = {}
        self._cached: dict[tuple, int] = {}  # the prompt tokens up to a block's end -> the block
        self._key: dict[int, tuple] = {}     # the reverse
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
            del self._cached[self._key.pop(block)]
            self._free.append(block)
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def match(self, prompt: list[int]) -> list[int]:
        """The cached blocks holding the longest run of ``prompt``'s whole blocks from its start,
        each now also held by the caller."""
        found = []
        for end in range(self.size, len(prompt) + 1, self.size):
            block = self._cached.get(tuple(prompt[:end]))
            if block is None:
                break
            found.append(block)
        for block in found:
            self._idle.pop(block, None)
            self._refs[block] = self._refs.get(block, 0) + 1
        return found

    def register(self, prompt: list[int], table: list[int]) -> None:
        """Offers ``table``'s blocks that hold whole blocks of ``prompt`` to later requests (the
        caller fills them before any such request reads them)."""
        for j in range(min(len(table), len(prompt) // self.size)):
            key = tuple(prompt[:(j + 1) * self.size])
            if key not in self._cached and table[j] not in self._key:
                self._cached[key], self._key[table[j]] = table[j], key

    def release(self, table: list[int], keep: bool = True) -> None:
        """The caller no longer holds ``table``'s blocks. Cached ones stay findable (``keep``;
        the deepest are reclaimed first), unless ``keep`` is False (their contents are not to be
        trusted: a prefill that failed)."""
        for block in reversed(table):
            self._refs[block] -= 1
            if not keep and block in self._key:
                del self._cached[self._key.pop(block)]
            if self._refs[block]:
                continue
            del self._refs[block]
            if block in self._key:
                self._idle[block] = None
            else:
                self._free.append(block)
