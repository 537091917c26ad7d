"""Direct Preference Optimization on the fine-tuning trainer: the log-probability of each
response under the model and under a frozen reference, and the preference loss of their margin.

    h = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected))
    sigmoid (DPO):  (1 - s) softplus(-beta h) + s softplus(beta h)     (s: --label-smoothing)
    ipo:            (h - 1 / (2 beta))^2

The reference's log-probabilities are computed once, on the device, with the model as it starts
(for LoRA, whose adapters start at zero, that is the frozen base), and kept with the data.
Every op runs on the device (softplus is composed from exp, log and where), so strict mode
holds for a DPO step as for SFT.
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from anychip.ops.dispatch import place
from anychip.frontends.paddle import import_paddle

from .preference import PreferenceBatch, PreferenceData
from .trainer import Trainer

paddle = import_paddle()

LOSSES = ("sigmoid", "ipo")
_LINEAR_FROM = 20.0  # log(1 + e^x) == x in float32 beyond it


def sequence_logps(model, batch: PreferenceBatch):
    """[pairs] chosen and [pairs] rejected summed log-probabilities of ``batch`` under ``model``
    (a TrainableModel), as tensors on its device."""
    dev = place(model.device)
    mask = None if batch.startend_row_indices is None else paddle.to_tensor(batch.startend_row_indices, place=dev)
    logits = model.model(paddle.to_tensor(batch.input_ids, place=dev), paddle.to_tensor(batch.position_ids, place=dev),
                         startend_row_indices=mask, rows=paddle.to_tensor(batch.rows, place=dev),
                         recompute=model.recompute)
    token_logps = -paddle.nn.functional.cross_entropy(
        logits, paddle.to_tensor(batch.labels.reshape(-1, 1), place=dev), reduction="none").reshape([-1, 1])
    chosen, rejected = (paddle.matmul(paddle.to_tensor(s, place=dev), token_logps).reshape([-1])
                        for s in batch.selectors())
    return chosen, rejected


def _softplus(x):
    """log(1 + e^x), differentiable everywhere. (The usual relu(x) + log(1 + e^-|x|) has a zero
    gradient at exactly 0, which is where every margin starts: the reference is the model.) e^x is
    capped where softplus(x) is x in float32."""
    capped = paddle.minimum(x, paddle.full_like(x, _LINEAR_FROM))
    return paddle.where(x > _LINEAR_FROM, x, paddle.log(1.0 + paddle.exp(capped)))


def preference_loss(h, beta: float, loss: str = "sigmoid", label_smoothing: float = 0.0):
    """Per-pair loss of margins ``h`` (a tensor)."""
    if loss == "ipo":
        return paddle.square(h - 1.0 / (2.0 * beta))
    return (1.0 - label_smoothing) * _softplus(-beta * h) + label_smoothing * _softplus(beta * h)


class DpoTrainer(Trainer):
    """The Trainer with DPO's objective on PreferenceData: a step's loss is the mean over its
    pairs; records carry the rewards (beta times each side's log-ratio), their margin and the
    share of pairs the model prefers the chosen response of."""

    def __init__(self, model, base, train: PreferenceData, dev: PreferenceData, args, output, beta: float = 0.1,
                 loss: str = "sigmoid", label_smoothing: float = 0.0, progress: bool = True, world=None):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if not 0 <= label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
        super().__init__(model, base, train, dev, args, output, progress=progress, kind="dpo", world=world)
        self.beta, self.loss_kind, self.label_smoothing = beta, loss, label_smoothing
        self.reference = {"train": self._reference(self.train_set), "dev": self._reference(self.dev_set)}

    def _reference(self, data) -> np.ndarray:
        """[pairs, 2] log-probabilities of each pair's chosen and rejected response under the
        model as it is now (before any step)."""
        out = np.zeros((len(data), 2), np.float64)
        self.model.dropout.training = False
        batches = data.batches(range(len(data)), self.args)
        with paddle.no_grad():
            for batch in tqdm(batches, desc="reference log-probs", unit="batch",
                              disable=not self.progress or len(batches) < 2):
                chosen, rejected = sequence_logps(self.model, batch)
                out[batch.pairs, 0], out[batch.pairs, 1] = chosen.numpy(), rejected.numpy()
        return out

    def _weight(self, batch) -> int:
        return batch.num_pairs

    def _pair_terms(self, batch, split: str):
        chosen, rejected = sequence_logps(self.model, batch)
        ref = self.reference[split][batch.pairs]
        dev = place(self.model.device)
        chosen_ratio = chosen - paddle.to_tensor(ref[:, 0].astype(np.float32), place=dev)
        rejected_ratio = rejected - paddle.to_tensor(ref[:, 1].astype(np.float32), place=dev)
        losses = preference_loss(chosen_ratio - rejected_ratio, self.beta, self.loss_kind, self.label_smoothing)
        return losses, chosen_ratio.numpy() * self.beta, rejected_ratio.numpy() * self.beta

    def _loss(self, batch, denominator: int):
        losses, chosen, rejected = self._pair_terms(batch, "train")
        return losses.sum() / denominator, {"rewards_chosen": chosen.sum(), "rewards_rejected": rejected.sum(),
                                            "reward_accuracy": float((chosen > rejected).sum())}

    def _finish_metrics(self, sums: dict, denominator: int) -> dict:
        out = {k: v / denominator for k, v in sums.items()}
        out["reward_margin"] = out["rewards_chosen"] - out["rewards_rejected"]
        return out

    def evaluate(self) -> dict:
        """Mean loss, rewards, margin and preference accuracy on the dev pairs."""
        self.model.dropout.training = False
        totals, pairs = {"loss": 0.0, "chosen": 0.0, "rejected": 0.0, "accuracy": 0.0}, 0
        with paddle.no_grad():
            for batch in self._dev_batches():
                losses, chosen, rejected = self._pair_terms(batch, "dev")
                totals["loss"] += float(losses.sum())
                totals["chosen"] += float(chosen.sum())
                totals["rejected"] += float(rejected.sum())
                totals["accuracy"] += float((chosen > rejected).sum())
                pairs += batch.num_pairs
        n = max(pairs, 1)
        return {"eval_loss": totals["loss"] / n, "eval_rewards_chosen": totals["chosen"] / n,
                "eval_rewards_rejected": totals["rejected"] / n,
                "eval_reward_margin": (totals["chosen"] - totals["rejected"]) / n,
                "eval_reward_accuracy": totals["accuracy"] / n}


def preference_accuracy(model, data: PreferenceData, args) -> float:
    """The share of pairs whose chosen response ``model`` finds likelier than the rejected one."""
    wins = 0
    with paddle.no_grad():
        for batch in data.batches(range(len(data)), args):
            chosen, rejected = sequence_logps(model, batch)
            wins += int((chosen.numpy() > rejected.numpy()).sum())
    return wins / max(len(data), 1)
