"""A Llama-family model set up for training on any device: every weight trainable (full SFT), a
frozen base (float32 or weight-only int8/int4, as QLoRA) with LoRA adapters, or a frozen base
with a trained prefix (Prefix Tuning), and the loss of one batch. Parameters have
device-independent names, which checkpoints use; their values move through numpy, so a state
saved on one device loads on any other."""

from __future__ import annotations

import math

import numpy as np

import anychip.ops as ops
from anychip.ops.dispatch import place
from anychip.frontends.paddle import import_paddle

from ..checkpoint import Checkpoint, QuantWeight
from ..layers import Linear, assign, matmul, to_device
from ..llama import LlamaForCausalLM
from ..lora import LoraConfig
from ..prefix import EMBEDDING, MLP, PrefixConfig, encoder_shapes, split_layers
from ..tensor_parallel import TensorParallel
from .packing import Batch

paddle = import_paddle()

COMPUTE_DTYPES = ("float32", "bfloat16")


def _trainable(tensor):
    tensor.stop_gradient = False
    return tensor


class Dropout:
    """LoRA dropout masks drawn from (seed, step, micro-batch, layer, target) alone: a resumed
    run and a recomputed layer draw the same masks, on every device."""

    def __init__(self, rate: float, seed: int):
        self.rate, self.seed = rate, seed
        self.step = self.micro = 0
        self.training = True

    def __call__(self, x, layer: int, target: int, split: tuple[int, int] | None = None):
        """``split`` (rank, ranks): ``x`` is that rank's share of the last axis of the input
        (tensor parallelism), which gets its share of the whole input's mask."""
        if self.rate == 0.0 or not self.training:
            return x
        rng = np.random.default_rng([self.seed, self.step, self.micro, layer, target])
        shape = list(x.shape)
        if split is not None:
            shape[-1] *= split[1]
        keep = (rng.random(shape, dtype=np.float32) >= self.rate).astype(np.float32) / (1.0 - self.rate)
        if split is not None:
            width = x.shape[-1]
            keep = keep[..., split[0] * width:(split[0] + 1) * width]
        return x * paddle.to_tensor(np.ascontiguousarray(keep), place=x.place)


class LoraLinear:
    """A frozen projection whose output rows are the concatenation of ``parts`` (q, k, v of a
    fused qkv, say), each targeted part adapted by ``scaling * B_p A_p x``. ``split`` (rank,
    ranks): the projection is row-parallel (tensor parallelism), ``x`` this rank's share of the
    input, and A this rank's columns of the A one device draws."""

    def __init__(self, base: Linear, parts: list[tuple[str, int]], config: LoraConfig, layer: int,
                 dropout: Dropout, rng: np.random.Generator, device, compute_dtype: str = "float32",
                 split: tuple[int, int] | None = None):
        self.base, self.parts, self.layer, self.dropout, self.split = base, parts, layer, dropout, split
        self.compute_dtype = compute_dtype
        self.scaling = config.scaling
        k = base.weight.shape[1] * (2 if base.bits == 4 else 1)
        whole = k * (split[1] if split else 1)
        self.adapters = {}
        for name, rows in parts:
            if name in config.targets:
                # A as PEFT initialises it (Kaiming-uniform, a = sqrt(5): bound 1/sqrt(K)), B zero:
                # the adapted model starts as the base model
                bound = 1.0 / math.sqrt(whole)
                a = rng.uniform(-bound, bound, size=(config.rank, whole)).astype(np.float32)
                if split:
                    a = np.ascontiguousarray(a[:, split[0] * k:(split[0] + 1) * k])
                self.adapters[name] = (_trainable(to_device(a, device)),
                                       _trainable(to_device(np.zeros((rows, config.rank), np.float32), device)))

    def __call__(self, x):
        y = self.base(x)
        outputs = [y] if len(self.parts) == 1 else paddle.split(y, [rows for _, rows in self.parts], axis=-1)
        for index, (name, _) in enumerate(self.parts):
            if name in self.adapters:
                a, b = self.adapters[name]
                h = matmul(self.dropout(x, self.layer, index, self.split), a, compute_dtype=self.compute_dtype)
                outputs[index] = outputs[index] + matmul(h, b, compute_dtype=self.compute_dtype) * self.scaling
        return outputs[0] if len(outputs) == 1 else paddle.concat(outputs, axis=-1)


