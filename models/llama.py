"""The Llama-family decoder (Llama 2/3, Qwen2, SmolLM2): RMSNorm, RoPE, grouped-query attention,
SwiGLU MLP, tied or untied embeddings. Every hot path is an anychip op, so the same code runs on
every device; the decode step is one fused ``decoder_step`` launch where the device registers
that kernel, and the op-by-op forward otherwise (a counted fallback)."""

from __future__ import annotations

import numpy as np

import anychip.ops as ops
from anychip import fallback
from anychip.ops.dispatch import place
from anychip.ops.quant import x_int8_fits
from anychip.frontends.paddle import import_paddle
from anychip.plugins import registry

from .checkpoint import Checkpoint
from .kv_cache import KVCache, PagedKVCache, check_kv_dtype
from .layers import DecoderLayer, Embedding, Linear, concat_rows, to_device
from .tensor_parallel import TensorParallel, shard_checkpoint, vocab_chunk

paddle = import_paddle()


def _recompute(fn, *args):
    from paddle.distributed.fleet.utils import recompute  # a slow import, only for training

    return recompute(fn, *args, use_reentrant=True)


def _prefixed(prefix_kv, k, v):
    """``k``, ``v`` [B, T, Hk, D] behind a layer's prefix ``prefix_kv`` [2, P, Hk, D] (when
    given): [B, P + T, Hk, D] each."""
    if prefix_kv is None:
        return k, v
    shape = [k.shape[0]] + list(prefix_kv.shape[1:])
    return (paddle.concat([prefix_kv[0].unsqueeze(0).expand(shape), k], axis=1),
            paddle.concat([prefix_kv[1].unsqueeze(0).expand(shape), v], axis=1))


def _shifted(positions, by: int):
    """``positions + by`` as a tensor add (an int64 ``scale``, what ``+ by`` would launch, is
    no base op)."""
    return positions + paddle.full_like(positions, by)


# The smallest decode step that batch_int8 takes in int8. SmolLM2 (Q4_1) on 2 Zen 4 cores, ms
# per step exact / int8: 2 sequences 7.2 / 9.5, 4: 13.0 / 11.7, 8: 24.4 / 15.6, 16: 48.2 / 22.4;
# capped to AVX2 (another day, slower): 4: 23.6 / 18.5.
BATCH_INT8_MIN = 4


