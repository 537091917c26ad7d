"""Hugging Face folder export: what write_hf_folder writes, load_checkpoint reads back exactly
(tensors, config, tokenizer with its special tokens, chat template and eos ids), and the model
built from it gives the same logits; a training checkpoint can be a model folder too."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from tokenizers.processors import TemplateProcessing

from anychip_models.loader import load_checkpoint
from anychip_models.export import hf_folder_files, hf_metadata_files, hf_tensors, write_hf_folder
from anychip_models.tokenizer import Tokenizer
from anychip_models.training.checkpoints import save_checkpoint
from loader_helpers import (random_weights, tiny_config, tokenizer_metadata, train_tokenizer,
                            write_hf_folder as write_test_folder)
from model_helpers import tiny_checkpoint
from ops_helpers import host, paddle

TEXTS = ["The capital of France is Paris.", "Hello world! 1234567890", "naïve façade, 東京 😀",
         "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>", "  spaces\tand\n\nlines "]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]


def assert_same_model(got, want):
    assert replace(got.config, name="") == replace(want.config, name="")
    assert got.tensors.keys() == want.tensors.keys()
    for name, value in want.tensors.items():
        expected = value.dequantize() if hasattr(value, "dequantize") else value
        assert got.tensors[name].dtype == np.float32
        np.testing.assert_array_equal(got.tensors[name], expected, err_msg=name)


def assert_same_tokenizer(got: Tokenizer, want: Tokenizer):
    assert (got.bos_id, got.bos_token, got.eos_token, got.pad_id, got.add_bos) == \
        (want.bos_id, want.bos_token, want.eos_token, want.pad_id, want.add_bos)
    assert got.eos_ids == want.eos_ids and got.vocab_size == want.vocab_size
    assert got.chat_template == want.chat_template
    for text in TEXTS:
        assert got.encode(text) == want.encode(text), text
        assert got.encode(text, add_bos=True) == want.encode(text, add_bos=True), text
        ids = want.encode(text)
        assert got.decode(ids) == want.decode(ids) and got.decode(ids, False) == want.decode(ids, False)
    if want.has_chat_template:
        for gen in (True, False):
            assert got.apply_chat_template(CHAT, gen) == want.apply_chat_template(CHAT, gen)


def logits(checkpoint, ids):
    pd = paddle()
    from anychip_models.llama import LlamaForCausalLM

    model = LlamaForCausalLM(checkpoint, "cpu")
    tokens = pd.to_tensor(np.array([ids], np.int64))
    positions = pd.to_tensor(np.arange(len(ids), dtype=np.int64)[None])
    return host(model(tokens, positions))


@pytest.mark.parametrize("variant", [dict(), dict(tie=False), dict(qkv_bias=True)], ids=["tied", "untied", "bias"])
def test_tiny_model_round_trip_and_logits(tmp_path, variant):
    original = tiny_checkpoint("float", **variant)
    folder = write_hf_folder(tmp_path / "model", original.config, original.tensors, original.tokenizer)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                         "tokenizer.json", "tokenizer_config.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary folder left
    loaded = load_checkpoint(folder)
    assert_same_model(loaded, original)
    assert_same_tokenizer(loaded.tokenizer, original.tokenizer)
    ids = [5, 17, 42, 3, 88, 1, 60]
    np.testing.assert_array_equal(logits(loaded, ids), logits(original, ids))


def test_quantized_weights_are_exported_dequantized(tmp_path):
    original = tiny_checkpoint("int4")
    loaded = load_checkpoint(write_hf_folder(tmp_path / "m", original.config, original.tensors, original.tokenizer))
    assert_same_model(loaded, original)


def test_qwen2_config(tmp_path):
    tok = train_tokenizer()
    config = tiny_config(tok, "qwen2", tie_embeddings=True)
    weights = random_weights(config)
    source = load_checkpoint(write_test_folder(tmp_path / "src", config, weights, tok))
    loaded = load_checkpoint(write_hf_folder(tmp_path / "out", source.config, source.tensors, source.tokenizer))
    assert loaded.config.arch == "qwen2" and loaded.config.qkv_bias
    assert_same_model(loaded, source)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["torch_dtype"] == "float32"


def tokenizer_of(kind: str, tmp_path) -> Tokenizer:
    tok = train_tokenizer()
    if kind.startswith("gguf"):
        meta = tokenizer_metadata(tok)
        if kind == "gguf-add-bos":
            meta["tokenizer.ggml.add_bos_token"] = True
            meta["tokenizer.ggml.eot_token_id"] = tok.token_to_id("<|im_end|>")
        return Tokenizer.from_gguf_metadata(meta, "test.gguf")
    if kind == "hf-bos":  # a post-processor that puts bos first, as Llama's tokenizer.json does
        bos = tok.token_to_id("<|im_start|>")
        tok.post_processor = TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)])
    folder = write_test_folder(tmp_path / "src", tiny_config(tok), random_weights(tiny_config(tok)), tok)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.token_to_id("<|endoftext|>"),
                                                                                 tok.token_to_id("<|im_end|>")]}))
    return load_checkpoint(folder).tokenizer


@pytest.mark.parametrize("kind", ["hf", "hf-bos", "gguf", "gguf-add-bos"])
def test_tokenizer_round_trip(tmp_path, kind):
    original = tokenizer_of(kind, tmp_path)
    assert original.add_bos == kind.endswith("bos") and original.has_chat_template
    config = tiny_config(train_tokenizer())
    folder = write_hf_folder(tmp_path / "out", config, random_weights(config), original)
    assert_same_tokenizer(load_checkpoint(folder).tokenizer, original)
    assert_same_tokenizer(Tokenizer.from_hf_folder(folder), original)
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok_config["bos_token"] == "<|im_start|>" and tok_config["eos_token"] == "<|endoftext|>"
    assert tok_config["add_bos_token"] == original.add_bos


def test_to_files_leaves_the_tokenizer_unchanged(tmp_path):
    tok = tokenizer_of("gguf-add-bos", tmp_path)
    before = tok._backend.to_str()
    tok.to_files()
    assert tok._backend.to_str() == before


def test_export_replaces_an_earlier_export(tmp_path):
    original = tiny_checkpoint()
    folder = write_hf_folder(tmp_path / "m", original.config, original.tensors, original.tokenizer)
    changed = {**original.tensors, "norm": original.tensors["norm"] + 1}
    write_hf_folder(folder, original.config, changed, original.tokenizer)
    np.testing.assert_array_equal(load_checkpoint(folder).tensors["norm"], changed["norm"])
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_export_into_a_training_output_folder(tmp_path):
    """A folder holding other things (checkpoints) keeps them; files that would shadow the new
    ones (an index, a chat_template.jinja) go."""
    original = tiny_checkpoint()
    save_checkpoint(tmp_path, 1, {"w": np.zeros(2, np.float32)}, {}, {})
    (tmp_path / "chat_template.jinja").write_text("stale")
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    write_hf_folder(tmp_path, original.config, original.tensors, original.tokenizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-1", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json"]
    assert_same_model(load_checkpoint(tmp_path), original)


def test_checkpoint_folder_is_a_model_folder(tmp_path):
    """A full fine-tuning checkpoint with HF tensor names and the metadata files loads as a model;
    the optimizer file beside it is not read as weights, even under the same tensor names."""
    original = tiny_checkpoint(tie=False)
    model = hf_tensors(original.config, original.tensors)
    optimizer = {name: np.full(value.shape, 7, np.float32) for name, value in model.items()}
    ckpt = save_checkpoint(tmp_path, 4, model, optimizer, {"step": 4},
                           extra=hf_metadata_files(original.config, original.tokenizer))
    loaded = load_checkpoint(ckpt)
    assert_same_model(loaded, original)
    assert_same_tokenizer(loaded.tokenizer, original.tokenizer)


def test_refuses_tensors_that_do_not_match_the_config():
    original = tiny_checkpoint()
    c, t, tok = original.config, original.tensors, original.tokenizer
    with pytest.raises(ValueError, match="missing.*'norm'"):
        hf_folder_files(c, {k: v for k, v in t.items() if k != "norm"}, tok)
    with pytest.raises(ValueError, match="unexpected.*'lm_head'"):
        hf_folder_files(c, {**t, "lm_head": t["embed_tokens"]}, tok)
    with pytest.raises(ValueError, match="'norm' has shape"):
        hf_folder_files(c, {**t, "norm": t["norm"][:-1]}, tok)
    with pytest.raises(ValueError, match="qwen2"):
        hf_folder_files(replace(c, arch="qwen2"), t, tok)
