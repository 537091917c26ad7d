"""AdamW over a model's named parameters, through the fused ``adamw_step`` op (one launch per
device and dtype group), with global-norm gradient clipping, and the learning-rate schedules."""

from __future__ import annotations

import math

import numpy as np

import anychip.ops as ops
from anychip.frontends.paddle import import_paddle

from ..layers import assign

paddle = import_paddle()

SCHEDULES = ("cosine", "linear", "constant")


def learning_rate(step: int, base_lr: float, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """The rate of update ``step`` (1-based): linear warmup over ``warmup_steps``, then
    ``schedule`` decays it towards 0 over the remaining steps (cosine, linear) or holds it
    (constant)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if step <= warmup_steps:
        return base_lr * step / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return base_lr
    # the first step after warmup runs at the full rate, the last one just above 0
    progress = min(1.0, (step - warmup_steps - 1) / (total_steps - warmup_steps))
    if schedule == "linear":
        return base_lr * (1.0 - progress)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


class AdamW:
    """Decoupled weight decay on matrices only (norm weights and biases are not decayed, the
    usual practice). Moments are float32 on the parameters' device."""

    def __init__(self, params: dict, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0):
        self.params = params
        self.beta1, self.beta2, self.eps, self.weight_decay = beta1, beta2, eps, weight_decay
        self.m1 = {n: paddle.zeros(p.shape, dtype="float32", device=p.place) for n, p in params.items()}
        self.m2 = {n: paddle.zeros(p.shape, dtype="float32", device=p.place) for n, p in params.items()}

    def _grads(self) -> dict:
        missing = [n for n, p in self.params.items() if p.grad is None]
        if missing:
            raise RuntimeError(f"no gradient reached {missing[0]} (and {len(missing) - 1} more parameters)")
        return {n: p.grad for n, p in self.params.items()}

    def clip_grad_norm(self, max_norm: float | None, total=None, squares=None) -> float:
        """The global L2 norm of all gradients; above ``max_norm`` they are scaled down to it.
        ``total``: the sum across ranks of a float, when each rank holds some of the gradients;
        ``squares``: the squared global norm of {name: gradient}, where it is not their sum."""
        grads = self._grads()
        if squares is not None:
            square = squares(grads)
        else:
            square = sum(float((g * g).sum()) for g in grads.values())
            square = total(square) if total else square
        norm = math.sqrt(square)
        if max_norm and norm > max_norm:
            scale = max_norm / (norm + 1e-6)
            with paddle.no_grad():
                for g in grads.values():
                    g.scale_(scale)
        return norm

    def step(self, lr: float, step: int) -> None:
        grads = self._grads()
        decay = [n for n, p in self.params.items() if len(p.shape) >= 2]
        plain = [n for n, p in self.params.items() if len(p.shape) < 2]
        for names, wd in ((decay, self.weight_decay), (plain, 0.0)):
            if names:
                ops.adamw_step([self.params[n] for n in names], [grads[n] for n in names],
                               [self.m1[n] for n in names], [self.m2[n] for n in names], lr=lr, beta1=self.beta1,
                               beta2=self.beta2, eps=self.eps, weight_decay=wd, step=step)

    def zero_grad(self) -> None:
        # Not clear_gradient(): on a device without a `full` kernel it fills zeros through
        # Paddle's CPU kernel straight into device memory (the simulator's guard catches it)
        for p in self.params.values():
            p.grad = None

    def state(self) -> dict[str, np.ndarray]:
        out = {}
        for n in self.params:
            out[n + ".m1"] = self.m1[n].numpy()
            out[n + ".m2"] = self.m2[n].numpy()
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        for n in self.params:
            for key, table in ((n + ".m1", self.m1), (n + ".m2", self.m2)):
                if key not in state:
                    raise ValueError(f"the saved optimizer state has no {key}")
                assign(table[n], state[key])
