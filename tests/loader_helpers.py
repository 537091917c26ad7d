"""Tiny random Llama-family checkpoint files for the loader tests: a Hugging Face folder
(config.json, safetensors, tokenizer files) and the GGUF file llama.cpp's converter would make
of it (q/k rows permuted for its interleaved RoPE, tensors in any of the GGUF types)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import tokenizers
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import save_file
from tokenizers import decoders, models, pre_tokenizers, trainers

from anychip_models.checkpoint import ModelConfig, tensor_shapes

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["The capital of France is Paris.", "Hello world! 1234567890", "the quick brown fox jumps over",
          "what is the weather like today?", "Café déjà vu, naïve façade"] * 20

GGUF_GLOBAL = {"embed_tokens": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}
GGUF_LAYER = {"attn_norm": "attn_norm.weight", "q_proj": "attn_q.weight", "k_proj": "attn_k.weight",
              "v_proj": "attn_v.weight", "q_bias": "attn_q.bias", "k_bias": "attn_k.bias", "v_bias": "attn_v.bias",
              "o_proj": "attn_output.weight", "ffn_norm": "ffn_norm.weight", "gate_proj": "ffn_gate.weight",
              "up_proj": "ffn_up.weight", "down_proj": "ffn_down.weight"}
HF_LAYER = {"attn_norm": "input_layernorm.weight", "q_proj": "self_attn.q_proj.weight",
            "k_proj": "self_attn.k_proj.weight", "v_proj": "self_attn.v_proj.weight",
            "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
            "o_proj": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
            "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight", "down_proj": "mlp.down_proj.weight"}


def gguf_tensor_name(canonical: str) -> str:
    if canonical.startswith("layers."):
        _, i, key = canonical.split(".", 2)
        return f"blk.{i}.{GGUF_LAYER[key]}"
    return GGUF_GLOBAL[canonical]


def hf_tensor_name(canonical: str) -> str:
    if canonical.startswith("layers."):
        _, i, key = canonical.split(".", 2)
        return f"model.layers.{i}.{HF_LAYER[key]}"
    return {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight",
            "lm_head": "lm_head.weight"}[canonical]


def train_tokenizer(digits: bool = True) -> tokenizers.Tokenizer:
    """A small byte-level BPE as SmolLM2's is built: digits split one by one, then GPT-2's split."""
    tok = tokenizers.Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]) \
        if digits else byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def tiny_config(tok: tokenizers.Tokenizer, arch: str = "llama", **changes) -> ModelConfig:
    config = ModelConfig(arch=arch, vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_eps=1e-5,
                         max_position=256, tie_embeddings=False, qkv_bias=arch == "qwen2", name="tiny")
    return replace(config, **changes)


def random_weights(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * 0.5).astype(np.float32)
            for name, shape in tensor_shapes(config).items()}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows reordered so that HF's
    half-rotation pairs (j, j + D/2) become adjacent rows (2j, 2j + 1)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---- Hugging Face folder -----------------------------------------------------------------------

def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def stored_value(a: np.ndarray, dtype: str) -> np.ndarray:
    """The float32 values a tensor has once stored as ``dtype``."""
    if dtype == "BF16":
        return (to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float16).astype(np.float32) if dtype == "F16" else a


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    if dtype != "BF16":
        save_file({k: v.astype(np.float16 if dtype == "F16" else np.float32) for k, v in tensors.items()}, str(path))
        return
    bits = {k: to_bf16_bits(v) for k, v in tensors.items()}  # kept alive while serialize_file reads them
    specs = {k: TensorSpec(dtype="bfloat16", shape=list(b.shape), data_ptr=b.ctypes.data, data_len=b.nbytes)
             for k, b in bits.items()}
    serialize_file(specs, str(path), metadata={"format": "pt"})


def write_hf_folder(folder: Path, config: ModelConfig, weights: dict, tok: tokenizers.Tokenizer,
                    dtype: str = "F32", shards: int = 1, chat_template: str | None = CHATML) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM" if config.arch == "llama" else "Qwen2ForCausalLM"],
           "model_type": config.arch, "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
           "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
           "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
           "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_eps,
           "max_position_embeddings": config.max_position, "tie_word_embeddings": config.tie_embeddings,
           "attention_bias": config.qkv_bias}
    (folder / "config.json").write_text(json.dumps(cfg))
    named = {hf_tensor_name(k): v for k, v in weights.items()}
    if shards == 1:
        write_safetensors(folder / "model.safetensors", named, dtype)
    else:
        names = list(named)
        weight_map = {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            write_safetensors(folder / file, {k: named[k] for k in part}, dtype)
            weight_map.update(dict.fromkeys(part, file))
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    tok.save(str(folder / "tokenizer.json"))
    tok_config = {"bos_token": "<|im_start|>", "eos_token": "<|endoftext|>"}
    if chat_template is not None:
        tok_config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return folder


# ---- GGUF ------------------------------------------------------------------------------------------

def tokenizer_metadata(tok: tokenizers.Tokenizer, pre: str = "smollm") -> dict:
    """tokenizer.* keys as llama.cpp's converter writes them for a byte-level BPE."""
    model = json.loads(tok.to_str())["model"]
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.token_type": [3 if t in specials else 1 for t in tokens],
            "tokenizer.ggml.bos_token_id": vocab["<|im_start|>"],
            "tokenizer.ggml.eos_token_id": vocab["<|endoftext|>"],
            "tokenizer.ggml.padding_token_id": vocab["<|endoftext|>"],
            "tokenizer.chat_template": CHATML}


def _add_metadata(writer: gguf.GGUFWriter, meta: dict) -> None:
    for key, value in meta.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif value and isinstance(value[0], str):
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)


def write_gguf(path: Path, config: ModelConfig, weights: dict, tokenizer_meta: dict, qtype: T = T.F32,
               types: dict | None = None, permute: bool | None = None, drop: tuple = (),
               meta: dict | None = None) -> Path:
    """The GGUF file of ``weights`` (HF layout): matrices in ``qtype`` (or ``types[canonical]``),
    norms and biases F32, q/k rows permuted as llama.cpp does for arch llama."""
    permute = config.arch == "llama" if permute is None else permute
    arch = config.arch
    writer = gguf.GGUFWriter(str(path), arch)
    _add_metadata(writer, {
        "general.name": config.name, f"{arch}.block_count": config.num_layers,
        f"{arch}.context_length": config.max_position, f"{arch}.embedding_length": config.hidden_size,
        f"{arch}.feed_forward_length": config.intermediate_size, f"{arch}.attention.head_count": config.num_heads,
        f"{arch}.attention.head_count_kv": config.num_kv_heads, f"{arch}.rope.freq_base": config.rope_theta,
        f"{arch}.attention.layer_norm_rms_epsilon": config.rms_eps,
        f"{arch}.rope.dimension_count": config.head_dim, **tokenizer_meta, **(meta or {})})
    for name, w in weights.items():
        if name in drop:
            continue
        if permute and name.endswith(("q_proj", "q_bias", "k_proj", "k_bias")):
            w = llama_cpp_permute(w, config.num_heads if ".q_" in name else config.num_kv_heads)
        t = (types or {}).get(name, qtype if w.ndim == 2 else T.F32)
        if t == T.F32:
            writer.add_tensor(gguf_tensor_name(name), np.ascontiguousarray(w, dtype=np.float32))
        elif t == T.F16:
            writer.add_tensor(gguf_tensor_name(name), w.astype(np.float16))
        else:
            writer.add_tensor(gguf_tensor_name(name), quantize(w, t), raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
