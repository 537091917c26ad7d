"""Held-out Paddle programs, written the way a user writes them (plain Paddle, no anychip):
a small MLP classifier and GPT-2- and Bloom-style decoders, each trained a few steps with AdamW.

``tests/test_paddle_programs.py`` runs them on every simulated chip under ANYCHIP_STRICT=1 and
compares the losses with the CPU's; the numpy forwards here check the decoders' own math.
"""

from __future__ import annotations

import math

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F


# ---- (a) an MLP classifier ----------------------------------------------------------------------

class MLP(nn.Layer):
    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)  # default init: Paddle's random initializers
        self.norm = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(self.drop(self.norm(F.gelu(self.fc1(x)))))


def mlp_losses(steps: int = 3, seed: int = 0) -> list[float]:
    paddle.seed(seed)
    model = MLP(16, 32, 5)
    opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), weight_decay=0.01)
    x = paddle.randn([8, 16])
    labels = paddle.randint(0, 5, [8, 1])
    losses = []
    for _ in range(steps):
        logits = model(x)
        ce = F.cross_entropy(logits, labels).squeeze(-1).mean()
        # a margin on the sorted probabilities: top-2, argsort and cumsum feed the loss
        probs = F.softmax(logits, axis=-1)
        top2 = paddle.topk(probs, k=2, axis=-1)[0]
        order = paddle.argsort(probs, axis=-1, descending=True)
        ranked = paddle.take_along_axis(probs, order, axis=-1)
        tail = paddle.cumsum(ranked, axis=-1)[:, 2:].unsqueeze(1)
        loss = ce + 0.1 * (1.0 - top2.sum(-1)).mean() + 0.01 * tail.mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
    return losses


# ---- (b) GPT-2 and (c) Bloom decoders -------------------------------------------------------------

CONFIG = dict(vocab=37, hidden=16, heads=2, layers=2, ffn=32, positions=12)


