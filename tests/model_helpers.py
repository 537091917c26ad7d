"""Tiny random checkpoints for the model and generation tests, and their numpy oracle.

``tiny_checkpoint(weights)`` writes a random Llama checkpoint as llama.cpp would (GGUF, q/k rows
permuted) and loads it back with anychip_models, so the model sees exactly what a real file
gives: "float" (F32), "int8" (Q8_0), "int4" (Q4_1 linears, offsets; Q8_0 embedding, as
SmolLM2's file) or "int4-sym" (Q4_0 linears)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from anychip_models.checkpoint import Checkpoint, ModelConfig, QuantWeight
from anychip_models.loader import load_checkpoint
from llama_reference import forward
from loader_helpers import random_weights, write_gguf

FORMATS = {"float": (T.F32, T.F32), "int8": (T.Q8_0, T.Q8_0), "int4": (T.Q4_1, T.Q8_0), "int4-sym": (T.Q4_0, T.Q8_0)}

# 96 tokens: <|endoftext|> (eos), the byte-level spellings of " " and "!".."}", and " t" (GGUF
# wants at least one merge): any id decodes to ASCII text.
TOKENS = ["<|endoftext|>", "Ġ"] + [chr(c) for c in range(0x21, 0x7E)] + ["Ġt"]
TOKENIZER_META = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": TOKENS,
                  "tokenizer.ggml.merges": ["Ġ t"], "tokenizer.ggml.token_type": [3] + [1] * (len(TOKENS) - 1),
                  "tokenizer.ggml.eos_token_id": 0}

CONFIG = ModelConfig(arch="llama", vocab_size=len(TOKENS), hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_eps=1e-5, max_position=256,
                     tie_embeddings=True, qkv_bias=False, name="tiny")


@lru_cache(maxsize=None)
def tiny_checkpoint(weights: str = "float", tie: bool = True, qkv_bias: bool = False) -> Checkpoint:
    linear, embedding = FORMATS[weights]
    config = replace(CONFIG, tie_embeddings=tie, qkv_bias=qkv_bias)
    tensors = random_weights(config, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_gguf(Path(tmp) / f"tiny-{weights}.gguf", config, tensors, TOKENIZER_META, qtype=linear,
                          types={"embed_tokens": embedding})
        return load_checkpoint(path, weights="float" if weights == "float" else "native")


def oracle_logits(checkpoint: Checkpoint, ids: list[int]) -> np.ndarray:
    """Logits [T, V] of ``ids`` from llama_reference, in float64 on the checkpoint's own
    (dequantized) weights."""
    c = checkpoint.config

    def f64(name: str) -> np.ndarray:
        value = checkpoint.tensors[name]
        return (value.dequantize() if isinstance(value, QuantWeight) else value).astype(np.float64)

    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
             "down": "down_proj", "attn_norm": "attn_norm", "ffn_norm": "ffn_norm"}
    if c.qkv_bias:
        names.update(q_bias="q_bias", k_bias="k_bias", v_bias="v_bias")
    t = {"embed": f64("embed_tokens"), "norm": f64("norm"),
         "head": f64("embed_tokens" if c.tie_embeddings else "lm_head")}
    for i in range(c.num_layers):
        t.update({f"l{i}.{short}": f64(f"layers.{i}.{name}") for short, name in names.items()})
    cfg = {"layers": c.num_layers, "heads": c.num_heads, "kv_heads": c.num_kv_heads, "eps": c.rms_eps,
           "theta": c.rope_theta}
    return forward(t, cfg, [int(i) for i in ids])
