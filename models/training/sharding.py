"""The optimizer partitioned across data-parallel ranks: ``--sharding stage1|stage2``, as
PaddleNLP's sharding stages 1 and 2 (ZeRO 1 and 2).

Every parameter has one owner rank, which alone keeps its AdamW moments and updates it; the
owner then broadcasts the new value to the other ranks. Stage 1 all-reduces every gradient (as
plain data parallelism) and partitions the optimizer state; stage 2 reduces each gradient to its
owner only, so the others drop theirs as soon as it is sent. The global gradient norm is the
sum over owners of their parameters' squared norms, so the update is the one plain data
parallelism makes. Checkpoints stay whole: saving gathers the moments on rank 0 (every rank takes
part), and loading keeps each rank's share of a whole state, from any number of ranks.
"""

from __future__ import annotations

import numpy as np

from anychip.frontends.paddle import import_paddle

from .distributed import World
from .optimizer import AdamW

paddle = import_paddle()

STAGES = ("stage1", "stage2")


def owners(shapes: dict[str, tuple], size: int) -> dict[str, int]:
    """Each parameter's owner: the largest first, each to the rank holding the fewest elements so
    far (the lowest such rank). Depends only on the names, shapes and ``size``, so every rank
    computes the same map."""
    load = [0] * size
    out = {}
    for name in sorted(shapes, key=lambda n: (-int(np.prod(shapes[n])), n)):
        rank = min(range(size), key=lambda r: (load[r], r))
        out[name] = rank
        load[rank] += int(np.prod(shapes[name]))
    return out


class ShardedAdamW:
    """AdamW over ``params`` with its state partitioned across ``world``'s ranks (``stage``:
    stage1 or stage2). The Trainer calls, in order: ``reduce_gradients``, ``clip_grad_norm``,
    ``step``, ``zero_grad``; ``state`` and ``load_state`` as AdamW's, ``state`` being a
    collective."""

    def __init__(self, params: dict, world: World, stage: str, **adamw):
        if stage not in STAGES:
            raise ValueError(f"sharding must be one of {', '.join(STAGES)}, got {stage!r}")
        self.params, self.world, self.stage = params, world, stage
        self.owner = owners({n: tuple(p.shape) for n, p in params.items()}, world.size)
        self.inner = AdamW({n: p for n, p in params.items() if self.owner[n] == world.rank}, **adamw)

    def reduce_gradients(self) -> None:
        """Stage 1: every gradient summed on every rank. Stage 2: each summed on its owner only."""
        import paddle.distributed as dist

        for p in self.params.values():
            if p.grad is None:  # a rank without a micro-batch this step contributes zeros
                p.grad = paddle.zeros(p.shape, dtype=p.dtype, device=p.place)
        if self.stage == "stage1":
            self.world.all_reduce([p.grad for p in self.params.values()])
            return
        for name, p in self.params.items():
            dist.reduce(p.grad, dst=self.owner[name])
            if self.owner[name] != self.world.rank:
                p.grad = None

    def clip_grad_norm(self, max_norm: float | None) -> float:
        return self.inner.clip_grad_norm(max_norm, total=lambda sq: self.world.totals([sq])[0])

    def step(self, lr: float, step: int) -> None:
        import paddle.distributed as dist

        if self.inner.params:
            self.inner.step(lr, step)
        for name, p in self.params.items():
            dist.broadcast(p, src=self.owner[name])

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def state(self) -> dict[str, np.ndarray]:
        """Every parameter's moments on rank 0 (a collective: each owner broadcasts its own);
        {} on the other ranks."""
        import paddle.distributed as dist

        mine = self.inner.state()
        out = {}
        for name, p in self.params.items():
            owner = self.owner[name]
            for key in (name + ".m1", name + ".m2"):
                if owner == self.world.rank:
                    moment = (self.inner.m1 if key.endswith(".m1") else self.inner.m2)[name]
                else:
                    moment = paddle.zeros(p.shape, dtype="float32", device=p.place)
                dist.broadcast(moment, src=owner)
                if self.world.main:
                    out[key] = mine[key] if owner == self.world.rank else moment.numpy()
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """This rank's share of a whole state (saved by any number of ranks)."""
        self.inner.load_state(state)
