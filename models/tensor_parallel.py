"""Tensor parallelism, Megatron's scheme as PaddleNLP's ``tensor_parallel_degree`` applies it to
Llama: each of K ranks holds 1/K of every layer, and the ranks' partial results meet in
paddle.distributed collectives (the device's own, through the Paddle bridge).

- Column-parallel (q, k and v by heads, gate and up by the MLP's inner dimension): a rank holds
  its rows of the weight and computes its heads or inner features from the whole input; the
  input enters through :meth:`TensorParallel.copy` (identity forward, gradients summed across
  the ranks backward).
- Row-parallel (o by heads, down by inner dimension): a rank holds its columns and computes a
  partial output from its share of the input; :meth:`TensorParallel.reduce` sums the parts
  (all-reduce forward, identity backward).
- Vocabulary-parallel embedding and output head: a rank holds a contiguous chunk of the
  vocabulary's rows (the last chunk padded with zero rows); a token outside a rank's chunk looks
  up zeros there and the ranks' lookups are summed; the head's logits are gathered
  (:meth:`TensorParallel.gather`) and the padding cut off, so every rank sees all logits.

A rank's model is the whole model's with ``num_heads``, ``num_kv_heads`` and
``intermediate_size`` divided by K (:func:`shard_checkpoint`), and the checkpoint stays whole:
:func:`unshard` gathers the ranks' tensors back into the one layout a single device uses, so a
run saved by K ranks resumes on one and the other way round.

LoRA adapters follow their linear: B is split with a column-parallel weight, A with a
row-parallel one; the other factor is whole on every rank but sees only the rank's part of the
product, so its gradient is a partial sum: :func:`partial_gradient` names those, and the trainer
sums their gradients across the ranks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from anychip.frontends.paddle import import_paddle

from .checkpoint import Checkpoint, ModelConfig, QuantWeight

paddle = import_paddle()

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "q_bias", "k_bias", "v_bias",
          "qkv", "qkv_bias", "gate_up")  # the last three: TrainableModel's fused parameters
ROW = ("o_proj", "down_proj")
VOCAB = ("embed_tokens", "lm_head")


def shard_axis(name: str) -> int | None:
    """The axis along which canonical tensor or trainable parameter ``name`` (``layers.3.q_proj``,
    ``layers.3.qkv``, ``embed_tokens``, ``layers.0.o_proj.lora_A``) is split across ranks; None:
    whole on every rank."""
    parts = name.split(".")
    if parts[-1] in ("lora_A", "lora_B"):
        linear = parts[-2]
        if parts[-1] == "lora_B" and linear in COLUMN:
            return 0
        if parts[-1] == "lora_A" and linear in ROW:
            return 1
        return None
    if parts[-1] in COLUMN or parts[-1] in VOCAB:
        return 0
    if parts[-1] in ROW:
        return 1
    return None


def partial_gradient(name: str) -> bool:
    """Whether parameter ``name``, whole on every rank, gets only its rank's part of its gradient
    (a LoRA factor beside a split one)."""
    parts = name.split(".")
    return parts[-1] in ("lora_A", "lora_B") and shard_axis(name) is None


def vocab_chunk(vocab_size: int, size: int) -> int:
    """Rows of the vocabulary each rank holds (the last rank's padded)."""
    return -(-vocab_size // size)


def check(config: ModelConfig, size: int) -> None:
    """Raises ValueError unless ``config`` splits into ``size`` ranks."""
    if size < 1:
        raise ValueError(f"tensor parallel degree must be >= 1, got {size}")
    for what, n in (("attention heads", config.num_heads), ("key/value heads", config.num_kv_heads),
                    ("MLP inner features", config.intermediate_size)):
        if n % size:
            raise ValueError(f"--tensor-parallel {size} must divide the model's {what} ({n})")


def _split(array: np.ndarray, axis: int | None, rank: int, size: int, rows: int | None = None) -> np.ndarray:
    if axis is None:
        return array
    if rows is not None:  # a vocabulary chunk, zero-padded to `rows`
        part = array[rank * rows:(rank + 1) * rows]
        if part.shape[0] < rows:
            part = np.concatenate([part, np.zeros((rows - part.shape[0],) + part.shape[1:], part.dtype)])
        return part
    return np.split(array, size, axis=axis)[rank]


def shard_checkpoint(checkpoint: Checkpoint, rank: int, size: int) -> Checkpoint:
    """Rank ``rank``'s share of ``checkpoint`` (float weights), with the rank's head and inner
    counts in its config."""
    c = checkpoint.config
    check(c, size)
    quantized = [n for n, t in checkpoint.tensors.items() if isinstance(t, QuantWeight)]
    if quantized:
        raise ValueError(f"tensor parallelism takes float weights, but {quantized[0]} is quantized: load the model "
                         "with --weights float")
    if checkpoint.prefix is not None:
        raise ValueError("tensor parallelism does not split a model that carries a prefix (Prefix Tuning)")
    rows = vocab_chunk(c.vocab_size, size)
    tensors = {name: _split(t, shard_axis(name), rank, size, rows if name in VOCAB else None)
               for name, t in checkpoint.tensors.items()}
    config = dataclasses.replace(c, num_heads=c.num_heads // size, num_kv_heads=c.num_kv_heads // size,
                                 intermediate_size=c.intermediate_size // size)
    return dataclasses.replace(checkpoint, config=config, tensors=tensors)


@dataclass
class TensorParallel:
    """This rank's place in a tensor-parallel group of ``size`` ranks (``group``: its
    paddle.distributed group), and the collectives the split layers meet in."""

    rank: int
    size: int
    group: object = None

    def copy(self, x):
        """``x`` as a column-parallel layer's input: unchanged, its gradient summed over ranks."""
        return _Copy.apply(x, self.group)

    def reduce(self, x):
        """The sum over ranks of a row-parallel layer's partial output ``x``."""
        return _Reduce.apply(x, self.group)

    def gather(self, x, total: int):
        """The ranks' ``x`` [..., n] side by side along the last axis, cut to ``total`` columns."""
        return _Gather.apply(x, self.group, self.rank, self.size)[..., :total]

    def gather_array(self, array: np.ndarray, axis: int, total: int | None, device) -> np.ndarray:
        """The ranks' numpy ``array`` concatenated along ``axis`` (cut to ``total`` there, when
        given): a checkpoint's whole tensor from its shards."""
        import paddle.distributed as dist

        from anychip.ops.dispatch import place

        parts = []
        dist.all_gather(parts, paddle.to_tensor(np.ascontiguousarray(array), place=place(device)), group=self.group)
        whole = np.concatenate([p.numpy() for p in parts], axis=axis)
        return whole if total is None else whole[:total]


def unshard(tensors: dict[str, np.ndarray], tp: TensorParallel, vocab_size: int, device) -> dict[str, np.ndarray]:
    """The whole canonical tensors from every rank's ``tensors`` (a collective: every rank calls it,
    in the same order)."""
    out = {}
    for name in sorted(tensors):
        axis = shard_axis(name)
        if axis is None:
            out[name] = tensors[name]
        else:
            out[name] = tp.gather_array(tensors[name], axis, vocab_size if name in VOCAB else None, device)
    return out


def shard(tensors: dict[str, np.ndarray], tp: TensorParallel, vocab_size: int) -> dict[str, np.ndarray]:
    """This rank's share of whole canonical ``tensors``."""
    rows = vocab_chunk(vocab_size, tp.size)
    return {name: _split(t, shard_axis(name), tp.rank, tp.size, rows if name in VOCAB else None)
            for name, t in tensors.items()}


# Trainable parameters that fuse canonical tensors (TrainableModel's names), and their parts
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "qkv_bias": ("q_bias", "k_bias", "v_bias"),
         "gate_up": ("gate_proj", "up_proj")}


def _parts(name: str, config: ModelConfig) -> tuple[list[str], list[int]] | None:
    """The canonical names and row counts of fused parameter ``name`` under ``config``; None
    when ``name`` is not fused."""
    prefix, _, last = name.rpartition(".")
    if last not in FUSED:
        return None
    d = config.head_dim
    rows = ([config.num_heads * d, config.num_kv_heads * d, config.num_kv_heads * d] if last != "gate_up"
            else [config.intermediate_size] * 2)
    return [f"{prefix}.{part}" for part in FUSED[last]], rows


def unshard_params(arrays: dict[str, np.ndarray], tp: TensorParallel, config: ModelConfig, vocab_size: int,
                   device) -> dict[str, np.ndarray]:
    """Whole arrays of trainable parameters (or per-parameter state, ``<param>.m1``) from each
    rank's share under the rank's ``config`` (a collective). Fused parameters are gathered part
    by part, so that the whole one is laid out as on one device."""
    out = {}
    for key in sorted(arrays):
        param, _, suffix = key.rpartition(".") if key.endswith((".m1", ".m2")) else (key, "", "")
        parts = _parts(param, config)
        if parts is None:
            out[key] = unshard({param: arrays[key]}, tp, vocab_size, device)[param]
            continue
        names, rows = parts
        pieces = np.split(arrays[key], np.cumsum(rows)[:-1])
        out[key] = np.concatenate([unshard({n: piece}, tp, vocab_size, device)[n] for n, piece in zip(names, pieces)])
    return out


def shard_params(arrays: dict[str, np.ndarray], tp: TensorParallel, config: ModelConfig,
                 vocab_size: int) -> dict[str, np.ndarray]:
    """This rank's share of whole trainable-parameter arrays (``config``: the whole model's)."""
    out = {}
    for key, array in arrays.items():
        param = key.rpartition(".")[0] if key.endswith((".m1", ".m2")) else key
        parts = _parts(param, config)
        if parts is None:
            out[key] = shard({param: array}, tp, vocab_size)[param]
            continue
        names, rows = parts
        pieces = np.split(array, np.cumsum(rows)[:-1])
        out[key] = np.concatenate([shard({n: piece}, tp, vocab_size)[n] for n, piece in zip(names, pieces)])
    return out


class _Copy(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        import paddle.distributed as dist

        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad


class _Reduce(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        import paddle.distributed as dist

        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Gather(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x, group, rank, size):
        import paddle.distributed as dist

        ctx.rank, ctx.width = rank, x.shape[-1]
        parts = []
        dist.all_gather(parts, x, group=group)
        return paddle.concat(parts, axis=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width]
