"""An independent Llama forward pass in plain numpy (float64), the oracle for the model tests.

It takes tensors in the Hugging Face layout (linear weights [out, in], q/k rows in the
half-rotation RoPE order) by their HF-style names, and shares no code with anychip."""

from __future__ import annotations

import numpy as np


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, positions, theta):
    """x [T, H, D] rotated by position, halves (i, i + D/2) as a pair."""
    d = x.shape[-1]
    freqs = positions[:, None].astype(np.float64) * theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    cos, sin = np.cos(freqs)[:, None, :], np.sin(freqs)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def forward(t: dict, cfg: dict, ids: list[int]) -> np.ndarray:
    """Logits [T, V] of one sequence. ``t`` maps names such as "embed", "l0.q", "l0.attn_norm",
    "norm", "head" to float64 arrays; cfg has layers, heads, kv_heads, eps, theta."""
    hq, hk, eps, theta = cfg["heads"], cfg["kv_heads"], cfg["eps"], cfg["theta"]
    x = t["embed"][np.asarray(ids)]
    n = len(ids)
    pos = np.arange(n)
    for i in range(cfg["layers"]):
        p = f"l{i}."
        a = rms_norm(x, t[p + "attn_norm"], eps)
        q = a @ t[p + "q"].T + t.get(p + "q_bias", 0)
        k = a @ t[p + "k"].T + t.get(p + "k_bias", 0)
        v = a @ t[p + "v"].T + t.get(p + "v_bias", 0)
        d = q.shape[-1] // hq
        q = rope(q.reshape(n, hq, d), pos, theta)
        k = rope(k.reshape(n, hk, d), pos, theta)
        v = v.reshape(n, hk, d)
        group = hq // hk
        out = np.empty((n, hq, d))
        mask = np.tril(np.ones((n, n), dtype=bool))
        for h in range(hq):
            s = q[:, h] @ k[:, h // group].T / np.sqrt(d)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, h] = (s / s.sum(-1, keepdims=True)) @ v[:, h // group]
        x = x + out.reshape(n, hq * d) @ t[p + "o"].T
        m = rms_norm(x, t[p + "ffn_norm"], eps)
        g, u = m @ t[p + "gate"].T, m @ t[p + "up"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ t[p + "down"].T
    return rms_norm(x, t["norm"], eps) @ t["head"].T
