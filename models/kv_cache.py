"""The KV caches a Llama-family model decodes through, on its device, in the layout the fused
``decoder_step`` kernel reads:

- :class:`KVCache`: B rows of S slots, [L, B, S, Hk, D], allocated whole (generation, evaluation:
  a batch whose lengths are known up front);
- :class:`PagedKVCache`: a pool of blocks of ``block_size`` slots, [L, N, block_size, Hk, D],
  shared out to the rows by block tables (vLLM's PagedAttention; serving): a row holds only
  the blocks its tokens fill, rows may share the blocks of a common prompt prefix, and the pool
  grows as blocks are asked for, up to its limit.

Both offer the model the same calls: :meth:`write` a row's new keys and values, :meth:`view`
its first n as dense tensors, and :meth:`index` the rows of a decode step for the kernel.
"""

from __future__ import annotations

import numpy as np

from anychip.ops.decoder import CACHE_DTYPES
from anychip.ops.dispatch import place
from anychip.frontends.paddle import import_paddle

from .checkpoint import ModelConfig

paddle = import_paddle()


def check_kv_dtype(dtype: str, device: tuple[str, int]) -> None:
    """Raises ValueError unless ``dtype`` is a KV cache dtype that ``device`` has tensors of."""
    from anychip.devices import describe

    if dtype not in CACHE_DTYPES:
        raise ValueError(f"KV cache dtype must be one of {', '.join(CACHE_DTYPES)}, got {dtype!r}")
    supported = describe(device[0]).dtypes
    if dtype not in supported:
        raise ValueError(f"device {device[0]} has no {dtype} tensors for a {dtype} KV cache "
                         f"(its dtypes: {', '.join(supported)})")


def _stored(x, dtype: str):
    return x if dtype == "float32" else x.astype(dtype)


def _dense(k, v, dtype: str):
    """[1, n, Hk, D] float32 views (copies of a 16-bit cache: Paddle's CPU has no float16
    unsqueeze, so the cast comes first)."""
    if dtype != "float32":
        k, v = k.astype("float32"), v.astype("float32")
    return k.unsqueeze(0), v.unsqueeze(0)


