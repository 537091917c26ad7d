"""The paged cache's block manager alone: references, whole-block sharing, the partial match that
is copied, registration on admission, and which cached block is reclaimed first."""

from __future__ import annotations

import pytest


class FakeCache:
    """The part of PagedKVCache a BlockPool uses: its size, and growing it."""

    def __init__(self, blocks: int, block_size: int = 4):
        self.blocks, self.block_size, self.grown = blocks, block_size, []

    def reserve(self, blocks: int) -> None:
        self.grown.append(blocks)
        self.blocks = max(self.blocks, blocks)


def pool(blocks=2, limit=8, size=4):
    from anychip_models.serving.blocks import BlockPool

    return BlockPool(FakeCache(blocks, size), limit)


def test_the_pool_grows_by_doubling_up_to_its_limit_then_refuses():
    p = pool(blocks=2, limit=5)
    got = [p.allocate() for _ in range(5)]
    assert sorted(got) == list(range(5)) and p.cache.grown == [4, 5] and p.in_use == 5
    with pytest.raises(RuntimeError, match="all held"):
        p.allocate()


def test_whole_blocks_are_shared_by_reference_and_the_rest_matched_to_the_token():
    p = pool()
    prompt = list(range(10))  # blocks [0..3], [4..7], then a partial [8, 9]
    table = [p.allocate() for _ in range(3)]
    p.register(prompt, table)
    m = p.match(list(range(9)) + [99, 98])  # agrees for 9 tokens
    assert m.shared == table[:2] and m.source == table[2] and m.copied == 1
    p.copied(m)
    same = p.match(prompt)  # all of it cached: the last token is left to prefill
    assert same.shared == table[:2] and same.source == table[2] and same.copied == 1
    exact = p.match(list(range(8)))  # ends on a block boundary: that block is copied, not shared
    assert exact.shared == table[:1] and exact.source == table[1] and exact.copied == 3
    other = p.match([5, 1, 2, 3, 4])
    assert other.shared == [] and other.source is None


def test_blocks_stay_cached_after_release_and_the_deepest_go_first():
    p = pool(blocks=4, limit=4)
    first = [p.allocate() for _ in range(3)]
    p.register(list(range(12)), first)
    p.release(first)
    assert p.in_use == 0 and p.cached_idle == 3
    fresh = p.allocate()  # the one free block
    assert fresh not in first
    taken = p.allocate()  # then the deepest cached block is reclaimed
    assert taken == first[2] and p.cached_idle == 2
    m = p.match(list(range(12)) + [50])
    assert m.shared == first[:2] and m.source is None


def test_a_failed_prefill_forgets_what_it_registered():
    p = pool()
    table = [p.allocate(), p.allocate()]
    p.register(list(range(8)), table)
    p.release(table, keep=False)
    assert p.match(list(range(8)) + [1]).shared == [] and p.cached_idle == 0
