"""Serving a tensor-parallel model (``anychip serve --nproc K --tensor-parallel K``): rank 0 runs
the engine and the HTTP server; every model call it makes is first announced to the other ranks,
which make the same call on their share of the model, so that the ranks meet in the same
collectives in the same order.

An announcement is two broadcasts over the tensor-parallel group: a header of int64s (what call,
its shapes, the cache slot it starts at, the paged cache's blocks and table width) and the call's
integer inputs (token ids, positions, the rows to read, the cache rows and their block tables),
on the model's device. The followers hold a paged KV cache of the engine's shape, grown and its
rows' tables set as rank 0's before each call, so the same calls fill the same blocks.
"""

from __future__ import annotations

import numpy as np

from anychip.ops.dispatch import place
from anychip.frontends.paddle import import_paddle

paddle = import_paddle()

STOP, PREFILL, DECODE, COPY = 0, 1, 2, 3
HEADER = 9  # kind, batch, width, has last_index, cache rows, fused, start, pool blocks, table width


class LeaderModel:
    """Rank 0's model: the engine's calls, each announced to the followers first. Anything else
    (config, context, device, new_cache) is the model's own."""

    def __init__(self, model):
        self.model = model
        self.tp = model.tp

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, tokens, positions, cache, start: int = 0, last_index=None, cache_rows=None):
        ids, pos = tokens.numpy(), positions.numpy()
        last = None if last_index is None else last_index.numpy()
        rows = list(range(ids.shape[0])) if cache_rows is None else list(cache_rows)
        _announce(self.tp, self.model.device,
                  [PREFILL, ids.shape[0], ids.shape[1], last is not None, len(rows), 0, start] + _pool(cache),
                  [ids.reshape(-1), pos.reshape(-1), np.zeros(0, np.int64) if last is None else last, rows,
                   _tables(cache, rows)])
        return self.model(tokens, positions, cache, start=start, last_index=last_index, cache_rows=cache_rows)

    def decode(self, tokens, positions, cache, fused: bool = True, cache_rows=None):
        ids, pos = tokens.numpy(), positions.numpy()
        rows = list(range(ids.shape[0])) if cache_rows is None else list(cache_rows)
        _announce(self.tp, self.model.device, [DECODE, ids.shape[0], 1, 0, len(rows), int(fused), 0] + _pool(cache),
                  [ids, pos, rows, _tables(cache, rows)])
        return self.model.decode(tokens, positions, cache, fused=fused, cache_rows=cache_rows)

    def copy_block(self, cache, src: int, dst: int) -> None:
        _announce(self.tp, self.model.device, [COPY, src, dst, 0, 0, 0, 0] + _pool(cache), [])
        self.model.copy_block(cache, src, dst)

    def stop(self) -> None:
        """Ends the followers' loops."""
        _announce(self.tp, self.model.device, [STOP] + [0] * (HEADER - 1), [])


def _pool(cache) -> list[int]:
    return [cache.blocks, cache.width]


def _tables(cache, rows: list[int]) -> np.ndarray:
    """The rows' block tables, each padded with -1 to the cache's table width."""
    out = np.full((len(rows), cache.width), -1, np.int64)
    for i, row in enumerate(rows):
        out[i, :len(cache.tables[row])] = cache.tables[row]
    return out


def follow(model, cache) -> None:
    """A rank other than 0: makes every call rank 0 announces, on ``model``'s share, until STOP."""
    dev = place(model.device)
    with paddle.no_grad():
        while True:
            header = [int(v) for v in _receive(model.tp, model.device, HEADER)]
            kind, b, t, has_last, n_rows, fused, start, blocks, width = header
            if kind == STOP:
                return
            if kind == COPY:  # (the header's batch and width fields hold src and dst)
                cache.reserve(blocks)
                model.copy_block(cache, b, t)
                continue
            inputs = b * t * 2 + (b if has_last else 0) if kind == PREFILL else 2 * b
            payload = _receive(model.tp, model.device, inputs + n_rows + n_rows * width)
            rows = [int(r) for r in payload[inputs:inputs + n_rows]]
            cache.reserve(blocks)
            for row, table in zip(rows, payload[inputs + n_rows:].reshape(n_rows, width)):
                cache.set_table(row, [int(v) for v in table if v >= 0])
            if kind == PREFILL:
                ids, pos = payload[:b * t].reshape(b, t), payload[b * t:2 * b * t].reshape(b, t)
                last = payload[2 * b * t:2 * b * t + b] if has_last else None
                model(paddle.to_tensor(ids, place=dev), paddle.to_tensor(pos, place=dev), cache, start=start,
                      last_index=None if last is None else paddle.to_tensor(last, place=dev), cache_rows=rows)
            else:
                model.decode(paddle.to_tensor(payload[:b], place=dev), paddle.to_tensor(payload[b:2 * b], place=dev),
                             cache, fused=bool(fused), cache_rows=rows)


def _announce(tp, device, header: list, parts: list) -> None:
    import paddle.distributed as dist

    dist.broadcast(paddle.to_tensor(np.asarray(header, np.int64), place=place(device)), src=0, group=tp.group)
    payload = np.concatenate([np.asarray(p, np.int64).reshape(-1) for p in parts]) if parts else np.zeros(0, np.int64)
    if payload.size:
        dist.broadcast(paddle.to_tensor(payload, place=place(device)), src=0, group=tp.group)


def _receive(tp, device, n: int) -> np.ndarray:
    import paddle.distributed as dist

    buf = paddle.zeros([n], dtype="int64", device=place(device))
    dist.broadcast(buf, src=0, group=tp.group)
    return buf.numpy()