class Block(nn.Layer):
    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def attention(self, h, bias):
        b, s, d = h.shape
        q, k, v = paddle.split(self.qkv(h), 3, axis=-1)
        heads = lambda t: t.reshape([b, s, self.heads, d // self.heads]).transpose([0, 2, 1, 3])
        q, k, v = heads(q), heads(k), heads(v)
        scores = paddle.matmul(q, k, transpose_y=True) / math.sqrt(d // self.heads) + bias
        out = paddle.matmul(F.softmax(scores, axis=-1), v)
        return self.proj(out.transpose([0, 2, 1, 3]).reshape([b, s, d]))

    def forward(self, h, bias):
        h = h + self.attention(self.ln1(h), bias)
        return h + self.down(F.gelu(self.up(self.ln2(h)), approximate=True))


def causal_mask(s: int):
    upper = paddle.triu(paddle.ones([s, s]), diagonal=1)
    return paddle.where(upper > 0, paddle.full([s, s], -1e9), paddle.zeros([s, s]))


def alibi_slopes(heads: int) -> np.ndarray:
    """Bloom's ALiBi slopes for a power-of-two head count: 2^(-8 i / heads), i = 1..heads."""
    return np.array([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)], np.float32)


class GPT2(nn.Layer):
    def __init__(self, vocab, hidden, heads, layers, ffn, positions):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(positions, hidden)
        self.blocks = nn.LayerList([Block(hidden, heads, ffn) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, ids):
        s = ids.shape[1]
        h = self.wte(ids) + self.wpe(paddle.arange(s, dtype="int64").unsqueeze(0))
        bias = causal_mask(s)
        for block in self.blocks:
            h = block(h, bias)
        return paddle.matmul(self.ln_f(h), self.wte.weight, transpose_y=True)


class Bloom(nn.Layer):
    def __init__(self, vocab, hidden, heads, layers, ffn, positions):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, hidden)
        self.embed_norm = nn.LayerNorm(hidden)  # Bloom normalizes right after the embedding
        self.blocks = nn.LayerList([Block(hidden, heads, ffn) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, ids):
        s = ids.shape[1]
        h = self.embed_norm(self.embed(ids))
        slopes = paddle.to_tensor(alibi_slopes(self.heads)).reshape([self.heads, 1, 1])
        distance = paddle.arange(s, dtype="float32").unsqueeze(0) - paddle.arange(s, dtype="float32").unsqueeze(1)
        bias = (slopes * distance.unsqueeze(0)).unsqueeze(0) + causal_mask(s)  # [1, heads, s, s]
        for block in self.blocks:
            h = block(h, bias)
        return paddle.matmul(self.ln_f(h), self.embed.weight, transpose_y=True)


def lm_losses(model_class, steps: int = 3, seed: int = 0) -> list[float]:
    paddle.seed(seed)
    model = model_class(**CONFIG)
    opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters())
    ids = paddle.randint(0, CONFIG["vocab"], [2, 9])
    losses = []
    for _ in range(steps):
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape([-1, CONFIG["vocab"]]), ids[:, 1:].reshape([-1, 1]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
    return losses


def all_losses() -> dict[str, list[float]]:
    return {"mlp": mlp_losses(), "gpt2": lm_losses(GPT2), "bloom": lm_losses(Bloom)}


# ---- independent numpy forwards of (b) and (c) ----------------------------------------------------

def _np_layer_norm(h, w, b, eps=1e-5):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) / np.sqrt(var + eps) * w + b


def _np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _np_block(p, prefix, h, bias, heads):
    def linear(name, x):
        return x @ p[f"{prefix}.{name}.weight"] + p[f"{prefix}.{name}.bias"]

    b, s, d = h.shape
    x = _np_layer_norm(h, p[f"{prefix}.ln1.weight"], p[f"{prefix}.ln1.bias"])
    q, k, v = np.split(linear("qkv", x), 3, axis=-1)
    split = lambda t: t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads) + bias
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    att = (scores / scores.sum(-1, keepdims=True)) @ v
    h = h + linear("proj", att.transpose(0, 2, 1, 3).reshape(b, s, d))
    x = _np_layer_norm(h, p[f"{prefix}.ln2.weight"], p[f"{prefix}.ln2.bias"])
    return h + linear("down", _np_gelu_tanh(linear("up", x)))


def _np_causal(s):
    return np.where(np.triu(np.ones((s, s)), 1) > 0, -1e9, 0.0)


def numpy_forward(kind: str, params: dict, ids: np.ndarray) -> np.ndarray:
    """The logits of GPT2 (kind "gpt2") or Bloom ("bloom") from their state_dict as float64 numpy."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    s = ids.shape[1]
    if kind == "gpt2":
        table = p["wte.weight"]
        h = table[ids] + p["wpe.weight"][np.arange(s)][None]
        bias = _np_causal(s)
    else:
        table = p["embed.weight"]
        h = _np_layer_norm(table[ids], p["embed_norm.weight"], p["embed_norm.bias"])
        slopes = alibi_slopes(CONFIG["heads"]).astype(np.float64)[:, None, None]
        distance = np.arange(s)[None, :] - np.arange(s)[:, None]
        bias = (slopes * distance[None])[None] + _np_causal(s)
    for i in range(CONFIG["layers"]):
        h = _np_block(p, f"blocks.{i}", h, bias, CONFIG["heads"])
    return _np_layer_norm(h, p["ln_f.weight"], p["ln_f.bias"]) @ table.T


def forward_errors(seed: int = 1) -> dict[str, float]:
    """The largest |logit| difference between each decoder's Paddle forward and numpy_forward
    on the same weights (random init from ``seed``, random ids)."""
    errors = {}
    for kind, model_class in (("gpt2", GPT2), ("bloom", Bloom)):
        paddle.seed(seed)
        model = model_class(**CONFIG)
        model.eval()
        ids = np.random.default_rng(seed).integers(0, CONFIG["vocab"], (2, 7))
        got = model(paddle.to_tensor(ids)).numpy().astype(np.float64)
        params = {k: v.numpy() for k, v in model.state_dict().items()}
        errors[kind] = float(np.abs(got - numpy_forward(kind, params, ids)).max())
    return errors