def quantize_linear(linear: Linear, bits: int, group_size: int = -1) -> Linear:
    """``linear``'s float weight as anychip weight-only int8/int4, quantized on its device."""
    qweight, scales = ops.weight_quantize(linear.weight.transpose([1, 0]), bits=bits, group_size=group_size)
    linear.weight, linear.scales, linear.bits, linear.group_size = qweight, scales, bits, group_size
    for t in (qweight, scales):
        t.stop_gradient = True
    return linear


class TrainableModel:
    """``checkpoint``'s model on ``device`` with its trainable parameters in ``params`` (name ->
    tensor). ``lora`` or ``prefix``: an adapter on the frozen base; neither: full fine-tuning
    (float checkpoints only)."""

    def __init__(self, checkpoint: Checkpoint, device: tuple[str, int], lora: LoraConfig | None = None,
                 recompute: bool = False, seed: int = 0, compute_dtype: str = "float32",
                 prefix: PrefixConfig | None = None, tp: TensorParallel | None = None):
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {compute_dtype!r}")
        if lora is not None and prefix is not None:
            raise ValueError("train a LoRA adapter or a prefix, not both at once")
        if checkpoint.prefix is not None:
            raise ValueError("the model carries a trained prefix already: train from its base model")
        if prefix is not None and tp is not None and tp.size > 1:
            raise ValueError("Prefix Tuning does not run tensor parallel: train the prefix on one device per rank")
        self.device, self.lora, self.prefix, self.recompute = device, lora, prefix, recompute
        self.compute_dtype = compute_dtype
        self.model = LlamaForCausalLM(checkpoint, device, tp=tp)
        self.tp = self.model.tp
        self.config = self.model.config  # a tensor-parallel rank's: its heads and MLP features
        for layer in self.model.blocks:
            for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
                linear.compute_dtype = compute_dtype
        self.model.head.compute_dtype = compute_dtype
        self.dropout = Dropout(lora.dropout if lora else 0.0, seed)
        self.params: dict[str, object] = {}
        if prefix is not None:
            self._add_prefix(prefix, np.random.default_rng(seed))
        elif lora is None:
            quantized = [n for n, t in checkpoint.tensors.items() if isinstance(t, QuantWeight)]
            if quantized:
                raise ValueError(f"full fine-tuning needs float weights, but {quantized[0]} (and "
                                 f"{len(quantized) - 1} more) are quantized: load the model with --weights float "
                                 "or train a LoRA adapter")
            self._make_all_trainable()
        else:
            self._add_adapters(lora, np.random.default_rng(seed))

    # ---- set-up ----------------------------------------------------------------------------

    def _make_all_trainable(self):
        m, c = self.model, self.config
        self.params["embed_tokens"] = _trainable(m.embed.table)
        for i, layer in enumerate(m.blocks):
            p = f"layers.{i}."
            self.params[p + "attn_norm"] = _trainable(layer.attn_norm)
            self.params[p + "qkv"] = _trainable(layer.qkv.weight)
            if layer.qkv.bias is not None:
                self.params[p + "qkv_bias"] = _trainable(layer.qkv.bias)
            self.params[p + "o_proj"] = _trainable(layer.o.weight)
            self.params[p + "ffn_norm"] = _trainable(layer.ffn_norm)
            self.params[p + "gate_up"] = _trainable(layer.gate_up.weight)
            self.params[p + "down_proj"] = _trainable(layer.down.weight)
        self.params["norm"] = _trainable(m.norm)
        if c.tie_embeddings:
            m.head.weight = m.embed.table  # one tensor, so both uses train it
        else:
            self.params["lm_head"] = _trainable(m.head.weight)

    def _add_adapters(self, lora: LoraConfig, rng: np.random.Generator):
        c = self.config
        bits = {"float": 0, "int8": 8, "int4": 4}[lora.base_weights]
        d = c.head_dim
        for i, layer in enumerate(self.model.blocks):
            for name in ("qkv", "o", "gate_up", "down"):
                linear = getattr(layer, name)
                if bits and linear.bits == 0:
                    quantize_linear(linear, bits)
                parts = {"qkv": [("q_proj", c.num_heads * d), ("k_proj", c.num_kv_heads * d),
                                 ("v_proj", c.num_kv_heads * d)],
                         "o": [("o_proj", c.hidden_size)],
                         "gate_up": [("gate_proj", c.intermediate_size), ("up_proj", c.intermediate_size)],
                         "down": [("down_proj", c.hidden_size)]}[name]
                if not any(part in lora.targets for part, _ in parts):
                    continue
                split = (self.tp.rank, self.tp.size) if self.tp is not None and name in ("o", "down") else None
                adapted = LoraLinear(linear, parts, lora, i, self.dropout, rng, self.device, self.compute_dtype,
                                     split)
                setattr(layer, name, adapted)
                for part, (a, b) in adapted.adapters.items():
                    self.params[f"layers.{i}.{part}.lora_A"] = a
                    self.params[f"layers.{i}.{part}.lora_B"] = b

    def _add_prefix(self, config: PrefixConfig, rng: np.random.Generator):
        """The prefix encoder's parameters. Without projection its embedding holds the prefix's
        keys and values themselves, and they start as those the frozen model computes for P
        tokens of its vocabulary drawn from the seed (real activations, as Li & Liang
        initialise: the model starts as the base model reading a short text first, not as one
        disturbed by keys and values of the wrong scale). With projection the MLP starts with
        that prefix's mean as its output bias."""
        c, p = self.config, config.num_prefix_tokens
        if p >= c.max_position:
            raise ValueError(f"{p} prefix tokens leave no room in the model's context of {c.max_position}")
        tokens = rng.integers(0, c.vocab_size, size=(1, p))
        cache = self.model.new_cache(1, p)
        with paddle.no_grad():
            dev = place(self.device)
            self.model(paddle.to_tensor(tokens, place=dev), paddle.to_tensor(np.arange(p)[None], place=dev), cache)
        # [L, P, Hk, D] keys and values -> the encoder's rows [P, L*2*Hk*D]
        kv = np.stack([cache.k.astype("float32").numpy()[:, 0], cache.v.astype("float32").numpy()[:, 0]], axis=1)
        rows = kv.transpose(2, 0, 1, 3, 4).reshape(p, -1)
        shapes = encoder_shapes(c, config)
        if config.projection:
            h, m = c.hidden_size, config.projection_hidden
            values = {EMBEDDING: rng.standard_normal(shapes[EMBEDDING]).astype(np.float32),
                      MLP[0]: rng.uniform(-1, 1, shapes[MLP[0]]).astype(np.float32) / math.sqrt(h),
                      MLP[1]: np.zeros(shapes[MLP[1]], np.float32),
                      MLP[2]: rng.uniform(-1, 1, shapes[MLP[2]]).astype(np.float32) / math.sqrt(m),
                      MLP[3]: rows.mean(axis=0)}
        else:
            values = {EMBEDDING: rows}
        for name, value in values.items():
            self.params[name] = _trainable(to_device(value.astype(np.float32), self.device))

    def prefix_kv(self):
        """The prefix the encoder gives now, [L, 2, P, Hk, D] (in the autograd graph)."""
        past = self.params[EMBEDDING]
        if self.prefix.projection:
            hidden = paddle.tanh(matmul(past, self.params[MLP[0]], self.params[MLP[1]], self.compute_dtype))
            past = matmul(hidden, self.params[MLP[2]], self.params[MLP[3]], self.compute_dtype)
        return split_layers(past, self.config)

    @property
    def adapter(self) -> LoraConfig | PrefixConfig | None:
        """What is trained on the frozen base, None for full fine-tuning."""
        return self.lora or self.prefix

    # ---- the loss ----------------------------------------------------------------------------

    def batch_loss(self, batch: Batch, denominator: int):
        """Summed next-token cross-entropy of ``batch``'s target tokens divided by
        ``denominator`` (the target tokens of the whole optimizer step, so that accumulated
        micro-batches weigh every token alike). Returns (loss tensor, per-token losses [R])."""
        dev = place(self.device)
        labels = batch.labels.reshape(-1)
        rows = np.flatnonzero(labels != -100)
        mask = None if batch.startend_row_indices is None else paddle.to_tensor(batch.startend_row_indices, place=dev)
        logits = self.model(paddle.to_tensor(batch.input_ids, place=dev), paddle.to_tensor(batch.position_ids, place=dev),
                            startend_row_indices=mask, rows=paddle.to_tensor(rows, place=dev), recompute=self.recompute,
                            prefix=None if self.prefix is None else self.prefix_kv())
        losses = paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(labels[rows].reshape(-1, 1), place=dev),
                                                    reduction="none").reshape([-1])
        return losses.sum() / denominator, losses

    # ---- state -------------------------------------------------------------------------------

    def state(self) -> dict[str, np.ndarray]:
        return {name: t.numpy() for name, t in self.params.items()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        missing = sorted(set(self.params) - set(state))
        extra = sorted(set(state) - set(self.params))
        if missing or extra:
            raise ValueError(f"the saved model state does not match this model: missing {missing[:3]}, "
                             f"unexpected {extra[:3]}")
        for name, t in self.params.items():
            if tuple(state[name].shape) != tuple(t.shape):
                raise ValueError(f"saved {name} has shape {list(state[name].shape)}, the model {list(t.shape)}")
            assign(t, state[name])

    def load_canonical(self, tensors: dict[str, np.ndarray]) -> None:
        """Full fine-tuning: loads what :meth:`canonical_tensors` gives."""
        c = self.config
        state = {name: tensors[name] for name in ("embed_tokens", "norm", "lm_head") if name in self.params}
        for i in range(c.num_layers):
            p = f"layers.{i}."
            state[p + "qkv"] = np.concatenate([tensors[p + "q_proj"], tensors[p + "k_proj"], tensors[p + "v_proj"]])
            if p + "qkv_bias" in self.params:
                state[p + "qkv_bias"] = np.concatenate([tensors[p + "q_bias"], tensors[p + "k_bias"],
                                                        tensors[p + "v_bias"]])
            state[p + "gate_up"] = np.concatenate([tensors[p + "gate_proj"], tensors[p + "up_proj"]])
            for key in ("attn_norm", "o_proj", "ffn_norm", "down_proj"):
                state[p + key] = tensors[p + key]
        self.load_state(state)

    def canonical_tensors(self) -> dict[str, np.ndarray]:
        """Full fine-tuning: every tensor under the checkpoint's canonical names (fused qkv and
        gate_up split back), ready for export as a model folder."""
        c, d = self.config, self.config.head_dim
        state = self.state()
        out = {"embed_tokens": state["embed_tokens"], "norm": state["norm"]}
        if not c.tie_embeddings:
            out["lm_head"] = state["lm_head"]
        splits = np.cumsum([c.num_heads * d, c.num_kv_heads * d])
        for i in range(c.num_layers):
            p = f"layers.{i}."
            out[p + "q_proj"], out[p + "k_proj"], out[p + "v_proj"] = np.split(state[p + "qkv"], splits)
            if p + "qkv_bias" in state:
                out[p + "q_bias"], out[p + "k_bias"], out[p + "v_bias"] = np.split(state[p + "qkv_bias"], splits)
            out[p + "gate_proj"], out[p + "up_proj"] = np.split(state[p + "gate_up"], 2)
            for key in ("attn_norm", "o_proj", "ffn_norm", "down_proj"):
                out[p + key] = state[p + key]
        return out
