"""The tokenizer: rebuilt from GGUF metadata it must tokenize as the tokenizer.json it came from;
chat templates render as transformers renders them; streaming never splits a character.
Then the real SmolLM2 GGUF (pulled into the test cache once per module) end to end."""

from __future__ import annotations

import pytest

from anychip_models import hub
from anychip_models.checkpoint import CheckpointError, QuantWeight
from anychip_models.loader import load_checkpoint
from anychip_models.tokenizer import PRE_TOKENIZERS, Tokenizer
from loader_helpers import tokenizer_metadata, train_tokenizer

TEXTS = ["The capital of France is Paris.", "Hello world! 1234567890 and 3.14159", "naïve façade, 東京 and ñ",
         "emoji 😀🎉 and 👩‍💻 too", "  leading   spaces\nand\ttabs\n\n", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def hf_tok():
    return train_tokenizer()


def from_meta(hf_tok, pre="smollm", **changes) -> Tokenizer:
    return Tokenizer.from_gguf_metadata({**tokenizer_metadata(hf_tok, pre), **changes}, source="test.gguf")


@pytest.mark.parametrize("digits,pre", [(True, "smollm"), (False, "gpt-2")])
def test_gguf_metadata_tokenizes_as_the_tokenizer_json(digits, pre):
    hf = train_tokenizer(digits=digits)
    tok = from_meta(hf, pre)
    for text in TEXTS:
        assert tok.encode(text) == hf.encode(text).ids, text
        assert tok.decode(tok.encode(text), skip_special=False) == text


def test_pre_tokenizer_splits():
    """How each family splits digits before merging (llama.cpp's regexes per tokenizer.ggml.pre)."""
    hf = train_tokenizer()

    def pieces(pre, text):
        return [p for p, _ in from_meta(hf, pre)._backend.pre_tokenizer.pre_tokenize_str(text)]

    assert pieces("smollm", "x 12345") == ["x", "Ġ", "1", "2", "3", "4", "5"]
    assert pieces("qwen2", "x 12345") == ["x", "Ġ", "1", "2", "3", "4", "5"]
    assert pieces("llama3", "x 12345") == ["x", "Ġ", "123", "45"]
    assert pieces("gpt-2", "x 12345") == ["x", "Ġ12345"]
    assert pieces("llama3", "I'VE got\n\nit") == ["I", "'VE", "Ġgot", "ĊĊ", "it"]
    for name in PRE_TOKENIZERS:  # every regex compiles and covers the text
        assert "".join(pieces(name, "Hi, it's 2024!\n  ok")) == "Hi,Ġit'sĠ2024!ĊĠĠok"


def test_round_trips_and_special_tokens(hf_tok):
    tok = from_meta(hf_tok)
    for text in TEXTS:
        assert tok.decode(tok.encode(text), skip_special=False) == text
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == start and ids[-1] == end
    assert tok.decode(ids) == "user\nhi"
    assert tok.token_to_id("no such token") is None
    assert tok.vocab_size == hf_tok.get_vocab_size()


def test_bos(hf_tok):
    tok = from_meta(hf_tok)
    assert tok.bos_id == tok.token_to_id("<|im_start|>") and tok.bos_token == "<|im_start|>"
    assert tok.encode("hi", add_bos=True) == [tok.bos_id] + tok.encode("hi")
    assert tok.encode("<|im_start|>hi", add_bos=True) == tok.encode("<|im_start|>hi")  # not twice
    assert not tok.add_bos and from_meta(hf_tok, **{"tokenizer.ggml.add_bos_token": True}).add_bos


def test_eos_ids_add_the_templates_end_of_turn(hf_tok):
    eos, im_end = hf_tok.token_to_id("<|endoftext|>"), hf_tok.token_to_id("<|im_end|>")
    assert from_meta(hf_tok).eos_ids == {eos, im_end}
    no_template = from_meta(hf_tok, **{"tokenizer.chat_template": ""})
    assert no_template.eos_ids == {eos} and not no_template.has_chat_template
    with_eot = from_meta(hf_tok, **{"tokenizer.chat_template": "", "tokenizer.ggml.eot_token_id": im_end})
    assert with_eot.eos_ids == {eos, im_end}


def test_chat_template_renders_like_transformers(hf_tok):
    tok = from_meta(hf_tok)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
    assert tok.apply_chat_template(messages[:1]).endswith("<|im_start|>assistant\n")
    template = ("{{ bos_token }}{% for m in messages %}\n  {% if m['role'] not in ['user'] %}"
                "{{ raise_exception('only users') }}{% endif %}\n  {{ m | tojson }}|{{ eos_token }}\n{% endfor %}")
    tok = from_meta(hf_tok, **{"tokenizer.chat_template": template})
    # lstrip_blocks drops the indent before {% if %}, trim_blocks the newline after {% endif %}
    # (the indent before {{ }} stays); tojson keeps non-ASCII
    assert tok.apply_chat_template([{"role": "user", "content": "é"}]) == \
        '<|im_start|>  {"role": "user", "content": "é"}|<|endoftext|>\n'
    import jinja2

    with pytest.raises(jinja2.TemplateError, match="only users"):
        tok.apply_chat_template([{"role": "system", "content": "x"}])
    with pytest.raises(ValueError, match="no chat template"):
        from_meta(hf_tok, **{"tokenizer.chat_template": ""}).apply_chat_template([])


def test_stream_decoder_never_splits_a_character(hf_tok):
    tok = from_meta(hf_tok)
    text = "ok 😀 naïve 👩‍💻 東京!"
    ids = tok.encode(text)
    assert len(ids) > len(text) // 2  # the emoji come out as several byte tokens
    stream = tok.stream_decoder()
    pieces = [stream.feed(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert "" in pieces  # some ids completed no character


def test_unsupported_tokenizers(hf_tok):
    with pytest.raises(CheckpointError, match=r"test\.gguf: tokenizer\.ggml\.model 'llama' is not supported"):
        from_meta(hf_tok, **{"tokenizer.ggml.model": "llama"})
    with pytest.raises(CheckpointError, match=r"tokenizer\.ggml\.pre 'klingon' is not supported \(supported: .*smollm"):
        from_meta(hf_tok, "klingon")


# ---- the real SmolLM2-135M-Instruct GGUF ---------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    return load_checkpoint(hub.resolve("smollm2"), weights="native")


def test_smollm2_config(smollm2):
    c = smollm2.config
    assert (c.arch, c.num_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert (c.rope_theta, c.rms_eps, c.tie_embeddings, c.qkv_bias) == (100000.0, 1e-5, True, False)
    assert "lm_head" not in smollm2.tensors


def test_smollm2_tensors(smollm2):
    t = smollm2.tensors
    embed, q = t["embed_tokens"], t["layers.0.q_proj"]
    assert isinstance(embed, QuantWeight) and embed.bits == 8 and embed.shape == (49152, 576)
    assert isinstance(q, QuantWeight) and q.bits == 4 and q.offsets is not None and q.shape == (576, 576)
    assert isinstance(t["layers.29.down_proj"], QuantWeight) and t["layers.29.down_proj"].shape == (576, 1536)
    assert t["norm"].shape == (576,) and t["layers.0.attn_norm"].dtype.name == "float32"


def test_smollm2_tokenizer(smollm2):
    tok = smollm2.tokenizer
    for text in ["The quick brown fox jumps over the lazy dog.", "Call 555-0123 or 42 × 7 = 294",
                 "naïve café, Ελληνικά, 日本語, русский", "emoji 😀🎉 👩‍💻 🇫🇷"]:
        assert tok.decode(tok.encode(text)) == text, text
    ids = tok.encode("Hello world! 123")
    assert [tok.decode([i]) for i in ids] == ["Hello", " world", "!", " ", "1", "2", "3"]  # digits one by one
    assert tok.encode("<|im_start|>") == [tok.token_to_id("<|im_start|>")] == [1]
    assert tok.bos_id == 1 and 2 in tok.eos_ids and tok.eos_token == "<|im_end|>"
    assert tok.vocab_size == 49152


def test_smollm2_chat_template(smollm2):
    tok = smollm2.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    # the template adds its default system prompt when the conversation has none
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(prompt)
    assert ids[0] == 1 and ids[-4:] == tok.encode("<|im_start|>assistant\n") and ids.count(2) == 2


def test_smollm2_streaming(smollm2):
    tok = smollm2.tokenizer
    text = "Paris 🇫🇷 est la capitale — 東京 aussi? 😀"
    stream = tok.stream_decoder()
    pieces = [stream.feed(i) for i in tok.encode(text)]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)
