"""Hugging Face folders: config.json, safetensors in float32/float16/bfloat16 (one file or shards),
tokenizer.json with tokenizer_config.json and generation_config.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from anychip_models.checkpoint import CheckpointError
from anychip_models.loader import load_checkpoint
from loader_helpers import (random_weights, stored_value, tiny_config, train_tokenizer, write_hf_folder,
                            write_safetensors)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def folder_of(tmp_path, tok, arch="llama", dtype="F32", shards=1, **changes):
    config = tiny_config(tok, arch, **changes)
    weights = random_weights(config)
    return config, weights, write_hf_folder(tmp_path / "model", config, weights, tok, dtype=dtype, shards=shards)


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("shards", [1, 3])
def test_tensors_in_every_dtype_and_sharding(tmp_path, tok, dtype, shards):
    config, weights, folder = folder_of(tmp_path, tok, dtype=dtype, shards=shards)
    ckpt = load_checkpoint(folder, weights="native")  # HF weights are float: native changes nothing
    assert ckpt.tensors.keys() == weights.keys()
    for name, w in weights.items():
        assert ckpt.tensors[name].dtype == np.float32
        np.testing.assert_array_equal(ckpt.tensors[name], stored_value(w, dtype), err_msg=name)
    assert ckpt.source == folder


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_config(tmp_path, tok, arch):
    config, _, folder = folder_of(tmp_path, tok, arch=arch, tie_embeddings=True, qkv_bias=arch == "qwen2")
    got = load_checkpoint(folder).config
    assert got.arch == arch and got.name == "model"
    assert (got.vocab_size, got.hidden_size, got.intermediate_size, got.num_layers) == (config.vocab_size, 64, 128, 2)
    assert (got.num_heads, got.num_kv_heads, got.head_dim) == (4, 2, 16)
    assert (got.rope_theta, got.rms_eps, got.max_position) == (10000.0, 1e-5, 256)
    assert got.tie_embeddings and got.qkv_bias == (arch == "qwen2")
    assert "lm_head" not in load_checkpoint(folder).tensors


def test_tokenizer_files(tmp_path, tok):
    _, _, folder = folder_of(tmp_path, tok)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.token_to_id("<|im_end|>")]}))
    t = load_checkpoint(folder).tokenizer
    assert t.bos_id == tok.token_to_id("<|im_start|>")
    assert t.eos_token == "<|endoftext|>"
    assert t.eos_ids == {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}
    assert t.encode("Hello world! 123") == tok.encode("Hello world! 123").ids
    assert t.has_chat_template and not t.add_bos


def test_bos_from_the_post_processor(tmp_path):
    """A tokenizer.json whose post-processor puts bos first (as Llama's does) sets add_bos; encode
    itself adds bos only when asked."""
    from tokenizers.processors import TemplateProcessing

    tok = train_tokenizer()
    bos = tok.token_to_id("<|im_start|>")
    tok.post_processor = TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)])
    _, _, folder = folder_of(tmp_path, tok)
    t = load_checkpoint(folder).tokenizer
    assert t.add_bos
    assert t.encode("hi", add_bos=True) == [bos] + t.encode("hi") and bos not in t.encode("hi")


def test_chat_template_file_wins(tmp_path, tok):
    _, _, folder = folder_of(tmp_path, tok)
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] | upper }}")
    assert load_checkpoint(folder).tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "HI"


def test_errors(tmp_path, tok):
    config, weights, folder = folder_of(tmp_path, tok)
    cfg = json.loads((folder / "config.json").read_text())

    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(CheckpointError,
                       match=r"config\.json: unsupported model_type 'gpt2' \(supported: llama, qwen2\)"):
        load_checkpoint(folder)

    (folder / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.gate_proj\.weight' \(layers\.0\.gate_proj\) "
                                              r"has shape \[128, 64\], config\.json makes it \[96, 64\]"):
        load_checkpoint(folder)

    (folder / "config.json").write_text(json.dumps(cfg))
    named = {"model.embed_tokens.weight": weights["embed_tokens"]}
    write_safetensors(folder / "model.safetensors", named, "F32")
    with pytest.raises(CheckpointError, match=r"tensor 'model\.layers\.0\.input_layernorm\.weight' "
                                              r"\(layers\.0\.attn_norm\) is missing"):
        load_checkpoint(folder)

    save_file({"model.embed_tokens.weight": weights["embed_tokens"].astype(np.float64)},
              str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'model\.embed_tokens\.weight' has dtype "
                                              r"F64, which is not supported \(supported: F32, F16, BF16\)"):
        load_checkpoint(folder)

    write_safetensors(folder / "model.safetensors", named, "F32")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="may be truncated"):
        load_checkpoint(folder)

    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_checkpoint(folder)

    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_checkpoint(folder)


def test_missing_tokenizer(tmp_path, tok):
    _, _, folder = folder_of(tmp_path, tok)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json is missing"):
        load_checkpoint(folder)