class LlamaForCausalLM(paddle.nn.Layer):
    """A Llama-family causal LM on ``device``, built from a :class:`Checkpoint` (float, anychip
    weight-only or A8W8 tensors, as the checkpoint holds them). ``x_int8``: the fused decode
    step feeds its quantized linears int8 activations (per run of 32, or up to 128 beside 4-bit
    weights, as llama.cpp's quantized dot products do): faster, with logits ~5e-3 off the exact
    product; prefill stays exact.

    A8W8 linears (:class:`~anychip_models.checkpoint.W8A8Weight`) run through ``w8a8_linear`` in
    prefill and op-by-op decode: int8 weights, x quantized to int8 per token. The fused decode
    step has no per-token mode; it takes them as the weight-only int8 per-channel weights they
    are stored as (bit for bit, group = K) with ``x_int8`` forced on, so their activations are
    int8 too, on the same grid (absmax / 127, round half away, int32-exact dot products) but
    with one scale per run of 32 instead of per token. Each run's scale is at most the token's,
    so every activation's rounding error is bounded by what w8a8_linear allows (each product is
    closer to the exact one, in RMS); decode's logits are not bit-identical to prefill's but
    within A8W8's error of them (tests/test_quantization_format.py measures both). That is the
    same computation in kind (int8 x int8, no requantized weights), only with finer activation
    scales, so it is used rather than a slower op-by-op decode. ``x_int8`` then also applies to
    the model's other quantized linears (a weight-only head). Where an x_int8 product is
    impossible (a quantized linear with K or group_size not a multiple of 32), an A8W8 model
    decodes op by op instead, as does any model whose layers differ in the format of one kind of
    linear (some left float), since the fused step takes one format per kind. ``a8w8`` says
    whether the model has A8W8 linears.

    ``batch_int8``: the fused decode step takes ``x_int8`` for steps of ``BATCH_INT8_MIN`` or
    more sequences only; fewer decode exactly. Many rows of x are where int8 pays: the weights
    are unpacked once for all of them and summed with int8 dot products (serving's default),
    while a few rows are bound by reading the weights either way. Where the quantized linears
    cannot take int8 x, every step is exact.

    ``bf16``: the linears multiply in bfloat16, float32 sums (AMX tiles where the CPU has them):
    prefill rounds each linear's input to bfloat16 (``compute_dtype``), and the fused decode step
    reads bfloat16 copies of the weights, made here (dequantized, then rounded to nearest; 2
    bytes per weight). This is for serving many requests at once: on AMX a
    decode step of 16 sequences costs about twice a step of one (float32 FMAs: about six
    times), and prefill runs about twice as fast. Logits move by about bfloat16's rounding.

    ``kv_dtype``: the dtype of the KV caches :meth:`new_cache` makes, float32 or a 16-bit one
    (see :class:`KVCache`).

    A checkpoint with a prefix (Prefix Tuning, :mod:`anychip_models.prefix`) gives every sequence
    its P keys and values first: callers number a sequence's tokens from 0 as always, and the
    model places them at RoPE positions and cache slots ``P + position`` behind the prefix, which
    :meth:`new_cache` writes into slots ``0 .. P-1`` of every row (so a decode step reads it like
    any earlier token). ``context`` is what remains of the model's context for the tokens.

    ``tp``: this rank's share of a tensor-parallel model (:mod:`anychip_models.tensor_parallel`):
    ``config`` is then the rank's (its heads and MLP features), and every rank returns all the
    logits. Its fused decode step goes by parts (:meth:`decode`): two launches per layer, the
    ranks summing each half layer's output between them."""

    def __init__(self, checkpoint: Checkpoint, device: tuple[str, int] | str = ("cpu", 0), x_int8: bool = False,
                 bf16: bool = False, kv_dtype: str = "float32", tp: TensorParallel | None = None,
                 batch_int8: bool = False):
        super().__init__()
        self.tp = tp if tp is not None and tp.size > 1 else None
        if self.tp is not None:
            checkpoint = shard_checkpoint(checkpoint, self.tp.rank, self.tp.size)
        if bf16 and (x_int8 or batch_int8):
            raise ValueError("bf16 and x_int8 exclude each other: bfloat16 linears take bfloat16 input")
        self.x_int8, self.bf16, self.batch_int8 = x_int8, bf16, batch_int8
        if isinstance(device, str):
            name, _, index = device.partition(":")
            device = (name, int(index or 0))
        check_kv_dtype(kv_dtype, device)
        self.kv_dtype = kv_dtype
        self.config = c = checkpoint.config
        self.device = device
        t = checkpoint.tensors
        self.embed = Embedding(t["embed_tokens"], device)
        self.blocks = []
        for i in range(c.num_layers):
            p = f"layers.{i}."
            bias = None
            if c.qkv_bias:
                bias = np.concatenate([t[p + "q_bias"], t[p + "k_bias"], t[p + "v_bias"]]).astype(np.float32)
            self.blocks.append(DecoderLayer(
                attn_norm=to_device(t[p + "attn_norm"].astype(np.float32), device),
                qkv=Linear(concat_rows([t[p + "q_proj"], t[p + "k_proj"], t[p + "v_proj"]]), device, bias),
                o=Linear(t[p + "o_proj"], device),
                ffn_norm=to_device(t[p + "ffn_norm"].astype(np.float32), device),
                gate_up=Linear(concat_rows([t[p + "gate_proj"], t[p + "up_proj"]]), device),
                down=Linear(t[p + "down_proj"], device)))
        self.norm = to_device(t["norm"].astype(np.float32), device)
        # [L, 2, P, Hk, D]: layer i's prefix keys at [i, 0], values at [i, 1]
        self.prefix = None if checkpoint.prefix is None else to_device(checkpoint.prefix.astype(np.float32), device)
        self.prefix_len = 0 if checkpoint.prefix is None else int(checkpoint.prefix.shape[2])
        self.head = Linear(t["embed_tokens"] if c.tie_embeddings else t["lm_head"], device)
        self._fused = {}  # x_int8 -> ops.DecoderWeights
        linears = [lin for l in self.blocks for lin in (l.qkv, l.o, l.gate_up, l.down)] + [self.head]
        if bf16:
            for lin in linears:
                lin.compute_dtype = "bfloat16"
        self.a8w8 = any(lin.a8w8 for lin in linears)
        quantized = [lin for lin in linears if lin.bits]  # whether batch_int8 can take them int8
        self._int8_fits = bool(quantized) and all(x_int8_fits(lin.in_features, lin.group_size) for lin in quantized)
        # The fused step takes one format per kind of linear across layers (a model with some
        # layers left float, as A8W8 recipes do, decodes op by op), and for an A8W8 model x_int8
        # on every quantized linear (see the class doc).
        def fmt(lin):
            return lin.bits, lin.group_size if lin.bits else -1, lin.offsets is not None

        uniform = all(len({fmt(getattr(l, kind)) for l in self.blocks}) == 1
                      for kind in ("qkv", "o", "gate_up", "down"))
        self._fused_ok = uniform and (not self.a8w8 or all(
            lin.bits == 0 or (lin.in_features % 32 == 0 and (lin.group_size == -1 or lin.group_size % 32 == 0))
            for lin in linears))
        if bf16 and self._fused_ok and self.has_fused_decode():
            self._fused_weights()  # the bfloat16 copies now, not in the first request's time

    @property
    def context(self) -> int:
        """Tokens a sequence may hold: the model's context less the prefix."""
        return self.config.max_position - self.prefix_len

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """A KV cache on the model's device in its ``kv_dtype``, for ``batch`` sequences of up to
        ``max_len`` tokens (each row ``P + max_len`` slots, the prefix written in the first P)."""
        p = self.prefix_len
        if p and max_len > self.context:
            raise ValueError(f"max_len {max_len} plus the {p} prefix tokens exceeds the model's context of "
                             f"{self.config.max_position} tokens")
        cache = KVCache(self.config, batch, max_len + p, self.device, self.kv_dtype)
        if p:
            c = self.config
            with paddle.no_grad():
                for i in range(c.num_layers):
                    shape = [batch, p, c.num_kv_heads, c.head_dim]
                    cache.write(i, slice(None), 0, self.prefix[i, 0].unsqueeze(0).expand(shape),
                                self.prefix[i, 1].unsqueeze(0).expand(shape))
        return cache

    def new_paged_cache(self, rows: int, max_len: int, block_size: int, blocks: int) -> PagedKVCache:
        """A paged KV cache on the model's device in its ``kv_dtype`` (see :class:`PagedKVCache`):
        ``rows`` sequences of up to ``max_len`` tokens in a pool of ``blocks`` blocks to start."""
        if self.prefix_len:
            raise ValueError("a model with a prefix (Prefix Tuning) keeps it in every row of a KVCache; it has no "
                             "paged cache")
        return PagedKVCache(self.config, rows, max_len, self.device, self.kv_dtype, block_size, blocks)

    def copy_block(self, cache: PagedKVCache, src: int, dst: int) -> None:
        """Block ``dst`` of the paged ``cache`` becomes a copy of block ``src`` (the part of a
        cached prompt block that a new prompt shares, copied for it to write on)."""
        with paddle.no_grad():
            cache.copy_block(src, dst)

    # ---- op by op: prefill, and decode where the device has no decoder_step kernel ----------

    def forward(self, tokens, positions, cache: KVCache | None = None, start: int = 0, last_index=None,
                startend_row_indices=None, rows=None, recompute: bool = False, cache_rows: list[int] | None = None,
                prefix=None):
        """Logits for ``tokens`` [B, T] at ``positions`` [B, T] (int64). With ``cache``, the
        tokens' keys and values are written at slots ``start .. start + T`` of cache row
        ``cache_rows[b]`` (default: row b of a cache of B rows) and attention reads slots
        ``0 .. start + T`` (causal). ``last_index`` [B] (int64): return only the logits of
        those positions, [B, V], as generation needs, instead of [B, T, V].

        Training: ``startend_row_indices`` [B, 1, T, 1] (int32) is the FlashMask of packed
        sequences (causal within each document, nothing across); ``rows`` [R] (int64) returns
        only the logits of those flattened positions (b * T + t), [R, V], the ones with a loss;
        ``recompute`` frees each layer's activations after its forward and recomputes them in
        the backward (activation checkpointing); ``prefix`` [L, 2, P, Hk, D] replaces the
        model's own prefix (Prefix Tuning trains it)."""
        c = self.config
        b, t = tokens.shape
        prefix = self.prefix if prefix is None else prefix
        p = 0 if prefix is None else prefix.shape[2]
        if p:  # the tokens stand behind the prefix
            positions = _shifted(positions, p)
            if startend_row_indices is not None:  # the prefix's key columns: masked for no query row
                se = startend_row_indices
                startend_row_indices = paddle.concat(
                    [paddle.full([b, se.shape[1], p, se.shape[3]], t, dtype="int32", device=se.place), se], axis=2)
        h = self._embed(tokens)
        residual = None
        for i, layer in enumerate(self.blocks):
            def block(h, residual, kv, i=i, layer=layer):
                return self._block(i, layer, h, residual, positions, cache, start, startend_row_indices, cache_rows,
                                   kv)

            kv = None if prefix is None else prefix[i]
            # The first layer hands its input h through unchanged, which Paddle's recompute
            # cannot return; it keeps its activations (1/L of them). The prefix goes in as an
            # argument, so that its gradient comes back out of the recomputed layer.
            if recompute and residual is not None:
                h, residual = _recompute(block, h, residual, kv)
            else:
                h, residual = block(h, residual, kv)
        h = h + residual
        if last_index is not None:
            h = paddle.take_along_axis(h, last_index.reshape([b, 1, 1]).expand([b, 1, c.hidden_size]), axis=1)
            h = h.reshape([b, c.hidden_size])
        elif rows is not None:
            h = paddle.gather(h.reshape([b * t, c.hidden_size]), rows)
        return self._head(ops.rms_norm(h, self.norm, c.rms_eps))

    def _embed(self, tokens):
        """Embeddings of ``tokens``; with tensor parallelism each rank looks up the tokens of its
        vocabulary chunk (zeros for the others) and the ranks' lookups are summed."""
        if self.tp is None:
            return self.embed(tokens)
        rows = vocab_chunk(self.config.vocab_size, self.tp.size)
        local = tokens - paddle.full_like(tokens, self.tp.rank * rows)  # a tensor add: no int64 scale op
        inside = paddle.logical_and(local >= paddle.zeros_like(local), local < paddle.full_like(local, rows))
        h = self.embed(paddle.where(inside, local, paddle.zeros_like(local)))
        return self.tp.reduce(h * inside.unsqueeze(-1).astype(h.dtype))

    def _head(self, h):
        """Logits of the final hidden states ``h``; with tensor parallelism each rank computes
        its vocabulary chunk's and every rank gets them all."""
        if self.tp is None:
            return self.head(h)
        return self.tp.gather(self.head(self.tp.copy(h)), self.config.vocab_size)

    def _column(self, x):
        return x if self.tp is None else self.tp.copy(x)

    def _row(self, x):
        return x if self.tp is None else self.tp.reduce(x)

    def _block(self, i: int, layer: DecoderLayer, h, residual, positions, cache, start, startend_row_indices,
               cache_rows=None, prefix_kv=None):
        """One decoder layer: returns the new (h, residual), the residual add of its MLP output
        left to the next layer's fused norm. ``prefix_kv`` [2, P, Hk, D]: this layer's prefix."""
        c = self.config
        b, t = h.shape[0], h.shape[1]
        if residual is None:
            a = ops.rms_norm(h, layer.attn_norm, c.rms_eps)
        else:
            a, h = ops.rms_norm(h, layer.attn_norm, c.rms_eps, residual=residual)
        q, k, v = self._qkv(layer, self._column(a), positions, b, t)
        if startend_row_indices is not None:
            attn = ops.flashmask_attention(q, *_prefixed(prefix_kv, k, v), startend_row_indices, causal=True)
        else:
            attn = self._attend(i, q, k, v, cache, start, cache_rows, prefix_kv)
        residual = self._row(layer.o(attn.reshape([b, t, c.num_heads * c.head_dim])))
        m, h = ops.rms_norm(h, layer.ffn_norm, c.rms_eps, residual=residual)
        gate, up = paddle.split(layer.gate_up(self._column(m)), 2, axis=-1)
        return h, self._row(layer.down(ops.swiglu(gate, up)))

    def _qkv(self, layer: DecoderLayer, a, positions, b: int, t: int):
        c = self.config
        hq, hk, d = c.num_heads, c.num_kv_heads, c.head_dim
        q, k, v = paddle.split(layer.qkv(a), [hq * d, hk * d, hk * d], axis=-1)
        q, k = ops.rotary_embedding(q.reshape([b, t, hq, d]), k.reshape([b, t, hk, d]), positions, c.rope_theta)
        return q, k, v.reshape([b, t, hk, d])

    def _attend(self, layer: int, q, k, v, cache: KVCache | None, start: int, cache_rows: list[int] | None,
                prefix_kv=None):
        if cache is None:
            return ops.attention(q, *_prefixed(prefix_kv, k, v), causal=True)
        b, t = q.shape[0], q.shape[1]
        p = 0 if prefix_kv is None else prefix_kv.shape[1]
        start += p
        if cache_rows is None:
            cache_rows = list(range(b))
            cache.write(layer, slice(None), start, k, v)
        else:
            for i, row in enumerate(cache_rows):
                cache.write(layer, row, start, k[i], v[i])
        if start == p:  # a fresh prefill: its own keys (behind the prefix) are all there is
            return ops.attention(q, *_prefixed(prefix_kv, k, v), causal=True)
        # One sequence at a time: its cache rows are a dense view, which every device can read
        return paddle.concat([ops.attention(q[i:i + 1], *cache.view(layer, row, start + t), causal=True)
                              for i, row in enumerate(cache_rows)], axis=0)

    # ---- decode ----------------------------------------------------------------------------

    def has_fused_decode(self, kv_dtype: str | None = None) -> bool:
        """Whether the device has a decoder_step kernel for a KV cache of ``kv_dtype`` (default:
        the model's)."""
        return registry().kernels.find("decoder_step", self.device[0], kv_dtype or self.kv_dtype) is not None

    def decode(self, tokens, positions, cache: KVCache, fused: bool = True, cache_rows: list[int] | None = None):
        """Next-token logits [B, V] for one token per sequence, ``tokens`` [B] at ``positions``
        [B] (each sequence's own length so far), through the cache: sequence b in row
        ``cache_rows[b]`` (default b, with B the cache's rows). An A8W8 model's fused step
        quantizes activations per run of 32 rather than per token (see the class doc)."""
        has_kernel = fused and self.has_fused_decode(cache.dtype)
        if self.prefix_len:  # behind the prefix
            positions = _shifted(positions, self.prefix_len)
        if has_kernel and self._fused_ok:
            index = cache.index(cache_rows, tokens.shape[0])
            if self.tp is None:
                weights = self._fused_weights(self.int8_step(tokens.shape[0]))
                return ops.decoder_step(self.embed(tokens), positions, weights, cache.k, cache.v, **index)
            return self._decode_split(self._embed(tokens), positions, cache, index)
        if fused and not has_kernel:  # (weights the fused step cannot take are no device fallback)
            fallback.record_op_fallback(self.device[0], "decoder_step", cache.dtype,
                                        f"no {cache.dtype} decoder_step kernel on {self.device[0]}: decoding op by op")
        rows = []
        pos = positions.numpy()
        for i in range(tokens.shape[0]):  # sequences differ in length: one cache view each
            rows.append(self._decode_one(tokens[i:i + 1], int(pos[i]), cache, i if cache_rows is None else cache_rows[i]))
        return paddle.concat(rows, axis=0)

    def _decode_split(self, h, positions, cache: KVCache | PagedKVCache, index: dict):
        """A tensor-parallel rank's fused decode step: each half layer (attention by this rank's
        heads, the MLP by its inner features) is one launch whose output is the rank's partial
        sum; the ranks' sum joins the residual stream ``h`` before the next launch, and the
        head's vocabulary chunks are gathered at the end."""
        weights = self._fused_weights(self.int8_step(h.shape[0]))
        for i in range(weights.num_layers):
            for half in ("attention", "mlp"):
                h = h + self.tp.reduce(ops.decoder_step(h, positions, weights, cache.k, cache.v, part=half, layer=i,
                                                        **index))
        logits = ops.decoder_step(h, positions, weights, cache.k, cache.v, part="head", **index)
        return self.tp.gather(logits, self.config.vocab_size)

    def _decode_one(self, token, pos: int, cache: KVCache, row: int):
        c = self.config
        h = self._embed(token.reshape([1, 1]))
        positions = paddle.to_tensor([[pos]], dtype="int64", place=place(self.device))
        for i, layer in enumerate(self.blocks):
            a = ops.rms_norm(h, layer.attn_norm, c.rms_eps)
            q, k, v = self._qkv(layer, a, positions, 1, 1)
            cache.write(i, row, pos, k[0], v[0])
            attn = ops.attention(q, *cache.view(i, row, pos + 1), causal=True)
            h = h + self._row(layer.o(attn.reshape([1, 1, c.num_heads * c.head_dim])))
            m = ops.rms_norm(h, layer.ffn_norm, c.rms_eps)
            gate, up = paddle.split(layer.gate_up(m), 2, axis=-1)
            h = h + self._row(layer.down(ops.swiglu(gate, up)))
        return self._head(ops.rms_norm(h.reshape([1, c.hidden_size]), self.norm, c.rms_eps))

    def batches_int8(self) -> bool:
        """Whether large decode steps take int8 activations while a lone sequence's is exact."""
        return self.int8_step(BATCH_INT8_MIN) and not self.int8_step(1)

    def batch_panel_bytes(self) -> int:
        """Bytes of the panel form of the quantized weights that batched int8 steps read (built
        now if not yet, rather than at the first such step); 0 without batched int8 steps."""
        return self._fused_weights(True).panel_bytes if self.batches_int8() else 0

    def int8_step(self, batch: int) -> bool:
        """Whether a fused decode step of ``batch`` sequences takes int8 activations."""
        if self.x_int8 or self.a8w8:
            return True
        return self.batch_int8 and batch >= BATCH_INT8_MIN and self._int8_fits

    def _fused_weights(self, x_int8: bool | None = None) -> ops.DecoderWeights:
        """The fused step's weights, described once per activation mode (``x_int8`` None: the
        model's own, as one sequence's step takes it). The two share every tensor; with
        ``batch_int8`` the batched steps' weights add the panel form of the quantized ones (a
        second copy of their bytes, which their products read as they are: 17% of a 16-sequence
        SmolLM2 step on 2 Zen 4 cores went to gathering W's rows into that order)."""
        x_int8 = self.int8_step(1) if x_int8 is None else x_int8
        if x_int8 not in self._fused:
            c = self.config
            def lin(layer):
                fused = layer.fused()
                return fused.bfloat16() if self.bf16 else fused

            layers = [ops.DecoderLayer(l.attn_norm, lin(l.qkv), l.qkv.bias, lin(l.o), l.ffn_norm,
                                       lin(l.gate_up), lin(l.down)) for l in self.blocks]
            self._fused[x_int8] = ops.DecoderWeights(layers=layers, final_norm=self.norm, head=lin(self.head),
                                                     num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
                                                     eps=c.rms_eps, theta=c.rope_theta, x_int8=x_int8,
                                                     panels=x_int8 and not self.int8_step(1))
        return self._fused[x_int8]
