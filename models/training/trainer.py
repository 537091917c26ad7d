"""The training loop of fine-tuning, pretraining and DPO: batches (zero-padded packs, plain
padding, windows of a token stream, preference pairs) in a seeded order per epoch, gradient
accumulation weighted by target tokens (or pairs), clipping, AdamW with a warmup + decay
schedule, periodic evaluation, a metrics log, unified checkpoints and exact resume.

Everything random derives from (seed, epoch) for the data order and (seed, step, micro-batch)
for LoRA dropout, so the seed and the data position are the whole RNG state a checkpoint needs,
and a resumed run repeats the uninterrupted one step for step.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from anychip.frontends.paddle import import_paddle

from ..checkpoint import Checkpoint
from ..export import hf_metadata_files, hf_tensors
from ..hf_folder import hf_name
from ..tensor_parallel import partial_gradient, shard, shard_axis, shard_params, unshard, unshard_params
from . import checkpoints, distributed
from .data import Example
from .distributed import World
from .model import TrainableModel
from .optimizer import AdamW, learning_rate
from .packing import Batch, ExampleData
from .sharding import STAGES, ShardedAdamW

paddle = import_paddle()

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"


@dataclass
class TrainArgs:
    max_length: int = 512
    batch_size: int = 1
    grad_accum: int = 1
    epochs: float = 1.0
    max_steps: int | None = None         # overrides epochs
    lr: float = 2e-4
    warmup_steps: int = 0
    schedule: str = "cosine"
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    zero_padding: bool = False
    eval_steps: int | None = None         # also evaluates at the end when there is dev data
    save_steps: int | None = None         # also saves at the end
    save_total_limit: int | None = 3
    seed: int = 42
    buffer_size: int = 500                # zero padding's packing window
    sharding: str | None = None           # stage1 | stage2: the optimizer partitioned across ranks

    def __post_init__(self):
        for name in ("max_length", "batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is None and self.epochs <= 0:
            raise ValueError(f"epochs must be > 0, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.sharding is not None and self.sharding not in STAGES:
            raise ValueError(f"sharding must be one of {', '.join(STAGES)}, got {self.sharding!r}")


class Trainer:
    """Trains ``model`` on ``train`` (evaluating on ``dev``) into ``output``: checkpoints
    ``checkpoint-<step>/``, ``metrics.jsonl``, ``loss.png`` and, at the end, the model itself
    (a Hugging Face folder for full training, an adapter for LoRA).

    ``train`` and ``dev`` are fine-tuning Examples, or any data with ``len()`` and
    ``batches(order, args) -> list[Batch]`` (pretraining's TokenSequences); ``kind`` names
    the run in the progress bar and the plot.

    ``world``: with several ranks (data parallelism, anychip_models.training.distributed), an
    optimizer step takes ``grad_accum`` micro-batches per rank, each rank computing its share
    and the ranks summing gradients and figures; rank 0 alone writes the output folder."""

    def __init__(self, model: TrainableModel, base: Checkpoint, train: list[Example], dev: list[Example],
                 args: TrainArgs, output: str | Path, progress: bool = True, kind: str = "finetune",
                 world: World | None = None):
        train, dev = (d if hasattr(d, "batches") else ExampleData(d) for d in (train, dev))
        if not len(train):
            raise ValueError("no training examples")
        self.model, self.base, self.train_set, self.dev_set, self.args = model, base, train, dev, args
        self.output = Path(output)
        self.world = world or World(device=model.device)
        self.progress, self.kind = progress and self.world.main, kind
        if args.sharding and self.world.size > 1:
            self.optimizer = ShardedAdamW(model.params, self.world, args.sharding, weight_decay=args.weight_decay)
        else:
            self.optimizer = AdamW(model.params, weight_decay=args.weight_decay)
        self.micro_per_step = args.grad_accum * self.world.dp_size
        self.steps_per_epoch = math.ceil(len(self._epoch_batches(0)) / self.micro_per_step)
        self.total_steps = args.max_steps or max(1, math.ceil(args.epochs * self.steps_per_epoch))
        self.step, self.epoch, self.batch_index = 0, 0, 0
        self.history: list[dict] = []

    # ---- data --------------------------------------------------------------------------------

    def _epoch_batches(self, epoch: int) -> list[Batch]:
        order = np.random.default_rng([self.args.seed, epoch]).permutation(len(self.train_set))
        return self.train_set.batches(order, self.args)

    def _dev_batches(self) -> list[Batch]:
        return self.dev_set.batches(range(len(self.dev_set)), self.args)

    def _next_micro_batches(self) -> list[Batch]:
        batches = self._batches
        out = []
        while len(out) < self.micro_per_step:
            if self.batch_index >= len(batches):
                self.epoch, self.batch_index = self.epoch + 1, 0
                batches = self._batches = self._epoch_batches(self.epoch)
            out.append(batches[self.batch_index])
            self.batch_index += 1
        return out

    # ---- the loop ----------------------------------------------------------------------------

    def train(self, resume: bool = False, overwrite: bool = False) -> dict:
        """Runs to ``total_steps``; with ``resume``, continues from the latest checkpoint in the
        output folder; with ``overwrite``, starts afresh over an earlier run's output (its
        checkpoints and metrics log are deleted). Returns the last metrics record."""
        main = self.world.main
        if main:
            self.output.mkdir(parents=True, exist_ok=True)
        if overwrite and main:
            checkpoints.remove_checkpoints(self.output)
            (self.output / METRICS_FILE).unlink(missing_ok=True)  # else the new run's log appends to it
        if resume:
            self._resume()
        elif main and checkpoints.latest_checkpoint(self.output) is not None:
            raise FileExistsError(f"{self.output} holds checkpoints of an earlier run: resume it, or choose "
                                  "another output folder")
        self._batches = self._epoch_batches(self.epoch)
        if self.step == 0 and len(self.dev_set):  # the starting point of the evaluation curve
            self._log({"step": 0, **self.evaluate()})
        bar = tqdm(total=self.total_steps, initial=self.step, desc=self.kind, unit="step", disable=not self.progress)
        record = {}
        while self.step < self.total_steps:
            record = self._train_step()
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}", tok_s=f"{record['tokens_per_s']:.0f}")
            last = self.step == self.total_steps
            if len(self.dev_set) and ((self.args.eval_steps and self.step % self.args.eval_steps == 0) or last):
                record.update(self.evaluate())
                bar.write(f"step {self.step}: " + ", ".join(f"{k.removeprefix('eval_').replace('_', ' ')} {v:.4f}"
                                                            for k, v in record.items() if k.startswith("eval_")))
            self._log(record)
            if (self.args.save_steps and self.step % self.args.save_steps == 0) or last:
                self.save()
        bar.close()
        self._export()
        if main:
            self.plot()
        return record

    def _train_step(self) -> dict:
        started = time.perf_counter()
        micro = self._next_micro_batches()
        self.step += 1
        denominator = sum(self._weight(b) for b in micro)  # the whole step's, on every rank
        self.model.dropout.training = True
        total, sums = 0.0, {}
        world = self.world
        # Data-parallel rank r takes micro-batches r, r + size, ...; each keeps its index j, which
        # seeds its LoRA dropout as on one device.
        for j in range(world.dp_rank, len(micro), world.dp_size):
            self.model.dropout.step, self.model.dropout.micro = self.step, j
            loss, metrics = self._loss(micro[j], denominator)
            loss.backward()
            total += float(loss)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(value)
        if world.size > 1:
            distributed.fault_point(world.rank, self.step)
            self._sum_partial_gradients()
            if isinstance(self.optimizer, ShardedAdamW):
                self.optimizer.reduce_gradients()
            else:
                self._sum_gradients()
            keys = sorted(sums)
            total, *summed = world.totals([total] + [sums[k] for k in keys])
            sums = dict(zip(keys, summed))
        if self.model.tp is not None:
            norm = self.optimizer.clip_grad_norm(self.args.max_grad_norm, squares=self._tp_squares)
        else:
            norm = self.optimizer.clip_grad_norm(self.args.max_grad_norm)
        lr = learning_rate(self.step, self.args.lr, self.args.warmup_steps, self.total_steps, self.args.schedule)
        self.optimizer.step(lr, self.step)
        self.optimizer.zero_grad()
        seconds = time.perf_counter() - started
        tokens = sum(b.real_tokens for b in micro)
        return {"step": self.step, "epoch": self.epoch, "loss": total, **self._finish_metrics(sums, denominator),
                "lr": lr, "grad_norm": norm, "tokens": tokens, "target_tokens": denominator,
                "tokens_per_s": tokens / seconds, "seconds": seconds}

    def _sum_partial_gradients(self) -> None:
        """Tensor parallelism: the gradients of whole parameters that saw only their rank's part
        of a split product, summed over the tensor-parallel ranks."""
        tp = self.model.tp
        if tp is None:
            return
        import paddle.distributed as dist

        for name, p in self.model.params.items():
            if partial_gradient(name) and p.grad is not None:
                dist.all_reduce(p.grad, group=tp.group)

    def _tp_squares(self, grads: dict) -> float:
        """The squared global gradient norm under tensor parallelism: split parameters' squares
        summed over the ranks, whole ones' counted once."""
        import paddle.distributed as dist

        from anychip.ops.dispatch import place

        split = sum(float((g * g).sum()) for n, g in grads.items() if shard_axis(n) is not None)
        whole = sum(float((g * g).sum()) for n, g in grads.items() if shard_axis(n) is None)
        total = paddle.to_tensor(np.asarray([split], np.float32), place=place(self.model.device))
        dist.all_reduce(total, group=self.model.tp.group)
        return float(total.numpy()[0]) + whole

    def _sum_gradients(self) -> None:
        """Every parameter's gradient summed across the ranks (a rank that had no micro-batch
        this step contributes zeros)."""
        for p in self.model.params.values():
            if p.grad is None:
                p.grad = paddle.zeros(p.shape, dtype=p.dtype, device=p.place)
        self.world.all_reduce([p.grad for p in self.model.params.values()])

    # The objective, which DPO replaces: a micro-batch's weight in its step (its target tokens),
    # its loss (divided by the step's total weight) with metrics to sum, and their step values.

    def _weight(self, batch) -> int:
        return batch.loss_tokens

    def _loss(self, batch, denominator: int):
        loss, _ = self.model.batch_loss(batch, denominator)
        return loss, {}

    def _finish_metrics(self, sums: dict, denominator: int) -> dict:
        return {}

    def evaluate(self) -> dict:
        """Mean target-token loss and perplexity on the dev set (each rank scoring its share)."""
        self.model.dropout.training = False
        total, count = 0.0, 0
        with paddle.no_grad():
            for batch in self._dev_batches()[self.world.dp_rank::self.world.dp_size]:
                _, losses = self.model.batch_loss(batch, 1)
                total += float(losses.sum())
                count += batch.loss_tokens
        total, count = self.world.totals([total, count])
        mean = total / max(count, 1)
        return {"eval_loss": mean, "eval_ppl": math.exp(min(mean, 50.0))}

    # ---- state ---------------------------------------------------------------------------------

    def _model_files(self) -> tuple[dict, dict]:
        """The model's tensors and extra files as a checkpoint (or the final output) holds them:
        a Hugging Face folder for full fine-tuning, an adapter folder for LoRA or a prefix. Under
        tensor parallelism a collective (every rank calls it) giving the whole tensors."""
        adapter = self.model.adapter
        tensors = self.model.canonical_tensors() if adapter is None else self.model.state()
        if self.model.tp is not None:
            tensors = unshard(tensors, self.model.tp, self.base.config.vocab_size, self.model.device)
        if adapter is None:
            config = self.base.config
            return hf_tensors(config, tensors), hf_metadata_files(config, self.base.tokenizer)
        return tensors, {adapter.config_file: adapter.to_json().encode()}

    def _load_model_tensors(self, tensors: dict) -> None:
        tp = self.model.tp
        if self.model.adapter is None:
            by_hf = {hf_name(n): n for n in self.base.tensors}
            unknown = sorted(set(tensors) - set(by_hf))
            if unknown:
                raise ValueError(f"the checkpoint holds tensors this model lacks: {unknown[:3]}")
            tensors = {by_hf[n]: t for n, t in tensors.items()}
            if tp is not None:
                tensors = shard(tensors, tp, self.base.config.vocab_size)
            self.model.load_canonical(tensors)
        else:
            if tp is not None:
                tensors = shard(tensors, tp, self.base.config.vocab_size)
            self.model.load_state(tensors)

    def _whole_optimizer_state(self, state: dict) -> dict:
        """Tensor parallelism: the whole optimizer state from the ranks' shares (a collective)."""
        return unshard_params(state, self.model.tp, self.model.config, self.base.config.vocab_size, self.model.device)

    def save(self) -> Path | None:
        """A checkpoint of this step, written by rank 0 (None on the others). Every rank calls
        it: a sharded optimizer gathers its state on rank 0 first."""
        sharded = isinstance(self.optimizer, ShardedAdamW)
        optimizer = self.optimizer.state() if sharded or self.world.main else None
        if self.model.tp is not None:  # the whole tensors: every rank takes part
            tensors, extra = self._model_files()
            optimizer = self._whole_optimizer_state(optimizer if self.world.main else self.optimizer.state())
        if not self.world.main:
            return None
        if self.model.tp is None:
            tensors, extra = self._model_files()
        state = {"step": self.step, "epoch": self.epoch, "batch_index": self.batch_index,
                 "total_steps": self.total_steps, "rng": {"seed": self.args.seed},
                 "scheduler": {"schedule": self.args.schedule, "lr": self.args.lr,
                               "warmup_steps": self.args.warmup_steps, "total_steps": self.total_steps},
                 "args": asdict(self.args), "lora": None if self.model.lora is None else asdict(self.model.lora),
                 "prefix": None if self.model.prefix is None else asdict(self.model.prefix),
                 "device": ":".join(map(str, self.model.device))}
        return checkpoints.save_checkpoint(self.output, self.step, tensors, optimizer, state, extra,
                                           keep=self.args.save_total_limit)

    def _resume(self) -> None:
        latest = checkpoints.latest_checkpoint(self.output)
        if latest is None:  # starting afresh instead would silently redo (or lose) a run
            raise checkpoints.CheckpointStateError(
                f"{self.output}: no complete checkpoint-<step> folder to resume from")
        tensors, optimizer, state = checkpoints.load_checkpoint_state(latest)
        if state.get("rng", {}).get("seed") != self.args.seed or state.get("total_steps") != self.total_steps:
            raise ValueError(f"{latest} was saved with seed {state.get('rng', {}).get('seed')} and "
                             f"{state.get('total_steps')} steps; resuming needs the same data and arguments "
                             f"(this run: seed {self.args.seed}, {self.total_steps} steps)")
        self._load_model_tensors(tensors)
        if self.model.tp is not None:
            optimizer = shard_params(optimizer, self.model.tp, self.base.config, self.base.config.vocab_size)
        self.optimizer.load_state(optimizer)
        self.step, self.epoch, self.batch_index = state["step"], state["epoch"], state["batch_index"]
        # the log of the interrupted run may run past this checkpoint: those steps are redone
        self.history = [r for r in self._read_log() if r["step"] <= self.step]
        if self.world.main:
            _write_atomic(self.output / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in self.history).encode())

    def _read_log(self) -> list[dict]:
        path = self.output / METRICS_FILE
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _log(self, record: dict) -> None:
        self.history.append(record)
        if not self.world.main:
            return
        with open(self.output / METRICS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def _export(self) -> None:
        """The trained model into the output folder itself, each file atomically, the file that
        makes the folder loadable (config.json, lora_config.json, prefix_config.json) last."""
        tensors, extra = self._model_files()  # every rank: a collective under tensor parallelism
        if not self.world.main:
            return
        from safetensors.numpy import save

        marker = "config.json" if self.model.adapter is None else self.model.adapter.config_file
        _write_atomic(self.output / "model.safetensors", save(tensors, metadata={"format": "pt"}))
        for name, data in sorted(extra.items(), key=lambda item: item[0] == marker):
            _write_atomic(self.output / name, data)

    def plot(self) -> Path:
        """loss.png: training loss per step and evaluation loss where measured."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        trained = [r for r in self.history if "loss" in r]
        ax.plot([r["step"] for r in trained], [r["loss"] for r in trained], label="train loss", linewidth=1)
        evals = [r for r in self.history if "eval_loss" in r]
        if evals:
            ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (per preference pair)" if self.kind == "dpo" else "loss (nats per target token)")
        what = {"pretrain": "pretraining", "dpo": "DPO"}.get(self.kind, "fine-tuning")
        ax.set_title(f"{what} on {device_label(self.model.device)}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = self.output / PLOT_FILE
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def device_label(device: tuple[str, int]) -> str:
    from anychip.devices import describe

    name = f"{device[0]}:{device[1]}"
    return f"{name} (simulated)" if describe(device[0]).status == "simulated" else name


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    checkpoints.write_file(tmp, data)
    os.replace(tmp, path)
    checkpoints.fsync_dir(path.parent)