class KVCache:
    """Keys and values of every layer for B sequences of up to S tokens, allocated once on the
    device: [L, B, S, Hk, D] each (the layout decoder_step updates in place), in ``dtype``:
    float32, or bfloat16 / float16 (half the bytes, which every decode step reads in full at
    long contexts; keys and values are rounded once, when written)."""

    def __init__(self, config: ModelConfig, batch: int, max_len: int, device: tuple[str, int],
                 dtype: str = "float32"):
        if max_len > config.max_position:
            raise ValueError(f"max_len {max_len} exceeds the model's context of {config.max_position} tokens")
        check_kv_dtype(dtype, device)
        shape = [config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim]
        self.k = paddle.zeros(shape, dtype=dtype, device=place(device))
        self.v = paddle.zeros(shape, dtype=dtype, device=place(device))
        self.batch, self.max_len, self.dtype, self.device = batch, max_len, dtype, device

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values together."""
        return 2 * int(np.prod(self.k.shape)) * self.k.element_size()

    def write(self, layer: int, rows, start: int, k, v) -> None:
        """Stores float32 ``k``, ``v`` at slots ``start ..`` of ``rows`` (an int, or a slice of
        rows matching k's leading dim) in ``layer``, rounded to the cache's dtype."""
        end = start + k.shape[-3]
        self.k[layer, rows, start:end] = _stored(k, self.dtype)
        self.v[layer, rows, start:end] = _stored(v, self.dtype)

    def view(self, layer: int, row: int, length: int):
        """The first ``length`` keys and values of sequence ``row`` in ``layer``, [1, length, Hk,
        D] float32 each: dense views of a float32 cache (an integer row index, then a new leading
        dim, keeps Paddle's strides contiguous, which a size-1 slice would not), float32 copies
        of a 16-bit one."""
        return _dense(self.k[layer, row, :length], self.v[layer, row, :length], self.dtype)

    def index(self, rows: list[int] | None, batch: int) -> dict:
        """decoder_step's argument naming the cache rows of a step's ``batch`` sequences (none:
        row b)."""
        if rows is None:
            return {}
        return {"cache_rows": paddle.to_tensor(np.asarray(rows, dtype=np.int64), place=place(self.device))}


class PagedKVCache:
    """Keys and values in a pool of blocks, [L, N, block_size, Hk, D] each, shared out to
    ``rows`` sequences by their block tables: slot j of row r lives at slot j % block_size of
    block ``tables[r][j // block_size]``. A row holds up to ``max_len`` tokens.

    Who owns which block is the caller's (:class:`anychip_models.serving.blocks.BlockPool`):
    it sets a row's table (:meth:`set_table`) before the row is written or read. The pool starts
    with ``blocks`` blocks and :meth:`reserve` grows it (a copy into a larger pool, so its memory
    follows the blocks in use rather than rows x max_len)."""

    def __init__(self, config: ModelConfig, rows: int, max_len: int, device: tuple[str, int], dtype: str = "float32",
                 block_size: int = 32, blocks: int = 0):
        if max_len > config.max_position:
            raise ValueError(f"max_len {max_len} exceeds the model's context of {config.max_position} tokens")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        check_kv_dtype(dtype, device)
        self.config, self.device, self.dtype, self.block_size = config, device, dtype, block_size
        self.batch, self.max_len = rows, max_len
        self.width = -(-max_len // block_size)  # blocks of a full row
        self.tables: list[list[int]] = [[] for _ in range(rows)]
        self.k = self.v = None
        self.blocks = 0
        self.reserve(max(blocks, 1))

    @property
    def nbytes(self) -> int:
        """Bytes of the pool's keys and values together (what it holds now, not its limit)."""
        return 2 * int(np.prod(self.k.shape)) * self.k.element_size()

    def block_bytes(self) -> int:
        """Bytes one block of keys and values takes."""
        return self.nbytes // self.blocks

    def reserve(self, blocks: int) -> None:
        """Grows the pool to at least ``blocks`` blocks (its contents kept)."""
        if blocks <= self.blocks:
            return
        c = self.config
        shape = [c.num_layers, blocks - self.blocks, self.block_size, c.num_kv_heads, c.head_dim]
        more = [paddle.zeros(shape, dtype=self.dtype, device=place(self.device)) for _ in range(2)]
        if self.k is None:
            self.k, self.v = more
        else:
            self.k, self.v = (paddle.concat([old, new], axis=1) for old, new in zip((self.k, self.v), more))
        self.blocks = blocks
        # views of the same memory: every layer's blocks in one dim (gathers), and a layer's
        # blocks as one row of elements (a block of every layer is then one slice of columns)
        self._blocks = [t.reshape([c.num_layers * blocks, self.block_size, c.num_kv_heads, c.head_dim])
                        for t in (self.k, self.v)]
        self._rows = [t.reshape([c.num_layers, -1]) for t in (self.k, self.v)]

    def set_table(self, row: int, blocks: list[int]) -> None:
        """Row ``row``'s blocks, in slot order."""
        if len(blocks) > self.width or any(not 0 <= b < self.blocks for b in blocks):
            raise ValueError(f"row {row}: blocks {blocks} must be at most {self.width} of the pool's {self.blocks}")
        self.tables[row] = list(blocks)

    def copy_block(self, src: int, dst: int) -> None:
        """Block ``dst`` of every layer becomes a copy of block ``src``."""
        n = self._rows[0].shape[1] // self.blocks  # elements of one layer's block
        for rows in self._rows:  # (a 2-D slice copies 4x faster than k[:, dst] = k[:, src])
            rows[:, dst * n:(dst + 1) * n] = rows[:, src * n:(src + 1) * n]

    def _runs(self, row: int, start: int, end: int):
        """(block, offset in it, first, last) of the runs of slots [start, end) of ``row`` that
        its blocks hold, the offsets into that range."""
        table, bs = self.tables[row], self.block_size
        end = min(end, len(table) * bs)
        j = start
        while j < end:
            stop = min(end, (j // bs + 1) * bs)
            yield table[j // bs], j % bs, j - start, stop - start
            j = stop

    def write(self, layer: int, rows, start: int, k, v) -> None:
        """Stores float32 ``k``, ``v`` ([T, Hk, D] for one row, [R, T, Hk, D] for a slice of
        rows) at slots ``start ..`` of ``rows`` in ``layer``, rounded to the cache's dtype.
        Slots past a row's blocks are not stored: they are the padding of a batched prefill
        (prompts right-padded to the longest), which no block was taken for; a token there that
        mattered would fail the reads, which check."""
        if isinstance(rows, slice):
            for i, row in enumerate(range(*rows.indices(self.batch))[:k.shape[0]]):
                self.write(layer, row, start, k[i], v[i])
            return
        k, v = _stored(k, self.dtype), _stored(v, self.dtype)
        for block, offset, first, last in self._runs(rows, start, start + k.shape[0]):
            self.k[layer, block, offset:offset + last - first] = k[first:last]
            self.v[layer, block, offset:offset + last - first] = v[first:last]

    def view(self, layer: int, row: int, length: int):
        """The first ``length`` keys and values of ``row`` in ``layer``, [1, length, Hk, D]
        float32 each (gathered from its blocks)."""
        c = self.config
        used = -(-length // self.block_size)
        if used > len(self.tables[row]):
            raise ValueError(f"row {row} has {len(self.tables[row])} blocks of {self.block_size} slots, not the "
                             f"{length} tokens asked for")
        # gathered from every layer's blocks in one dim: indexing the pool by layer first would
        # copy the whole layer
        blocks = np.asarray(self.tables[row][:used], dtype=np.int64) + layer * self.blocks
        index = paddle.to_tensor(blocks, place=place(self.device))
        shape = [used * self.block_size, c.num_kv_heads, c.head_dim]
        k, v = (paddle.index_select(t, index).reshape(shape)[:length] for t in self._blocks)
        return _dense(k, v, self.dtype)

    def index(self, rows: list[int] | None, batch: int) -> dict:
        """decoder_step's block tables of a step's ``batch`` rows (none: rows 0 .. batch-1)."""
        rows = list(range(batch)) if rows is None else rows
        tables = np.full((len(rows), max(1, max(len(self.tables[r]) for r in rows))), -1, dtype=np.int64)
        for i, row in enumerate(rows):
            tables[i, :len(self.tables[row])] = self.tables[row]
        return {"block_tables": paddle.to_tensor(tables, place=place(self.device))}
